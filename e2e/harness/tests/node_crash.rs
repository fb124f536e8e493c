//! The node's start-up is idempotent after a crash: a supervisor killed with SIGKILL leaves
//! its pods' containers and containerd's shims running (they are daemons), and the next
//! start finds and removes them — and everything else of the crashed run — before it
//! starts anew.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use leasehold_harness::Node;
use leasehold_harness::node::BUSYBOX_IMAGE;
use nix::sys::signal::kill;
use nix::unistd::Pid;

/// Pids of processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(needle))
        })
        .collect()
}

#[tokio::test]
async fn a_start_after_a_crash_removes_what_the_crashed_node_left() {
    let dir = leasehold_harness::node::test_dir().with_file_name("crash");
    let first = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || Node::start(&dir, &[])
    })
    .await
    .expect("join")
    .expect("the first node starts");
    let pods: Api<Pod> = Api::namespaced(first.admin_client().await, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "survivor"},
        "spec": {"containers": [{"name": "c", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]},
    }))
    .expect("a Pod");
    pods.create(&PostParams::default(), &pod).await.expect("create a pod");
    leasehold_harness::eventually("the pod to run", Duration::from_secs(120), || async {
        let phase = pods.get("survivor").await.map_err(|e| e.to_string())?.status.and_then(|s| s.phase);
        if phase.as_deref() == Some("Running") { Ok(()) } else { Err(format!("phase {phase:?}")) }
    })
    .await;

    // The crash: SIGKILL, no teardown. The pod's shim and container live on.
    let socket = first.state.containerd_socket.display().to_string();
    // `crash` returns once the supervisor is reaped: a kill(2) alone returns while the
    // process may still hold the machine-wide node lock.
    first.crash();
    let shims = processes_mentioning(&socket);
    assert!(!shims.is_empty(), "a crashed node leaves its shims running (or this test proves nothing)");

    let second = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || Node::start(&dir, &[])
    })
    .await
    .expect("join")
    .expect("the node starts again after the crash");
    for pid in shims {
        assert!(kill(Pid::from_raw(pid), None).is_err(), "shim {pid} of the crashed node is still running");
    }
    let log = std::fs::read_to_string(dir.join("supervisor.log")).expect("the supervisor's log");
    assert!(log.contains("left by an earlier run") && log.contains("containerd shims"), "{log}");
    // And the new node works: it is a fresh cluster.
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(second.admin_client().await);
    assert_eq!(nodes.list(&Default::default()).await.expect("nodes").items.len(), 1);
    let pods: Api<Pod> = Api::namespaced(second.admin_client().await, "default");
    assert!(pods.get_opt("survivor").await.expect("read").is_none(), "a fresh cluster, not the crashed one's state");
}
