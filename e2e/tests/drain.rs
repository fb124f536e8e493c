//! Revocations that drain, against the real control plane: a hold taken away while its
//! holder may still believe it holds (forced, max hold, Pod gone, lock deleted) makes the
//! old token stale at once, but the next claimant is granted only once the holder has let
//! go (it acknowledges) or its lease duration has passed since its last renewal — whatever
//! the holder's process does meanwhile (busy, frozen, its Pod deleted), whatever the lock's
//! spec is edited to, and across a controller restart. A Lease deleted before a new leader
//! saw it is re-created from status, which may trail the grants: above every token issued
//! since, drained to its end.

use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use leasehold::claim::{LostReason, edit};
use leasehold::crd::{ANNOTATION_REVOKED, ANNOTATION_TOKEN, DistributedLock, DistributedLockSpec};
use leasehold::lease::token;
use serde_json::json;

use crate::controller::ManualClaimant;
use crate::support::Env;
use crate::support::clock::set_clock;
use crate::support::locks::{LeaseWatch, acquire_time, renew_time};
use crate::support::watch::{GrantLog, until, until_gone};

const LOCK: &str = "orders";
const WAIT: Duration = Duration::from_secs(30);

/// A lock spec with this timing, in seconds.
pub(crate) fn timing(lease: i32, renew: i32, retry: i32) -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: lease,
        renew_deadline_seconds: renew,
        retry_period_seconds: retry,
        ..DistributedLockSpec::default()
    }
}

fn seconds(s: i64) -> SignedDuration {
    SignedDuration::from_secs(s)
}

fn revoked_for(lease: &Lease) -> Option<&str> {
    lease.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_REVOKED)).map(String::as_str)
}

async fn fenced_write(cms: &Api<ConfigMap>, token: i64) -> kube::Result<ConfigMap> {
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "inventory", "labels": {"leasehold.dev/fenced-by": LOCK},
                     "annotations": {ANNOTATION_TOKEN: token.to_string()}},
        "data": {"stock": "1"},
    });
    cms.patch("inventory", &PatchParams::apply("writer").force(), &Patch::Apply(&cm)).await
}

async fn queued(env: &Env, waiters: i32) {
    until(&env.locks(), LOCK, WAIT, "the waiter queued", move |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.queue_length == waiters)
    })
    .await;
}

#[tokio::test]
async fn a_forced_release_raises_the_token_at_once_and_grants_the_next_only_after_the_app_lets_go() {
    let env = Env::new("drain-ack").await;
    let _controller = env.webhook_controller(None, &[]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let mut grants = GrantLog::start(env.leases(), LOCK);
    let cms: Api<ConfigMap> = Api::namespaced(env.ns.client.clone(), env.name());

    let hold_a = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires");
    let token_a = hold_a.token();
    fenced_write(&cms, token_a).await.expect("a's write with its token is admitted");
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, Duration::from_secs(90)).await });
    queued(&env, 1).await;

    // Unstamped, as from an older webhook: it targets the hold the controller first sees.
    env.force_release(LOCK, "stuck batch", None).await;
    let drained = env.draining(LOCK, token_a, WAIT).await;
    assert!(token::of_lease(&drained).expect("a token") > token_a, "the token rose with the revocation");
    assert_eq!(edit::holder(&drained), Some(a.identity().id.as_str()), "the revoked holder stays named");
    assert_eq!(revoked_for(&drained), Some("Forced"));
    match fenced_write(&cms, token_a).await {
        Err(kube::Error::Api(s)) => assert!(s.message.contains("stale"), "{}", s.message),
        other => panic!("a write with the revoked token was admitted: {other:?}"),
    }

    // a is told at once; its app is still busy with what it started: nobody is granted.
    let reason = tokio::time::timeout(WAIT, hold_a.lost()).await.expect("a learns of the revocation");
    assert_eq!(reason, Some(LostReason::Revoked("Forced".into())));
    assert!(!hold_a.is_held());
    env.event("ForceReleased", WAIT).await;
    assert_eq!(grants.grants().len(), 1, "no grant while a's app may still act: {:?}", grants.grants());
    assert!(!waiting_b.is_finished(), "b was granted during the drain");

    // The app lets go: the sidecar (here the claimant API) acknowledges; b is granted.
    let (let_go, let_go_at) = (Instant::now(), Timestamp::now());
    assert!(!hold_a.release().await.was_held, "a revoked hold was not held when let go");
    let hold_b = waiting_b.await.expect("join").expect("b is granted after a's acknowledgement");
    // b's claimant may see its grant before this test's own watch of the Lease does.
    let seen = grants.wait_for(2, WAIT).await;
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1].holder, b.identity().id);
    assert!(seen[1].seen >= let_go, "b was granted before a let go");
    assert!(seen[1].acquire_time >= let_go_at, "b's grant is stamped before a let go: {seen:?}");
    assert!(hold_b.token() > token::of_lease(&drained).expect("a token"), "b's token is above the reserved one");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.ns.client.clone(), env.name());
    let drained_event = leasehold_harness::eventually("a Drained event", WAIT, || async {
        let list = events.list(&Default::default()).await.map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Drained"))
            .and_then(|e| e.note)
            .ok_or_else(|| "none yet".to_owned())
    })
    .await;
    assert!(drained_event.contains("acknowledged"), "the drain ended by the acknowledgement: {drained_event}");
    let lock = until(&env.locks(), LOCK, WAIT, "the force release recorded", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.last_force_release.as_ref()).is_some()
    })
    .await;
    let status = lock.status.expect("status");
    assert_eq!(status.last_force_release.expect("recorded").revoked_token, Some(token_a));
    assert_eq!(status.stats.forced_releases, 1);
    hold_b.release().await;
}

#[tokio::test]
async fn a_frozen_holder_revoked_by_force_is_drained_for_its_lease_duration_since_its_last_renewal() {
    let env = Env::new("drain-frozen").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, timing(6, 4, 1)).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let sidecar = env.sidecar(&a, &[]).await;
    let (status, held) = sidecar.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200, "{held}");
    let token_a = held["fencingToken"].as_i64().expect("a token");
    let mut events = sidecar.events(LOCK).await;
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, Duration::from_secs(60)).await });
    queued(&env, 1).await;

    sidecar.process.signal(libc::SIGSTOP);
    env.force_release(LOCK, "frozen worker", Some(&token_a.to_string())).await;
    let drained = env.draining(LOCK, token_a, WAIT).await;
    let last_renewal = renew_time(&drained);
    let hold_b = waiting_b.await.expect("join").expect("b is granted once the drain times out");
    let seen_at = Timestamp::now();
    let granted_at = acquire_time(&env.leases().get(LOCK).await.expect("the lock Lease"));
    assert!(
        granted_at.duration_since(last_renewal) >= seconds(6) && seen_at.duration_since(last_renewal) >= seconds(6),
        "b was granted {:?} after a's last renewal (seen {:?} after it), within a's lease duration (6 s)",
        granted_at.duration_since(last_renewal),
        seen_at.duration_since(last_renewal)
    );

    // Thawed, a's sidecar tells its app the hold is lost; when the app lets go, its
    // acknowledgement comes too late to touch b's hold.
    sidecar.process.signal(libc::SIGCONT);
    let lost = events.expect("lost", WAIT).await;
    assert_eq!(lost["fencingToken"].as_i64(), Some(token_a), "{lost}");
    let (status, released) = sidecar.release(LOCK).await;
    assert_eq!((status, released["wasHeld"].as_bool()), (200, Some(false)), "{released}");
    let lease = env.leases().get(LOCK).await.expect("the lock Lease");
    assert_eq!(edit::granted_token(&lease, &b.identity()), Some(hold_b.token()), "b's hold untouched");
    assert!(hold_b.is_held());
    hold_b.release().await;
}

async fn delete_pod(env: &Env, name: &str) {
    let pods: Api<Pod> = Api::namespaced(env.ns.client.clone(), env.name());
    pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .expect("delete the pod");
}

#[tokio::test]
async fn a_deleted_pods_holder_is_drained_and_the_next_grant_waits_until_its_belief_ended() {
    let env = Env::new("drain-podgone").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, timing(6, 4, 1)).await;
    env.lock("jobs", timing(6, 4, 1)).await;
    let (a, b, c) = (env.pod("a").await, env.pod("b").await, env.pod("c").await);
    env.wait_claim_rbac(&a).await;

    // A sidecar whose Pod is deleted at once, no grace, while its process keeps running
    // (the apiserver stops accepting its Pod-bound token): it reports the loss, and the
    // next claimant is granted only after that, once the drain is over.
    let sidecar = env.sidecar(&a, &[]).await;
    let (status, held) = sidecar.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200, "{held}");
    let token_a = held["fencingToken"].as_i64().expect("a token");
    let mut events = sidecar.events(LOCK).await;
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, Duration::from_secs(60)).await });
    queued(&env, 1).await;
    let mut watch = LeaseWatch::start(env.leases(), LOCK, WAIT).await;
    delete_pod(&env, "a").await;
    let lost = events.expect("lost", WAIT).await;
    let lost_at = Timestamp::now();
    assert_eq!(lost["fencingToken"].as_i64(), Some(token_a), "{lost}");
    let reason = lost["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("Unauthorized") || reason.contains("PodGone"), "lost because: {reason}");
    let drained = watch.draining(token_a).await;
    assert_eq!(revoked_for(&drained), Some("PodGone"));
    assert!(token::of_lease(&drained).expect("a token") > token_a, "the token rose at once");
    let hold_b = waiting_b.await.expect("join").expect("b is granted once a's belief has ended");
    let granted_at = acquire_time(&env.leases().get(LOCK).await.expect("the lock Lease"));
    assert!(granted_at >= lost_at, "b was granted before a's sidecar reported the loss");
    env.event("PodGone", WAIT).await;
    env.event("Drained", WAIT).await;
    hold_b.release().await;

    // A holder whose app does not let go (it keeps its Hold): the drain lasts the lease
    // duration from its last renewal, whatever its Pod's token still allows.
    let hold_c = c.claimant(env.name()).acquire("jobs", WAIT).await.expect("c acquires");
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire("jobs", Duration::from_secs(60)).await });
    until(&env.locks(), "jobs", WAIT, "b queued", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.queue_length == 1)
    })
    .await;
    let mut watch = LeaseWatch::start(env.leases(), "jobs", WAIT).await;
    delete_pod(&env, "c").await;
    let reason = tokio::time::timeout(WAIT, hold_c.lost()).await.expect("c learns of it").expect("lost");
    assert!(
        matches!(&reason, LostReason::Revoked(why) if why == "PodGone") || matches!(&reason, LostReason::Refused(_)),
        "lost because: {reason}"
    );
    let drained = watch.draining(hold_c.token()).await;
    let hold_b = waiting_b.await.expect("join").expect("b is granted after the drain");
    let granted_at = acquire_time(&env.leases().get("jobs").await.expect("the lock Lease"));
    let last_renewal = renew_time(&drained);
    assert!(
        granted_at.duration_since(last_renewal) >= seconds(6),
        "b was granted {:?} after c's last renewal, within c's lease duration (6 s)",
        granted_at.duration_since(last_renewal)
    );
    drop(hold_c);
    hold_b.release().await;
}

#[tokio::test]
async fn max_hold_self_fences_the_holder_and_the_next_grant_follows_its_end() {
    let env = Env::new("drain-maxhold").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec { max_hold_seconds: Some(3), ..timing(6, 4, 1) }).await;
    env.lock("bounded", DistributedLockSpec { max_hold_seconds: Some(3), ..DistributedLockSpec::default() }).await;
    let (a, b, c) = (env.pod("a").await, env.pod("b").await, env.pod("c").await);
    env.wait_claim_rbac(&a).await;

    // Through the sidecar: the time it promises never reaches past the max hold.
    let sidecar = env.sidecar(&c, &[]).await;
    let (status, held) = sidecar.acquire("bounded", 30.0).await;
    assert_eq!(status, 200, "{held}");
    assert!(held["remainingMs"].as_u64().is_some_and(|ms| ms <= 3000), "{held}");
    assert!(sidecar.view("bounded").await["remainingMs"].as_u64().is_some_and(|ms| ms <= 3000));

    // Every version of the Lease from here on: the hold may end in milliseconds.
    let mut watch = LeaseWatch::start(env.leases(), LOCK, WAIT).await;
    let asked = Instant::now();
    let hold_a = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires");
    let returned = Instant::now();
    let token_a = hold_a.token();
    let granted_a = acquire_time(&watch.until("a's grant", |l| token::of_lease(l) == Some(token_a)).await);
    assert_eq!(hold_a.max_hold(), Some(Duration::from_secs(3)));
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, Duration::from_secs(60)).await });

    // Sampled while held: remaining time never reaches past the max-hold deadline (at
    // most 3 s after the claim or the confirmation it counts from, sent before `returned`).
    let max_deadline = returned + Duration::from_secs(3);
    let mut samples = 0;
    loop {
        let before = Instant::now();
        let Some(remaining) = hold_a.remaining() else { break };
        assert!(before + remaining <= max_deadline, "remaining {remaining:?} reaches past the max-hold deadline");
        samples += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(samples > 0, "never held");
    tokio::time::sleep_until(max_deadline.into()).await;
    assert!(!hold_a.is_held(), "held past its max-hold deadline");
    let reason = hold_a.lost().await.expect("lost");
    assert!(reason == LostReason::MaxHold || reason == LostReason::Revoked("MaxHold".into()), "lost because: {reason}");

    // Two ends race, both at the max hold: the controller drains the hold, or a's holder,
    // self-fenced, gives the lock back first (handing it on to b, whom the Lease names as
    // next). Either way b is granted only after a's max hold, which ran from a's
    // confirmation (sent after the grant) or from a's claim (sent after `asked`, so at
    // most `returned - asked` before the grant).
    let ended = watch
        .until("a's hold ended", |l| {
            let given_back = edit::holder(l).is_none() && token::of_lease(l) == Some(token_a);
            let handed_on = edit::holder(l).is_some_and(|h| h != a.identity().id)
                && token::of_lease(l).is_some_and(|t| t > token_a);
            edit::draining(l) == Some(Some(token_a)) || given_back || handed_on
        })
        .await;
    if edit::draining(&ended).is_some() {
        assert_eq!(revoked_for(&ended), Some("MaxHold"));
    }
    let hold_b = waiting_b.await.expect("join").expect("b is granted after a's max hold");
    let granted_at = acquire_time(&env.leases().get(LOCK).await.expect("the lock Lease"));
    let claim_to_grant = SignedDuration::try_from(returned - asked).expect("a short acquisition");
    assert!(
        granted_at.duration_since(granted_a) >= seconds(3) - claim_to_grant,
        "b was granted {:?} after a's grant, within a's max hold (3 s, from at most {:?} before that grant)",
        granted_at.duration_since(granted_a),
        claim_to_grant
    );
    drop(hold_a);
    hold_b.release().await;
}

#[tokio::test]
async fn a_holder_past_its_max_hold_is_drained_and_the_next_grant_waits_for_its_lease_duration() {
    let env = Env::new("drain-maxhold-stuck").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec { max_hold_seconds: Some(3), ..timing(6, 4, 1) }).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;

    // a confirms its grant once and then neither renews nor gives anything back, as a
    // holder frozen since: only the controller can end the hold, at the max hold.
    let mut watch = LeaseWatch::start(env.leases(), LOCK, WAIT).await;
    let manual = ManualClaimant::claim(&a, env.name(), LOCK).await;
    let (token_a, last_renewal) = manual.confirm(LOCK).await;
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, Duration::from_secs(60)).await });
    queued(&env, 1).await;

    let drained = watch.draining(token_a).await;
    assert_eq!(revoked_for(&drained), Some("MaxHold"));
    assert!(token::of_lease(&drained).expect("a token") > token_a, "the token rose with the revocation");
    let hold_b = waiting_b.await.expect("join").expect("b is granted once the drain times out");
    let granted_at = acquire_time(&env.leases().get(LOCK).await.expect("the lock Lease"));
    assert!(
        granted_at.duration_since(last_renewal) >= seconds(6),
        "b was granted {:?} after a's last renewal, within a's lease duration (6 s)",
        granted_at.duration_since(last_renewal)
    );
    env.event("MaxHold", WAIT).await;
    env.event("Drained", WAIT).await;
    hold_b.release().await;
}

#[tokio::test]
async fn editing_a_held_locks_timing_does_not_shorten_its_holders_protection() {
    let env = Env::new("drain-edit").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, timing(6, 4, 1)).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;

    // a confirms its grant (under lease 6 s) once, then stops renewing.
    let manual = ManualClaimant::claim(&a, env.name(), LOCK).await;
    let (_, last_renewal) = manual.confirm(LOCK).await;
    let shorter = json!({"spec": {"leaseDurationSeconds": 3, "renewDeadlineSeconds": 2, "retryPeriodSeconds": 1}});
    let edited = env.locks().patch(LOCK, &PatchParams::default(), &Patch::Merge(&shorter)).await.expect("edit");
    let generation = edited.metadata.generation;
    until(&env.locks(), LOCK, WAIT, "the edit observed", move |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.observed_generation == generation)
    })
    .await;

    let hold_b = b.claimant(env.name()).acquire(LOCK, WAIT).await.expect("b is granted once a expires");
    let lease = env.leases().get(LOCK).await.expect("the lock Lease");
    let gap = acquire_time(&lease).duration_since(last_renewal);
    assert!(gap >= seconds(6), "b was granted {gap:?} after a's last renewal, within a's granted lease duration (6 s)");
    // b's hold is granted under the new timing.
    assert_eq!(lease.spec.as_ref().and_then(|s| s.lease_duration_seconds), Some(3));
    assert_eq!(hold_b.timing().renew_deadline, Duration::from_secs(2));
    hold_b.release().await;
}

#[tokio::test]
async fn deleting_a_held_lock_drains_before_its_lease_goes_and_a_recreated_lock_gets_a_higher_token() {
    let env = Env::new("drain-delete").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let hold_a = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires");
    let token_a = hold_a.token();
    until(&env.locks(), LOCK, WAIT, "the finalizer", |l: &DistributedLock| {
        l.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == leasehold::crd::FINALIZER))
    })
    .await;

    env.locks().delete(LOCK, &DeleteParams::default()).await.expect("delete the lock");
    let drained = env.draining(LOCK, token_a, WAIT).await;
    assert_eq!(revoked_for(&drained), Some("LockDeleted"));
    let reason = tokio::time::timeout(WAIT, hold_a.lost()).await.expect("a learns of it");
    assert_eq!(reason, Some(LostReason::Revoked("LockDeleted".into())));
    // a's app has not let go: the lock and its Lease stay.
    let lock = env.locks().get(LOCK).await.expect("the lock stays while a may act");
    assert!(lock.metadata.deletion_timestamp.is_some());
    let lease = env.leases().get(LOCK).await.expect("the Lease stays while a may act");
    assert_eq!(edit::holder(&lease), Some(a.identity().id.as_str()));
    env.event("LockDeleted", WAIT).await;

    hold_a.release().await;
    until_gone(&env.leases(), LOCK, WAIT, "the lock Lease deleted after the acknowledgement").await;
    until_gone(&env.locks(), LOCK, WAIT, "the lock deleted").await;
    let raised = token::of_lease(&drained).expect("a token");

    env.lock(LOCK, DistributedLockSpec::default()).await;
    let hold_b = b.claimant(env.name()).acquire(LOCK, WAIT).await.expect("b holds the re-created lock");
    assert!(hold_b.token() > raised && raised > token_a, "tokens {token_a} < {raised} < {}", hold_b.token());
    hold_b.release().await;
}

#[tokio::test]
async fn a_controller_restarted_mid_drain_waits_a_full_lease_duration_from_its_first_sighting() {
    let env = Env::new("drain-restart").await;
    let mut controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, timing(6, 4, 1)).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let manual = ManualClaimant::claim(&a, env.name(), LOCK).await;
    let (token_a, _) = manual.confirm(LOCK).await;
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, Duration::from_secs(60)).await });
    queued(&env, 1).await;

    env.force_release(LOCK, "replace the worker", Some(&token_a.to_string())).await;
    env.draining(LOCK, token_a, WAIT).await;
    controller.kill();
    let restarted = Timestamp::now();
    let _controller = env.controller(&["--leader-elect=false"]).await;

    let hold_b = waiting_b.await.expect("join").expect("b is granted after the drain");
    let granted_at = acquire_time(&env.leases().get(LOCK).await.expect("the lock Lease"));
    assert!(
        granted_at.duration_since(restarted) >= seconds(6),
        "the new controller ended the drain {:?} after it started, before a full lease duration (6 s)",
        granted_at.duration_since(restarted)
    );
    hold_b.release().await;
}

#[tokio::test]
async fn a_renewal_refused_with_401_is_a_loss_at_once() {
    let env = Env::new("drain-401").await;
    let mut controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, timing(15, 10, 2)).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires");
    // No controller to revoke anything: only the renewal can tell.
    controller.kill();
    let pods: Api<Pod> = Api::namespaced(env.ns.client.clone(), env.name());
    pods.delete("a", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .expect("delete pod a");
    let reason = tokio::time::timeout(WAIT, hold.lost()).await.expect("a loses the hold").expect("lost");
    match reason {
        LostReason::Refused(message) => assert!(message.contains("Unauthorized"), "{message}"),
        other => panic!("a renewal refused with 401 was not a loss by refusal: {other}"),
    }
}

#[tokio::test]
async fn a_lock_lease_deleted_under_a_hold_is_recreated_draining_it_until_the_holder_lets_go() {
    let env = Env::new("drain-leasedel").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, timing(20, 15, 2)).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let sidecar = env.sidecar(&a, &[]).await;
    let (status, held) = sidecar.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200, "{held}");
    let token_a = held["fencingToken"].as_i64().expect("a token");
    let mut events = sidecar.events(LOCK).await;
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, Duration::from_secs(60)).await });
    queued(&env, 1).await;

    // Deleted as the garbage collector (or an administrator) can: a's app is still inside
    // the time it was told, so the Lease comes back draining a's hold, not free.
    let old_uid = env.leases().get(LOCK).await.expect("the lock Lease").metadata.uid;
    let mut watch = LeaseWatch::start(env.leases(), LOCK, WAIT).await;
    let as_gc: Api<Lease> =
        Api::namespaced(env.impersonating(crate::support::locks::GARBAGE_COLLECTOR).await, env.name());
    as_gc.delete(LOCK, &DeleteParams::default()).await.expect("delete the held lock Lease");
    let lost = events.expect("lost", WAIT).await;
    assert_eq!(lost["fencingToken"].as_i64(), Some(token_a), "{lost}");
    let recreated = watch.draining(token_a).await;
    assert_ne!(recreated.metadata.uid, old_uid, "a new Lease");
    assert_eq!(revoked_for(&recreated), Some("LeaseDeleted"));
    assert_eq!(edit::holder(&recreated), Some(a.identity().id.as_str()), "the holder is still named");
    assert!(token::of_lease(&recreated).expect("a token") > token_a, "the token rose at once");
    env.event("LeaseDeleted", WAIT).await;
    // The drain lasts a's lease duration (20 s) unless a lets go: b cannot have been
    // granted while a's app has not released.
    assert!(!waiting_b.is_finished(), "b was granted while a's app still held");

    // a's app lets go: the sidecar acknowledges the drain and b is granted after that.
    let (status, released) = sidecar.release(LOCK).await;
    assert_eq!(status, 200, "{released}");
    let hold_b = waiting_b.await.expect("join").expect("b is granted once a let go");
    assert!(hold_b.token() > token_a);
    env.event("Drained", WAIT).await;
    hold_b.release().await;
}

/// Refuses every write of the lock's status in this namespace (a failing status write, as
/// the apiserver may answer any): a ValidatingAdmissionPolicy bound here alone. Returns
/// its name, for [`allow_status_writes`].
async fn refuse_status_writes(env: &Env) -> String {
    let name = format!("refuse-lock-status-{}", env.name());
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["leasehold.dev"], "apiVersions": ["*"],
                "operations": ["UPDATE"], "resources": ["distributedlocks/status"]}]},
            "validations": [{"expression": "false", "message": "lock status writes are refused here"}],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.name()}}}},
    });
    let params = PatchParams::apply("leasehold-e2e").force();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(env.ns.client.clone());
    policies.patch(&name, &params, &Patch::Apply(&policy)).await.expect("apply the policy");
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(env.ns.client.clone());
    bindings.patch(&name, &params, &Patch::Apply(&binding)).await.expect("apply the binding");
    let locks = env.locks();
    let probe = PatchParams { dry_run: true, ..PatchParams::default() };
    leasehold_harness::eventually("lock status writes are refused", WAIT, || async {
        match locks.patch_status(LOCK, &probe, &Patch::Merge(json!({"status": {"queueLength": 0}}))).await {
            Err(kube::Error::Api(s)) if s.message.contains("lock status writes are refused here") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    name
}

/// Removes the policy and binding [`refuse_status_writes`] made.
async fn allow_status_writes(env: &Env, name: &str) {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(env.ns.client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(env.ns.client.clone());
    bindings.delete(name, &DeleteParams::default()).await.expect("delete the binding");
    policies.delete(name, &DeleteParams::default()).await.expect("delete the policy");
}

#[tokio::test]
async fn a_lock_lease_deleted_while_status_trails_is_recreated_above_every_token_and_drained_unacknowledged() {
    let env = Env::new("drain-trailing").await;
    // The first leader's wall clock stands still: each token it mints is the one before
    // plus one, so the tokens issued after its last status write are just above the token
    // status records.
    let clocks = std::env::temp_dir().join(format!("leasehold-e2e-{}-clocks", env.name()));
    std::fs::create_dir_all(&clocks).expect("a directory for the clocks");
    let (frozen, behind) = (clocks.join("frozen"), clocks.join("behind"));
    set_clock(&frozen, &Timestamp::now().strftime("%Y-%m-%d %H:%M:%S").to_string());
    set_clock(&behind, "-3600");
    let mut first = env.controller_under_clock(&frozen, &["--leader-elect=false"]).await;
    env.lock(LOCK, timing(20, 15, 2)).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let hold_a = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires");
    let token_a = hold_a.token();
    until(&env.locks(), LOCK, WAIT, "status names a", move |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.holders.first()).is_some_and(|h| h.fencing_token == token_a)
    })
    .await;

    // Status stops following the grants: a lets go and b is granted, which status never
    // shows (held back under contention, or its write refused as here).
    let policy = refuse_status_writes(&env).await;
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, WAIT).await });
    hold_a.release().await;
    let hold_b = waiting_b.await.expect("join").expect("b is granted");
    let token_b = hold_b.token();
    assert!(token_b > token_a);
    let trailing = env.locks().get(LOCK).await.expect("the lock").status.expect("a status");
    assert_eq!(trailing.fencing_token, Some(token_a), "status still shows a's grant alone");

    // The first leader goes; the Lease is deleted before a new leader — its clock an hour
    // behind — has seen it. The new leader knows only what status says.
    first.kill();
    let old_uid = env.leases().get(LOCK).await.expect("the lock Lease").metadata.uid;
    let as_gc: Api<Lease> =
        Api::namespaced(env.impersonating(crate::support::locks::GARBAGE_COLLECTOR).await, env.name());
    as_gc.delete(LOCK, &DeleteParams::default()).await.expect("delete the lock Lease");
    let _second = env.controller_under_clock(&behind, &["--leader-elect=false"]).await;
    let recreated = until(&env.leases(), LOCK, WAIT, "the Lease re-created", move |l: &Lease| {
        l.metadata.uid.is_some() && l.metadata.uid != old_uid
    })
    .await;

    let raised = token::of_lease(&recreated).expect("a token");
    assert!(
        raised > token_b,
        "the re-created Lease's token {raised} is not above b's {token_b}, which status never showed"
    );
    assert_eq!(revoked_for(&recreated), Some("LeaseDeleted"));
    assert_eq!(edit::holder(&recreated), Some(a.identity().id.as_str()), "the holder status names is drained");
    assert_eq!(
        edit::draining(&recreated),
        Some(Some(raised)),
        "drained under the raised token, which no claimant was handed: nobody acknowledges it"
    );
    assert!(edit::given_back(&recreated, &a.identity(), token_a).is_none(), "a cannot end the drain");
    let lost = tokio::time::timeout(WAIT, hold_b.lost()).await.expect("b loses the hold");
    assert!(lost.is_some(), "b is told its hold is lost");
    allow_status_writes(&env, &policy).await;
}
