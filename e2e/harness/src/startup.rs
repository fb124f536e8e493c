//! First start of a control plane: files, then etcd, kube-apiserver and
//! kube-controller-manager in order, each waited for before the next, retrying with new
//! ports when a component loses the race for a port it was given.

use std::{
    io::Read as _,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    binaries::Binaries,
    components::{self, Launch, Layout},
    kubeconfig::Identity,
    pki::{APISERVER_HOSTS, Pki},
    process::Supervised,
};

/// etcd starts in about a second; generous for a loaded machine.
pub(crate) const ETCD_TIMEOUT: Duration = Duration::from_secs(60);
/// A cold kube-apiserver on 2 busy cores can take over a minute to pass /readyz.
pub(crate) const APISERVER_TIMEOUT: Duration = Duration::from_secs(180);
/// Controller-manager start-up plus its first sync of the `default` namespace.
const CONTROLLER_MANAGER_TIMEOUT: Duration = Duration::from_secs(120);
/// Attempts at a component whose ports were taken between choosing and binding them.
const PORT_ATTEMPTS: usize = 3;

/// The user name of the admin token (group `system:masters`).
pub(crate) const ADMIN_USER: &str = "leasehold-admin";

/// A started control plane, before it is wrapped into a `ControlPlane`.
pub(crate) struct Running {
    pub(crate) etcd: (Launch, Supervised),
    pub(crate) apiserver: (Launch, Supervised),
    pub(crate) controller_manager: (Launch, Supervised),
    pub(crate) etcd_url: String,
    pub(crate) server_url: String,
    pub(crate) timings: Timings,
}

/// How long each component took to become ready.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timings {
    pub(crate) etcd: Duration,
    pub(crate) apiserver: Duration,
    pub(crate) controller_manager: Duration,
}

/// Writes the PKI, the token file and the etcd data directory into `layout`.
pub(crate) fn write_files(layout: &Layout, pki: &Pki, admin_token: &str) -> anyhow::Result<()> {
    let serving = pki.serving_cert(&APISERVER_HOSTS)?;
    let write = |path: std::path::PathBuf, contents: &str| {
        std::fs::write(&path, contents).with_context(|| format!("failed to write {}", path.display()))
    };
    write(layout.ca_cert(), pki.ca_pem())?;
    write(layout.apiserver_cert(), &serving.cert_pem)?;
    write(layout.apiserver_key(), &serving.key_pem)?;
    write(layout.sa_private_key(), pki.sa_private_pem())?;
    write(layout.sa_public_key(), pki.sa_public_pem())?;
    // token,user,uid,"group,..." — the static token authenticator's CSV format.
    write(layout.token_file(), &format!("{admin_token},{ADMIN_USER},{ADMIN_USER},\"system:masters\"\n"))
}

/// A random bearer token (hex of 24 bytes from the kernel's CSPRNG).
pub(crate) fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .context("failed to read /dev/urandom")?;
    Ok(bytes.iter().fold(String::with_capacity(48), |mut hex, byte| {
        use std::fmt::Write as _;
        let _ = write!(hex, "{byte:02x}"); // writing to a String cannot fail
        hex
    }))
}

/// Starts etcd, kube-apiserver and kube-controller-manager, each ready before the next.
pub(crate) async fn start_all(
    binaries: &Binaries,
    layout: &Layout,
    ca_pem: &str,
    admin_token: &str,
) -> anyhow::Result<Running> {
    let began = Instant::now();
    let (etcd_launch, etcd, etcd_port) = start_etcd(binaries, layout).await?;
    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    let etcd_ready = Instant::now();

    let (apiserver_launch, apiserver, server_url) =
        start_apiserver(binaries, layout, &etcd_url, ca_pem, admin_token).await?;
    let apiserver_ready = Instant::now();

    let admin = admin_identity(&server_url, ca_pem, admin_token, "default");
    admin.write(&layout.admin_kubeconfig())?;
    let launch = components::controller_manager(binaries, layout);
    let mut controller_manager = launch.spawn()?;
    let admin_client = admin.client().await?;
    components::wait_controller_manager_ready(&mut controller_manager, &admin_client, CONTROLLER_MANAGER_TIMEOUT)
        .await?;

    Ok(Running {
        etcd: (etcd_launch, etcd),
        apiserver: (apiserver_launch, apiserver),
        controller_manager: (launch, controller_manager),
        etcd_url,
        server_url,
        timings: Timings {
            etcd: etcd_ready - began,
            apiserver: apiserver_ready - etcd_ready,
            controller_manager: apiserver_ready.elapsed(),
        },
    })
}

/// The admin's identity (static token in `system:masters`).
pub(crate) fn admin_identity<'a>(server: &'a str, ca_pem: &'a str, token: &'a str, namespace: &'a str) -> Identity<'a> {
    Identity { server, ca_pem, user: ADMIN_USER, token, namespace }
}

/// A client for readiness probes: no automatic retries, so each probe is one request.
pub(crate) async fn probe_client(identity: Identity<'_>) -> anyhow::Result<kube::Client> {
    let mut config = identity.config().await?;
    config.default_retry = false;
    kube::Client::try_from(config).context("failed to build the readiness probe client")
}

async fn start_etcd(binaries: &Binaries, layout: &Layout) -> anyhow::Result<(Launch, Supervised, u16)> {
    for attempt in 1..=PORT_ATTEMPTS {
        let [client_port, peer_port] = components::free_ports()?;
        let launch = components::etcd(binaries, layout, client_port, peer_port);
        let mut etcd = launch.spawn()?;
        match components::wait_etcd_healthy(&mut etcd, client_port, ETCD_TIMEOUT).await {
            Ok(()) => return Ok((launch, etcd, client_port)),
            Err(_) if attempt < PORT_ATTEMPTS && components::lost_port_race(&etcd) => {
                // A member that never served may still have written its (port-bearing)
                // membership into the data directory: start the next one from scratch.
                drop(etcd);
                let _ = std::fs::remove_dir_all(layout.etcd_data());
            }
            Err(error) => return Err(error),
        }
    }
    bail!("etcd lost the race for its ports {PORT_ATTEMPTS} times")
}

async fn start_apiserver(
    binaries: &Binaries,
    layout: &Layout,
    etcd_url: &str,
    ca_pem: &str,
    admin_token: &str,
) -> anyhow::Result<(Launch, Supervised, String)> {
    for attempt in 1..=PORT_ATTEMPTS {
        // --secure-port cannot be 0, so a free port is chosen here and may be lost.
        let [port] = components::free_ports()?;
        let server_url = format!("https://127.0.0.1:{port}");
        let launch = components::apiserver(binaries, layout, etcd_url, port);
        let mut apiserver = launch.spawn()?;
        let probe = probe_client(admin_identity(&server_url, ca_pem, admin_token, "default")).await?;
        match components::wait_apiserver_ready(&mut apiserver, &probe, APISERVER_TIMEOUT).await {
            Ok(()) => return Ok((launch, apiserver, server_url)),
            Err(_) if attempt < PORT_ATTEMPTS && components::lost_port_race(&apiserver) => {}
            Err(error) => return Err(error),
        }
    }
    bail!("kube-apiserver lost the race for its port {PORT_ATTEMPTS} times")
}
