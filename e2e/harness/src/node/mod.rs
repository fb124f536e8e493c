//! A real single-node cluster for tests, `make cluster` and `make demo-cluster`: the control
//! plane of [`crate::ControlPlane`] plus kube-scheduler, kubelet and kube-proxy built from
//! the same pinned `k8s.io/kubernetes` module, containerd v2 from the Go module proxy, runc
//! and the CNI plugins from Debian — every pod a real container.
//!
//! The `leasehold-node` supervisor ([`supervisor`]) runs everything inside a network
//! namespace and a mount namespace of its own. The network namespace has loopback and a
//! bridge with no ports holding the node's address: no packet can leave it. The mount
//! namespace keeps the paths kubelet, containerd and the CNI plugins hard-code on the host
//! (`/var/lib/kubelet`, `/run/containerd`, ...) and fake `/proc/sys` values (kubelet would
//! otherwise rewrite host sysctls) private to the node. Tests and kubectl reach the
//! apiserver through a relay on the host's loopback.
//!
//! One node runs on a machine at a time (a lock in the cache directory): pods' cgroups live
//! under one fixed root in every hierarchy. Start-up first removes whatever a crashed
//! run left (its processes, containers, shims, cgroups and mount points), so it is
//! idempotent. [`Node`] is the tests' handle; [`shared_node`] starts one per test binary.

pub mod apps;
mod cleanup;
mod config;
mod handle;
pub mod images;
mod mounts;
pub mod supervisor;

pub use handle::{ContainerMemory, Node, NodeState, shared_node, test_dir};

/// The node's name (kubelet's `--hostname-override`).
pub const NODE_NAME: &str = "leasehold-node";
/// The node's address, on the port-less bridge [`NODE_BRIDGE`].
pub const NODE_IP: &str = "10.200.0.1";
/// The bridge that holds [`NODE_IP`].
pub const NODE_BRIDGE: &str = "lhnode0";
/// Pods of the cluster (the node gets the first /24).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The node's pod range and its gateway (the CNI bridge).
pub const NODE_POD_CIDR: &str = "10.244.0.0/24";
/// The CNI bridge's address.
pub const POD_GATEWAY: &str = "10.244.0.1";
/// ClusterIPs; the `kubernetes` Service is the first.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The `kubernetes` Service's ClusterIP.
pub const APISERVER_SERVICE_IP: &str = "10.96.0.1";
/// The apiserver's port inside the namespace.
pub const APISERVER_PORT: u16 = 6443;
/// The cgroup (in every hierarchy) under which kubelet puts every pod.
pub const CGROUP_ROOT: &str = "leasehold-node";
/// The sandbox image kubelet and containerd use.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// A shell and the usual tools (Debian's busybox-static), for test and example pods.
pub const BUSYBOX_IMAGE: &str = "leasehold.test/busybox:1";
