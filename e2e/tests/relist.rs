//! The controller after its watches re-list, against a real control plane it restarts:
//! what changed while a watch was down arrives as a list, which the controller's caches
//! take in whole at its end. A lock created meanwhile is reconciled once its cache shows
//! it, with no later event to remind the controller of it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use leasehold::crd::{DistributedLock, DistributedLockSpec};
use leasehold::lease::slot::lease_name;
use leasehold_harness::ControlPlane;

use crate::support::Env;
use crate::support::watch::until;

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_lock_created_while_the_controllers_watches_were_down_is_reconciled_after_they_relist() {
    // Its own control plane: restarting the shared apiserver would break the other tests.
    let cp: &'static ControlPlane = Box::leak(Box::new(
        tokio::task::spawn_blocking(ControlPlane::start).await.expect("join").expect("start a control plane"),
    ));
    let ns = cp.namespace("relist").await;
    crate::support::install_crd(&ns.client).await;
    let env = Env { cp, ns };
    // No election: a replica that lost its leadership while stopped would look at every
    // lock again when it leads again, whatever its watches did.
    let controller = env.controller(&["--leader-elect=false"]).await;
    env.lock("before", DistributedLockSpec::default()).await;
    until(&env.leases(), &lease_name("before", 0), WAIT, "the first lock's Lease", |_| true).await;

    // The controller is stopped while the apiserver restarts and a lock is created: its
    // watches resume from a version the new apiserver's watch cache no longer has, and
    // list everything again.
    controller.signal(libc::SIGSTOP);
    tokio::task::spawn_blocking(move || cp.restart_apiserver()).await.expect("join").expect("restart the apiserver");
    // A new client: the old one's connections went with the old apiserver.
    let client = cp.admin_client().await;
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), env.name());
    locks
        .create(&PostParams::default(), &DistributedLock::new("during", DistributedLockSpec::default()))
        .await
        .expect("create a lock while the controller is stopped");
    controller.signal(libc::SIGCONT);

    let leases: Api<Lease> = Api::namespaced(client, env.name());
    until(
        &leases,
        &lease_name("during", 0),
        WAIT,
        "the Lease of the lock created while the controller was stopped",
        |_| true,
    )
    .await;
}
