//! The three control-plane components: how each is launched (flags checked against the
//! `--help` of the v1.36 binaries) and how each is known to be ready.

use std::{
    net::{Ipv4Addr, TcpListener},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, anyhow};
use http::Request;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::{
    binaries::Binaries,
    process::Supervised,
    wait::{self, Probe},
};

/// The issuer of service-account tokens, and the audience the apiserver accepts.
pub(crate) const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc";

/// Lines of a component's log quoted in an error.
const LOG_LINES_IN_ERRORS: usize = 25;

/// How to (re)start one component: the same program and flags every time.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
}

impl Launch {
    /// Starts the component; its output is appended to its log file.
    pub(crate) fn spawn(&self) -> anyhow::Result<Supervised> {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        Supervised::spawn(self.name, command, &self.log)
    }

    /// The log file of this component.
    pub(crate) fn log(&self) -> &Path {
        &self.log
    }
}

/// The files of one control plane, all inside its temporary directory.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) dir: PathBuf,
}

impl Layout {
    pub(crate) fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    pub(crate) fn apiserver_cert(&self) -> PathBuf {
        self.dir.join("apiserver.crt")
    }
    pub(crate) fn apiserver_key(&self) -> PathBuf {
        self.dir.join("apiserver.key")
    }
    pub(crate) fn sa_private_key(&self) -> PathBuf {
        self.dir.join("service-account.key")
    }
    pub(crate) fn sa_public_key(&self) -> PathBuf {
        self.dir.join("service-account.pub")
    }
    pub(crate) fn token_file(&self) -> PathBuf {
        self.dir.join("tokens.csv")
    }
    pub(crate) fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }
    pub(crate) fn etcd_data(&self) -> PathBuf {
        self.dir.join("etcd-data")
    }
    fn log(&self, component: &str) -> PathBuf {
        self.dir.join(format!("{component}.log"))
    }
}

/// etcd on loopback, with a data directory that survives restarts of the process.
pub(crate) fn etcd(binaries: &Binaries, layout: &Layout, client_port: u16, peer_port: u16) -> Launch {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    Launch {
        name: "etcd",
        program: binaries.path("etcd"),
        args: vec![
            "--name=leasehold".into(),
            format!("--data-dir={}", layout.etcd_data().display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=leasehold={peer}"),
            // Test data is throwaway; fsync would dominate start-up and write latency.
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ],
        log: layout.log("etcd"),
    }
}

/// kube-apiserver on `127.0.0.1:<port>` with real authentication and RBAC.
pub(crate) fn apiserver(binaries: &Binaries, layout: &Layout, etcd_url: &str, port: u16) -> Launch {
    let path = |p: PathBuf| p.display().to_string();
    Launch {
        name: "kube-apiserver",
        program: binaries.path("kube-apiserver"),
        args: vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            // Without it the server looks for an interface with a default route.
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", path(layout.apiserver_cert())),
            format!("--tls-private-key-file={}", path(layout.apiserver_key())),
            // Ignored when the files above are given, but keeps the default
            // /var/run/kubernetes out of the picture.
            format!("--cert-dir={}", path(layout.dir.join("apiserver-certs"))),
            format!("--client-ca-file={}", path(layout.ca_cert())),
            format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
            format!("--api-audiences={SERVICE_ACCOUNT_ISSUER}"),
            format!("--service-account-key-file={}", path(layout.sa_public_key())),
            format!("--service-account-signing-key-file={}", path(layout.sa_private_key())),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            // RBAC must be real: the chart's RBAC is under test.
            "--authorization-mode=Node,RBAC".into(),
            format!("--token-auth-file={}", path(layout.token_file())),
            // The `kubernetes` Service is still created (with ClusterIP 10.0.0.1), but its
            // endpoints are not: they would be 127.0.0.1, which validation rejects for
            // Endpoints every 10 s ("may not be in the loopback range"), filling the log
            // with errors that mislead whoever reads it after a failure.
            "--endpoint-reconciler-type=none".into(),
        ],
        log: layout.log("kube-apiserver"),
    }
}

/// kube-controller-manager with only the controllers tests rely on: garbage collection
/// (owner references), namespace deletion, each namespace's `default` ServiceAccount, and
/// ClusterRole aggregation (the built-in `view`, `edit` and `admin` roles gain what the
/// chart's aggregated roles add).
pub(crate) fn controller_manager(binaries: &Binaries, layout: &Layout) -> Launch {
    let path = |p: PathBuf| p.display().to_string();
    Launch {
        name: "kube-controller-manager",
        program: binaries.path("kube-controller-manager"),
        args: vec![
            format!("--kubeconfig={}", path(layout.admin_kubeconfig())),
            "--controllers=garbage-collector-controller,namespace-controller,serviceaccount-controller,clusterrole-aggregation-controller"
                .into(),
            // One instance: electing a leader would only add seconds to start-up.
            "--leader-elect=false".into(),
            // 0 disables its HTTPS endpoint, which tests do not use (no port to collide).
            "--secure-port=0".into(),
            format!("--service-account-private-key-file={}", path(layout.sa_private_key())),
            format!("--root-ca-file={}", path(layout.ca_cert())),
        ],
        log: layout.log("kube-controller-manager"),
    }
}

/// `N` distinct loopback ports that were free a moment ago (held open together so that
/// they differ). Another process may take one before the component binds it, so callers
/// retry start-up on bind failures.
pub(crate) fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("failed to bind an ephemeral loopback port")?;
        *port = listener.local_addr().context("failed to read an ephemeral port")?.port();
        listeners.push(listener);
    }
    Ok(ports)
}

/// Whether `child` exited because one of its ports was taken.
pub(crate) fn lost_port_race(child: &Supervised) -> bool {
    child.log_tail(LOG_LINES_IN_ERRORS).contains("address already in use")
}

/// The error for a component that exited while it was expected to come up.
fn exited(child: &mut Supervised) -> Option<anyhow::Error> {
    let status = child.exit_status()?;
    Some(anyhow!(
        "{} exited ({status}); log {}, last lines:\n{}",
        child.name(),
        child.log().display(),
        child.log_tail(LOG_LINES_IN_ERRORS)
    ))
}

/// Waits until etcd answers `GET /health` with `"health":"true"`.
pub(crate) async fn wait_etcd_healthy(
    child: &mut Supervised,
    client_port: u16,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait::poll("etcd /health", timeout, || {
        let failed = exited(child);
        async move {
            if let Some(error) = failed {
                return Probe::Fatal(error);
            }
            match tokio::time::timeout(Duration::from_secs(2), etcd_health(client_port)).await {
                Ok(Ok(body)) if body.contains("\"health\":\"true\"") => Probe::Ready(()),
                Ok(Ok(body)) => Probe::NotYet(format!("unhealthy: {body}")),
                Ok(Err(error)) => Probe::NotYet(format!("{error:#}")),
                Err(_) => Probe::NotYet("no answer within 2s".into()),
            }
        }
    })
    .await
}

/// One plain-HTTP `GET /health` (etcd's client port is loopback HTTP; this avoids an
/// HTTP client dependency).
async fn etcd_health(port: u16) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
    stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

/// Waits until the apiserver answers `/readyz` with 200, asking as `probe` (the admin).
pub(crate) async fn wait_apiserver_ready(
    child: &mut Supervised,
    probe: &kube::Client,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait::poll("kube-apiserver /readyz", timeout, || {
        let failed = exited(child);
        async move {
            if let Some(error) = failed {
                return Probe::Fatal(error);
            }
            let request = match Request::get("/readyz").body(Vec::new()) {
                Ok(request) => request,
                Err(error) => return Probe::Fatal(error.into()),
            };
            match tokio::time::timeout(Duration::from_secs(5), probe.request_text(request)).await {
                Ok(Ok(_)) => Probe::Ready(()),
                Ok(Err(error)) => Probe::NotYet(error.to_string()),
                Err(_) => Probe::NotYet("no answer within 5s".into()),
            }
        }
    })
    .await
}

/// Waits until the `default` ServiceAccount exists in the `default` namespace: proof that
/// kube-controller-manager is connected and its controllers run.
pub(crate) async fn wait_controller_manager_ready(
    child: &mut Supervised,
    admin: &kube::Client,
    timeout: Duration,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let service_accounts = kube::Api::<ServiceAccount>::namespaced(admin.clone(), "default");
    wait::poll("the default ServiceAccount (kube-controller-manager)", timeout, || {
        let failed = exited(child);
        let service_accounts = service_accounts.clone();
        async move {
            if let Some(error) = failed {
                return Probe::Fatal(error);
            }
            match service_accounts.get_opt("default").await {
                Ok(Some(_)) => Probe::Ready(()),
                Ok(None) => Probe::NotYet("not created yet".into()),
                Err(error) => Probe::NotYet(error.to_string()),
            }
        }
    })
    .await
}
