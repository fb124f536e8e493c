//! A claimant acquiring a lock again starts from the terms it learned before instead of
//! reading the lock, against the real control plane: its hold still lives by the terms
//! its grant records (the lock's spec edited meanwhile), and a lock deleted since is
//! answered as unknown at once, not after the caller's wait.

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};
use leasehold::claim::AcquireError;
use leasehold::crd::{DistributedLock, DistributedLockSpec};
use serde_json::json;

use crate::drain::timing;
use crate::support::Env;
use crate::support::watch::{until, until_gone};

const LOCK: &str = "orders";
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_claimant_acquiring_again_holds_by_the_terms_its_grant_records_not_those_it_learned_before() {
    let env = Env::new("terms-edit").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec { max_hold_seconds: Some(60), ..timing(15, 10, 2) }).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let claimant = a.claimant(env.name());
    let first = claimant.acquire(LOCK, WAIT).await.expect("a acquires");
    assert_eq!((first.timing().renew_deadline, first.max_hold()), (secs(10), Some(secs(60))));
    first.release().await;

    let shorter = json!({"spec": {
        "leaseDurationSeconds": 6, "renewDeadlineSeconds": 4, "retryPeriodSeconds": 1, "maxHoldSeconds": 20
    }});
    let edited = env.locks().patch(LOCK, &PatchParams::default(), &Patch::Merge(&shorter)).await.expect("edit");
    let generation = edited.metadata.generation;
    until(&env.locks(), LOCK, WAIT, "the edit observed", move |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.observed_generation == generation)
    })
    .await;

    let again = claimant.acquire(LOCK, WAIT).await.expect("a acquires again");
    assert_eq!(again.timing().lease_duration, secs(6), "the grant's lease duration, not the one a learned first");
    assert_eq!(again.timing().renew_deadline, secs(4), "the grant's renew deadline, not the one a learned first");
    assert_eq!(again.max_hold(), Some(secs(20)), "the grant's max hold, not the one a learned first");
    again.release().await;
}

#[tokio::test]
async fn a_claimant_acquiring_a_lock_deleted_since_its_last_hold_is_told_the_lock_does_not_exist() {
    let env = Env::new("terms-deleted").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let claimant = a.claimant(env.name());
    claimant.acquire(LOCK, WAIT).await.expect("a acquires").release().await;

    env.locks().delete(LOCK, &DeleteParams::default()).await.expect("delete the lock");
    until_gone(&env.locks(), LOCK, WAIT, "the lock deleted").await;
    until_gone(&env.leases(), LOCK, WAIT, "the lock Lease deleted").await;

    // A wait far longer than the test's own timeout: only an answer from the lock ends it.
    let acquired = tokio::time::timeout(WAIT, claimant.acquire(LOCK, Duration::from_secs(3600)))
        .await
        .expect("the acquisition is answered before its wait");
    match acquired {
        Err(AcquireError::UnknownLock { namespace, lock }) => {
            assert_eq!((namespace.as_str(), lock.as_str()), (env.name(), LOCK))
        }
        Err(other) => panic!("acquiring a deleted lock failed otherwise: {other}"),
        Ok(hold) => panic!("a deleted lock was acquired with token {}", hold.token()),
    }
    assert!(env.claims().list(&Default::default()).await.expect("claims").items.is_empty(), "its claim withdrawn");
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
