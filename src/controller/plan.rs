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
//! The lock is one permit today: at most one holder. The queue, the grant and the facts
//! are written for holders in the plural so that a lock with more permits is more rows of
//! the same table, not another function.

mod settle;
mod setup;

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use super::build;
use super::decide::{self, Blocked, Current, Decision, DrainState, HolderState, Tokens};
use super::force::{self, Target};
use super::requests::HoldView;
use super::status::{Granted, Outcome, Ready};
use super::view::{self, Claim, LeaseDrain, LeaseHold, LeaseState};
use crate::crd::{DistributedLock, DistributedLockStatus, ForceRelease, ForceReleaseEntry, ForceReleaseRequest};
use crate::lease::{GrantedTiming, Identity, RevokeReason, Timing, granted, token};

pub use settle::{Judgement, RequestUpdate};
pub use setup::{Setup, setup};

/// How often a lock that cannot be granted (a foreign Lease with its name, a tampered or
/// exhausted token) is looked at again: a foreign Lease carries no labels of ours, so its
/// deletion reaches us through no watch.
pub const NOT_READY_RECHECK: Duration = Duration::from_secs(10);

/// A claim as observed: its age on our clock and whether its claimant may be served.
#[derive(Clone, Debug, PartialEq)]
pub struct Waiting {
    /// The claim.
    pub claim: Claim,
    /// How long its refresh has been unchanged on our clock.
    pub unchanged_for: Duration,
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

/// Everything one reconcile decides from.
#[derive(Clone, Debug)]
pub struct Observation<'a> {
    /// The lock.
    pub lock: &'a DistributedLock,
    /// Its Lease (ours).
    pub lease: &'a Lease,
    /// The well-formed claims on it, in grant order.
    pub claims: Vec<Waiting>,
    /// The UID of the claim the latest hold was granted on: a claim is served once, so
    /// this one is never granted again (its claimant withdraws it before it releases; our
    /// cache may still show it after the release).
    pub spent: Option<String>,
    /// The granted hold's clocks (when the Lease is held).
    pub hold: Option<HoldClock>,
    /// Since the drained hold's last renewal before its revocation (when draining).
    pub drain_since_renewal: Option<Duration>,
    /// The lock's ForceReleaseRequests, oldest first.
    pub requests: Vec<Arc<ForceReleaseRequest>>,
    /// The request the lock records as carried out, with the token it revoked.
    pub executed: Option<(String, Option<i64>)>,
    /// Approvals a force release needs.
    pub required: u32,
    /// The highest token recorded in status or issued by this process.
    pub known: i64,
    /// The tokens known, the Lease's included, judged against the mintable ceiling.
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
    /// Delete it (the lock is going and nobody can believe they hold it), then let the
    /// lock go.
    Delete,
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
    /// The claim served.
    pub claim: Claim,
    /// Its token.
    pub token: i64,
    /// How long its claimant waited, seconds.
    pub waited_seconds: f64,
    /// From the previous holder's release to this grant, ms (none after a drain).
    pub handoff_ms: Option<i64>,
}

/// A revocation.
#[derive(Clone, Debug, PartialEq)]
pub struct Revoked {
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
    /// The drained token.
    pub token: Option<i64>,
    /// Its holder let go (else the drain timed out).
    pub acknowledged: bool,
}

/// What status is computed from once the writes are made.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusPlan {
    /// The hold after the writes.
    pub hold: Option<LeaseHold>,
    /// The drain after the writes.
    pub draining: Option<LeaseDrain>,
    /// Live waiters, in grant order.
    pub waiters: Vec<Claim>,
    /// Whether the lock can be granted.
    pub ready: Ready,
    /// The timing the hold was granted under.
    pub timing: Timing,
    /// The highest token issued.
    pub token: i64,
    /// What the writes do, for status (request history is added as those writes land).
    pub outcome: Outcome,
    /// How many approvals a force release needs.
    pub approvals: u32,
}

/// Everything one reconcile writes and records.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// A write before anything else; the rest of the plan is then empty.
    pub first: Option<First>,
    /// The Lease write.
    pub lease: LeaseWrite,
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
}

impl Plan {
    fn empty() -> Self {
        Plan {
            first: None,
            lease: LeaseWrite::Keep,
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
        }
    }

    /// The token this plan's write records, if it mints one.
    pub fn minted(&self) -> Option<i64> {
        self.grants.iter().map(|g| g.token).chain(self.revocations.iter().map(|r| r.raised_to)).max()
    }
}

/// The plan of a lock that cannot be granted: report why, grant nothing, look again later.
pub fn not_ready(lock: &DistributedLock, known: i64, approvals: u32, ready: Ready) -> Plan {
    let announce = announcement(lock.status.as_ref(), &ready);
    Plan {
        status: Some(StatusPlan {
            hold: None,
            draining: None,
            waiters: Vec::new(),
            ready,
            timing: Timing::of(&lock.spec),
            token: known,
            outcome: Outcome::default(),
            approvals,
        }),
        announce,
        recheck: Some(NOT_READY_RECHECK),
        ..Plan::empty()
    }
}

/// The queue, split: live waiters in grant order, and stale claims to drop. The holder's
/// own claim is neither; a claim that aged out, was already served, or whose claimant may
/// not be served is stale.
fn queue<'a>(o: &'a Observation, holder: Option<&Identity>) -> (Vec<&'a Waiting>, Vec<Claim>) {
    let mut live = Vec::new();
    let mut stale = Vec::new();
    for w in o.claims.iter().filter(|w| Some(&w.claim.identity) != holder) {
        let spent = o.spent.as_deref() == Some(w.claim.uid.as_str());
        if spent || w.unchanged_for >= w.claim.ttl || w.serveable == Some(false) {
            stale.push(w.claim.clone());
        } else {
            live.push(w);
        }
    }
    (live, stale)
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

/// The hold on the Lease as the decision sees it, with its clocks.
fn current(o: &Observation, state: &LeaseState, force: Option<&force::Request>) -> Current {
    match (state, o.hold, o.drain_since_renewal) {
        (LeaseState::Held(h), Some(clock), _) => Current::Held(HolderState {
            token: h.token,
            confirmed: h.confirmed,
            unchanged_for: clock.unchanged_for,
            held_for: clock.held_for,
            pod_gone: clock.pod_gone,
            claim_present: o.claims.iter().any(|w| w.claim.identity == h.identity),
            forced: force.is_some_and(|r| force::targets(r, h.token)),
        }),
        (LeaseState::Draining(d), _, Some(since_renewal)) => {
            Current::Draining(DrainState { acknowledged: d.holder.is_none(), since_renewal })
        }
        _ => Current::Free,
    }
}

/// A write the force-release annotation needs before anything else: refused where the
/// policy needs approvals, stamped with its target while it names none.
fn first_write(o: &Observation, annotation: Option<&force::Request>, held: Option<&LeaseHold>) -> Option<First> {
    let request = annotation?;
    if o.required > 0 {
        return Some(settle::refusal(request, o.required, o.wall));
    }
    (request.target == Target::Unstamped).then(|| First::Stamp(force::target_of(held.and_then(|h| h.token))))
}

/// What is left to plan after a decision is carried out.
enum Next {
    /// Settle force releases and status around this Lease write (`None`: no write).
    Settle(Option<Box<Lease>>),
    /// Nothing: the plan is complete.
    Done,
}

/// Carries out `decision` into `plan`: the grants, revocations and drains it makes, and
/// what is left to plan.
fn carry_out(
    o: &Observation,
    decision: &Decision,
    current: &Current,
    head: Option<&Claim>,
    force: Option<&force::Request>,
    plan: &mut Plan,
) -> Next {
    let spec_terms = GrantedTiming::of_spec(&o.lock.spec);
    let state = view::lease_state(o.lease);
    let drained = match &state {
        LeaseState::Draining(d) => Some(Drained { token: d.revoked, acknowledged: d.holder.is_none() }),
        _ => None,
    };
    let revoked = |revocation: &decide::Revocation, raised_to: i64, drain_from: Option<Duration>| {
        let LeaseState::Held(h) = &state else { unreachable!("only a granted hold is revoked") };
        Revoked {
            reason: revocation.reason,
            token: revocation.token,
            raised_to,
            holder: h.identity.clone(),
            claim: o.claims.iter().find(|w| w.claim.identity == h.identity).map(|w| w.claim.clone()),
            drain_from,
            force: force.cloned().filter(|_| revocation.reason == RevokeReason::Forced),
        }
    };
    let lease = match decision {
        Decision::Blocked(blocked) => {
            *plan = not_ready(o.lock, o.known, o.required, blocked_ready(blocked));
            return Next::Done;
        }
        Decision::DeleteLease => {
            plan.drained.extend(drained);
            plan.lease = LeaseWrite::Delete;
            plan.track_holder = false;
            return Next::Done;
        }
        Decision::Keep { recheck } => {
            plan.recheck = *recheck;
            None
        }
        Decision::Grant { token, revoked: revocation } => {
            let head = head.expect("a grant serves the head of the queue");
            let reason = revocation.as_ref().map(|r| r.reason.as_str());
            let lease = build::granted(o.lease, head, *token, &spec_terms, o.wall, reason);
            // From the holder's release (the Lease's last renewal) to this grant; none
            // after a drain.
            let handoff_ms = match (current, revocation) {
                (Current::Free, None) => o
                    .lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.renew_time.as_ref())
                    .map(|t| o.wall.duration_since(t.0).as_millis().max(0) as i64),
                (Current::Draining(_), _) => None,
                _ => Some(0),
            };
            let waited_seconds = o.wall.duration_since(head.requested).as_secs_f64().max(0.0);
            plan.grants.push(Grant { claim: head.clone(), token: *token, waited_seconds, handoff_ms });
            plan.revocations.extend(revocation.as_ref().map(|r| revoked(r, *token, None)));
            plan.drained.extend(drained);
            plan.recheck = Some(o.confirm_timeout);
            Some(lease)
        }
        Decision::Revoke { revocation, raise_to } => {
            plan.revocations.push(revoked(revocation, *raise_to, None));
            Some(build::revoked(o.lease, *raise_to, revocation.reason.as_str()))
        }
        Decision::Drain { revocation, raise_to, recheck } => {
            let unchanged = o.hold.map_or(Duration::ZERO, |c| c.unchanged_for);
            plan.revocations.push(revoked(revocation, *raise_to, Some(unchanged)));
            plan.recheck = Some(*recheck);
            Some(build::draining(o.lease, *raise_to, revocation.reason.as_str(), revocation.token))
        }
        Decision::Free => {
            plan.drained.extend(drained);
            Some(build::freed(o.lease))
        }
    };
    Next::Settle(lease.map(Box::new))
}

/// The status that follows the writes of `plan`, which leave the Lease as `after`.
fn status_after(
    o: &Observation,
    plan: &Plan,
    after: &Lease,
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
    let (hold, draining) = match view::lease_state(after) {
        LeaseState::Held(h) => (Some(h), None),
        LeaseState::Draining(d) => (None, Some(d)),
        LeaseState::Free => (None, None),
    };
    StatusPlan {
        hold,
        draining,
        waiters,
        ready,
        timing: granted::of_lease(after, &GrantedTiming::of_spec(&o.lock.spec)).timing,
        token: trusted.max(o.known).max(plan.minted().unwrap_or(0)),
        outcome: Outcome {
            granted: plan
                .grants
                .first()
                .map(|g| Granted { waited_seconds: g.waited_seconds, handoff_ms: g.handoff_ms }),
            revoked: plan.revocations.first().map(|r| r.reason),
            forced,
            history: Vec::new(),
        },
        approvals: o.required,
    }
}

/// What to write and record for one lock.
pub fn plan(o: &Observation) -> Plan {
    let deleting = o.lock.metadata.deletion_timestamp.is_some();
    let state = view::lease_state(o.lease);
    let held = match &state {
        LeaseState::Held(h) => Some(h),
        _ => None,
    };
    let annotation = force::request(o.lock.annotations());
    if let Some(first) = first_write(o, annotation.as_ref(), held) {
        return Plan { first: Some(first), ..Plan::empty() };
    }
    // ForceReleaseRequests: the oldest approved one is carried out like the annotation.
    let judgements = if deleting { Vec::new() } else { settle::judge(o, &hold_view(&state)) };
    let force = annotation.or_else(|| settle::to_execute(&judgements));

    let (live, stale) = queue(o, held.map(|h| &h.identity));
    let current = current(o, &state, force.as_ref());
    let inputs = decide::Inputs {
        terms: granted::of_lease(o.lease, &GrantedTiming::of_spec(&o.lock.spec)),
        confirm_timeout: o.confirm_timeout,
        current: current.clone(),
        // Only a waiter looked at and found serveable is granted.
        waiting: live.iter().take_while(|w| w.serveable == Some(true)).count(),
        deleting,
        tokens: o.tokens,
        wall_clock_ms: o.wall.as_millisecond(),
    };
    let decision = decide::decide(&inputs);
    let mut plan = Plan { stale, track_holder: true, ..Plan::empty() };
    let head = live.first().map(|w| &w.claim);
    let desired = match carry_out(o, &decision, &current, head, force.as_ref(), &mut plan) {
        Next::Settle(desired) => desired,
        Next::Done => return plan,
    };
    plan.lease = desired.clone().map_or(LeaseWrite::Keep, LeaseWrite::Replace);

    // What the force release and the requests become, given this write.
    let revoked_now = plan.revocations.iter().any(|r| r.reason == RevokeReason::Forced);
    let settled = settle::settle(o.lock, force, held.and_then(|h| h.token), &state, revoked_now, o.wall);
    plan.clear_annotation = settled.clear;
    plan.skipped = settled.skipped;
    let executed_now = settled.forced.as_ref().and_then(|f| f.request.clone());
    plan.requests = settle::updates(&judgements, o.required, executed_now.as_deref(), o.wall);

    let granted_live = plan.grants.len();
    let waiters = live.iter().skip(granted_live).map(|w| w.claim.clone()).collect();
    let status = status_after(o, &plan, desired.as_deref().unwrap_or(o.lease), waiters, settled.forced);
    plan.announce = announcement(o.lock.status.as_ref(), &status.ready);
    plan.status = Some(status);

    // Wake up for the next deadline: expiry, confirmation, max hold, drain, a claim going
    // stale, a request expiring.
    let claim_deadline = live.iter().skip(granted_live).map(|w| w.claim.ttl.saturating_sub(w.unchanged_for)).min();
    let request_deadline = settle::next_expiry(&judgements, o.wall);
    plan.recheck = [plan.recheck, claim_deadline, request_deadline].into_iter().flatten().min();
    plan
}

#[cfg(test)]
mod tests;
