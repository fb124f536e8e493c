//! What the controller records once a plan's writes have landed, and only then: metrics,
//! Events, logs and its memory (the tokens it issued, the clocks of a new hold or a
//! drain). A write that failed records nothing, so a retried reconcile counts nothing
//! twice.

use std::time::Instant;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::context::{Context, LockKey};
use super::events::{self, publish};
use super::plan::{Drained, First, Grant, Plan, RequestUpdate, Revoked};
use super::recreate::{self, Orphan};
use super::status::{self, Outcome};
use crate::crd::{DistributedLock, DistributedLockStatus};
use crate::lease::{self, RevokeReason};
use crate::metrics::{OutcomeLabel, ReasonLabel};

/// A lock Lease created, draining the hold its deleted predecessor carried (if any).
pub fn created(ctx: &Context, lock: &DistributedLock, key: &LockKey, orphan: Option<&(Orphan, i64)>, token: i64) {
    let Some((orphan, raise_to)) = orphan else {
        info!(namespace = %key.namespace, lock = %key.name, token, "created lock lease");
        return;
    };
    warn!(namespace = %key.namespace, lock = %key.name, holder = %orphan.identity, token = orphan.token, raise_to,
        "the lock lease was deleted under a hold: re-created it draining that hold");
    let note = format!(
        "the lock Lease was deleted while {} held token {}: re-created draining that hold (token raised to {raise_to})",
        orphan.identity, orphan.token
    );
    publish(ctx, lock, EventType::Warning, recreate::REASON, note, None);
}

/// A plan's write of slot `slot`'s Lease landed: tokens issued, clocks started, each of
/// that slot's grants, revocations and drains counted and announced. `observed` is when
/// the plan's observation was made.
pub fn lease_written(ctx: &Context, lock: &DistributedLock, key: &LockKey, plan: &Plan, slot: u32, observed: Instant) {
    let uid = lock.uid().unwrap_or_default();
    let minted = plan.grants.iter().filter(|g| g.slot == slot).map(|g| g.token);
    let raised = plan.revocations.iter().filter(|r| r.slot == slot).map(|r| r.raised_to);
    if let Some(token) = minted.chain(raised).max() {
        ctx.record_issued(key, token);
    }
    for drained in plan.drained.iter().filter(|d| d.slot == slot) {
        self::drained(ctx, lock, key, drained);
    }
    for grant in plan.grants.iter().filter(|g| g.slot == slot) {
        granted(ctx, lock, key, &uid, grant);
    }
    for revoked in plan.revocations.iter().filter(|r| r.slot == slot) {
        if let (RevokeReason::Unconfirmed, Some(token), Some(_)) = (revoked.reason, revoked.token, &revoked.claim) {
            missed_confirmation(ctx, lock, key, token);
        }
        if let Some(unchanged) = revoked.drain_from {
            // The drain counts from the last renewal seen before this revocation.
            ctx.with_memory(key, &uid, |m| {
                super::clocks::drain_started(m.slot(slot), revoked.token, observed - unchanged)
            });
        }
        self::revoked(ctx, lock, key, revoked);
    }
}

/// A drain ended: say so.
pub fn drained(ctx: &Context, lock: &DistributedLock, key: &LockKey, drained: &Drained) {
    let token = drained.token.map_or_else(|| "unknown".to_owned(), |t| t.to_string());
    let how = if drained.acknowledged { "acknowledged by its holder" } else { "timed out" };
    info!(namespace = %key.namespace, lock = %key.name, token, how, "drain over");
    publish(ctx, lock, EventType::Normal, "Drained", format!("drain of token {token} {how}"), None);
}

fn granted(ctx: &Context, lock: &DistributedLock, key: &LockKey, uid: &str, grant: &Grant) {
    let holder = &grant.claim.identity;
    ctx.with_memory(key, uid, |m| {
        let slot = m.slot(grant.slot);
        let now = Instant::now();
        super::clocks::granted(slot, &holder.id, grant.token, now);
        slot.served = Some(grant.claim.uid.clone());
        slot.awaiting = grant.confirm_first.then_some((grant.token, now));
    });
    ctx.metrics.grants.inc();
    ctx.metrics.wait_seconds.observe(grant.waited_seconds);
    if let Some(ms) = grant.handoff_ms {
        ctx.metrics.handoff_seconds.observe(ms as f64 / 1000.0);
    }
    let (token, waited) = (grant.token, grant.waited_seconds);
    info!(namespace = %key.namespace, lock = %key.name, token, holder = %holder, waited, "granted");
    let note = format!("granted to {holder} with token {token}");
    publish(ctx, lock, EventType::Normal, "Granted", note, holder.pod.as_ref());
}

/// A grant was revoked unconfirmed while its claim stood: the lock's next grant waits
/// longer for its confirmation.
fn missed_confirmation(ctx: &Context, lock: &DistributedLock, key: &LockKey, token: i64) {
    let uid = lock.uid().unwrap_or_default();
    let missed = ctx.with_memory(key, &uid, |m| {
        m.misses.missed(token);
        m.misses
    });
    let timing = crate::lease::GrantedTiming::of_spec(&lock.spec).timing;
    let floor = ctx.confirmations.lock().expect("confirmation times are never poisoned").floor(Instant::now());
    let next = super::confirm::window(&missed, floor, ctx.settings.confirm_timeout, timing.lease_duration);
    info!(namespace = %key.namespace, lock = %key.name, in_a_row = missed.count(), next = ?next,
        "a grant went unconfirmed: waiting longer for the next confirmation");
}

fn revoked(ctx: &Context, lock: &DistributedLock, key: &LockKey, revoked: &Revoked) {
    ctx.metrics.revocations.get_or_create(&ReasonLabel { reason: revoked.reason.as_str().into() }).inc();
    let token = revoked.token.map_or_else(|| "none".to_owned(), |t| t.to_string());
    let holder = &revoked.holder;
    warn!(namespace = %key.namespace, lock = %key.name, token, raised_to = revoked.raised_to, holder = %holder,
        reason = %revoked.reason, "revoked");
    let (event, why) = events::revocation(&revoked.reason);
    let note = match (&revoked.reason, &revoked.force) {
        (RevokeReason::Forced, force) => {
            let (by, reason) =
                force.as_ref().map_or_else(|| ("unknown".into(), String::new()), |r| (r.by.clone(), r.reason.clone()));
            let approved = match force {
                Some(r) if !r.approved_by.is_empty() => format!(", approved by {}", r.approved_by.join(", ")),
                _ => String::new(),
            };
            let request = force
                .as_ref()
                .and_then(|r| r.request.as_deref())
                .map(|r| format!(" [forcereleaserequest {r}]"))
                .unwrap_or_default();
            format!("force-released by {by} ({reason}{approved}){request}: revoked {holder} with token {token}")
        }
        _ => format!("revoked {holder} with token {token}: {why}"),
    };
    publish(ctx, lock, EventType::Warning, event, note, holder.pod.as_ref());
}

/// A write made first landed.
pub fn first(ctx: &Context, lock: &DistributedLock, key: &LockKey, first: &First) {
    let First::Refuse(refusal) = first else { return };
    let (request, message, entry) = (&refusal.request, &refusal.message, &refusal.entry);
    warn!(namespace = %key.namespace, lock = %key.name, by = %request.by, "force-release annotation refused: approvals needed");
    let note = format!("{} ({}): {message}", request.by, request.reason);
    publish(ctx, lock, EventType::Warning, "ForceReleaseRefused", note, None);
    ctx.metrics.force_release_requests.get_or_create(&OutcomeLabel { outcome: "refused".into() }).inc();
    // Kept until the next status write records it in the lock's history.
    let outcome = Outcome { history: vec![entry.clone()], ..Outcome::default() };
    ctx.with_memory(key, &lock.uid().unwrap_or_default(), |m| {
        m.pending = Some(status::merge(m.pending.take(), outcome))
    });
}

/// A force release that revoked nothing.
pub fn skipped(ctx: &Context, lock: &DistributedLock, key: &LockKey, note: &str) {
    info!(namespace = %key.namespace, lock = %key.name, note, "force release cleared without revoking");
    publish(ctx, lock, EventType::Normal, "ForceReleaseSkipped", note.to_owned(), None);
}

/// A request's status write landed: its history entries announced, its end counted.
pub fn request_written(ctx: &Context, lock: &DistributedLock, key: &LockKey, update: &RequestUpdate) {
    for entry in &update.entries {
        let (reason, type_) = match entry.event.as_str() {
            "Requested" => ("ForceReleaseRequested", EventType::Normal),
            "Approved" => ("ForceReleaseApproved", EventType::Normal),
            "Denied" => ("ForceReleaseDenied", EventType::Normal),
            "Expired" => ("ForceReleaseExpired", EventType::Normal),
            "Superseded" => ("ForceReleaseSuperseded", EventType::Normal),
            // An execution already has its ForceReleased Event.
            _ => continue,
        };
        let request = entry.request.as_deref().unwrap_or("");
        let by = entry.by.as_deref().map(|b| format!(" by {b}")).unwrap_or_default();
        let details = entry.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default();
        let note = format!("forcereleaserequest {request} {}{by}{details}", entry.event.to_ascii_lowercase());
        info!(namespace = %key.namespace, lock = %key.name, %request, event = %entry.event, "force-release request");
        publish(ctx, lock, type_, reason, note, None);
    }
    if let Some(phase) = update.ended {
        let label = OutcomeLabel { outcome: phase.as_str().to_ascii_lowercase() };
        ctx.metrics.force_release_requests.get_or_create(&label).inc();
    }
}

/// The lock has just become impossible to grant (for this reason).
pub fn announce(ctx: &Context, lock: &DistributedLock, key: &LockKey, reason: &'static str, message: &str) {
    warn!(namespace = %key.namespace, lock = %key.name, %message, reason, "lock cannot be granted");
    publish(ctx, lock, EventType::Warning, reason, message.to_owned(), None);
}

/// A status write landed: what the change says happened (releases, how long a hold
/// lasted, the queue's length) counted, a release announced.
pub fn status_written(
    ctx: &Context,
    lock: &DistributedLock,
    previous: &DistributedLockStatus,
    desired: &DistributedLockStatus,
    outcome: &Outcome,
) {
    let released = desired.stats.releases - previous.stats.releases;
    if released > 0 {
        ctx.metrics.releases.inc_by(u64::try_from(released).unwrap_or(0));
    }
    let queued = i64::from(desired.queue_length) - i64::from(previous.queue_length);
    ctx.metrics.queue_depth.inc_by(queued);
    // Every hold that ended, including one granted and ended while an earlier status
    // write failed.
    for old in super::ended::ended(&status::listed(previous), &status::listed(desired), outcome) {
        let held = Timestamp::now().duration_since(old.acquired).as_secs_f64().max(0.0);
        ctx.metrics.hold_seconds.observe(held);
        if old.revoked.is_none() {
            let pod = lease::Identity::parse(&old.identity).pod;
            let note = format!("released by {} (token {})", old.identity, old.token);
            publish(ctx, lock, EventType::Normal, "Released", note, pod.as_ref());
        }
    }
}
