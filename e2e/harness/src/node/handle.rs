//! [`Node`]: the tests' handle on a running node — clients, kubectl, image imports, and the
//! containers' cgroups — and [`shared_node`], one node per test binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use super::config::Layout;
use crate::kubeconfig::Identity;
use crate::namespace::{Access, TestNamespace};
use crate::process::Supervised;

/// What a ready node tells its users (`<dir>/node.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    /// The supervisor's pid.
    pub supervisor_pid: u32,
    /// The apiserver as the host reaches it: `https://127.0.0.1:<relay port>`.
    pub server: String,
    /// The admin kubeconfig for [`Self::server`].
    pub kubeconfig: PathBuf,
    /// The admin's bearer token (`system:masters`).
    pub admin_token: String,
    /// The cluster's CA (PEM).
    pub ca_pem: String,
    /// The directory of kubectl and the other Kubernetes binaries.
    pub bin_dir: PathBuf,
    /// containerd's `ctr`.
    pub ctr: PathBuf,
    /// containerd's socket.
    pub containerd_socket: PathBuf,
    /// The components' logs.
    pub logs: PathBuf,
    /// Seconds from `leasehold-node up` to ready.
    pub startup_seconds: f64,
}

/// A container's memory from its cgroup, in bytes.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ContainerMemory {
    /// `usage - inactive_file`: what the kubelet calls the working set (and evicts on).
    pub working_set: u64,
    /// `memory.usage_in_bytes`.
    pub usage: u64,
    /// `memory.max_usage_in_bytes`: the peak.
    pub max_usage: u64,
    /// Anonymous memory (`total_rss`).
    pub rss: u64,
    /// Page cache (`total_cache`).
    pub cache: u64,
}

/// A running node.
pub struct Node {
    /// What the node said when it became ready.
    pub state: NodeState,
    dir: PathBuf,
    _supervisor: Option<Supervised>,
}

/// The `leasehold-node` binary: `$LEASEHOLD_NODE_BIN`, or next to the running program or
/// one directory up (test and bench binaries live in `target/<profile>/deps`), or in
/// `target/debug`.
pub fn supervisor_binary() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("LEASEHOLD_NODE_BIN").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe().context("no current executable")?;
    let mut candidates: Vec<PathBuf> = exe.ancestors().skip(1).take(2).map(|d| d.join("leasehold-node")).collect();
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/leasehold-node"));
    candidates.into_iter().find(|c| c.is_file()).context(
        "the leasehold-node binary is not built: run `cargo build -p leasehold-harness --bin leasehold-node` \
         (make test and make cluster do)",
    )
}

impl Node {
    /// Starts a node in `dir` with the image archives `images` (Leasehold's), and waits
    /// until it is ready (or fails with the supervisor's reason).
    pub fn start(dir: &Path, images: &[PathBuf]) -> anyhow::Result<Node> {
        for image in images {
            if !image.is_file() {
                bail!("the image archive {} does not exist: run `make image` first", image.display());
            }
        }
        let layout = Layout { dir: dir.to_owned() };
        std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
        let _ = std::fs::remove_file(layout.state());
        let mut command = Command::new(supervisor_binary()?);
        command.arg("up").arg("--dir").arg(dir);
        for image in images {
            command.arg("--image").arg(image);
        }
        let log = dir.join("supervisor.log");
        let _ = std::fs::remove_file(&log);
        // Teardown kills containers and shims and removes cgroups: seconds, not minutes.
        let mut supervisor = Supervised::spawn_graceful("leasehold-node", command, &log, Duration::from_secs(60))?;
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            if let Ok(text) = std::fs::read_to_string(layout.state())
                && let Ok(state) = serde_json::from_str::<NodeState>(&text)
                && state.supervisor_pid == supervisor.pid()
            {
                crate::process::eprint_direct(&format!(
                    "leasehold-harness: node ready in {:.1} s at {} (logs in {})",
                    state.startup_seconds,
                    state.server,
                    state.logs.display()
                ));
                return Ok(Node { state, dir: dir.to_owned(), _supervisor: Some(supervisor) });
            }
            if let Some(status) = supervisor.exit_status() {
                bail!("the node failed to start ({status}); {}:\n{}", log.display(), supervisor.log_tail(40));
            }
            if Instant::now() >= deadline {
                bail!("the node was not ready within 10 minutes; {}:\n{}", log.display(), supervisor.log_tail(40));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The node `make cluster` started in `dir`.
    pub fn attach(dir: &Path) -> anyhow::Result<Node> {
        let layout = Layout { dir: dir.to_owned() };
        let text = std::fs::read_to_string(layout.state())
            .with_context(|| format!("no running node in {} (make cluster starts one)", dir.display()))?;
        let state: NodeState = serde_json::from_str(&text).context("node.json")?;
        if !crate::process_exists(state.supervisor_pid) {
            bail!("the node in {} is not running (its supervisor {} is gone)", dir.display(), state.supervisor_pid);
        }
        Ok(Node { state, dir: dir.to_owned(), _supervisor: None })
    }

    /// Crashes the node: SIGKILLs its supervisor, with no teardown, and returns once the
    /// supervisor is gone (its components die with it; containerd's shims live on).
    pub fn crash(mut self) {
        if let Some(supervisor) = self._supervisor.take() {
            supervisor.crash();
        }
    }

    /// The node's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The admin kubeconfig (through the relay).
    pub fn kubeconfig(&self) -> &Path {
        &self.state.kubeconfig
    }

    fn identity<'a>(&'a self, token: &'a str, namespace: &'a str) -> Identity<'a> {
        Identity { server: &self.state.server, ca_pem: &self.state.ca_pem, user: "leasehold-admin", token, namespace }
    }

    /// A new admin client (namespace `default`).
    pub async fn admin_client(&self) -> kube::Client {
        self.identity(&self.state.admin_token, "default").client().await.expect("the node's kubeconfig is valid")
    }

    /// `kubectl --kubeconfig=<admin>`; add arguments and run it.
    pub fn kubectl(&self) -> Command {
        let mut kubectl = Command::new(self.state.bin_dir.join("kubectl"));
        kubectl.arg(format!("--kubeconfig={}", self.state.kubeconfig.display()));
        kubectl
    }

    /// `ctr` in kubelet's containerd namespace; add arguments and run it.
    pub fn ctr(&self) -> Command {
        let mut ctr = Command::new(&self.state.ctr);
        ctr.arg("--address").arg(&self.state.containerd_socket).args(["-n", "k8s.io"]);
        ctr
    }

    /// Imports an image archive into the node's containerd.
    pub fn import(&self, archive: &Path) -> anyhow::Result<()> {
        let output = self.ctr().args(["images", "import"]).arg(archive).output().context("run ctr")?;
        if !output.status.success() {
            bail!("ctr images import {}: {}", archive.display(), String::from_utf8_lossy(&output.stderr));
        }
        Ok(())
    }

    /// Writes `spec` as an archive in the node's directory and imports it.
    pub fn build_and_import(&self, spec: &leasehold_image::ImageSpec) -> anyhow::Result<leasehold_image::Built> {
        let file = spec.reference.to_string().replace(['/', ':'], "_");
        let archive = self.dir.join("run/images").join(format!("{file}.oci.tar"));
        // Test images are rebuilt from the same files on every run: reuse their compression.
        let cache = test_dir().with_file_name("layers");
        let built = leasehold_image::write_archive_cached(spec, &archive, Some(&cache))?;
        self.import(&archive)?;
        Ok(built)
    }

    /// The pid of a container's main process (`containerd://<id>` or `<id>`).
    pub fn container_pid(&self, container_id: &str) -> anyhow::Result<u32> {
        let id = container_id.trim_start_matches("containerd://");
        let output = self.ctr().args(["tasks", "ls"]).output().context("run ctr tasks ls")?;
        let text = String::from_utf8_lossy(&output.stdout);
        text.lines()
            .find_map(|line| {
                let mut fields = line.split_whitespace();
                (fields.next() == Some(id)).then(|| fields.next()?.parse().ok()).flatten()
            })
            .with_context(|| format!("container {id} has no running task:\n{text}"))
    }

    /// When containerd saw a container (`containerd://<id>` or `<id>`) exit, in seconds since
    /// the epoch: the `exited_at` of its exit event in containerd's log, which logs every
    /// exit at its default level. `None` if the log holds no exit of it yet.
    pub fn container_exited_at(&self, container_id: &str) -> anyhow::Result<Option<f64>> {
        let path = self.state.logs.join("containerd.log");
        let log = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        Ok(exit_event_at(&log, container_id.trim_start_matches("containerd://")))
    }

    /// A container's memory as its cgroup (v1) counts it.
    pub fn container_memory(&self, container_id: &str) -> anyhow::Result<ContainerMemory> {
        let pid = self.container_pid(container_id)?;
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).context("read the container's cgroups")?;
        let path = cgroups
            .lines()
            .find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers.split(',').any(|c| c == "memory").then(|| path.to_owned())
            })
            .context("the container has no memory cgroup")?;
        let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
        let read = |name: &str| -> anyhow::Result<String> {
            std::fs::read_to_string(dir.join(name)).with_context(|| format!("read {}", dir.join(name).display()))
        };
        let number = |name: &str| -> anyhow::Result<u64> {
            read(name)?.trim().parse().with_context(|| format!("{name} is not a number"))
        };
        let stat = read("memory.stat")?;
        let field = |name: &str| {
            stat.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0u64)
        };
        let usage = number("memory.usage_in_bytes")?;
        Ok(ContainerMemory {
            working_set: usage.saturating_sub(field("total_inactive_file")),
            usage,
            max_usage: number("memory.max_usage_in_bytes")?,
            rss: field("total_rss"),
            cache: field("total_cache"),
        })
    }

    /// A fresh namespace for one test (dumped if the test fails).
    pub async fn namespace(&self, prefix: &str) -> TestNamespace {
        let access = Access {
            admin: self.admin_client().await,
            server_url: self.state.server.clone(),
            ca_pem: self.state.ca_pem.clone(),
            admin_token: self.state.admin_token.clone(),
            kubectl: self.state.bin_dir.join("kubectl"),
            admin_kubeconfig: self.state.kubeconfig.clone(),
            work_dir: self.state.logs.clone(),
        };
        TestNamespace::create_with(&access, prefix)
            .await
            .unwrap_or_else(|error| panic!("failed to create a test namespace: {error:#}"))
    }
}

/// The `exited_at` of container `id`'s exit event in containerd's log `log`, in seconds
/// since the epoch: `... msg="received container exit event container_id:\"<id>\" ...
/// exited_at:{seconds:<s> nanos:<ns>}"`.
fn exit_event_at(log: &str, id: &str) -> Option<f64> {
    let event = format!("received container exit event container_id:\\\"{id}\\\"");
    let line = log.lines().find(|l| l.contains(&event))?;
    let at = &line[line.find("exited_at:{")? + "exited_at:{".len()..];
    let field = |name: &str| -> Option<f64> {
        let rest = &at[at.find(name)? + name.len()..];
        rest[..rest.find(|c: char| !c.is_ascii_digit())?].parse().ok()
    };
    Some(field("seconds:")? + field("nanos:")? / 1e9)
}

/// The node directory tests use: `${LEASEHOLD_CACHE:-~/.cache/leasehold}/node/test`.
pub fn test_dir() -> PathBuf {
    let cache = match std::env::var_os("LEASEHOLD_CACHE").filter(|v| !v.is_empty()) {
        Some(cache) => PathBuf::from(cache),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/leasehold"),
    };
    cache.join("node/test")
}

/// The node shared by every test of this test binary, started on first use with the
/// image archives `images` (the first caller's list counts), stopped (gracefully) when the
/// process exits. A failed start is remembered: every test fails with the same reason.
pub fn shared_node(images: &[PathBuf]) -> &'static Node {
    static SHARED: OnceLock<Result<Node, String>> = OnceLock::new();
    let started = SHARED.get_or_init(|| Node::start(&test_dir(), images).map_err(|error| format!("{error:#}")));
    match started {
        Ok(node) => node,
        Err(message) => panic!("the test node failed to start: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as containerd 2 writes them: an exit with and without an exit status, and an
    /// event of another container.
    const LOG: &str = concat!(
        r#"time="2026-12-07T16:54:29.083007144Z" level=info msg="received container exit event container_id:\"d8e5\"  id:\"d8e5\"  pid:3821  exited_at:{seconds:1796662469  nanos:82140039}""#,
        "\n",
        r#"time="2026-12-07T16:54:47.497254921Z" level=info msg="received container exit event container_id:\"b917\"  id:\"b917\"  pid:4148  exit_status:137  exited_at:{seconds:1796662487  nanos:496685988}""#,
        "\n",
        r#"time="2026-12-07T16:54:48.000000000Z" level=info msg="StopContainer for \"aaaa\" with timeout 10 (s)""#,
        "\n",
    );

    #[test]
    fn a_containers_exit_is_read_from_its_exit_event() {
        let cases = [
            ("d8e5", Some(1_796_662_469.082_14)),
            ("b917", Some(1_796_662_487.496_686)),
            // Another container's lines name it, but not as an exit.
            ("aaaa", None),
            // A prefix of an ID is not the ID.
            ("d8e", None),
            ("ffff", None),
        ];
        for (id, want) in cases {
            let got = exit_event_at(LOG, id);
            match (got, want) {
                (Some(got), Some(want)) => assert!((got - want).abs() < 1e-6, "{id}: {got} != {want}"),
                (got, want) => assert_eq!(got, want, "{id}"),
            }
        }
    }
}
