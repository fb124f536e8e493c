//! Removing what a node leaves on the machine: its containers (every process in its cgroup
//! tree), containerd's shims (daemons that outlive the supervisor), the cgroups, and the
//! host directories it created as mount points. Each step is idempotent, so the same code
//! serves a clean teardown and the start after a crashed run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::CGROUP_ROOT;
use super::config::Layout;

/// The node's cgroup directory in every mounted hierarchy.
fn roots() -> Vec<PathBuf> {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else { return Vec::new() };
    hierarchies.filter_map(Result::ok).map(|h| h.path().join(CGROUP_ROOT)).filter(|root| root.is_dir()).collect()
}

/// Every directory under `root`, deepest first.
fn tree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        if let Ok(children) = std::fs::read_dir(&dir) {
            stack.extend(children.filter_map(Result::ok).filter(|c| c.path().is_dir()).map(|c| c.path()));
        }
        out.push(dir);
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

/// Pids of every process in the node's cgroup trees.
fn cgroup_pids() -> Vec<i32> {
    let mut pids: Vec<i32> = roots()
        .iter()
        .flat_map(|root| tree(root))
        .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
        .flat_map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<i32>>())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// SIGKILLs every process in the node's cgroups (its containers) until none is left or
/// `timeout` passes; returns how many were signalled.
pub fn kill_containers(timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    let mut signalled = 0;
    loop {
        let pids = cgroup_pids();
        if pids.is_empty() || Instant::now() >= deadline {
            return signalled;
        }
        for pid in pids {
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                signalled += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Processes whose command line contains `needle` and whose program name ends with `program`.
pub fn processes_with(program: &str, needle: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
            let mut args = cmdline.split(|b| *b == 0).map(String::from_utf8_lossy);
            let first = args.next().unwrap_or_default();
            first.ends_with(program) && args.any(|a| a.contains(needle))
        })
        .collect()
}

/// SIGKILLs containerd's shims of the node whose containerd socket is `socket`.
pub fn kill_shims(socket: &Path) -> usize {
    let pids = processes_with("containerd-shim-runc-v2", &socket.display().to_string());
    for pid in &pids {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    pids.len()
}

/// Removes the node's cgroups (empty once its processes are gone), deepest first.
pub fn remove_cgroups() -> Vec<String> {
    let mut left = Vec::new();
    for root in roots() {
        for dir in tree(&root) {
            if let Err(error) = std::fs::remove_dir(&dir) {
                left.push(format!("{}: {error}", dir.display()));
            }
        }
    }
    left
}

/// Unmounts (in this mount namespace) and removes the host directories the node created
/// as mount points.
pub fn remove_created_mount_points(layout: &Layout) {
    let record = layout.created_mount_points();
    let Ok(text) = std::fs::read_to_string(&record) else { return };
    for top in text.lines().filter(|l| !l.is_empty()) {
        // Deepest first: a created directory may hold the mount point below it.
        for dir in tree(Path::new(top)) {
            let _ = nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_dir(&dir);
        }
    }
    let _ = std::fs::remove_file(record);
}

/// The pid in `file`, if its process is alive and runs `program`.
pub fn live_pid(file: &Path, program: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let first = cmdline.split(|b| *b == 0).next().map(String::from_utf8_lossy)?;
    first.ends_with(program).then_some(pid)
}

/// Everything a crashed (or still running) node of `layout` left: stops a live
/// supervisor (SIGTERM, then SIGKILL after `grace`), kills the component processes of
/// the last run, its containers and shims, removes its cgroups, created mount points and
/// run directory. Returns a line per thing it found.
pub fn leftovers(layout: &Layout, grace: Duration) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(pid) = live_pid(&layout.supervisor_pid(), "leasehold-node") {
        found.push(format!("stopping the running supervisor {pid}"));
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && kill(Pid::from_raw(pid), None).is_ok() {
            std::thread::sleep(Duration::from_millis(100));
        }
        if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
            found.push(format!("supervisor {pid} killed after {grace:?}"));
        }
    }
    if let Ok(pids) = std::fs::read_dir(layout.pids()) {
        for file in pids.filter_map(Result::ok) {
            let name = file.file_name().to_string_lossy().trim_end_matches(".pid").to_owned();
            if let Some(pid) = live_pid(&file.path(), &name) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                found.push(format!("killed {name} ({pid})"));
            }
        }
    }
    let containers = kill_containers(Duration::from_secs(10));
    if containers > 0 {
        found.push(format!("killed {containers} container processes"));
    }
    let shims = kill_shims(&layout.containerd_socket());
    if shims > 0 {
        found.push(format!("killed {shims} containerd shims"));
    }
    let left = remove_cgroups();
    if !left.is_empty() {
        found.push(format!("cgroups that could not be removed: {}", left.join("; ")));
    }
    remove_created_mount_points(layout);
    let _ = std::fs::remove_file(layout.state());
    let _ = std::fs::remove_file(layout.supervisor_pid());
    let _ = std::fs::remove_dir_all(layout.run());
    found
}
