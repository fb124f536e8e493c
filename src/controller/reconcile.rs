//! One reconcile of one lock: observe → plan → apply → record. The lock Lease is set up
//! first (created, adopted, or found not ours); then every read is made once
//! ([`super::observe`]), one pure function decides everything ([`super::plan`]), the
//! writes are made ([`super::apply`]) and what landed is recorded ([`super::record`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use kube::ResourceExt;
use tracing::{Level, debug, info, warn};

use super::apply::{self, Target};
use super::context::{Context, LockKey};
use super::dispatch::Recheck;
use super::error::Error;
use super::plan::{self, Setup};
use super::view::{self, LeaseState};
use super::{finalize, force_requests, lock_lease, observe, rbac, record};
use crate::crd::{DistributedLock, MANAGER_CONTROLLER};
use crate::lease::{CasError, LeaseStore};

/// Reconciles one lock, if this replica leads.
pub async fn reconcile(lock: Arc<DistributedLock>, ctx: Arc<Context>) -> Result<Recheck, Error> {
    if !ctx.leadership.is_leading() {
        return Ok(None);
    }
    let started = Instant::now();
    // A reconcile stuck on one request (a connection the apiserver dropped while
    // restarting, say) would stall this lock — every later trigger waits behind it.
    let result = match tokio::time::timeout(RECONCILE_TIMEOUT, reconcile_lock(&lock, &ctx)).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout {
            namespace: lock.namespace().unwrap_or_default(),
            name: lock.name_any(),
            after: RECONCILE_TIMEOUT,
        }),
    };
    ctx.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
    // An idle lock keeps no memory between reconciles: nothing in it would change a
    // decision, and at scale it is most of what the controller holds.
    ctx.forget_at_rest(&LockKey::of(&lock));
    result
}

/// The longest one reconcile may take.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(5);

/// What to do after a failed reconcile: count it and look again soon.
pub fn error_policy(lock: Arc<DistributedLock>, error: &Error, ctx: Arc<Context>) -> Recheck {
    warn!(namespace = lock.namespace().unwrap_or_default(), lock = %lock.name_any(), %error, "reconcile failed");
    ctx.metrics.reconcile_errors.get_or_create(&crate::metrics::CategoryLabel { category: error.category() }).inc();
    Some(Duration::from_millis(500))
}

async fn reconcile_lock(lock: &DistributedLock, ctx: &Context) -> Result<Recheck, Error> {
    let key = LockKey::of(lock);
    let deleting = lock.metadata.deletion_timestamp.is_some();
    if deleting && !finalize::present(lock) {
        return Ok(None);
    }
    if ctx.settings.manage_rbac && !deleting {
        rbac::ensure_for(ctx, &key).await?;
    }
    finalize::ensure(ctx, lock, &key).await?;
    let store = LeaseStore::new(ctx.client.clone(), &key.namespace, MANAGER_CONTROLLER);
    // A conflict means our view was stale, and a Lease gone under a write must be
    // re-created: read the Lease afresh and plan again.
    let mut fresh = false;
    loop {
        match pass(lock, ctx, &key, &store, fresh).await {
            Err(Error::Lease(
                CasError::Conflict { .. } | CasError::AlreadyExists { .. } | CasError::NotFound { .. },
            )) if !fresh => fresh = true,
            other => return other,
        }
    }
}

/// One observe → plan → apply pass, from the slot Leases as best known (`fresh`: read
/// from the apiserver).
async fn pass(
    lock: &DistributedLock,
    ctx: &Context,
    key: &LockKey,
    store: &LeaseStore,
    fresh: bool,
) -> Result<Recheck, Error> {
    let uid = lock.uid().unwrap_or_default();
    let mut known = observe::known_token(ctx, key, lock);
    let permits = plan::permits(lock);
    // A Lease re-created from status, read afresh (below); kept for every slot.
    let mut recovering: Option<DistributedLock> = None;
    let mut leases = Vec::new();
    // Above the permits (the lock shrank), only the slots whose Lease the cache holds.
    let above = ctx.slot_index.lock().expect("a cache index is never poisoned").slots_from(key, permits);
    for slot in (0..permits).chain(above) {
        let found = if slot < permits {
            lock_lease::current(ctx, &uid, key, slot, store, fresh).await?
        } else {
            // Only a slot Lease that still exists.
            match lock_lease::cached(ctx, &uid, key, slot) {
                Some(_) if fresh => store.get(&crate::lease::slot::lease_name(&key.name, slot)).await?,
                found => found,
            }
        };
        let seen = ctx.with_memory(key, &uid, |m| m.slots.get(&slot).and_then(|s| s.seen.clone()));
        // A Lease to create that this leader never saw is created from what status says:
        // status as the apiserver has it now, not as a cache that may lag its latest write.
        let from_status = found.is_none() && seen.is_none() && plan::from_status(lock, slot);
        if from_status && recovering.is_none() {
            let current = read_lock(ctx, key).await?;
            known = known.max(observe::known_token(ctx, key, &current));
            recovering = Some(current);
        }
        let setup_from = if from_status { recovering.as_ref().unwrap_or(lock) } else { lock };
        match plan::setup(setup_from, slot, found.as_ref(), known, seen.as_ref(), Timestamp::now()) {
            Setup::Use => leases.push((slot, found.expect("a Lease to use"))),
            Setup::Create { lease, orphan } => {
                if let Some((_, raise_to)) = &orphan {
                    // Reserved before the write: a re-created Lease never repeats a token.
                    ctx.record_issued(key, *raise_to);
                }
                let created = lock_lease::write(ctx, key, &uid, slot, store, None, &lease).await?;
                record::created(ctx, lock, key, orphan.as_ref(), known);
                leases.push((slot, created));
            }
            Setup::Adopt(adopted) => {
                info!(namespace = %key.namespace, lock = %key.name, slot, "adopting the lock lease of a re-created lock");
                let written = lock_lease::write(ctx, key, &uid, slot, store, found.as_ref(), &adopted).await?;
                leases.push((slot, written));
            }
            Setup::Finish => {}
            Setup::Conflict(ready) => {
                let plan = plan::not_ready(lock, known, force_requests::required(ctx, lock), ready);
                let target = Target { ctx, lock, key, store, leases: &[], observed: Instant::now() };
                return apply::apply(&target, plan).await;
            }
        }
    }
    if leases.is_empty() {
        // Going, with no Lease left of its own.
        finalize::finish(ctx, lock, key).await?;
        return Ok(None);
    }
    let observed = Instant::now();
    let observation = observe::observe(ctx, lock, key, &leases, observed).await?;
    let plan = plan::plan(&observation);
    trace_plan(key, &observation, &plan);
    apply::apply(&Target { ctx, lock, key, store, leases: &leases, observed }, plan).await
}

/// Lock `key` as the apiserver has it now.
async fn read_lock(ctx: &Context, key: &LockKey) -> Result<DistributedLock, Error> {
    let api: kube::Api<DistributedLock> = kube::Api::namespaced(ctx.client.clone(), &key.namespace);
    api.get(&key.name).await.map_err(|source| Error::Read {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        source,
    })
}

/// What one pass decided from, and what it decided, at debug level: enough to tell why a
/// lock with waiters was or was not granted.
fn trace_plan(key: &LockKey, o: &plan::Observation, plan: &plan::Plan) {
    if !tracing::enabled!(Level::DEBUG) {
        return;
    }
    let slots: Vec<&str> = o
        .slots
        .iter()
        .map(|s| match view::lease_state(s.lease) {
            LeaseState::Held(_) => "held",
            LeaseState::Draining(_) => "draining",
            LeaseState::Free => "free",
        })
        .collect();
    let serveable = o.claims.iter().filter(|w| w.serveable == Some(true)).count();
    let aged = o.claims.iter().filter(|w| w.unchanged_for >= w.claim.ttl).count();
    debug!(
        namespace = %key.namespace,
        lock = %key.name,
        ?slots,
        claims = o.claims.len(),
        serveable,
        aged,
        spent = o.spent.len(),
        grants = plan.grants.len(),
        stale = plan.stale.len(),
        recheck = ?plan.recheck,
        "planned"
    );
}
