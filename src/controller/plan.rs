//! The arbiter's plan for one lock: from one observation, everything one reconcile writes
//! and records, as a pure function.
//!
//! A reconcile is observe → plan → apply → record. [`super::observe`] makes every read
//! once (the lock, its Lease, the claims with their ages, the holder's Pod, which waiters
//! may be served, the force-release requests, the highest token known). [`plan`] decides
//! from that alone: who is revoked and how ([`super::decide`]), who is granted (the queue
//! is split and served here, in claim order), the Lease to write, the claims to drop, what
//! the force-release requests become, the status that follows, and the facts (grants,
//! revocations, drains) that metrics, Events and the controller's memory record once the
//! writes succeed. [`super::apply`] makes the writes and [`super::record`] records.
//!
//! A lock has `spec.permits` slots, each a Lease of its own (a mutex has one). Each slot is
//! decided as a mutex's Lease is; who is served on which free slot is [`super::serve`]'s,
//! in claim order; tokens are minted from one counter for the whole lock, slot after slot,
//! so they increase across the lock and so within every slot.

mod next;
mod settle;
mod setup;
mod slots;

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use super::decide::{Blocked, Current, DrainState, HolderState, Tokens};
use super::force::{self, Target};
use super::requests::HoldView;
use super::status::{Granted, Outcome, Ready, SlotHold};
use super::view::{self, Claim, LeaseDrain, LeaseHold, LeaseState};
use crate::crd::{DistributedLock, DistributedLockStatus, ForceRelease, ForceReleaseEntry, ForceReleaseRequest};
use crate::lease::{GrantedTiming, Identity, RevokeReason, granted, token};

pub use settle::{Judgement, RequestUpdate};
pub use setup::{Setup, from_status, setup};
use slots::{SlotCase, decide_slots};

/// How often a lock that cannot be granted (a foreign Lease with its name, a tampered or
/// exhausted token) is looked at again: a foreign Lease carries no labels of ours, so its
/// deletion reaches us through no watch.
pub const NOT_READY_RECHECK: Duration = Duration::from_secs(10);

/// How long a claim whose hold its claimant gave back is left for the claimant to delete
/// (it sends that delete with the give-back) before the controller deletes it: a delete
/// of our own in that time would race the claimant's, and find the claim gone (404) or
/// its claimant's next claim of the same name (409). It is never granted meanwhile.
pub const GIVEN_BACK_GRACE: Duration = Duration::from_secs(1);

/// A claim as observed: its age on our clock and whether its claimant may be served.
#[derive(Clone, Debug, PartialEq)]
pub struct Waiting {
    /// The claim.
    pub claim: Claim,
    /// How long its refresh has been unchanged on our clock.
    pub unchanged_for: Duration,
    /// How long since we first saw it, on our clock: its claimant sent it before then.
    pub seen_for: Duration,
    /// `Some(false)`: its Pod is gone or it is not among the lock's clients;
    /// `Some(true)`: it may be served; `None`: not looked at (behind the ones to serve).
    pub serveable: Option<bool>,
}

/// The granted hold's clocks and liveness, as observed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HoldClock {
    /// How long its renewal record has been unchanged on our clock.
    pub unchanged_for: Duration,
    /// Its age on our clock.
    pub held_for: Duration,
    /// Its Pod is gone.
    pub pod_gone: bool,
}

/// One slot Lease, as observed.
#[derive(Clone, Debug)]
pub struct SlotView<'a> {
    /// Its slot.
    pub slot: u32,
    /// The Lease (ours).
    pub lease: &'a Lease,
    /// The granted hold's clocks (when the Lease is held).
    pub hold: Option<HoldClock>,
    /// Since the drained hold's last renewal before its revocation (when draining).
    pub drain_since_renewal: Option<Duration>,
}

/// Everything one reconcile decides from.
#[derive(Clone, Debug)]
pub struct Observation<'a> {
    /// The lock.
    pub lock: &'a DistributedLock,
    /// Its slot Leases (ours), slot 0 first: one per permit, and any above the permits
    /// still in use after the lock shrank.
    pub slots: Vec<SlotView<'a>>,
    /// The well-formed claims on it, in grant order.
    pub claims: Vec<Waiting>,
    /// The UIDs of the claims holds were granted on: a claim is served once, so these are
    /// never granted again (a claimant deletes its claim as it releases, and the delete
    /// may land, or reach our cache, after the release).
    pub spent: Vec<String>,
    /// Of those, the claims seen given back by their claimant (a free Lease still naming
    /// them), and for how long: the claimant deletes such a claim as it gives the hold
    /// back, so it is left to it for [`GIVEN_BACK_GRACE`].
    pub given_back: Vec<(String, Duration)>,
    /// The claims (UIDs) whose delete we sent was refused because they had changed, and
    /// that our cache still shows as they were: not deleted again until it shows the
    /// change (and judged afresh then).
    pub refused: Vec<String>,
    /// The lock's ForceReleaseRequests, oldest first.
    pub requests: Vec<Arc<ForceReleaseRequest>>,
    /// The request the lock records as carried out, with the token it revoked.
    pub executed: Option<(String, Option<i64>)>,
    /// Approvals a force release needs.
    pub required: u32,
    /// The highest token recorded in status or issued by this process.
    pub known: i64,
    /// The tokens known, every slot Lease's included, judged against the mintable ceiling.
    pub tokens: Tokens,
    /// Revoke grants not confirmed within this.
    pub confirm_timeout: Duration,
    /// Now, on the wall clock (a token source, and the time written).
    pub wall: Timestamp,
}

/// The Lease write of a plan.
#[derive(Clone, Debug, PartialEq)]
pub enum LeaseWrite {
    /// None.
    Keep,
    /// Replace the Lease by compare-and-swap with this.
    Replace(Box<Lease>),
    /// Delete it: the lock is going, or shrank below this slot, and nobody can believe
    /// they hold it.
    Delete,
}

/// A slot Lease's write.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotWrite {
    /// The slot.
    pub slot: u32,
    /// The write.
    pub write: LeaseWrite,
}

/// A write made before anything else, after which the lock is looked at again.
#[derive(Clone, Debug, PartialEq)]
pub enum First {
    /// Stamp the force-release annotation's target with this value.
    Stamp(String),
    /// Clear a force-release annotation the lock's policy does not allow (it needs
    /// approvals), recording why.
    Refuse(Box<Refusal>),
}

/// A force-release annotation refused.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// The request refused.
    pub request: force::Request,
    /// Why.
    pub message: String,
    /// Its history entry.
    pub entry: ForceReleaseEntry,
}

/// A grant.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    /// The slot granted.
    pub slot: u32,
    /// The claim served.
    pub claim: Claim,
    /// Its token.
    pub token: i64,
    /// How long its claimant waited, seconds.
    pub waited_seconds: f64,
    /// From the previous holder's release to this grant, ms (none after a drain).
    pub handoff_ms: Option<i64>,
    /// Whether its claimant must confirm it before answering: its claim was first seen a
    /// lease duration ago or more.
    pub confirm_first: bool,
}

/// A revocation.
#[derive(Clone, Debug, PartialEq)]
pub struct Revoked {
    /// The slot of the revoked hold.
    pub slot: u32,
    /// Why.
    pub reason: RevokeReason,
    /// The revoked hold's token, if it had one.
    pub token: Option<i64>,
    /// The token the Lease records after it.
    pub raised_to: i64,
    /// The holder.
    pub holder: Identity,
    /// The holder's claim, dropped with the hold (it claims again, at the back).
    pub claim: Option<Claim>,
    /// When the hold is drained: how long before the revocation its last renewal was seen
    /// (the drain counts from then).
    pub drain_from: Option<Duration>,
    /// The force release that asked for it.
    pub force: Option<force::Request>,
}

/// A drain that ends with this plan's write.
#[derive(Clone, Debug, PartialEq)]
pub struct Drained {
    /// The slot drained.
    pub slot: u32,
    /// The drained token.
    pub token: Option<i64>,
    /// Its holder let go (else the drain timed out).
    pub acknowledged: bool,
}

/// What status is computed from once the writes are made.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusPlan {
    /// The holds after the writes, by slot.
    pub holds: Vec<SlotHold>,
    /// The drains after the writes, by slot.
    pub draining: Vec<(u32, LeaseDrain)>,
    /// Live waiters, in grant order.
    pub waiters: Vec<Claim>,
    /// Whether the lock can be granted.
    pub ready: Ready,
    /// The highest token issued.
    pub token: i64,
    /// What the writes do, for status (request history is added as those writes land).
    pub outcome: Outcome,
    /// How many approvals a force release needs.
    pub approvals: u32,
    /// The lock's permits.
    pub permits: u32,
}

/// Everything one reconcile writes and records.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// A write before anything else; the rest of the plan is then empty.
    pub first: Option<First>,
    /// The slot Lease writes, in slot order (slots not written are not listed).
    pub leases: Vec<SlotWrite>,
    /// The lock goes once these writes land: every slot Lease is deleted.
    pub finish: bool,
    /// Grants this write makes.
    pub grants: Vec<Grant>,
    /// Revocations this write makes.
    pub revocations: Vec<Revoked>,
    /// Drains this write ends.
    pub drained: Vec<Drained>,
    /// Claims to drop: aged out, withdrawn, or their claimant may not be served.
    pub stale: Vec<Claim>,
    /// Clear the force-release annotation (carried out, or stale).
    pub clear_annotation: bool,
    /// A force release that revoked nothing, and why.
    pub skipped: Option<String>,
    /// Force-release requests whose status changes.
    pub requests: Vec<RequestUpdate>,
    /// The status to follow (none when the lock goes).
    pub status: Option<StatusPlan>,
    /// An Event to record because the lock has just become impossible to grant.
    pub announce: Option<(&'static str, String)>,
    /// When to look again (a deadline falling due), if nothing else wakes us.
    pub recheck: Option<Duration>,
    /// Record who holds the lock after the writes (for Pod events to find the lock).
    pub track_holder: bool,
    /// Tokens reserved for the grant of the waiter a slot Lease names as next (a release
    /// may hand the lock on with it), by slot: one above the highest known, so that status
    /// covers them within the margin it may trail by.
    pub reserved: Vec<(u32, i64)>,
}

impl Plan {
    fn empty() -> Self {
        Plan {
            first: None,
            leases: Vec::new(),
            finish: false,
            grants: Vec::new(),
            revocations: Vec::new(),
            drained: Vec::new(),
            stale: Vec::new(),
            clear_annotation: false,
            skipped: None,
            requests: Vec::new(),
            status: None,
            announce: None,
            recheck: None,
            track_holder: false,
            reserved: Vec::new(),
        }
    }

    /// The token this plan's write records, if it mints one (a grant's or a revocation's;
    /// not one reserved for the next waiter, which nobody holds yet).
    pub fn minted(&self) -> Option<i64> {
        self.grants.iter().map(|g| g.token).chain(self.revocations.iter().map(|r| r.raised_to)).max()
    }
}

/// The plan of a lock that cannot be granted: report why, grant nothing, look again later.
pub fn not_ready(lock: &DistributedLock, known: i64, approvals: u32, ready: Ready) -> Plan {
    let announce = announcement(lock.status.as_ref(), &ready);
    Plan {
        status: Some(StatusPlan {
            holds: Vec::new(),
            draining: Vec::new(),
            waiters: Vec::new(),
            ready,
            token: known,
            outcome: Outcome::default(),
            approvals,
            permits: permits(lock),
        }),
        announce,
        recheck: Some(NOT_READY_RECHECK),
        ..Plan::empty()
    }
}

/// The queue, split: live waiters in grant order, stale claims to drop, and when a claim
/// left to its claimant is next due to be dropped. The holders' own claims are none of
/// these; a claim that aged out, was already served, or whose claimant may not be served
/// is stale — except one given back less than [`GIVEN_BACK_GRACE`] ago, which is left to
/// the claimant deleting it (and never granted). A stale claim whose delete was refused
/// (it had changed) is not dropped again while our cache still shows it unchanged: with
/// thousands of claims our cache can lag their changes by seconds, and every reconcile of
/// the lock would send the same doomed delete.
fn queue<'a>(o: &'a Observation, holders: &[&Identity]) -> (Vec<&'a Waiting>, Vec<Claim>, Option<Duration>) {
    let mut live = Vec::new();
    let mut stale = Vec::new();
    let mut due: Option<Duration> = None;
    for w in o.claims.iter().filter(|w| !holders.contains(&&w.claim.identity)) {
        let spent = o.spent.contains(&w.claim.uid);
        let given_back_for = o.given_back.iter().find(|(uid, _)| *uid == w.claim.uid).map(|(_, d)| *d);
        if let (true, Some(given_back_for)) = (spent, given_back_for)
            && given_back_for < GIVEN_BACK_GRACE
        {
            let left = GIVEN_BACK_GRACE - given_back_for;
            due = Some(due.map_or(left, |d| d.min(left)));
        } else if spent || w.unchanged_for >= w.claim.ttl || w.serveable == Some(false) {
            if !o.refused.contains(&w.claim.uid) {
                stale.push(w.claim.clone());
            }
        } else {
            live.push(w);
        }
    }
    (live, stale, due)
}

/// The Ready condition of a lock that cannot be granted.
fn blocked_ready(blocked: &Blocked) -> Ready {
    match blocked {
        Blocked::TokenExhausted => {
            Ready::TokenExhausted("every fencing token has been issued: the lock can never be granted again".into())
        }
        Blocked::TokenTampered { found, ceiling } => Ready::TokenTampered(format!(
            "the lock Lease records fencing token {found}, above the highest a controller could have minted ({ceiling}): nothing is granted until the lock Lease is deleted"
        )),
    }
}

/// The Event to record when the lock starts being impossible to grant (for this reason).
fn announcement(previous: Option<&DistributedLockStatus>, ready: &Ready) -> Option<(&'static str, String)> {
    let (reason, message) = match ready {
        Ready::LeaseConflict(m) => ("LeaseConflict", m),
        Ready::TokenExhausted(m) => ("TokenExhausted", m),
        Ready::TokenTampered(m) => ("TokenTampered", m),
        Ready::Yes => return None,
    };
    let already = previous.is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == reason));
    (!already).then(|| (reason, message.clone()))
}

/// The hold as force-release requests are judged against it.
fn hold_view(state: &LeaseState) -> HoldView {
    match state {
        LeaseState::Held(h) => HoldView::Held { holder: h.identity.id.clone(), token: h.token },
        LeaseState::Draining(d) => HoldView::Draining(d.revoked),
        LeaseState::Free => HoldView::Free,
    }
}

/// The slot a force release targeting `target` is about: the one holding or draining
/// that token, else slot 0 (where a mutex's one hold is).
fn target_slot(states: &[LeaseState], target: Option<i64>) -> usize {
    let about = |state: &LeaseState, t: i64| match state {
        LeaseState::Held(h) => h.token == Some(t),
        LeaseState::Draining(d) => d.revoked == Some(t),
        LeaseState::Free => false,
    };
    target.and_then(|t| states.iter().position(|s| about(s, t))).unwrap_or(0)
}

/// The hold on a slot Lease as the decision sees it, with its clocks.
fn current(o: &Observation, slot: &SlotView, state: &LeaseState, force: Option<&force::Request>) -> Current {
    match (state, slot.hold, slot.drain_since_renewal) {
        (LeaseState::Held(h), Some(clock), _) => Current::Held(HolderState {
            token: h.token,
            confirmed: h.confirmed,
            unchanged_for: clock.unchanged_for,
            held_for: clock.held_for,
            pod_gone: clock.pod_gone,
            claim_present: o.claims.iter().any(|w| w.claim.identity == h.identity),
            // Its claim (or a later one in its name) was sent before we first saw it; with
            // none left, before the grant was.
            claim_seen_for: o
                .claims
                .iter()
                .filter(|w| w.claim.identity == h.identity)
                .map(|w| w.seen_for)
                .min()
                .unwrap_or(clock.unchanged_for),
            forced: force.is_some_and(|r| force::targets(r, h.token)),
        }),
        (LeaseState::Draining(d), _, Some(since_renewal)) => {
            Current::Draining(DrainState { acknowledged: d.holder.is_none(), since_renewal })
        }
        _ => Current::Free,
    }
}

/// A write the force-release annotation needs before anything else: refused where the
/// policy needs approvals, stamped with its target while it names none (the hold on the
/// lowest slot held).
fn first_write(o: &Observation, annotation: Option<&force::Request>, held: Option<&LeaseHold>) -> Option<First> {
    let request = annotation?;
    if o.required > 0 {
        return Some(settle::refusal(request, o.required, o.wall));
    }
    (request.target == Target::Unstamped).then(|| First::Stamp(force::target_of(held.and_then(|h| h.token))))
}

/// The status that follows the writes of `plan`, which leave the slot Leases as `after`.
fn status_after(
    o: &Observation,
    plan: &Plan,
    after: &[(u32, &Lease)],
    waiters: Vec<Claim>,
    forced: Option<ForceRelease>,
) -> StatusPlan {
    // With every token issued, what needs none goes on (holding, releasing, draining),
    // but the lock can never be granted again: say so.
    let ready = match o.tokens {
        Tokens::Known(previous) if token::mint(previous, o.wall.as_millisecond()).is_none() => {
            blocked_ready(&Blocked::TokenExhausted)
        }
        _ => Ready::Yes,
    };
    let trusted = match o.tokens {
        Tokens::Known(t) => t,
        Tokens::Tampered { .. } => 0,
    };
    let spec_terms = GrantedTiming::of_spec(&o.lock.spec);
    let mut holds = Vec::new();
    let mut draining = Vec::new();
    for (slot, lease) in after {
        match view::lease_state(lease) {
            LeaseState::Held(hold) => {
                holds.push(SlotHold { slot: *slot, hold, timing: granted::of_lease(lease, &spec_terms).timing })
            }
            LeaseState::Draining(d) => draining.push((*slot, d)),
            LeaseState::Free => {}
        }
    }
    StatusPlan {
        holds,
        draining,
        waiters,
        ready,
        token: trusted.max(o.known).max(plan.minted().unwrap_or(0)),
        outcome: Outcome {
            granted: plan
                .grants
                .iter()
                .map(|g| Granted {
                    slot: g.slot,
                    identity: g.claim.identity.id.clone(),
                    token: g.token,
                    acquired: o.wall,
                    waited_seconds: g.waited_seconds,
                    handoff_ms: g.handoff_ms,
                })
                .collect(),
            revoked: plan.revocations.iter().map(|r| (r.slot, r.reason)).collect(),
            forced,
            history: Vec::new(),
            unseen: 0,
            reserved: plan.reserved.iter().map(|(_, t)| *t).max(),
        },
        approvals: o.required,
        permits: permits(o.lock),
    }
}

/// What slot 0's `leasehold.dev/permits` annotation should say (none for one permit).
fn permits_annotation(lock: &DistributedLock) -> Option<String> {
    let permits = permits(lock);
    (permits > 1).then(|| permits.to_string())
}

/// The lock's permits, within the bounds the CRD enforces.
pub fn permits(lock: &DistributedLock) -> u32 {
    u32::try_from(lock.spec.permits).unwrap_or(1).clamp(1, crate::lease::slot::MAX_PERMITS)
}

/// What to write and record for one lock.
pub fn plan(o: &Observation) -> Plan {
    let deleting = o.lock.metadata.deletion_timestamp.is_some();
    let states: Vec<LeaseState> = o.slots.iter().map(|s| view::lease_state(s.lease)).collect();
    let holds: Vec<&LeaseHold> = states
        .iter()
        .filter_map(|s| match s {
            LeaseState::Held(h) => Some(h),
            _ => None,
        })
        .collect();
    let annotation = force::request(o.lock.annotations());
    if let Some(first) = first_write(o, annotation.as_ref(), holds.first().copied()) {
        return Plan { first: Some(first), ..Plan::empty() };
    }
    // ForceReleaseRequests: the oldest approved one is carried out like the annotation,
    // each judged against the hold it targets.
    let judgements =
        if deleting { Vec::new() } else { settle::judge(o, |target| hold_view(&states[target_slot(&states, target)])) };
    let force = annotation.or_else(|| settle::to_execute(&judgements));
    let force_target = match force.as_ref().map(|f| &f.target) {
        Some(Target::Token(t)) => Some(*t),
        _ => None,
    };
    let forced_slot = target_slot(&states, force_target);

    let holders: Vec<&Identity> = holds.iter().map(|h| &h.identity).collect();
    let (live, stale, given_back_due) = queue(o, &holders);
    // Only waiters looked at and found serveable are served.
    let serveable: Vec<&Waiting> = live.iter().copied().take_while(|w| w.serveable == Some(true)).collect();
    let cases: Vec<SlotCase> = o
        .slots
        .iter()
        .zip(&states)
        .map(|(view, state)| SlotCase {
            view,
            state: state.clone(),
            current: current(o, view, state, force.as_ref()),
            terms: granted::of_lease(view.lease, &GrantedTiming::of_spec(&o.lock.spec)),
        })
        .collect();
    let mut plan = Plan { stale, track_holder: true, ..Plan::empty() };
    let Ok((after, deleted)) = decide_slots(o, &cases, &serveable, (force.as_ref(), forced_slot), &mut plan) else {
        return plan;
    };
    if deleting && deleted == cases.len() {
        // The lock goes once every slot Lease is deleted: nothing left to report.
        plan.finish = true;
        plan.track_holder = false;
        plan.recheck = None;
        return plan;
    }

    // What the force release and the requests become, given this write.
    let revoked_now = plan.revocations.iter().any(|r| r.reason == RevokeReason::Forced);
    let target_state = states.get(forced_slot).cloned().unwrap_or(LeaseState::Free);
    let target_held = match &target_state {
        LeaseState::Held(h) => h.token,
        _ => None,
    };
    let settled = settle::settle(o.lock, force, target_held, &target_state, revoked_now, o.wall);
    plan.clear_annotation = settled.clear;
    plan.skipped = settled.skipped;
    let executed_now = settled.forced.as_ref().and_then(|f| f.request.clone());
    plan.requests = settle::updates(&judgements, o.required, executed_now.as_deref(), o.wall);

    let granted_claims: Vec<&str> = plan.grants.iter().map(|g| g.claim.uid.as_str()).collect();
    let waiting: Vec<&Waiting> =
        live.iter().copied().filter(|w| !granted_claims.contains(&w.claim.uid.as_str())).collect();
    let after: Vec<(u32, &Lease)> = after.iter().map(|(slot, lease)| (*slot, lease)).collect();
    let status = status_after(o, &plan, &after, waiting.iter().map(|w| w.claim.clone()).collect(), settled.forced);
    plan.announce = announcement(o.lock.status.as_ref(), &status.ready);
    plan.status = Some(status);

    // Wake up for the next deadline: expiry, confirmation, max hold, drain, a claim going
    // stale or left to its claimant no longer, a request expiring.
    let claim_deadline = waiting.iter().map(|w| w.claim.ttl.saturating_sub(w.unchanged_for)).min();
    let request_deadline = settle::next_expiry(&judgements, o.wall);
    plan.recheck = [plan.recheck, claim_deadline, request_deadline, given_back_due].into_iter().flatten().min();
    plan
}

#[cfg(test)]
mod tests;
