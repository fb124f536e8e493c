//! Test harness for Leasehold's end-to-end tests: a real `etcd`, `kube-apiserver` and
//! `kube-controller-manager` on loopback, built from Go modules by
//! `e2e/controlplane/build.sh` (the model of controller-runtime's envtest, without
//! downloads).
//!
//! Most tests use [`shared()`]: one control plane per test binary, started on first use
//! and killed when the process exits. Each test works in its own [`TestNamespace`], which
//! dumps the namespace's objects to stderr if the test panics. Tests that break the
//! control plane on purpose, or check its teardown, start their own with
//! [`ControlPlane::start`].
//!
//! Everything here waits on conditions with deadlines; nothing sleeps to synchronise.
//! Helpers that return plain values (clients, namespaces, Pods, tokens) are test helpers:
//! they panic with a message naming what failed rather than return errors.
//!
//! Beyond the control plane: [`netfault::FaultProxy`] puts network faults (delay, reset,
//! blackhole) between one client and one server, and [`postgres::Postgres`] runs a
//! throwaway PostgreSQL server for resource-side fencing tests and examples.
//!
//! [`profile`] reads where kube-apiserver's CPU goes from a CPU profile of it.
//!
//! [`node`] adds a real node (kubelet, containerd, kube-proxy, kube-scheduler) in network
//! and mount namespaces of its own, for tests that run Leasehold in real pods.
//!
//! Component logs (`etcd.log`, `kube-apiserver.log`, `kube-controller-manager.log`) are in
//! [`ControlPlane::work_dir`]; it is removed at exit unless a test failed. Only Linux is
//! supported (`PR_SET_PDEATHSIG`, `/proc`).

mod binaries;
mod components;
mod controlplane;
mod kubeconfig;
mod namespace;
pub mod netfault;
pub mod node;
mod pki;
pub mod postgres;
pub mod process;
pub mod profile;
pub mod schemas;
mod startup;
mod wait;

use std::sync::OnceLock;

pub use controlplane::ControlPlane;
pub use namespace::TestNamespace;
pub use netfault::{Fault, FaultProxy};
pub use node::{Node, shared_node};
pub use postgres::Postgres;
pub use process::{Supervised, process_exists};
pub use wait::{eventually, logged};

/// The control plane shared by every test of this test binary.
///
/// Started lazily by the first caller (others block until it is ready), never dropped:
/// its children are killed by an `atexit` hook when the test process exits, and by
/// `PR_SET_PDEATHSIG(SIGKILL)` if the test process dies without running it. A start-up
/// failure is remembered, so every test fails fast with the same message instead of
/// trying again.
pub fn shared() -> &'static ControlPlane {
    static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
    let started = SHARED.get_or_init(|| ControlPlane::start_shared().map_err(|error| format!("{error:#}")));
    match started {
        Ok(control_plane) => control_plane,
        Err(message) => panic!("the shared test control plane failed to start: {message}"),
    }
}
