//! One reconcile of one lock: read the caches, judge on our own clock, decide (pure), write
//! the lock Lease by compare-and-swap, clean up claims, apply status if it changed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::context::{Context, LockKey};
use super::decide::{self, Decision, HolderState, Revocation};
use super::error::Error;
use super::status::{self, Granted, Outcome};
use super::view::{self, Claim, Ownership};
use super::{build, rbac};
use crate::crd::{
    ANNOTATION_FORCE_RELEASE, ANNOTATION_FORCE_RELEASE_BY, DistributedLock, DistributedLockStatus, ForceRelease,
    LABEL_LOCK, LABEL_ROLE, MANAGER_CONTROLLER, ROLE_CLAIM,
};
use crate::lease::identity::PodRef;
use crate::lease::{self, CasError, LeaseStore, Timing, clock::Sighting, token};
use crate::metrics::{ReasonLabel, RevokeReason};

/// The reasons of the Events the controller emits (documented in docs/metrics.md).
pub const EVENT_REASONS: [&str; 5] = ["Granted", "Released", "Expired", "ForceReleased", "LeaseConflict"];

/// Events recorded at most once per [`ROUTINE_EVENT_INTERVAL`] per lock.
pub const ROUTINE_EVENTS: [&str; 2] = ["Granted", "Released"];
/// See [`ROUTINE_EVENTS`].
pub const ROUTINE_EVENT_INTERVAL: Duration = Duration::from_secs(60);

/// How often a lock whose Lease is foreign is looked at again (a foreign Lease carries no
/// labels of ours, so its deletion reaches us through no watch).
const CONFLICT_RECHECK: Duration = Duration::from_secs(10);

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
    let key: LockKey = (lock.namespace().unwrap_or_default(), lock.name_any());
    let store = LeaseStore::new(ctx.client.clone(), &key.0, MANAGER_CONTROLLER);
    if ctx.settings.manage_rbac {
        rbac::ensure(ctx, &key.0).await?;
    }
    // A conflict means our view was stale: read the Lease afresh and decide again.
    let mut fresh = false;
    loop {
        let lease = current_lease(ctx, lock, &key, &store, fresh).await?;
        match step(lock, ctx, &key, &store, lease).await {
            Err(Error::Lease(CasError::Conflict { .. } | CasError::AlreadyExists { .. })) if !fresh => fresh = true,
            other => return other,
        }
    }
}

/// The lock Lease as best known: our own last write while the cache still shows the
/// version it replaced; a direct read when the cache has none or `fresh` is asked.
async fn current_lease(
    ctx: &Context,
    lock: &DistributedLock,
    key: &LockKey,
    store: &LeaseStore,
    fresh: bool,
) -> Result<Option<Lease>, Error> {
    if fresh {
        return Ok(store.get(&key.1).await?);
    }
    let cached = ctx.leases.get(&ObjectRef::new(&key.1).within(&key.0)).map(|l| (*l).clone());
    let uid = lock.uid().unwrap_or_default();
    let written = ctx.with_memory(key, &uid, |m| m.written.clone());
    match (cached, written) {
        (cached, Some((replaced, ours))) if cached.as_ref().and_then(|c| c.resource_version()) == replaced => {
            Ok(Some(ours))
        }
        (Some(cached), _) => Ok(Some(cached)),
        (None, _) => Ok(store.get(&key.1).await?),
    }
}

/// Writes `desired` over `current` by CAS (or creates it) and remembers the result.
async fn write_lease(
    ctx: &Context,
    key: &LockKey,
    uid: &str,
    store: &LeaseStore,
    current: Option<&Lease>,
    desired: &Lease,
) -> Result<Lease, Error> {
    let written = match current {
        None => store.create(desired).await?,
        Some(_) => store.replace(desired).await?,
    };
    let replaced = current.and_then(|c| c.resource_version());
    ctx.with_memory(key, uid, |m| m.written = Some((replaced, written.clone())));
    Ok(written)
}

/// The highest token known for the lock from every source.
fn previous_token(ctx: &Context, key: &LockKey, lock: &DistributedLock, lease: Option<&Lease>) -> i64 {
    let status = lock.status.as_ref().and_then(|s| s.fencing_token).unwrap_or(0);
    let lease = lease.and_then(token::of_lease).unwrap_or(0);
    status.max(lease).max(ctx.issued(key))
}

async fn step(
    lock: &DistributedLock,
    ctx: &Context,
    key: &LockKey,
    store: &LeaseStore,
    lease: Option<Lease>,
) -> Result<Action, Error> {
    let uid = lock.uid().unwrap_or_default();
    let timing = Timing::of(&lock.spec);
    let lease = match lease {
        None => {
            let token = previous_token(ctx, key, lock, None);
            info!(namespace = %key.0, lock = %key.1, token, "creating lock lease");
            write_lease(ctx, key, &uid, store, None, &build::new_lock_lease(lock, token)).await?
        }
        Some(lease) => match view::ownership(&lease, &key.1, &uid) {
            Ownership::Ours => lease,
            Ownership::PreviousIncarnation => {
                let token = previous_token(ctx, key, lock, Some(&lease));
                info!(namespace = %key.0, lock = %key.1, token, "adopting the lock lease of a re-created lock");
                write_lease(ctx, key, &uid, store, Some(&lease), &build::adopted(&lease, lock, token)).await?
            }
            Ownership::Foreign(why) => return conflict(lock, ctx, key, &why).await,
        },
    };

    let now = Instant::now();
    let wall = Timestamp::now();
    let mut claims: Vec<Claim> = ctx
        .leases
        .state()
        .iter()
        .filter(|l| l.namespace().as_deref() == Some(key.0.as_str()))
        .filter(|l| l.labels().get(LABEL_ROLE).map(String::as_str) == Some(ROLE_CLAIM))
        .filter(|l| l.labels().get(LABEL_LOCK) == Some(&key.1))
        .filter_map(|l| view::claim(l, &key.1))
        .collect();
    super::queue::order(&mut claims);

    let hold = view::lease_hold(&lease);
    let (claim_ages, holder_unchanged) = ctx.with_memory(key, &uid, |m| {
        m.claims.retain(|uid, _| claims.iter().any(|c| &c.uid == uid));
        let ages: Vec<Duration> = claims
            .iter()
            .map(|c| now - Sighting::observe_in(&mut m.claims, &c.uid, c.renew_time.clone(), now))
            .collect();
        let holder = hold.as_ref().map(|h| {
            let renewal = (h.identity.id.clone(), h.token, h.renew_time.clone());
            now - Sighting::observe(&mut m.holder, renewal, now)
        });
        (ages, holder)
    });
    let age_of = |c: &Claim| claims.iter().position(|x| x.uid == c.uid).map_or(Duration::ZERO, |i| claim_ages[i]);
    let (mut live, mut stale) = super::queue::split(&claims, hold.as_ref().map(|h| h.identity.id.as_str()), age_of);

    // A waiter whose Pod is gone, or who is not among the lock's clients, is not served:
    // check the head until one may be.
    while let Some(head) = live.first().copied() {
        let gone = match &head.identity.pod {
            Some(pod) => pod_gone(ctx, &key.0, pod).await?,
            None => false,
        };
        if gone || !client_allowed(ctx, &key.0, &lock.spec.clients, head).await {
            stale.push(live.remove(0));
        } else {
            break;
        }
    }

    let force = lock.annotations().get(ANNOTATION_FORCE_RELEASE).cloned();
    let holder_state = match &hold {
        Some(h) => Some(HolderState {
            token: h.token,
            confirmed: h.confirmed,
            unchanged_for: holder_unchanged.unwrap_or_default(),
            held_for: h.acquire_time.map_or(Duration::ZERO, |t| wall.duration_since(t).unsigned_abs()),
            pod_gone: match &h.identity.pod {
                Some(pod) => pod_gone(ctx, &key.0, pod).await?,
                None => false,
            },
            claim_present: claims.iter().any(|c| c.identity == h.identity),
        }),
        None => None,
    };
    let previous = previous_token(ctx, key, lock, Some(&lease));
    let decision = decide::decide(&decide::Inputs {
        timing,
        max_hold: lock.spec.max_hold_seconds.map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0))),
        confirm_timeout: ctx.settings.confirm_timeout,
        holder: holder_state,
        waiting: live.len(),
        force: force.is_some() && hold.is_some(),
        previous_token: previous,
        wall_clock_ms: wall.as_millisecond(),
    });

    if !matches!(decision, Decision::Keep { .. }) && !ctx.leadership.is_leading() {
        return Ok(Action::await_change());
    }
    let mut outcome = Outcome::default();
    let mut recheck = None;
    let (lease, revocation) = match decision {
        Decision::Keep { recheck: r } => {
            recheck = r;
            (lease, None)
        }
        Decision::Grant { token, revoked } => {
            let head = live.remove(0);
            let reason = revoked.as_ref().map(|r| format!("{:?}", r.reason));
            let desired = build::granted(&lease, head, token, &timing, wall, reason.as_deref());
            let written = write_lease(ctx, key, &uid, store, Some(&lease), &desired).await?;
            ctx.record_issued(key, token);
            let waited = wall.duration_since(head.requested).as_secs_f64().max(0.0);
            // From the holder's release (it stamps renewTime as it lets go) to this grant.
            let handoff_ms = match (&hold, &revoked) {
                (None, None) => lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.renew_time.as_ref())
                    .map(|t| wall.duration_since(t.0).as_millis().max(0) as i64),
                _ => Some(0),
            };
            ctx.metrics.grants.inc();
            ctx.metrics.wait_seconds.observe(waited);
            if let Some(ms) = handoff_ms {
                ctx.metrics.handoff_seconds.observe(ms as f64 / 1000.0);
            }
            outcome.granted = Some(Granted { waited_seconds: waited, handoff_ms });
            info!(namespace = %key.0, lock = %key.1, token, holder = %head.identity, waited, "granted");
            publish(
                ctx,
                lock,
                EventType::Normal,
                "Granted",
                format!("granted to {} with token {token}", head.identity),
                head.identity.pod.as_ref(),
            );
            recheck = Some(ctx.settings.confirm_timeout);
            (written, revoked)
        }
        Decision::Revoke { revocation, raise_to } => {
            let desired = build::revoked(&lease, raise_to, &format!("{:?}", revocation.reason));
            let written = write_lease(ctx, key, &uid, store, Some(&lease), &desired).await?;
            ctx.record_issued(key, raise_to);
            (written, Some(revocation))
        }
    };
    if let (Some(r), Some(h)) = (&revocation, &hold) {
        outcome.revoked = Some(r.reason.clone());
        revoked_side_effects(ctx, lock, key, store, r, h, force.as_deref(), &mut outcome).await?;
    } else if force.is_some() {
        // Nothing held: the request is done as soon as it is recorded.
        outcome.forced = Some(force_record(lock, None));
        clear_force_annotation(ctx, key).await?;
    }
    for claim in &stale {
        if let Err(e) = store.delete(&claim.name, Some(&claim.resource_version)).await {
            warn!(namespace = %key.0, lock = %key.1, claim = %claim.name, error = %e, "failed to delete stale claim");
        }
    }

    let new_hold = view::lease_hold(&lease);
    ctx.record_holder(key, new_hold.as_ref().and_then(|h| h.identity.pod.as_ref()).map(|p| p.name.as_str()));
    apply_status(ctx, lock, key, &timing, new_hold.as_ref(), &lease, &live, &outcome, None).await?;

    // Wake up for the next deadline: expiry, confirmation, max hold, a claim going stale.
    let claim_deadline = live.iter().map(|c| c.ttl.saturating_sub(age_of(c))).min();
    let next = [recheck, claim_deadline].into_iter().flatten().min();
    Ok(next.map_or_else(Action::await_change, |d| Action::requeue(d.max(Duration::from_millis(10)))))
}

/// After revoking a hold: drop the holder's claim, count it, tell people, and finish a
/// forced release.
#[allow(clippy::too_many_arguments)]
async fn revoked_side_effects(
    ctx: &Context,
    lock: &DistributedLock,
    key: &LockKey,
    store: &LeaseStore,
    revocation: &Revocation,
    hold: &view::LeaseHold,
    force: Option<&str>,
    outcome: &mut Outcome,
) -> Result<(), Error> {
    let reason = &revocation.reason;
    ctx.metrics.revocations.get_or_create(&ReasonLabel { reason: reason.clone() }).inc();
    let claim = hold.claim.clone().unwrap_or_else(|| hold.identity.claim_name(&key.1));
    if let Err(e) = store.delete(&claim, None).await {
        warn!(namespace = %key.0, lock = %key.1, %claim, error = %e, "failed to delete the revoked holder's claim");
    }
    let token = revocation.token.map_or_else(|| "none".to_owned(), |t| t.to_string());
    warn!(namespace = %key.0, lock = %key.1, token, holder = %hold.identity, ?reason, "revoked");
    if *reason == RevokeReason::Forced {
        let record = force_record(lock, revocation.token);
        let note = format!(
            "force-released by {} ({}): revoked {} with token {token}",
            record.by, record.reason, hold.identity
        );
        publish(ctx, lock, EventType::Warning, "ForceReleased", note, hold.identity.pod.as_ref());
        outcome.forced = Some(record);
        if force.is_some() {
            clear_force_annotation(ctx, key).await?;
        }
    } else {
        let why = match reason {
            RevokeReason::Expired => "no renewal seen for the lease duration",
            RevokeReason::PodGone => "its Pod is gone",
            RevokeReason::Unconfirmed => "the grant was not confirmed",
            RevokeReason::MaxHold => "held longer than maxHoldSeconds",
            RevokeReason::Forced => "forced",
        };
        let note = format!("revoked {} with token {token}: {why}", hold.identity);
        publish(ctx, lock, EventType::Warning, "Expired", note, hold.identity.pod.as_ref());
    }
    Ok(())
}

fn force_record(lock: &DistributedLock, revoked_token: Option<i64>) -> ForceRelease {
    let annotations = lock.annotations();
    ForceRelease {
        by: annotations.get(ANNOTATION_FORCE_RELEASE_BY).cloned().unwrap_or_else(|| "unknown".into()),
        reason: annotations.get(ANNOTATION_FORCE_RELEASE).cloned().unwrap_or_default(),
        at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
        revoked_token,
    }
}

async fn clear_force_annotation(ctx: &Context, key: &LockKey) -> Result<(), Error> {
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &key.0);
    // A JSON merge patch with null removes the annotations; a typed None would be dropped.
    let patch =
        json!({"metadata": {"annotations": {ANNOTATION_FORCE_RELEASE: null, ANNOTATION_FORCE_RELEASE_BY: null}}});
    api.patch(&key.1, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(|source| Error::Annotation { namespace: key.0.clone(), name: key.1.clone(), source })
}

/// A Lease we must not touch has the lock's name: report it, grant nothing.
async fn conflict(lock: &DistributedLock, ctx: &Context, key: &LockKey, why: &str) -> Result<Action, Error> {
    let was_conflict = lock
        .status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == "LeaseConflict"));
    if !was_conflict {
        warn!(namespace = %key.0, lock = %key.1, %why, "lease conflict");
        publish(ctx, lock, EventType::Warning, "LeaseConflict", why.to_owned(), None);
    }
    let timing = Timing::of(&lock.spec);
    let dummy = Lease::default();
    apply_status(ctx, lock, key, &timing, None, &dummy, &[], &Outcome::default(), Some(why)).await?;
    Ok(Action::requeue(CONFLICT_RECHECK))
}

/// Applies the status that follows, if it differs from the last one written.
#[allow(clippy::too_many_arguments)]
async fn apply_status(
    ctx: &Context,
    lock: &DistributedLock,
    key: &LockKey,
    timing: &Timing,
    hold: Option<&view::LeaseHold>,
    lease: &Lease,
    waiters: &[&Claim],
    outcome: &Outcome,
    conflict: Option<&str>,
) -> Result<(), Error> {
    let uid = lock.uid().unwrap_or_default();
    let remembered = ctx.with_memory(key, &uid, |m| m.status.clone());
    let previous = remembered.or_else(|| lock.status.clone()).unwrap_or_default();
    let lease_token = token::of_lease(lease).unwrap_or(0);
    let desired = status::desired(&status::Inputs {
        previous: &previous,
        generation: lock.metadata.generation,
        now: Timestamp::now(),
        timing: *timing,
        hold,
        token: lease_token.max(ctx.issued(key)),
        waiters,
        outcome,
        conflict,
    });
    if desired == previous && lock.status.is_some() {
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
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &key.0);
    let patch = json!({
        "apiVersion": DistributedLock::api_version(&()),
        "kind": DistributedLock::kind(&()),
        "status": desired,
    });
    api.patch_status(&key.1, &PatchParams::apply(MANAGER_CONTROLLER).force(), &Patch::Apply(patch))
        .await
        .map_err(|source| Error::Status { namespace: key.0.clone(), name: key.1.clone(), source })?;
    ctx.with_memory(key, &uid, |m| m.status = Some(desired));
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

/// Whether Pod `pod` is gone: not in the cache and confirmed missing by a direct read, or
/// present with another UID. Errors count as "not gone": never revoke on a guess.
async fn pod_gone(ctx: &Context, namespace: &str, pod: &PodRef) -> Result<bool, Error> {
    if let Some(cached) = ctx.pods.get(&ObjectRef::new(&pod.name).within(namespace)) {
        return Ok(cached.uid().as_deref() != Some(pod.uid.as_str()));
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    match api.get_metadata_opt(&pod.name).await {
        Ok(None) => Ok(true),
        Ok(Some(meta)) => Ok(PartialObjectMeta::<Pod>::uid(&meta).as_deref() != Some(pod.uid.as_str())),
        Err(source) => {
            let error = Error::Pod { namespace: namespace.to_owned(), name: pod.name.clone(), source };
            warn!(%error, "cannot tell whether the holder's pod exists");
            Ok(false)
        }
    }
}

/// Whether the claimant of `claim` may hold a lock with `clients` (empty: anyone the
/// namespace's RBAC lets claim). A pod claims as its ServiceAccount (read once per pod);
/// anyone else by the `system:serviceaccount:<ns>:<name>/` prefix of its identity.
async fn client_allowed(ctx: &Context, namespace: &str, clients: &[String], claim: &Claim) -> bool {
    if clients.is_empty() {
        return true;
    }
    let account = match &claim.identity.pod {
        Some(pod) => {
            let known = ctx.pod_accounts.lock().expect("pod accounts are never poisoned").get(&pod.uid).cloned();
            match known {
                Some(account) => Some(account),
                None => {
                    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
                    let account = pods
                        .get_opt(&pod.name)
                        .await
                        .ok()
                        .flatten()
                        .filter(|p| p.metadata.uid.as_deref() == Some(pod.uid.as_str()))
                        .and_then(|p| p.spec.and_then(|s| s.service_account_name));
                    if let Some(a) = &account {
                        ctx.pod_accounts
                            .lock()
                            .expect("pod accounts are never poisoned")
                            .insert(pod.uid.clone(), a.clone());
                    }
                    account
                }
            }
        }
        None => claim
            .identity
            .id
            .strip_prefix(&format!("system:serviceaccount:{namespace}:"))
            .and_then(|rest| rest.split_once('/'))
            .map(|(account, _)| account.to_owned()),
    };
    let allowed = account.as_ref().is_some_and(|a| clients.contains(a));
    if !allowed {
        warn!(namespace, claimant = %claim.identity, ?account, "claimant is not among the lock's clients; dropping its claim");
    }
    allowed
}

/// Emits an Event on the lock (related to the Pod, if any) without delaying the reconcile.
fn publish(ctx: &Context, lock: &DistributedLock, type_: EventType, reason: &str, note: String, pod: Option<&PodRef>) {
    // Routine events of a busy lock would cost two apiserver writes per handoff: record at
    // most one Granted and one Released per lock per interval (the latest is in status).
    if ROUTINE_EVENTS.contains(&reason) {
        let key = (lock.namespace().unwrap_or_default(), lock.name_any(), reason.to_owned());
        let mut last = ctx.routine_events.lock().expect("event memory is never poisoned");
        let now = Instant::now();
        if last.get(&key).is_some_and(|at| now.duration_since(*at) < ROUTINE_EVENT_INTERVAL) {
            return;
        }
        last.insert(key, now);
    }
    let recorder = ctx.recorder.clone();
    let reference = lock.object_ref(&());
    let secondary = pod.map(|p| k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(p.name.clone()),
        namespace: lock.namespace(),
        uid: Some(p.uid.clone()),
        ..Default::default()
    });
    let event = Event { type_, reason: reason.to_owned(), note: Some(note), action: reason.to_owned(), secondary };
    tokio::spawn(async move {
        if let Err(error) = recorder.publish(&event, &reference).await {
            warn!(%error, "failed to publish event");
        }
    });
}
