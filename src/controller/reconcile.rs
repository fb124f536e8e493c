//! One reconcile of one lock: read the caches, judge ages on our own clock, decide (pure),
//! write the lock Lease by compare-and-swap, settle a force-release request, clean up
//! claims, apply status if it changed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::context::{Context, LockKey};
use super::decide::{self, Blocked, Current, Decision, DrainState, HolderState, Tokens};
use super::error::Error;
use super::events::publish;
use super::force::{self, Target};
use super::status::{self, Outcome, Ready};
use super::view::{self, Claim, LeaseState, Ownership};
use super::{apply, build, claims, clocks, finalize, force_requests, lock_lease, pods, rbac, recreate};
use crate::crd::{DistributedLock, DistributedLockStatus, LockClaim, MANAGER_CONTROLLER};
use crate::lease::{self, CasError, CasStore, GrantedTiming, LeaseStore, clock::Sighting, granted, token};

/// How often a lock that cannot be granted (a foreign Lease with its name, a tampered or
/// exhausted token) is looked at again: a foreign Lease carries no labels of ours, so its
/// deletion reaches us through no watch.
const NOT_READY_RECHECK: Duration = Duration::from_secs(10);

/// Reconciles one lock, if this replica leads.
pub async fn reconcile(lock: Arc<DistributedLock>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.leadership.is_leading() {
        return Ok(Action::await_change());
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
    result
}

/// The longest one reconcile may take.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(5);

/// What to do after a failed reconcile: count it and look again soon.
pub fn error_policy(lock: Arc<DistributedLock>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(namespace = lock.namespace().unwrap_or_default(), lock = %lock.name_any(), %error, "reconcile failed");
    ctx.metrics.reconcile_errors.get_or_create(&crate::metrics::CategoryLabel { category: error.category() }).inc();
    Action::requeue(Duration::from_millis(500))
}

async fn reconcile_lock(lock: &DistributedLock, ctx: &Context) -> Result<Action, Error> {
    let key = LockKey::of(lock);
    let uid = lock.uid().unwrap_or_default();
    let deleting = lock.metadata.deletion_timestamp.is_some();
    if deleting && !finalize::present(lock) {
        return Ok(Action::await_change());
    }
    if ctx.settings.manage_rbac && !deleting {
        rbac::ensure(ctx, &key.namespace).await?;
    }
    finalize::ensure(ctx, lock, &key).await?;
    let store = LeaseStore::new(ctx.client.clone(), &key.namespace, MANAGER_CONTROLLER);
    // A conflict means our view was stale, and a Lease gone under a write must be
    // re-created: read the Lease afresh and decide again.
    let mut fresh = false;
    loop {
        let lease = lock_lease::current(ctx, &uid, &key, &store, fresh).await?;
        match step(lock, ctx, &key, &store, lease).await {
            Err(Error::Lease(
                CasError::Conflict { .. } | CasError::AlreadyExists { .. } | CasError::NotFound { .. },
            )) if !fresh => fresh = true,
            other => return other,
        }
    }
}

/// The highest token known for the lock, from every source we trust: status, our
/// memory, and the Lease's annotation unless it is above what a controller could have
/// minted.
fn tokens(ctx: &Context, key: &LockKey, lock: &DistributedLock, lease: Option<&Lease>, wall_ms: i64) -> Tokens {
    let known = known_token(ctx, key, lock);
    match lease.and_then(token::of_lease) {
        Some(found) if found > token::ceiling(known, wall_ms) => {
            Tokens::Tampered { found, ceiling: token::ceiling(known, wall_ms) }
        }
        found => Tokens::Known(known.max(found.unwrap_or(0))),
    }
}

/// The highest token recorded in status or in our memory.
fn known_token(ctx: &Context, key: &LockKey, lock: &DistributedLock) -> i64 {
    lock.status.as_ref().and_then(|s| s.fencing_token).unwrap_or(0).max(ctx.issued(key))
}

/// The lock Lease to decide from: created, adopted from an earlier incarnation of the
/// lock, or `Err(action)` when there is none to use.
async fn own_lease(
    lock: &DistributedLock,
    ctx: &Context,
    key: &LockKey,
    store: &LeaseStore,
    lease: Option<Lease>,
) -> Result<Result<Lease, Action>, Error> {
    let uid = lock.uid().unwrap_or_default();
    let deleting = lock.metadata.deletion_timestamp.is_some();
    let Some(lease) = lease else {
        if deleting {
            finalize::finish(ctx, lock, key).await?;
            return Ok(Err(Action::await_change()));
        }
        let token = known_token(ctx, key, lock);
        let spec = GrantedTiming::of_spec(&lock.spec);
        let seen = ctx.with_memory(key, &uid, |m| m.seen.clone());
        let status = lock.status.as_ref().and_then(|s| s.holder.as_ref());
        let orphan = recreate::orphan(seen.as_ref(), status, &spec);
        let created = match (orphan, token::mint(token, Timestamp::now().as_millisecond())) {
            (Some(orphan), Some(raise_to)) => {
                warn!(namespace = %key.namespace, lock = %key.name, holder = %orphan.identity, token = orphan.token, raise_to,
                    "the lock lease was deleted under a hold: re-creating it draining that hold");
                let note = format!(
                    "the lock Lease was deleted while {} held token {}: re-created draining that hold (token raised to {raise_to})",
                    orphan.identity, orphan.token
                );
                publish(ctx, lock, EventType::Warning, recreate::REASON, note, None);
                ctx.record_issued(key, raise_to);
                recreate::recreated(lock, raise_to, &orphan, &spec)
            }
            _ => {
                info!(namespace = %key.namespace, lock = %key.name, token, "creating lock lease");
                build::new_lock_lease(lock, token)
            }
        };
        return Ok(Ok(lock_lease::write(ctx, key, &uid, store, None, &created).await?));
    };
    match view::ownership(&lease, &key.name, &uid) {
        Ownership::Ours => Ok(Ok(lease)),
        Ownership::PreviousIncarnation => {
            info!(namespace = %key.namespace, lock = %key.name, "adopting the lock lease of a re-created lock");
            Ok(Ok(lock_lease::write(ctx, key, &uid, store, Some(&lease), &build::adopted(&lease, lock)).await?))
        }
        // A Lease that is not ours is left alone, also when the lock goes.
        Ownership::Foreign(_) if deleting => {
            finalize::finish(ctx, lock, key).await?;
            Ok(Err(Action::await_change()))
        }
        Ownership::Foreign(why) => not_ready(lock, ctx, key, Ready::LeaseConflict(why)).await.map(Err),
    }
}

async fn step(
    lock: &DistributedLock,
    ctx: &Context,
    key: &LockKey,
    store: &LeaseStore,
    lease: Option<Lease>,
) -> Result<Action, Error> {
    let lease = match own_lease(lock, ctx, key, store, lease).await? {
        Ok(lease) => lease,
        Err(action) => return Ok(action),
    };
    let uid = lock.uid().unwrap_or_default();
    ctx.with_memory(key, &uid, |m| m.seen = Some(lease.clone()));
    let deleting = lock.metadata.deletion_timestamp.is_some();
    let (now, wall) = (Instant::now(), Timestamp::now());
    let spec_terms = GrantedTiming::of_spec(&lock.spec);
    let state = view::lease_state(&lease);
    let claims = claims::of_lock(ctx, key, &spec_terms.timing);

    // Ages on our clock: of every claim's refresh, of the hold's renewal and of the hold,
    // or of a drain.
    let (claim_ages, hold_ages, drain_age) = ctx.with_memory(key, &uid, |m| {
        m.claims.retain(|uid, _| claims.iter().any(|c| &c.uid == uid));
        let ages: Vec<Duration> = claims
            .iter()
            .map(|c| now - Sighting::observe_in(&mut m.claims, &c.uid, c.renew_time.clone(), now))
            .collect();
        match &state {
            LeaseState::Held(h) => (ages, Some(clocks::of_hold(m, h, now)), None),
            LeaseState::Draining(d) => (ages, None, Some(clocks::of_drain(m, d, now))),
            LeaseState::Free => (ages, None, None),
        }
    });
    let age_of = |c: &Claim| claims.iter().position(|x| x.uid == c.uid).map_or(Duration::ZERO, |i| claim_ages[i]);
    let held = match &state {
        LeaseState::Held(h) => Some(h),
        _ => None,
    };
    let (mut live, mut stale) = super::queue::split(&claims, held.map(|h| h.identity.id.as_str()), age_of);
    if !deleting {
        pods::serveable_head(ctx, &key.namespace, &lock.spec.clients, &mut live, &mut stale).await?;
    }

    // The one-step annotation acts only where the policy needs no approvals.
    let required = force_requests::required(ctx, lock);
    let mut force = force::request(lock.annotations());
    if let Some(request) = &force
        && required > 0
    {
        force_requests::refuse_annotation(ctx, lock, key, request, required).await?;
        return Ok(Action::await_change());
    }
    // A force-release request is acted on only once it names its target.
    if let Some(request) = &force
        && request.target == Target::Unstamped
    {
        let target = force::target_of(held.and_then(|h| h.token));
        info!(namespace = %key.namespace, lock = %key.name, %target, "force release without a target: it targets the current hold");
        force::stamp(ctx, lock, key, &target).await?;
        return Ok(Action::await_change());
    }

    // ForceReleaseRequests: the oldest approved one is carried out like the annotation.
    let judgements = if deleting {
        Vec::new()
    } else {
        let executed = force_requests::executed(ctx, key, lock);
        force_requests::judge(ctx, key, &force_requests::hold_view(&state), required, executed.as_ref(), wall)
    };
    if force.is_none() {
        force = force_requests::to_execute(&judgements);
    }

    let current = match (&state, hold_ages, drain_age) {
        (LeaseState::Held(h), Some((unchanged_for, held_for)), _) => Current::Held(HolderState {
            token: h.token,
            confirmed: h.confirmed,
            unchanged_for,
            held_for,
            pod_gone: match &h.identity.pod {
                Some(pod) => pods::pod_gone(ctx, &key.namespace, pod).await?,
                None => false,
            },
            claim_present: claims.iter().any(|c| c.identity == h.identity),
            forced: force.as_ref().is_some_and(|r| force::targets(r, h.token)),
        }),
        (LeaseState::Draining(d), _, Some(since_renewal)) => {
            Current::Draining(DrainState { acknowledged: d.holder.is_none(), since_renewal })
        }
        _ => Current::Free,
    };
    let tokens = tokens(ctx, key, lock, Some(&lease), wall.as_millisecond());
    let inputs = decide::Inputs {
        terms: granted::of_lease(&lease, &spec_terms),
        confirm_timeout: ctx.settings.confirm_timeout,
        current,
        waiting: live.len(),
        deleting,
        tokens,
        wall_clock_ms: wall.as_millisecond(),
    };
    let decision = decide::decide(&inputs);
    if !matches!(decision, Decision::Keep { .. }) && !ctx.leadership.is_leading() {
        return Ok(Action::await_change());
    }

    let claim_store = CasStore::<LockClaim>::new(ctx.client.clone(), &key.namespace, MANAGER_CONTROLLER);
    let write = apply::Write {
        ctx,
        lock,
        key,
        uid: &uid,
        store,
        claim_store: &claim_store,
        lease: &lease,
        state: &state,
        force: force.as_ref(),
    };
    let applied = match decision {
        Decision::Blocked(blocked) => return not_ready(lock, ctx, key, blocked_ready(&blocked)).await,
        Decision::DeleteLease => {
            write.drained();
            store.delete(&key.name, lease.resource_version().as_deref()).await?;
            finalize::finish(ctx, lock, key).await?;
            return Ok(Action::await_change());
        }
        Decision::Keep { recheck } => apply::Applied { lease: lease.clone(), outcome: Outcome::default(), recheck },
        Decision::Grant { token, revoked } => {
            let head = live.remove(0);
            write.grant(head, token, revoked.as_ref(), &spec_terms, wall, &inputs).await?
        }
        Decision::Revoke { revocation, raise_to } => {
            let desired = build::revoked(&lease, raise_to, &format!("{:?}", revocation.reason));
            write.revoke(&desired, &revocation, raise_to, None).await?
        }
        Decision::Drain { revocation, raise_to, recheck } => {
            // The drain counts from the last renewal seen before this revocation.
            let unchanged = match &inputs.current {
                Current::Held(h) => h.unchanged_for,
                _ => Duration::ZERO,
            };
            ctx.with_memory(key, &uid, |m| clocks::drain_started(m, revocation.token, now - unchanged));
            let desired = build::draining(&lease, raise_to, &format!("{:?}", revocation.reason), revocation.token);
            write.revoke(&desired, &revocation, raise_to, Some(recheck)).await?
        }
        Decision::Free => {
            write.drained();
            let written = lock_lease::write(ctx, key, &uid, store, Some(&lease), &build::freed(&lease)).await?;
            apply::Applied { lease: written, outcome: Outcome::default(), recheck: None }
        }
    };
    let mut outcome = applied.outcome;
    // Status is applied even if clearing the request fails: what was done is recorded.
    let settled = force::settle(ctx, lock, key, force, held.and_then(|h| h.token), &state, &mut outcome).await;
    let recorded = force_requests::record(ctx, lock, key, &judgements, required, &mut outcome).await;
    claims::delete_stale(&claim_store, key, &stale).await;

    let new_state = view::lease_state(&applied.lease);
    let (new_hold, new_drain) = match &new_state {
        LeaseState::Held(h) => (Some(h), None),
        LeaseState::Draining(d) => (None, Some(d)),
        LeaseState::Free => (None, None),
    };
    ctx.record_holder(key, new_hold.and_then(|h| h.identity.pod.as_ref()).map(|p| p.name.as_str()));
    // With every token issued, what needs none goes on (holding, releasing, draining),
    // but the lock can never be granted again: say so.
    let ready = match tokens {
        Tokens::Known(previous) if token::mint(previous, wall.as_millisecond()).is_none() => {
            blocked_ready(&Blocked::TokenExhausted)
        }
        _ => Ready::Yes,
    };
    announce(ctx, lock, key, &ready);
    let view = StatusView { hold: new_hold, draining: new_drain, lease: &applied.lease, waiters: &live, required };
    apply_status(ctx, lock, key, &view, outcome, &ready).await?;
    settled?;
    recorded?;

    // Wake up for the next deadline: expiry, confirmation, max hold, drain, a claim going
    // stale, a request expiring.
    let claim_deadline = live.iter().map(|c| c.ttl.saturating_sub(age_of(c))).min();
    let request_deadline = force_requests::next_expiry(&judgements, Timestamp::now());
    let next = [applied.recheck, claim_deadline, request_deadline].into_iter().flatten().min();
    Ok(next.map_or_else(Action::await_change, |d| Action::requeue(d.max(Duration::from_millis(10)))))
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

/// Records an Event when the lock starts being impossible to grant (for this reason).
fn announce(ctx: &Context, lock: &DistributedLock, key: &LockKey, ready: &Ready) {
    let (reason, message) = match ready {
        Ready::LeaseConflict(m) => ("LeaseConflict", m),
        Ready::TokenExhausted(m) => ("TokenExhausted", m),
        Ready::TokenTampered(m) => ("TokenTampered", m),
        Ready::Yes => return,
    };
    let already =
        lock.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == reason));
    if !already {
        warn!(namespace = %key.namespace, lock = %key.name, %message, reason, "lock cannot be granted");
        publish(ctx, lock, EventType::Warning, reason, message.clone(), None);
    }
}

/// A lock that cannot be granted: report why (an Event when it starts), grant nothing,
/// look again later.
async fn not_ready(lock: &DistributedLock, ctx: &Context, key: &LockKey, ready: Ready) -> Result<Action, Error> {
    announce(ctx, lock, key, &ready);
    let lease = Lease::default();
    let view = StatusView {
        hold: None,
        draining: None,
        lease: &lease,
        waiters: &[],
        required: force_requests::required(ctx, lock),
    };
    apply_status(ctx, lock, key, &view, Outcome::default(), &ready).await?;
    Ok(Action::requeue(NOT_READY_RECHECK))
}

/// What status is computed from, after this reconcile's writes.
struct StatusView<'a> {
    hold: Option<&'a view::LeaseHold>,
    draining: Option<&'a view::LeaseDrain>,
    lease: &'a Lease,
    waiters: &'a [&'a Claim],
    /// Approvals a force release needs.
    required: u32,
}

/// Applies the status that follows, if it differs from the last one written. What this
/// reconcile did is kept in memory until a status write succeeds, so a failed status
/// write loses nothing and counts nothing twice.
async fn apply_status(
    ctx: &Context,
    lock: &DistributedLock,
    key: &LockKey,
    view: &StatusView<'_>,
    outcome: Outcome,
    ready: &Ready,
) -> Result<(), Error> {
    let uid = lock.uid().unwrap_or_default();
    let (remembered, outcome) = ctx.with_memory(key, &uid, |m| {
        let merged = status::merge(m.pending.take(), outcome);
        m.pending = Some(merged.clone());
        (m.status.clone(), merged)
    });
    let previous = remembered.or_else(|| lock.status.clone()).unwrap_or_default();
    let trusted = match tokens(ctx, key, lock, Some(view.lease), token::wall_clock_ms()) {
        Tokens::Known(t) => t,
        Tokens::Tampered { .. } => 0,
    };
    let terms = granted::of_lease(view.lease, &GrantedTiming::of_spec(&lock.spec));
    let desired = status::desired(&status::Inputs {
        previous: &previous,
        generation: lock.metadata.generation,
        now: Timestamp::now(),
        timing: terms.timing,
        hold: view.hold,
        token: trusted.max(ctx.issued(key)),
        waiters: view.waiters,
        outcome: &outcome,
        draining: view.draining,
        ready,
        approvals: i32::try_from(view.required).unwrap_or(i32::MAX),
    });
    if desired == previous && lock.status.is_some() {
        ctx.with_memory(key, &uid, |m| m.pending = None);
        return Ok(());
    }
    record_transitions(ctx, &previous, &desired);
    if desired.stats.releases > previous.stats.releases
        && let Some(old) = &previous.holder
    {
        let pod = lease::Identity::parse(&old.identity).pod;
        let note = format!("released by {} (token {})", old.identity, old.fencing_token);
        publish(ctx, lock, EventType::Normal, "Released", note, pod.as_ref());
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
    ctx.with_memory(key, &uid, |m| {
        m.status = Some(desired);
        m.pending = None;
    });
    Ok(())
}

/// Counts what a status change says happened: releases, and hold durations.
fn record_transitions(ctx: &Context, previous: &DistributedLockStatus, desired: &DistributedLockStatus) {
    let released = desired.stats.releases - previous.stats.releases;
    if released > 0 {
        ctx.metrics.releases.inc_by(u64::try_from(released).unwrap_or(0));
    }
    let queued = i64::from(desired.queue_length) - i64::from(previous.queue_length);
    ctx.metrics.queue_depth.inc_by(queued);
    if let Some(old) = &previous.holder {
        let same =
            desired.holder.as_ref().is_some_and(|h| h.identity == old.identity && h.fencing_token == old.fencing_token);
        if !same {
            let held = Timestamp::now().duration_since(old.acquired_at.0).as_secs_f64().max(0.0);
            ctx.metrics.hold_seconds.observe(held);
        }
    }
}
