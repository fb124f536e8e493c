//! `leasehold-node up`: cleans up after any earlier run, enters the node's namespaces,
//! starts etcd, containerd, kube-apiserver, kube-controller-manager, kube-scheduler,
//! kubelet and kube-proxy, imports the images, relays the apiserver to the host's
//! loopback, writes [`super::NodeState`], and then supervises: a component that exits ends
//! the node (with its log tail), and SIGTERM or SIGINT tear everything down.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use k8s_openapi::api::core::v1::{Node as KubeNode, ServiceAccount};
use nix::fcntl::{Flock, FlockArg};

use super::config::{self, Layout, Tokens};
use super::{
    APISERVER_PORT, BUSYBOX_IMAGE, CLUSTER_CIDR, NODE_IP, NODE_NAME, NodeState, SERVICE_CIDR, cleanup, images, mounts,
};
use crate::components::SERVICE_ACCOUNT_ISSUER;
use crate::kubeconfig::Identity;
use crate::pki::Pki;
use crate::process::Supervised;
use crate::wait::{self, Probe};

/// What `leasehold-node up` is asked for.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// The node's directory.
    pub dir: PathBuf,
    /// Image archives to import besides the node's own (Leasehold's image).
    pub images: Vec<PathBuf>,
    /// The relay's port on the host's 127.0.0.1 (0: any free port).
    pub relay_port: u16,
}

/// Where the binaries are (from `e2e/node/build.sh`).
struct Binaries {
    controlplane: PathBuf,
    containerd: PathBuf,
    pause: PathBuf,
}

fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../node/build.sh")
}

fn binaries() -> anyhow::Result<Binaries> {
    let script = build_script();
    let output = Command::new(&script)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("failed to run {}", script.display()))?;
    if !output.status.success() {
        bail!("{} failed ({}): the node's binaries or packages are missing", script.display(), output.status);
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(PathBuf::from)
            .ok_or_else(|| anyhow!("{} printed no {key}=", script.display()))
    };
    Ok(Binaries { controlplane: get("controlplane")?, containerd: get("containerd")?, pause: get("pause")? })
}

/// The machine-wide lock: one node at a time (pods' cgroups share one root).
fn lock_path() -> anyhow::Result<PathBuf> {
    let cache = match std::env::var_os("LEASEHOLD_CACHE").filter(|v| !v.is_empty()) {
        Some(cache) => PathBuf::from(cache),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cache/leasehold"),
    };
    Ok(cache.join("node/node.lock"))
}

/// Takes the machine-wide node lock; the lock file names the directory of the node that
/// holds (or last held) it.
fn lock(layout: &Layout) -> anyhow::Result<(Flock<std::fs::File>, Option<PathBuf>)> {
    let path = lock_path()?;
    std::fs::create_dir_all(path.parent().context("lock path has a parent")?)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("failed to open {}", path.display()))?;
    let previous =
        std::fs::read_to_string(&path).ok().map(|t| PathBuf::from(t.trim())).filter(|p| !p.as_os_str().is_empty());
    let locked = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => locked,
        Err((_, _)) => bail!(
            "another Leasehold node is running on this machine (directory {}); stop it first \
             (make cluster-down, or leasehold-node down --dir <that directory>)",
            previous.as_deref().map_or("unknown".into(), |p| p.display().to_string())
        ),
    };
    std::fs::write(&path, layout.dir.display().to_string())
        .with_context(|| format!("failed to write {}", path.display()))?;
    Ok((locked, previous))
}

/// `leasehold-node down`: stops the node of `dir` and removes everything it left.
pub fn down(dir: &Path) -> anyhow::Result<Vec<String>> {
    let layout = Layout { dir: dir.to_owned() };
    Ok(cleanup::leftovers(&layout, Duration::from_secs(60)))
}

/// `leasehold-node up`. Must be called while the process is single-threaded.
pub fn up(options: UpOptions) -> anyhow::Result<()> {
    let began = Instant::now();
    let layout = Layout { dir: std::path::absolute(&options.dir)? };
    std::fs::create_dir_all(&layout.dir)?;
    let (_lock, previous) = lock(&layout)?;
    for dir in previous.iter().chain([&layout.dir]) {
        for line in cleanup::leftovers(&Layout { dir: dir.clone() }, Duration::from_secs(30)) {
            eprintln!("leasehold-node: left by an earlier run in {}: {line}", dir.display());
        }
    }
    let _ = std::fs::remove_dir_all(layout.logs());
    for dir in [layout.run(), layout.logs(), layout.pids(), layout.images()] {
        std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    }
    std::fs::write(layout.supervisor_pid(), std::process::id().to_string())?;

    let binaries = binaries()?;
    let pki = Pki::generate()?;
    let tokens = config::write_all(&layout, &pki)?;
    let mut archives = vec![
        write_image(&layout, "pause", &images::pause(&binaries.pause)?)?,
        write_image(&layout, "busybox", &images::busybox(BUSYBOX_IMAGE)?)?,
    ];
    archives.extend(options.images.iter().map(std::path::absolute).collect::<Result<Vec<_>, _>>()?);
    for archive in &archives {
        anyhow::ensure!(archive.is_file(), "image archive {} does not exist", archive.display());
    }
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").context("no /sys/fs/cgroup")?.filter_map(Result::ok) {
        // kubelet needs its cgroupRoot in every hierarchy.
        let _ = std::fs::create_dir_all(hierarchy.path().join(super::CGROUP_ROOT));
    }

    // The relay's host end is bound before the process leaves the host's network namespace.
    let relay = std::net::TcpListener::bind(("127.0.0.1", options.relay_port)).context("failed to bind the relay")?;
    relay.set_nonblocking(true)?;
    let relay_port = relay.local_addr()?.port();

    mounts::enter_namespaces()?;
    mounts::set_up(&layout)?;
    mounts::network()?;

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let mut node = Running { layout: layout.clone(), children: Vec::new() };
        let started = node.start(&binaries, &pki, &tokens, &archives, relay, relay_port, began).await;
        let outcome = match started {
            Ok(()) => node.supervise().await,
            Err(error) => Err(error),
        };
        node.teardown().await;
        outcome
    })
}

fn write_image(layout: &Layout, name: &str, spec: &leasehold_image::ImageSpec) -> anyhow::Result<PathBuf> {
    let path = layout.images().join(format!("{name}.oci.tar"));
    leasehold_image::write_archive_cached(spec, &path, Some(&super::handle::test_dir().with_file_name("layers")))?;
    Ok(path)
}

/// The started components.
struct Running {
    layout: Layout,
    children: Vec<Supervised>,
}

impl Running {
    fn spawn(&mut self, name: &str, program: &Path, args: &[String], env: &[(&str, String)]) -> anyhow::Result<()> {
        let mut command = Command::new(program);
        command.args(args);
        for (key, value) in env {
            command.env(key, value);
        }
        let child = Supervised::spawn(name, command, &self.layout.logs().join(format!("{name}.log")))?;
        std::fs::write(self.layout.pids().join(format!("{name}.pid")), child.pid().to_string())?;
        self.children.push(child);
        Ok(())
    }

    fn child(&mut self, name: &str) -> &mut Supervised {
        self.children.iter_mut().find(|c| c.name() == name).expect("a started component")
    }

    #[allow(clippy::too_many_arguments)]
    async fn start(
        &mut self,
        bin: &Binaries,
        pki: &Pki,
        tokens: &Tokens,
        archives: &[PathBuf],
        relay: std::net::TcpListener,
        relay_port: u16,
        began: Instant,
    ) -> anyhow::Result<()> {
        let run = self.layout.run();
        let p = self.layout.pki();
        let path = |name: &str| p.join(name).display().to_string();
        let cp = |name: &str| bin.controlplane.join(name);
        let say = |what: &str| eprintln!("leasehold-node: {:>5.1}s {what}", began.elapsed().as_secs_f64());

        self.spawn(
            "etcd",
            &cp("etcd"),
            &[
                "--name=node".into(),
                format!("--data-dir={}", run.join("etcd").display()),
                "--listen-client-urls=http://127.0.0.1:2379".into(),
                "--advertise-client-urls=http://127.0.0.1:2379".into(),
                "--listen-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-cluster=node=http://127.0.0.1:2380".into(),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
            &[],
        )?;
        // containerd finds its shim on PATH.
        let path_env = format!("{}:{}", bin.containerd.display(), std::env::var("PATH").unwrap_or_default());
        self.spawn(
            "containerd",
            &bin.containerd.join("containerd"),
            &["--config".into(), run.join("containerd.toml").display().to_string()],
            &[("PATH", path_env.clone())],
        )?;
        crate::components::wait_etcd_healthy(self.child("etcd"), 2379, Duration::from_secs(60)).await?;
        say("etcd ready");
        self.spawn(
            "kube-apiserver",
            &cp("kube-apiserver"),
            &[
                "--etcd-servers=http://127.0.0.1:2379".into(),
                "--bind-address=0.0.0.0".into(),
                format!("--advertise-address={NODE_IP}"),
                format!("--secure-port={APISERVER_PORT}"),
                format!("--tls-cert-file={}", path("apiserver.crt")),
                format!("--tls-private-key-file={}", path("apiserver.key")),
                format!("--cert-dir={}", run.join("apiserver-certs").display()),
                format!("--client-ca-file={}", path("ca.crt")),
                format!("--token-auth-file={}", path("tokens.csv")),
                format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
                format!("--api-audiences={SERVICE_ACCOUNT_ISSUER}"),
                format!("--service-account-key-file={}", path("sa.pub")),
                format!("--service-account-signing-key-file={}", path("sa.key")),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--authorization-mode=Node,RBAC".into(),
                "--enable-admission-plugins=NodeRestriction".into(),
                "--allow-privileged=true".into(),
                format!("--kubelet-client-certificate={}", path("apiserver-kubelet-client.crt")),
                format!("--kubelet-client-key={}", path("apiserver-kubelet-client.key")),
                format!("--kubelet-certificate-authority={}", path("ca.crt")),
                "--kubelet-preferred-address-types=InternalIP".into(),
            ],
            &[],
        )?;
        let socket = self.layout.containerd_socket();
        let ctr = bin.containerd.join("ctr");
        wait::poll("containerd", Duration::from_secs(60), || {
            let ok = Command::new(&ctr)
                .arg("--address")
                .arg(&socket)
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success());
            async move { if ok { Probe::Ready(()) } else { Probe::NotYet("ctr version fails".into()) } }
        })
        .await?;
        say("containerd ready");
        for archive in archives {
            import(&ctr, &socket, archive)?;
        }
        say(&format!("{} images imported", archives.len()));

        let admin_token = tokens.of("admin").to_owned();
        let inner = format!("https://127.0.0.1:{APISERVER_PORT}");
        let admin = Identity {
            server: &inner,
            ca_pem: pki.ca_pem(),
            user: "leasehold-admin",
            token: &admin_token,
            namespace: "default",
        };
        admin.write(&self.layout.inner_kubeconfig())?;
        let probe = crate::startup::probe_client(admin).await?;
        crate::components::wait_apiserver_ready(self.child("kube-apiserver"), &probe, Duration::from_secs(180)).await?;
        say("kube-apiserver ready");

        self.spawn(
            "kube-controller-manager",
            &cp("kube-controller-manager"),
            &[
                format!("--kubeconfig={}", self.layout.inner_kubeconfig().display()),
                "--controllers=*".into(),
                "--allocate-node-cidrs=true".into(),
                format!("--cluster-cidr={CLUSTER_CIDR}"),
                "--node-cidr-mask-size=24".into(),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                format!("--service-account-private-key-file={}", path("sa.key")),
                format!("--root-ca-file={}", path("ca.crt")),
                // Its default is created on the host.
                format!("--flex-volume-plugin-dir={}", run.join("kcm-flexvolume").display()),
            ],
            &[],
        )?;
        self.spawn(
            "kube-scheduler",
            &cp("kube-scheduler"),
            &[
                format!("--kubeconfig={}", path("kube-scheduler.kubeconfig")),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
            ],
            &[],
        )?;
        self.spawn(
            "kubelet",
            &cp("kubelet"),
            &[
                format!("--config={}", run.join("kubelet.yaml").display()),
                format!("--kubeconfig={}", path("kubelet.kubeconfig")),
                format!("--node-ip={NODE_IP}"),
                format!("--hostname-override={NODE_NAME}"),
                format!("--root-dir={}", run.join("kubelet").display()),
                format!("--cert-dir={}", run.join("kubelet/pki").display()),
                "--v=1".into(),
            ],
            &[("PATH", path_env)],
        )?;
        self.spawn(
            "kube-proxy",
            &cp("kube-proxy"),
            &[format!("--config={}", run.join("kube-proxy.yaml").display()), "--v=1".into()],
            &[],
        )?;

        let nodes = kube::Api::<KubeNode>::all(probe.clone());
        wait::poll("the node to be Ready", Duration::from_secs(240), || {
            let nodes = nodes.clone();
            async move {
                match nodes.get_opt(NODE_NAME).await {
                    Ok(Some(node)) => {
                        let ready = node
                            .status
                            .and_then(|s| s.conditions)
                            .unwrap_or_default()
                            .into_iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True");
                        if ready { Probe::Ready(()) } else { Probe::NotYet("registered, not Ready".into()) }
                    }
                    Ok(None) => Probe::NotYet("not registered".into()),
                    Err(error) => Probe::NotYet(error.to_string()),
                }
            }
        })
        .await?;
        say("node Ready");
        let accounts = kube::Api::<ServiceAccount>::namespaced(probe.clone(), "default");
        wait::poll("the default ServiceAccount", Duration::from_secs(120), || {
            let accounts = accounts.clone();
            async move {
                match accounts.get_opt("default").await {
                    Ok(Some(_)) => Probe::Ready(()),
                    other => Probe::NotYet(format!("{other:?}")),
                }
            }
        })
        .await?;

        let listener = tokio::net::TcpListener::from_std(relay)?;
        tokio::spawn(relay_loop(listener));
        let server = format!("https://127.0.0.1:{relay_port}");
        Identity {
            server: &server,
            ca_pem: pki.ca_pem(),
            user: "leasehold-admin",
            token: &admin_token,
            namespace: "default",
        }
        .write(&self.layout.kubeconfig())?;
        let state = NodeState {
            supervisor_pid: std::process::id(),
            server,
            kubeconfig: self.layout.kubeconfig(),
            admin_token,
            ca_pem: pki.ca_pem().to_owned(),
            bin_dir: bin.controlplane.clone(),
            ctr: ctr.clone(),
            containerd_socket: socket,
            logs: self.layout.logs(),
            startup_seconds: began.elapsed().as_secs_f64(),
        };
        let text = serde_json::to_string_pretty(&state)?;
        let partial = self.layout.state().with_extension("partial");
        std::fs::write(&partial, text)?;
        std::fs::rename(&partial, self.layout.state())?;
        say(&format!("ready: export KUBECONFIG={}", self.layout.kubeconfig().display()));
        Ok(())
    }

    /// Runs until a signal (Ok) or a component's exit (Err).
    async fn supervise(&mut self) -> anyhow::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        loop {
            tokio::select! {
                _ = term.recv() => return Ok(()),
                _ = int.recv() => return Ok(()),
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            for child in &mut self.children {
                if let Some(status) = child.exit_status() {
                    return Err(anyhow!(
                        "{} exited ({status}); last lines of {}:\n{}",
                        child.name(),
                        child.log().display(),
                        child.log_tail(30)
                    ));
                }
            }
        }
    }

    /// Stops kubelet and kube-proxy, kills every container and shim, then containerd and
    /// the control plane, and removes cgroups and created mount points.
    async fn teardown(&mut self) {
        let stop_first = ["kubelet", "kube-proxy"];
        for name in stop_first {
            if let Some(index) = self.children.iter().position(|c| c.name() == name) {
                self.children.remove(index).kill_and_reap();
            }
        }
        cleanup::kill_containers(Duration::from_secs(10));
        cleanup::kill_shims(&self.layout.containerd_socket());
        for child in self.children.drain(..).rev() {
            child.kill_and_reap();
        }
        let left = cleanup::remove_cgroups();
        if !left.is_empty() {
            eprintln!("leasehold-node: cgroups left: {}", left.join("; "));
        }
        cleanup::remove_created_mount_points(&self.layout);
        let _ = std::fs::remove_file(self.layout.state());
        let _ = std::fs::remove_file(self.layout.supervisor_pid());
        eprintln!("leasehold-node: stopped");
    }
}

/// `ctr images import` of one archive into kubelet's namespace.
fn import(ctr: &Path, socket: &Path, archive: &Path) -> anyhow::Result<()> {
    let output = Command::new(ctr)
        .arg("--address")
        .arg(socket)
        .args(["-n", "k8s.io", "images", "import"])
        .arg(archive)
        .output()
        .context("failed to run ctr")?;
    if !output.status.success() {
        bail!("ctr images import {} failed: {}", archive.display(), String::from_utf8_lossy(&output.stderr));
    }
    Ok(())
}

/// Host loopback → the apiserver inside the namespace, one task per connection.
async fn relay_loop(listener: tokio::net::TcpListener) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else { continue };
        tokio::spawn(async move {
            if let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", APISERVER_PORT)).await {
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}
