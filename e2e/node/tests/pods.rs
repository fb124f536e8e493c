//! Locks and logs for the node tests; the app pods themselves are `leasehold_harness::node::apps`.

use std::time::Duration;

use kube::api::{Api, PostParams};
use leasehold::crd::{DistributedLock, DistributedLockSpec};
pub use leasehold_harness::node::apps::{acquired_token, acquirer, container_id, identity};

use crate::e2e_support::lifecycle::wait_for;

/// Creates lock `name` with default timings and waits until the controller has reconciled
/// it (its status appears; the namespace's claimant RBAC is prepared with it).
pub async fn lock(client: &kube::Client, namespace: &str, name: &str) {
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), namespace);
    locks
        .create(&PostParams::default(), &DistributedLock::new(name, DistributedLockSpec::default()))
        .await
        .expect("create the lock");
    wait_for(&locks, name, Duration::from_secs(60), "the controller to reconcile the lock", |l: &DistributedLock| {
        l.status.is_some()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// `kubectl logs` of a container.
pub fn logs(namespace: &str, pod: &str, container: &str) -> String {
    let output = crate::support::kubectl()
        .args(["logs", "-n", namespace, pod, "-c", container])
        .output()
        .expect("run kubectl logs");
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}
