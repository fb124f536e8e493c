//! Each slot of a lock decided in turn: who is served on which slot, each slot's decision
//! carried out into the plan (its grant, revocation or drain and its Lease write), tokens
//! minted slot after slot from one counter, and a slot above the permits deleted once its
//! last hold is over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use super::{
    Drained, Grant, LeaseWrite, Observation, Plan, Revoked, SlotView, SlotWrite, Waiting, blocked_ready, not_ready,
    permits, permits_annotation,
};
use crate::controller::decide::{self, Blocked, Current, Decision, Tokens};
use crate::controller::view::{self, Claim, LeaseState};
use crate::controller::{build, force, serve};
use crate::crd::{ANNOTATION_PERMITS, ClaimMode};
use crate::lease::{GrantedTiming, RevokeReason};

/// What one slot's decision comes to.
pub(super) enum SlotPlan {
    /// This write (`None`: none).
    Write(Option<Box<Lease>>),
    /// Delete the slot Lease.
    Delete,
    /// Nothing can be granted: the whole plan is the not-ready plan.
    Blocked(Blocked),
}

/// One slot, as the plan goes through it.
pub(super) struct SlotCase<'o, 'a> {
    pub(super) view: &'o SlotView<'a>,
    pub(super) state: LeaseState,
    pub(super) current: Current,
    pub(super) terms: GrantedTiming,
}

/// Carries out `decision` on one slot into `plan`: the grants, revocations and drains it
/// makes, and the slot's write.
fn carry_out(
    o: &Observation,
    case: &SlotCase,
    decision: &Decision,
    head: Option<&Claim>,
    force: Option<&force::Request>,
    plan: &mut Plan,
) -> SlotPlan {
    let (slot, lease) = (case.view.slot, case.view.lease);
    let spec_terms = GrantedTiming::of_spec(&o.lock.spec);
    let drained = match &case.state {
        LeaseState::Draining(d) => Some(Drained { slot, token: d.revoked, acknowledged: d.holder.is_none() }),
        _ => None,
    };
    let revoked = |revocation: &decide::Revocation, raised_to: i64, drain_from: Option<Duration>| {
        let LeaseState::Held(h) = &case.state else { unreachable!("only a granted hold is revoked") };
        Revoked {
            slot,
            reason: revocation.reason,
            token: revocation.token,
            raised_to,
            holder: h.identity.clone(),
            // The claim the hold was granted on, not a later one in the holder's name: a
            // new acquisition, made after the holder lost this hold, keeps its place.
            claim: o.claims.iter().find(|w| h.granted_on(&w.claim)).map(|w| w.claim.clone()),
            drain_from,
            force: force.cloned().filter(|_| revocation.reason == RevokeReason::Forced),
        }
    };
    let written = match decision {
        Decision::Blocked(blocked) => return SlotPlan::Blocked(blocked.clone()),
        Decision::DeleteLease => {
            plan.drained.extend(drained);
            return SlotPlan::Delete;
        }
        Decision::Keep { recheck } => {
            plan.recheck = [plan.recheck, *recheck].into_iter().flatten().min();
            None
        }
        Decision::Grant { token, revoked: revocation } => {
            let head = head.expect("a grant serves a waiter");
            let reason = revocation.as_ref().map(|r| r.reason.as_str());
            let written = build::granted(lease, head, *token, &spec_terms, o.wall, reason);
            // From the holder's release (the Lease's last renewal) to this grant; none
            // after a drain.
            let handoff_ms = match (&case.current, revocation) {
                (Current::Free, None) => lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.renew_time.as_ref())
                    .map(|t| o.wall.duration_since(t.0).as_millis().max(0) as i64),
                (Current::Draining(_), _) => None,
                _ => Some(0),
            };
            let waited_seconds = o.wall.duration_since(head.requested).as_secs_f64().max(0.0);
            let confirm_first = o
                .claims
                .iter()
                .find(|w| w.claim.uid == head.uid)
                .is_some_and(|w| w.seen_for >= spec_terms.timing.lease_duration);
            plan.grants.push(Grant {
                slot,
                claim: head.clone(),
                token: *token,
                waited_seconds,
                handoff_ms,
                confirm_first,
            });
            plan.revocations.extend(revocation.as_ref().map(|r| revoked(r, *token, None)));
            plan.drained.extend(drained);
            plan.recheck = [plan.recheck, Some(o.confirm_timeout)].into_iter().flatten().min();
            Some(written)
        }
        Decision::Revoke { revocation, raise_to } => {
            plan.revocations.push(revoked(revocation, *raise_to, None));
            Some(build::revoked(lease, *raise_to, revocation.reason.as_str()))
        }
        Decision::Drain { revocation, raise_to, recheck } => {
            let unchanged = case.view.hold.map_or(Duration::ZERO, |c| c.unchanged_for);
            plan.revocations.push(revoked(revocation, *raise_to, Some(unchanged)));
            plan.recheck = [plan.recheck, Some(*recheck)].into_iter().flatten().min();
            Some(build::draining(lease, *raise_to, revocation.reason.as_str(), revocation.token))
        }
        Decision::Free => {
            plan.drained.extend(drained);
            Some(build::freed(lease))
        }
    };
    SlotPlan::Write(written.map(Box::new))
}

/// The token a decision records, if it mints one.
fn minted(decision: &Decision) -> Option<i64> {
    match decision {
        Decision::Grant { token, .. } => Some(*token),
        Decision::Revoke { raise_to, .. } | Decision::Drain { raise_to, .. } => Some(*raise_to),
        _ => None,
    }
}

/// How serving sees a slot: free when a waiter could be granted it by this write (its
/// hold expired, say, is revoked and re-granted in one write), else taken.
fn serving_state(inputs: &decide::Inputs, state: &LeaseState) -> serve::Slot {
    let probe = decide::Inputs { waiting: 1, ..inputs.clone() };
    match (decide::decide(&probe), state) {
        (Decision::Grant { .. }, _) => serve::Slot::Free,
        (_, LeaseState::Held(h)) => serve::Slot::Held(mode(h.mode)),
        (_, LeaseState::Draining(d)) => serve::Slot::Draining(mode(d.mode)),
        (_, LeaseState::Free) => serve::Slot::Draining(serve::Mode::Shared),
    }
}

/// How serving sees a claim's mode: a writer is exclusive.
pub(super) fn mode(mode: ClaimMode) -> serve::Mode {
    match mode {
        ClaimMode::Read => serve::Mode::Shared,
        ClaimMode::Write => serve::Mode::Exclusive,
    }
}

/// The decision inputs of one slot, with `tokens` known and `waiting` waiters for it.
fn inputs(o: &Observation, case: &SlotCase, tokens: Tokens, waiting: usize) -> decide::Inputs {
    decide::Inputs {
        terms: case.terms,
        confirm_timeout: o.confirm_timeout,
        current: case.current.clone(),
        waiting,
        deleting: o.lock.metadata.deletion_timestamp.is_some(),
        tokens,
        wall_clock_ms: o.wall.as_millisecond(),
    }
}

/// Decides every slot, slot 0 first, each serving the waiter [`serve::serve`] gives it and
/// minting above the tokens the slots before it minted; carries the decisions out into
/// `plan`. Returns the slot Leases as the writes leave them and how many are deleted — or
/// `Err` with `plan` replaced by the not-ready plan, when nothing can be granted.
pub(super) fn decide_slots(
    o: &Observation,
    cases: &[SlotCase],
    serveable: &[&Waiting],
    (force, forced_slot): (Option<&force::Request>, usize),
    plan: &mut Plan,
) -> Result<(Vec<(u32, Lease)>, usize), ()> {
    // Minting also goes above a token reserved for a next waiter on any slot Lease: a
    // release may hand the lock on with it at any moment.
    let reserved = cases.iter().filter_map(|c| crate::lease::next::of_lease(c.view.lease)).map(|n| n.token).max();
    let mut running = match (o.tokens, reserved) {
        (Tokens::Known(known), Some(reserved)) => Tokens::Known(known.max(reserved)),
        (tokens, _) => tokens,
    };
    let slots: Vec<serve::Slot> = cases.iter().map(|c| serving_state(&inputs(o, c, running, 1), &c.state)).collect();
    let modes: Vec<serve::Mode> = serveable.iter().map(|w| mode(w.claim.mode)).collect();
    let served = serve::serve(&slots, permits(o.lock) as usize, o.lock.spec.fairness, &modes);
    let mut after = Vec::new();
    let mut deleted = 0;
    for (index, case) in cases.iter().enumerate() {
        let head = served.iter().find(|s| s.slot == index).map(|s| &serveable[s.waiter].claim);
        let decision = decide::decide(&inputs(o, case, running, usize::from(head.is_some())));
        if let Some(t) = minted(&decision) {
            running = Tokens::Known(t);
        }
        let on_target = if index == forced_slot { force } else { None };
        match carry_out(o, case, &decision, head, on_target, plan) {
            SlotPlan::Blocked(blocked) => {
                *plan = not_ready(o.lock, o.known, o.required, blocked_ready(&blocked));
                return Err(());
            }
            SlotPlan::Delete => {
                deleted += 1;
                plan.leases.push(SlotWrite { slot: case.view.slot, write: LeaseWrite::Delete });
            }
            SlotPlan::Write(written) => {
                let written =
                    super::next::record(o, case.view.slot, case.view.lease, written, serveable, &mut running, plan);
                match finish_slot(o, case, written) {
                    Some((write, lease)) => {
                        plan.leases.extend(write);
                        after.push((case.view.slot, lease));
                    }
                    None => plan.leases.push(SlotWrite { slot: case.view.slot, write: LeaseWrite::Delete }),
                }
            }
        }
    }
    Ok((after, deleted))
}

/// A slot's write once decided, with what the slot's Lease then says; `None` when the
/// slot goes instead: the lock shrank below it and its last hold is over. Slot 0 also
/// records the lock's permits, where claimants learn how many slot Leases to watch.
fn finish_slot(o: &Observation, case: &SlotCase, written: Option<Box<Lease>>) -> Option<(Option<SlotWrite>, Lease)> {
    let slot = case.view.slot;
    let mut lease = written.as_deref().unwrap_or(case.view.lease).clone();
    let deleting = o.lock.metadata.deletion_timestamp.is_some();
    if slot >= permits(o.lock) && !deleting && view::lease_state(&lease) == LeaseState::Free {
        return None;
    }
    let mut written = written;
    if slot == 0 && lease.annotations().get(ANNOTATION_PERMITS) != permits_annotation(o.lock).as_ref() {
        build::set_permits(&mut lease, permits(o.lock));
        written = Some(Box::new(lease.clone()));
    }
    Some((written.map(|w| SlotWrite { slot, write: LeaseWrite::Replace(w) }), lease))
}
