//! A plan's writes, in order, each recorded once it lands: the lock Lease (compare-and-
//! swap), the revoked holders' claims, the force release's annotation and the requests'
//! statuses, the stale claims, and the lock's status (server-side apply, only when it
//! changed). A failed status write loses nothing: what the plan did waits in memory for
//! the next one.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::warn;

use super::coalesce::{self, StatusWrite};
use super::context::{AppliedStatus, Context, LockKey};
use super::dispatch::Recheck;
use super::error::Error;
use super::plan::{First, LeaseWrite, Plan, RequestUpdate, StatusPlan};
use super::{claims, finalize, force, lock_lease, record, status};
use crate::crd::{DistributedLock, ForceReleaseEntry, ForceReleaseRequest, LockClaim, MANAGER_CONTROLLER};
use crate::lease::{CasStore, GrantedTiming, LeaseStore};

/// Where a plan is written.
pub struct Target<'a> {
    /// Shared controller state.
    pub ctx: &'a Context,
    /// The lock.
    pub lock: &'a DistributedLock,
    /// Its key.
    pub key: &'a LockKey,
    /// Lock Leases of its namespace.
    pub store: &'a LeaseStore,
    /// The slot Leases the plan was made from (none: the lock has none of its own).
    pub leases: &'a [(u32, Lease)],
    /// When the plan's observation was made.
    pub observed: Instant,
}

/// Makes the writes of `plan` and records each as it lands; says when to look again.
pub async fn apply(t: &Target<'_>, plan: Plan) -> Result<Recheck, Error> {
    let (ctx, lock, key) = (t.ctx, t.lock, t.key);
    // Leadership lost while observing and planning: a replica that no longer leads
    // writes nothing.
    if !ctx.leadership.is_leading() {
        return Ok(None);
    }
    if let Some(first) = &plan.first {
        match first {
            First::Stamp(target) => force::stamp(ctx, lock, key, target).await?,
            First::Refuse(_) => force::clear(ctx, lock, key).await?,
        }
        record::first(ctx, lock, key, first);
        return Ok(None);
    }
    let uid = lock.uid().unwrap_or_default();
    for write in &plan.leases {
        let current = t.leases.iter().find(|(slot, _)| *slot == write.slot).map(|(_, l)| l);
        let current = current.expect("a plan writes only the slot Leases it was made from");
        match &write.write {
            LeaseWrite::Keep => continue,
            LeaseWrite::Replace(desired) => {
                lock_lease::write(ctx, key, &uid, write.slot, t.store, Some(current), desired).await?;
            }
            LeaseWrite::Delete => {
                t.store.delete(&current.name_any(), current.resource_version().as_deref()).await?;
                ctx.with_memory(key, &uid, |m| m.slots.remove(&write.slot));
            }
        }
        record::lease_written(ctx, lock, key, &plan, write.slot, t.observed);
    }
    if plan.finish {
        finalize::finish(ctx, lock, key).await?;
        return Ok(None);
    }
    let claim_store = CasStore::<LockClaim>::new(ctx.client.clone(), &key.namespace, MANAGER_CONTROLLER);
    for revoked in &plan.revocations {
        claims::delete_revoked(&claim_store, key, revoked.claim.as_ref()).await;
    }
    // Status is applied even if clearing the annotation or a request's status write
    // fails: what was done is recorded; the first error is returned after.
    if let Some(note) = &plan.skipped {
        record::skipped(ctx, lock, key, note);
    }
    let cleared = if plan.clear_annotation { force::clear(ctx, lock, key).await } else { Ok(()) };
    let (history, requests) = write_requests(t, &plan.requests).await;
    let refused = claims::delete_stale(&claim_store, key, &plan.stale).await;
    if !refused.is_empty() {
        ctx.with_memory(key, &uid, |m| {
            for claim in refused {
                if let Some(seen) = m.claims.get_mut(&claim.uid) {
                    seen.refused_at = Some(claim.resource_version.clone());
                }
            }
        });
    }
    if plan.track_holder {
        let holds = plan.status.as_ref().map(|s| s.holds.as_slice()).unwrap_or_default();
        let pods: Vec<&str> =
            holds.iter().filter_map(|h| h.hold.identity.pod.as_ref()).map(|p| p.name.as_str()).collect();
        ctx.record_holder(key, &pods);
    }
    if let Some((reason, message)) = &plan.announce {
        record::announce(ctx, lock, key, reason, message);
    }
    let held_back = match plan.status {
        Some(status) => apply_status(t, status, history).await?,
        None => None,
    };
    cleared?;
    requests?;
    let recheck = plan.recheck.into_iter().chain(held_back).min();
    Ok(recheck.map(|d| d.max(Duration::from_millis(10))))
}

/// Writes each request's new status; returns the history entries of those that landed,
/// and the first error (every other write is still tried).
async fn write_requests(t: &Target<'_>, updates: &[RequestUpdate]) -> (Vec<ForceReleaseEntry>, Result<(), Error>) {
    let (ctx, key) = (t.ctx, t.key);
    let api: Api<ForceReleaseRequest> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let mut history = Vec::new();
    let mut first_error = None;
    for update in updates {
        let patch = json!({
            "apiVersion": ForceReleaseRequest::api_version(&()),
            "kind": ForceReleaseRequest::kind(&()),
            "status": update.status,
        });
        let params = PatchParams::apply(MANAGER_CONTROLLER).force();
        let stored = match api.patch_status(&update.name, &params, &Patch::Apply(patch)).await {
            Ok(stored) => stored,
            Err(source) => {
                warn!(namespace = %key.namespace, request = %update.name, error = %source, "failed to write a force-release request's status");
                first_error.get_or_insert(Error::Request {
                    namespace: key.namespace.clone(),
                    name: update.name.clone(),
                    source,
                });
                continue;
            }
        };
        // Until the cache shows it, later reconciles judge the request from this.
        let status = stored.status.unwrap_or_else(|| update.status.clone());
        ctx.with_memory(key, &t.lock.uid().unwrap_or_default(), |m| m.requests.insert(update.uid.clone(), status));
        record::request_written(ctx, t.lock, key, update);
        history.extend(update.entries.iter().cloned());
    }
    (history, first_error.map_or(Ok(()), Err))
}

/// Applies the status that follows, if it differs from the last one written. What this
/// reconcile did is kept in memory until a status write succeeds, so a failed status
/// write loses nothing and counts nothing twice. A routine change of a contended lock
/// (grants, releases, the queue) may be held back a moment, and a status just written is
/// not applied again before the cache has had a moment to show it ([`coalesce`]): then
/// returns when to look again.
async fn apply_status(
    t: &Target<'_>,
    plan: StatusPlan,
    history: Vec<ForceReleaseEntry>,
) -> Result<Option<Duration>, Error> {
    let (ctx, lock, key) = (t.ctx, t.lock, t.key);
    let uid = lock.uid().unwrap_or_default();
    let mut outcome = plan.outcome;
    outcome.history.extend(history);
    let cached = ctx.locks.get(&ObjectRef::from_obj(lock));
    let (remembered, outcome, since_written) = ctx.with_memory(key, &uid, |m| {
        let merged = status::merge(m.pending.take(), outcome);
        m.pending = Some(merged.clone());
        if let (Some(applied), Some(cached)) = (m.status.as_mut(), &cached) {
            applied.share(cached);
        }
        let since_written = m.status_written.map(|at| at.elapsed());
        (m.status.as_ref().and_then(AppliedStatus::status).cloned(), merged, since_written)
    });
    let previous = remembered.or_else(|| lock.status.clone()).unwrap_or_default();
    let waiters: Vec<_> = plan.waiters.iter().collect();
    let desired = status::desired(&status::Inputs {
        previous: &previous,
        generation: lock.metadata.generation,
        now: Timestamp::now(),
        holds: &plan.holds,
        permits: plan.permits,
        token: plan.token,
        waiters: &waiters,
        outcome: &outcome,
        draining: &plan.draining,
        ready: &plan.ready,
        approvals: i32::try_from(plan.approvals).unwrap_or(i32::MAX),
    });
    // A reconcile that starts right after a write (an event of its own writes) may not see
    // it yet, in its copy of the lock or in the cache: it waits for the write's own event
    // rather than applying the same status again.
    let shown = lock.status.is_some() || cached.as_ref().is_some_and(|c| c.status.is_some());
    let lease_duration = GrantedTiming::of_spec(&lock.spec).timing.lease_duration;
    match coalesce::status_write(&previous, &desired, since_written, shown, &outcome, lease_duration) {
        StatusWrite::Apply => {}
        StatusWrite::Skip => {
            ctx.with_memory(key, &uid, |m| m.pending = None);
            return Ok(None);
        }
        // What was done stays pending: the write that lands counts it.
        StatusWrite::Wait(wait) => return Ok(Some(wait)),
        // Over the budget, it waits a settle at a time, until it may wait no longer.
        StatusWrite::Budgeted(up_to) => {
            if ctx.status_budget.check().is_err() {
                return Ok(Some(up_to.min(coalesce::STATUS_SETTLE)));
            }
        }
    }
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let patch = json!({
        "apiVersion": DistributedLock::api_version(&()),
        "kind": DistributedLock::kind(&()),
        "status": desired,
    });
    api.patch_status(&key.name, &PatchParams::apply(MANAGER_CONTROLLER).force(), &Patch::Apply(patch))
        .await
        .map_err(|source| Error::Status { namespace: key.namespace.clone(), name: key.name.clone(), source })?;
    record::status_written(ctx, lock, &previous, &desired, &outcome);
    ctx.with_memory(key, &uid, |m| {
        m.status = Some(AppliedStatus::Written(Box::new(desired)));
        m.status_written = Some(Instant::now());
        m.pending = None;
    });
    Ok(None)
}
