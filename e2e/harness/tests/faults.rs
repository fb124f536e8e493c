//! The fault-injection handles of a separate control plane: stopping and restarting etcd
//! and kube-apiserver keeps ports, flags and data.

use std::time::Duration;

use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::api::{Api, PostParams};
use leasehold_harness::{ControlPlane, process_exists};

#[tokio::test]
async fn components_restart_with_their_data() {
    let control_plane = ControlPlane::start().expect("a separate control plane should start");
    let config_maps = Api::<ConfigMap>::namespaced(control_plane.admin_client().await, "default");
    let marker = ConfigMap {
        metadata: ObjectMeta { name: Some("survives-restarts".to_owned()), ..ObjectMeta::default() },
        ..ConfigMap::default()
    };
    config_maps.create(&PostParams::default(), &marker).await.expect("creating a ConfigMap should succeed");

    let before = control_plane.child_pids();
    control_plane.stop_apiserver();
    let after_stop = control_plane.child_pids();
    assert_eq!(after_stop.len(), 2, "only etcd and the controller-manager remain");
    let stopped: Vec<u32> = before.iter().copied().filter(|pid| !after_stop.contains(pid)).collect();
    assert!(stopped.iter().all(|pid| !process_exists(*pid)), "the stopped apiserver {stopped:?} must be gone");
    let unreachable = tokio::time::timeout(Duration::from_secs(10), config_maps.get("survives-restarts"))
        .await
        .expect("a request to a stopped apiserver fails fast");
    assert!(unreachable.is_err(), "the apiserver must be down: {unreachable:?}");

    control_plane.stop_etcd();
    assert_eq!(control_plane.child_pids().len(), 1, "only the controller-manager remains");
    control_plane.start_etcd().expect("etcd should restart");
    control_plane.start_apiserver().expect("the apiserver should restart");
    assert_eq!(control_plane.child_pids().len(), 3, "all three components run again");

    // Same URL, CA and token: a new client from the same settings reaches the data.
    let config_maps = Api::<ConfigMap>::namespaced(control_plane.admin_client().await, "default");
    config_maps.get("survives-restarts").await.expect("data written before the restarts must survive them");
}
