//! The node's namespaces: entering a new network and mount namespace, the mounts that keep
//! the node's writes off the host, and the network inside.
//!
//! Must run while the process is single-threaded (`unshare(CLONE_NEWNS)` refuses a process
//! whose threads share its file-system attributes), before any child is spawned: every
//! component then inherits both namespaces.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};

use super::config::Layout;
use super::{NODE_BRIDGE, NODE_IP, SERVICE_CIDR};

/// Host paths that kubelet, containerd and the CNI plugins use whatever they are told:
/// each gets a private backing directory under the run directory.
const HOST_PATHS: [&str; 5] =
    ["/var/log/containers", "/var/lib/kubelet", "/var/lib/cni", "/run/containerd", "/run/netns"];

/// Kernel settings kubelet insists on (it refuses to start with `protectKernelDefaults`
/// when they differ): their expected values are bind-mounted over them, in the node's
/// mount namespace only, so the host's are never written.
const SYSCTLS: [(&str, &str); 6] = [
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

fn nix_mount(source: Option<&Path>, target: &Path, fstype: Option<&str>, flags: MsFlags) -> anyhow::Result<()> {
    mount(source, target, fstype, flags, None::<&str>)
        .with_context(|| format!("mount {source:?} on {} ({flags:?})", target.display()))
}

/// Enters a new network and mount namespace, with every mount private to it.
pub fn enter_namespaces() -> anyhow::Result<()> {
    unshare(CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWNS)
        .context("unshare(CLONE_NEWNET | CLONE_NEWNS) failed (the node needs root)")?;
    nix_mount(None, Path::new("/"), None, MsFlags::MS_REC | MsFlags::MS_PRIVATE)
}

/// The node's mounts; records host directories it had to create in
/// [`Layout::created_mount_points`].
pub fn set_up(layout: &Layout) -> anyhow::Result<()> {
    let run = layout.run();
    // A sysfs of this network namespace (kubelet and the CNI plugins read /sys/class/net),
    // keeping the host's cgroup mounts, which a fresh sysfs would hide ("failed to find
    // cgroup mounts").
    let carry = run.join(".cgroup");
    std::fs::create_dir_all(&carry)?;
    nix_mount(Some(Path::new("/sys/fs/cgroup")), &carry, None, MsFlags::MS_BIND | MsFlags::MS_REC)?;
    umount2("/sys", MntFlags::MNT_DETACH).context("umount /sys")?;
    nix_mount(Some(Path::new("sysfs")), Path::new("/sys"), Some("sysfs"), MsFlags::empty())?;
    nix_mount(Some(&carry), Path::new("/sys/fs/cgroup"), None, MsFlags::MS_BIND | MsFlags::MS_REC)?;
    umount2(&carry, MntFlags::MNT_DETACH).context("umount the cgroup carrier")?;

    let mut created = Vec::new();
    for path in HOST_PATHS {
        let backing = run.join(format!("hostpaths{}", path.replace('/', "_")));
        std::fs::create_dir_all(&backing)?;
        let target = PathBuf::from(path);
        if !target.exists() {
            // The first missing ancestor is what teardown must remove.
            let mut first_missing = target.clone();
            while let Some(parent) = first_missing.parent() {
                if parent.exists() {
                    break;
                }
                first_missing = parent.to_owned();
            }
            std::fs::create_dir_all(&target).with_context(|| format!("failed to create {path}"))?;
            created.push(first_missing.display().to_string());
            std::fs::write(layout.created_mount_points(), created.join("\n") + "\n")?;
        }
        nix_mount(Some(&backing), &target, None, MsFlags::MS_BIND)?;
    }
    // Mounts that kubelet makes (secrets, projected tokens) must reach containerd and runc.
    nix_mount(None, Path::new("/"), None, MsFlags::MS_REC | MsFlags::MS_SHARED)?;

    let sysctl_dir = run.join("sysctl");
    std::fs::create_dir_all(&sysctl_dir)?;
    for (key, value) in SYSCTLS {
        let file = sysctl_dir.join(key.replace('/', "_"));
        std::fs::write(&file, format!("{value}\n"))?;
        nix_mount(Some(&file), &Path::new("/proc/sys").join(key), None, MsFlags::MS_BIND)?;
    }
    Ok(())
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("ip").args(args).output().context("failed to run ip (iproute2)")?;
    if !output.status.success() {
        bail!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// Loopback, the node's address on a bridge with no ports (this kernel has no dummy
/// interface), and a route for ClusterIPs: processes of the namespace (the apiserver
/// calling a webhook Service) need one for kube-proxy's DNAT to see their packets. No
/// default route: nothing leaves.
pub fn network() -> anyhow::Result<()> {
    ip(&["link", "set", "lo", "up"])?;
    ip(&["link", "add", NODE_BRIDGE, "type", "bridge"])?;
    ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", NODE_BRIDGE])?;
    ip(&["link", "set", NODE_BRIDGE, "up"])?;
    ip(&["route", "add", SERVICE_CIDR, "dev", NODE_BRIDGE])?;
    // Per network namespace: the host's setting is untouched.
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1\n").context("enable forwarding in the node's namespace")?;
    Ok(())
}
