//! The lock Lease and its tokens against the real control plane: a Lease deleted (even
//! twice, as the garbage collector would) is re-created; a Lease is the lock's only when
//! its labels and owner reference both say so; a token no controller could have minted,
//! or no token left, stops grants instead of reusing a token; a force-release request
//! revokes only the hold it targets.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use leasehold::claim::{AcquireError, edit};
use leasehold::crd::{ANNOTATION_FORCE_RELEASE, ANNOTATION_TOKEN, DistributedLock, DistributedLockSpec};
use leasehold::lease::token;
use serde_json::json;

use crate::support::Env;
use crate::support::locks::GARBAGE_COLLECTOR;
use crate::support::watch::until;

const LOCK: &str = "orders";
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_lock_lease_deleted_twice_by_the_garbage_collector_is_recreated_each_time() {
    let env = Env::new("lease-gc").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a first grant");
    let first = hold.token();
    hold.release().await;

    // Deleted as kube-controller-manager's garbage collector deletes, twice, with no
    // write of the controller's in between the re-creation and the second deletion.
    let as_gc: Api<Lease> = Api::namespaced(env.impersonating(GARBAGE_COLLECTOR).await, env.name());
    let mut uid = env.leases().get(LOCK).await.expect("the lock Lease").uid();
    for round in 1..=2 {
        as_gc.delete(LOCK, &DeleteParams::default()).await.unwrap_or_else(|e| panic!("deletion {round}: {e}"));
        let old = uid.clone();
        let recreated = until(&env.leases(), LOCK, WAIT, &format!("the Lease re-created after deletion {round}"), {
            move |l: &Lease| l.uid() != old
        })
        .await;
        assert!(token::of_lease(&recreated).is_some_and(|t| t >= first), "the token record survives: {recreated:?}");
        uid = recreated.uid();
    }
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("granted on the re-created Lease");
    assert!(hold.token() > first);
    hold.release().await;
}

#[tokio::test]
async fn an_unlabelled_lease_with_the_locks_owner_reference_is_not_adopted() {
    let env = Env::new("lease-unlabelled").await;
    let lock = env.lock(LOCK, DistributedLockSpec::default()).await;
    let impostor = Lease {
        metadata: ObjectMeta {
            name: Some(LOCK.into()),
            owner_references: Some(vec![OwnerReference {
                api_version: DistributedLock::api_version(&()).into_owned(),
                kind: DistributedLock::kind(&()).into_owned(),
                name: LOCK.into(),
                uid: lock.uid().expect("a uid"),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some("someone-else".into()),
            ..Default::default()
        }),
    };
    let impostor = env.leases().create(&PostParams::default(), &impostor).await.expect("create the Lease");
    let _controller = env.controller(&["--leader-elect=false"]).await;
    let lock = env.ready_reason(LOCK, "LeaseConflict", WAIT).await;
    let ready = lock.status.expect("status").conditions.into_iter().find(|c| c.type_ == "Ready").expect("Ready");
    assert!(ready.message.contains("lacks the labels"), "{}", ready.message);
    let after = env.leases().get(LOCK).await.expect("the Lease");
    assert_eq!(after.resource_version(), impostor.resource_version(), "the unlabelled Lease was written to");

    // Once it goes, the lock recovers on its own: its own Lease, and grants.
    env.leases().delete(LOCK, &DeleteParams::default()).await.expect("delete the impostor");
    env.ready_reason(LOCK, "LeaseOwned", WAIT).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("granted once the conflict is gone");
    hold.release().await;
}

#[tokio::test]
async fn a_token_no_controller_could_have_minted_stops_grants_and_is_reported() {
    let env = Env::new("lease-tampered").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a first grant");
    let first = hold.token();
    hold.release().await;

    // Written around the guard (here: by the admin; with the guard in place, only as the
    // controller's own identity): the largest token there is.
    let patch = json!({"metadata": {"annotations": {ANNOTATION_TOKEN: i64::MAX.to_string()}}});
    env.leases().patch(LOCK, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("tamper");
    let lock = env.ready_reason(LOCK, "TokenTampered", WAIT).await;
    let ready = lock.status.expect("status").conditions.into_iter().find(|c| c.type_ == "Ready").expect("Ready");
    assert!(ready.message.contains(&i64::MAX.to_string()), "{}", ready.message);
    env.event("TokenTampered", WAIT).await;
    match b.claimant(env.name()).acquire(LOCK, Duration::from_secs(4)).await {
        Err(AcquireError::Timeout { .. }) => {}
        other => panic!("granted despite a tampered token: {:?}", other.map(|h| h.token())),
    }
    let lock = env.locks().get(LOCK).await.expect("the lock");
    assert!(lock.status.and_then(|s| s.fencing_token).is_some_and(|t| t < i64::MAX), "status took the tampered token");

    // An administrator deletes the Lease: re-created from the trusted record, grants resume.
    env.leases().delete(LOCK, &DeleteParams::default()).await.expect("delete the tampered Lease");
    let hold = b.claimant(env.name()).acquire(LOCK, WAIT).await.expect("granted on the re-created Lease");
    assert!(hold.token() > first && hold.token() < i64::MAX, "token {} after {first}", hold.token());
    env.ready_reason(LOCK, "LeaseOwned", WAIT).await;
    hold.release().await;
}

#[tokio::test]
async fn with_every_token_issued_nothing_is_granted_and_no_token_is_reused() {
    let env = Env::new("lease-exhausted").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    until(&env.locks(), LOCK, WAIT, "a status", |l: &DistributedLock| l.status.is_some()).await;
    // The record says the last token was issued (the status subresource, as the admin).
    let patch = json!({"status": {"fencingToken": i64::MAX}});
    env.locks().patch_status(LOCK, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("exhaust");
    env.ready_reason(LOCK, "TokenExhausted", WAIT).await;
    env.event("TokenExhausted", WAIT).await;
    match a.claimant(env.name()).acquire(LOCK, Duration::from_secs(4)).await {
        Err(AcquireError::Timeout { .. }) => {}
        other => panic!("granted with no token left: {:?}", other.map(|h| h.token())),
    }
    let lock = env.ready_reason(LOCK, "TokenExhausted", WAIT).await;
    assert_eq!(lock.status.and_then(|s| s.fencing_token), Some(i64::MAX), "the record never goes back");
    let lease = env.leases().get(LOCK).await.expect("the lock Lease");
    assert_eq!(edit::holder(&lease), None, "nobody holds it");
}

#[tokio::test]
async fn a_stale_force_release_never_revokes_a_later_holder() {
    let env = Env::new("lease-stale-force").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let hold_a = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires");
    let token_a = hold_a.token();
    hold_a.release().await;
    let hold_b = b.claimant(env.name()).acquire(LOCK, WAIT).await.expect("b acquires");

    // A request stamped while a held (its clearing never happened) arrives now.
    env.force_release(LOCK, "a was stuck", Some(&token_a.to_string())).await;
    let lock = until(&env.locks(), LOCK, WAIT, "the request recorded and cleared", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.last_force_release.as_ref()).is_some()
            && !l.annotations().contains_key(ANNOTATION_FORCE_RELEASE)
    })
    .await;
    let status = lock.status.expect("status");
    let record = status.last_force_release.expect("recorded");
    assert_eq!((record.reason.as_str(), record.revoked_token), ("a was stuck", None), "it revoked nothing");
    assert_eq!(status.stats.forced_releases, 0);
    assert_eq!(status.holder.expect("b holds").fencing_token, hold_b.token());
    let lease = env.leases().get(LOCK).await.expect("the lock Lease");
    assert_eq!(edit::granted_token(&lease, &b.identity()), Some(hold_b.token()), "b's hold untouched");
    assert!(hold_b.is_held());
    env.event("ForceReleaseSkipped", WAIT).await;

    // A request made while nothing was held (`none`) revokes nothing either.
    env.force_release(LOCK, "nothing held then", Some("none")).await;
    until(&env.locks(), LOCK, WAIT, "the second request cleared", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.last_force_release.as_ref()).is_some_and(|r| r.reason == "nothing held then")
            && !l.annotations().contains_key(ANNOTATION_FORCE_RELEASE)
    })
    .await;
    assert!(hold_b.is_held());
    hold_b.release().await;
}
