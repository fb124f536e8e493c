//! Holders that go away on a real node, and how soon the next waiter is granted — measured
//! from the moment the test acts to the grant seen on a watch of the lock Lease:
//! - the holder's app container killed (SIGKILL of its process, `restartPolicy: Never`):
//!   the pod ends, kubelet stops the sidecar, which releases;
//! - the holder pod deleted, or evicted, with a grace period: its sidecar releases on
//!   termination (a release, not a revocation or an expiry).
//!
//! Bounds asserted are the documented ones: a release is handed over long before the
//! lease could expire (`leaseDurationSeconds`, 15 s here); the figures are printed.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, PostParams};
use leasehold::crd::DistributedLock;

use crate::e2e_support::watch::GrantLog;
use crate::pods::{acquirer, container_id, identity, lock};
use crate::support::{installed, node, wait_pod};

/// The lock's lease duration (the default): a hold that is released must be handed over
/// well within it, since nothing waits for an expiry.
const LEASE: Duration = Duration::from_secs(15);

/// Waits until `pod` waits for the lock in the controller's view (`status.waiters`).
async fn claimed(locks: &Api<DistributedLock>, pod: &Pod) {
    let who = identity(pod);
    let what = format!("{who} among the lock's waiters");
    crate::e2e_support::watch::until(locks, "work", Duration::from_secs(60), &what, |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.waiters.iter().any(|w| w.identity == who))
    })
    .await;
}

/// The lock's statistics once its status records `grants` grants (status follows the Lease).
async fn recorded(admin: &kube::Client, namespace: &str, grants: i64) -> leasehold::crd::LockStats {
    let locks: Api<DistributedLock> = Api::namespaced(admin.clone(), namespace);
    let what = format!("status to record {grants} grants");
    let lock =
        crate::e2e_support::watch::until(&locks, "work", Duration::from_secs(30), &what, |l: &DistributedLock| {
            l.status.as_ref().is_some_and(|s| s.stats.grants >= grants)
        })
        .await;
    lock.status.map(|s| s.stats).unwrap_or_default()
}

async fn running(pods: &Api<Pod>, name: &str) -> Pod {
    wait_pod(pods, name, "Running", |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()?.phase.clone()).as_deref() == Some("Running")
    })
    .await
}

#[tokio::test]
async fn killing_the_holders_app_container_hands_the_lock_to_the_next_waiter_when_its_pod_ends() {
    let node = node();
    installed();
    let admin = node.admin_client().await;
    let ns = node.namespace("kill-app").await;
    lock(&admin, &ns.name, "work").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns.name);
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns.name);
    let mut grants = GrantLog::start(leases.clone(), "work");

    pods.create(&PostParams::default(), &acquirer("holder", "work", "Never")).await.expect("create the holder");
    let holder = running(&pods, "holder").await;
    let first = grants.wait_for(1, Duration::from_secs(60)).await;
    assert_eq!(first[0].holder, identity(&holder));
    pods.create(&PostParams::default(), &acquirer("waiter", "work", "Never")).await.expect("create the waiter");
    let waiter = running(&pods, "waiter").await;
    claimed(&Api::namespaced(admin.clone(), &ns.name), &waiter).await;

    // SIGKILL of the app's process, from the node (as the OOM killer or a crash would).
    let holder = pods.get("holder").await.expect("the holder");
    let pid = node.container_pid(&container_id(&holder, "app")).expect("the app's pid");
    let killed = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL)
        .expect("kill the app container's process");
    let seen = grants.wait_for(2, LEASE + Duration::from_secs(5)).await;
    let handover = seen[1].seen - killed;
    eprintln!("app container killed → next holder granted: {:.0} ms", handover.as_secs_f64() * 1000.0);
    assert_eq!(seen[1].holder, identity(&waiter), "the waiter is next");
    assert!(seen[1].token > seen[0].token, "tokens increase");
    assert!(handover < LEASE, "handed over after {handover:?}: not a release but an expiry");
    let stats = recorded(&admin, &ns.name, 2).await;
    assert_eq!(
        (stats.releases, stats.expirations),
        (1, 0),
        "released by the stopping sidecar: {stats:?}\nits log:\n{}",
        crate::pods::logs(&ns.name, "holder", "leasehold-sidecar")
    );
}

#[tokio::test]
async fn deleting_or_evicting_the_holders_pod_releases_on_termination() {
    let node = node();
    installed();
    let admin = node.admin_client().await;
    let ns = node.namespace("delete-pod").await;
    lock(&admin, &ns.name, "work").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns.name);
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns.name);
    let mut grants = GrantLog::start(leases.clone(), "work");

    let mut expected = Vec::new();
    for name in ["first", "second", "third"] {
        pods.create(&PostParams::default(), &acquirer(name, "work", "Always")).await.expect("create a pod");
        let pod = running(&pods, name).await;
        if name == "first" {
            grants.wait_for(1, Duration::from_secs(60)).await;
        } else {
            claimed(&Api::namespaced(admin.clone(), &ns.name), &pod).await;
        }
        expected.push(identity(&pod));
    }

    // Deleted with its grace period: the app exits on SIGTERM, then kubelet stops the sidecar.
    let deleted = Instant::now();
    pods.delete("first", &DeleteParams::default()).await.expect("delete the holder");
    let seen = grants.wait_for(2, LEASE).await;
    let deletion = seen[1].seen - deleted;
    // Evicted (a drain): the same path.
    let evicted = Instant::now();
    pods.evict("second", &EvictParams::default()).await.expect("evict the next holder");
    let seen = grants.wait_for(3, LEASE).await;
    let eviction = seen[2].seen - evicted;
    eprintln!(
        "holder pod deleted → next granted: {:.0} ms; evicted → next granted: {:.0} ms",
        deletion.as_secs_f64() * 1000.0,
        eviction.as_secs_f64() * 1000.0
    );
    let holders: Vec<&str> = seen.iter().map(|g| g.holder.as_str()).collect();
    assert_eq!(holders, expected.iter().map(String::as_str).collect::<Vec<_>>(), "granted in claim order");
    assert!(seen.windows(2).all(|w| w[1].token > w[0].token), "tokens increase: {seen:?}");
    let stats = recorded(&admin, &ns.name, 3).await;
    assert_eq!((stats.releases, stats.expirations), (2, 0), "both released on termination: {stats:?}");
}
