//! [`ControlPlane`]: a running etcd, kube-apiserver and kube-controller-manager, and the
//! handles tests use on it (clients, kubectl, certificates, fault injection).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tempfile::TempDir;

use crate::{
    binaries::Binaries,
    components::{self, Launch, Layout},
    kubeconfig::Identity,
    namespace::TestNamespace,
    pki::Pki,
    process::{self, Supervised},
    startup::{self, APISERVER_TIMEOUT, ETCD_TIMEOUT},
    wait,
};

/// A real control plane on loopback: etcd, kube-apiserver (token authentication, RBAC,
/// admission) and kube-controller-manager (garbage collection, namespace deletion,
/// `default` ServiceAccounts).
///
/// Dropping it kills and reaps every child; [`crate::shared()`] keeps one alive for the
/// whole test binary instead.
pub struct ControlPlane {
    // Declared first so that they are stopped before the directory they write to goes.
    controller_manager: Mutex<Option<Supervised>>,
    apiserver: Mutex<Option<Supervised>>,
    etcd: Mutex<Option<Supervised>>,
    apiserver_launch: Launch,
    etcd_launch: Launch,
    binaries: Binaries,
    pki: Pki,
    admin_token: String,
    server_url: String,
    etcd_url: String,
    kubeconfig: PathBuf,
    startup_time: Duration,
    dir: TempDir,
}

impl ControlPlane {
    /// Starts a separate control plane (about 10-60 s). Prefer [`crate::shared()`]; use
    /// this for tests that stop components or check teardown.
    ///
    /// Blocks the calling thread (not the caller's tokio runtime: the work runs on a
    /// helper thread with its own runtime), so it may be called from `#[tokio::test]`.
    pub fn start() -> anyhow::Result<ControlPlane> {
        Self::boot(false)
    }

    /// Starts the instance behind [`crate::shared()`], whose directory is removed at exit.
    pub(crate) fn start_shared() -> anyhow::Result<ControlPlane> {
        Self::boot(true)
    }

    fn boot(shared: bool) -> anyhow::Result<ControlPlane> {
        let began = Instant::now();
        let binaries = Binaries::locate()?;
        let mut dir = tempfile::Builder::new()
            .prefix("leasehold-controlplane-")
            .tempdir()
            .context("failed to create the control-plane directory")?;
        let layout = Layout { dir: dir.path().to_owned() };
        let pki = Pki::generate()?;
        let admin_token = startup::random_token()?;
        startup::write_files(&layout, &pki, &admin_token)?;

        let running = match wait::block_on(startup::start_all(&binaries, &layout, pki.ca_pem(), &admin_token)) {
            Ok(running) => running,
            Err(error) => {
                // The children are gone (dropped on the error path); their logs must stay.
                process::keep_logs();
                dir.disable_cleanup(true);
                return Err(error.context(format!(
                    "failed to start the test control plane {} (logs kept in {})",
                    binaries.version,
                    layout.dir.display()
                )));
            }
        };
        if shared {
            // Statics are never dropped: the exit hook removes the directory after it has
            // killed the children.
            dir.disable_cleanup(true);
            process::remove_at_exit(layout.dir.clone());
        }

        let startup_time = began.elapsed();
        let timings = running.timings;
        process::eprint_direct(&format!(
            "leasehold-harness: control plane {} ready in {:.1} s (etcd {:.1} s, \
             kube-apiserver {:.1} s, kube-controller-manager {:.1} s) at {}; logs in {}",
            binaries.version,
            startup_time.as_secs_f64(),
            timings.etcd.as_secs_f64(),
            timings.apiserver.as_secs_f64(),
            timings.controller_manager.as_secs_f64(),
            running.server_url,
            layout.dir.display(),
        ));
        let (etcd_launch, etcd) = running.etcd;
        let (apiserver_launch, apiserver) = running.apiserver;
        // kube-controller-manager is never restarted, so its launch settings are not kept.
        let (_, controller_manager) = running.controller_manager;
        Ok(ControlPlane {
            controller_manager: Mutex::new(Some(controller_manager)),
            apiserver: Mutex::new(Some(apiserver)),
            etcd: Mutex::new(Some(etcd)),
            apiserver_launch,
            etcd_launch,
            binaries,
            pki,
            admin_token,
            server_url: running.server_url,
            etcd_url: running.etcd_url,
            kubeconfig: layout.admin_kubeconfig(),
            startup_time,
            dir,
        })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The admin kubeconfig (CA embedded, admin token, namespace `default`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The test CA (PEM): it signs the apiserver's and [`Self::issue_serving_cert`]'s
    /// certificates, and is the apiserver's client CA.
    pub fn ca_pem(&self) -> &str {
        self.pki.ca_pem()
    }

    /// A static bearer token of a `system:masters` user.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// The directory holding `kubectl`, `kube-apiserver`, `etcd`, ...
    pub fn bin_dir(&self) -> &Path {
        &self.binaries.dir
    }

    /// `http://127.0.0.1:<client port>`.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The pinned Kubernetes release, e.g. `v1.36.3`.
    pub fn version(&self) -> &str {
        &self.binaries.version
    }

    /// How long [`Self::start`] took, including locating the binaries.
    pub fn startup_time(&self) -> Duration {
        self.startup_time
    }

    /// The directory with this control plane's files and component logs
    /// (`etcd.log`, `kube-apiserver.log`, `kube-controller-manager.log`).
    pub fn work_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A new admin client (namespace `default`). New on every call: a client belongs to
    /// the tokio runtime it was made in, and each test has its own runtime.
    pub async fn admin_client(&self) -> kube::Client {
        self.identity(startup::ADMIN_USER, &self.admin_token, "default")
            .client()
            .await
            .expect("the admin kubeconfig is generated and valid")
    }

    /// A new client authenticating with `token` (namespace `default`).
    pub async fn client_with_token(&self, token: &str) -> kube::Client {
        self.identity("token-user", token, "default").client().await.expect("a generated kubeconfig is valid")
    }

    /// The client configuration [`Self::client_with_token`] builds its client from, for a
    /// client with a layer of its own.
    pub async fn config_with_token(&self, token: &str) -> kube::Config {
        self.identity("token-user", token, "default").config().await.expect("a generated kubeconfig is valid")
    }

    /// A new admin client (namespace `default`) that reaches the apiserver through
    /// `server_url`: a [`crate::FaultProxy`] in front of it, as `https://<proxy addr>` (the
    /// apiserver's certificate covers 127.0.0.1, so TLS still verifies).
    pub async fn admin_client_via(&self, server_url: &str) -> kube::Client {
        Identity { server: server_url, ..self.identity(startup::ADMIN_USER, &self.admin_token, "default") }
            .client()
            .await
            .expect("a generated kubeconfig is valid")
    }

    /// `kubectl --kubeconfig=<admin kubeconfig>`; add the arguments and run it.
    pub fn kubectl(&self) -> Command {
        let mut kubectl = Command::new(self.binaries.path("kubectl"));
        kubectl.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        kubectl
    }

    /// A serving certificate and key (PEM) for `hosts` (IPs or DNS names), signed by the
    /// test CA: for webhook servers on 127.0.0.1 registered with `caBundle` = [`Self::ca_pem`].
    pub fn issue_serving_cert(&self, hosts: &[&str]) -> (String, String) {
        let served = self.pki.serving_cert(hosts).expect("hosts must be IP addresses or valid DNS names");
        (served.cert_pem, served.key_pem)
    }

    /// Pids of the etcd, kube-apiserver and kube-controller-manager processes now running.
    pub fn child_pids(&self) -> Vec<u32> {
        [&self.etcd, &self.apiserver, &self.controller_manager]
            .into_iter()
            .filter_map(|slot| {
                let mut child = lock(slot);
                let running = child.as_mut()?;
                running.exit_status().is_none().then(|| running.pid())
            })
            .collect()
    }

    /// Kills kube-apiserver (SIGKILL, like a crash) and waits until it is gone.
    ///
    /// Fault tests should do this to their own [`ControlPlane::start`] instance: on
    /// [`crate::shared()`] it would break the tests running concurrently.
    pub fn stop_apiserver(&self) {
        stop(&self.apiserver);
    }

    /// Starts kube-apiserver again with the same port and flags, and waits for /readyz.
    /// Does nothing if it is running. Blocks the calling thread (see [`Self::start`]).
    pub fn start_apiserver(&self) -> anyhow::Result<()> {
        restart(&self.apiserver, &self.apiserver_launch, |apiserver| {
            wait::block_on(async {
                let probe =
                    startup::probe_client(self.identity(startup::ADMIN_USER, &self.admin_token, "default")).await?;
                components::wait_apiserver_ready(apiserver, &probe, APISERVER_TIMEOUT).await
            })
        })
    }

    /// Kills kube-apiserver and starts it again ([`Self::stop_apiserver`], then
    /// [`Self::start_apiserver`]). Blocks the calling thread.
    pub fn restart_apiserver(&self) -> anyhow::Result<()> {
        self.stop_apiserver();
        self.start_apiserver()
    }

    /// Kills etcd (SIGKILL) and waits until it is gone. Its data directory is kept. As
    /// with [`Self::stop_apiserver`], use a separate instance.
    pub fn stop_etcd(&self) {
        stop(&self.etcd);
    }

    /// Starts etcd again with the same ports and data, and waits until it is healthy.
    /// Does nothing if it is running. Blocks the calling thread (see [`Self::start`]).
    pub fn start_etcd(&self) -> anyhow::Result<()> {
        let port =
            self.etcd_url.rsplit(':').next().and_then(|port| port.parse().ok()).context("the etcd URL has no port")?;
        restart(&self.etcd, &self.etcd_launch, |etcd| {
            wait::block_on(components::wait_etcd_healthy(etcd, port, ETCD_TIMEOUT))
        })
    }

    /// Creates a namespace named `<prefix>-<random suffix>` for one test.
    pub async fn namespace(&self, prefix: &str) -> TestNamespace {
        TestNamespace::create(self, prefix)
            .await
            .unwrap_or_else(|error| panic!("failed to create a test namespace: {error:#}"))
    }

    /// The connection settings of `user` with `token`, defaulting to `namespace`.
    pub(crate) fn identity<'a>(&'a self, user: &'a str, token: &'a str, namespace: &'a str) -> Identity<'a> {
        Identity { server: &self.server_url, ca_pem: self.pki.ca_pem(), user, token, namespace }
    }

    /// The path of a control-plane binary.
    pub(crate) fn binary(&self, name: &str) -> PathBuf {
        self.binaries.path(name)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for slot in [&self.controller_manager, &self.apiserver, &self.etcd] {
            stop(slot);
        }
        if std::thread::panicking() || process::logs_kept() {
            self.dir.disable_cleanup(true);
            eprintln!("leasehold-harness: kept control-plane directory {} (a test failed)", self.dir.path().display());
        }
    }
}

/// The component in `slot`; a panic elsewhere while holding the lock leaves a usable value.
fn lock(slot: &Mutex<Option<Supervised>>) -> MutexGuard<'_, Option<Supervised>> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

fn stop(slot: &Mutex<Option<Supervised>>) {
    if let Some(child) = lock(slot).take() {
        child.kill_and_reap();
    }
}

/// Starts `launch` into `slot` unless a live process is there, and waits with `ready`.
fn restart(
    slot: &Mutex<Option<Supervised>>,
    launch: &Launch,
    ready: impl FnOnce(&mut Supervised) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut current = lock(slot);
    if let Some(child) = current.as_mut()
        && child.exit_status().is_none()
    {
        return Ok(());
    }
    let mut child = launch.spawn()?;
    ready(&mut child).with_context(|| format!("log: {}", launch.log().display()))?;
    *current = Some(child);
    Ok(())
}
