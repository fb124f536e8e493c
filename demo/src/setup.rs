//! Bringing the demo world up: a local control plane, the chart's cluster objects, the
//! controller running with the chart's own ServiceAccount, PostgreSQL, and the lock.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use kube::api::{Api, PostParams};
use leasehold::crd::{DistributedLock, DistributedLockSpec};
use leasehold_harness::{ControlPlane, Postgres, Supervised, TestNamespace};
use serde_json::Value;

/// Kinds of the chart that make sense without a kubelet: the CRD, RBAC, the Lease guard.
/// (The Deployment, Services, PDB and webhook configurations need running pods.)
const CLUSTER_KINDS: [&str; 8] = [
    "CustomResourceDefinition",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// Where the chart is installed.
pub const RELEASE_NAMESPACE: &str = "leasehold-system";

fn run(command: &mut Command, what: &str) -> anyhow::Result<String> {
    let output = command.output().with_context(|| format!("failed to run {what}"))?;
    if !output.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Renders the chart and applies its cluster objects; returns the controller's
/// ServiceAccount name.
pub fn install_chart(cp: &ControlPlane, helm: &Path, chart: &Path) -> anyhow::Result<String> {
    let rendered = run(
        // Without the `helm test` hook, whose ServiceAccount is not the controller's.
        Command::new(helm)
            .args(["template", "leasehold", "--skip-tests"])
            .arg(chart)
            .args(["--namespace", RELEASE_NAMESPACE]),
        "helm template",
    )?;
    let mut keep = Vec::new();
    let mut service_account = None;
    for document in rendered.split("\n---") {
        let Ok(object) = serde_saphyr::from_str::<Value>(document) else { continue };
        let kind = object["kind"].as_str().unwrap_or_default();
        if CLUSTER_KINDS.contains(&kind) {
            if kind == "ServiceAccount" {
                service_account = object["metadata"]["name"].as_str().map(str::to_owned);
            }
            keep.push(document.trim().to_owned());
        }
    }
    let service_account = service_account.context("the chart rendered no ServiceAccount")?;
    run(cp.kubectl().args(["create", "namespace", RELEASE_NAMESPACE]), "kubectl create namespace")?;
    let mut apply = cp
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    {
        use std::io::Write as _;
        let mut stdin = apply.stdin.take().context("kubectl stdin")?;
        stdin.write_all(keep.join("\n---\n").as_bytes())?;
    }
    let output = apply.wait_with_output()?;
    if !output.status.success() {
        bail!("kubectl apply of the chart's objects failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    run(
        cp.kubectl().args([
            "wait",
            "--for=condition=Established",
            "crd/distributedlocks.leasehold.dev",
            "crd/lockclaims.leasehold.dev",
            "--timeout=60s",
        ]),
        "kubectl wait",
    )?;
    Ok(service_account)
}

/// Writes a kubeconfig for the chart's controller ServiceAccount (a TokenRequest, as the
/// kubelet would mount) and starts `leasehold controller` with it.
pub fn start_controller(
    cp: &ControlPlane,
    leasehold: &Path,
    service_account: &str,
    dir: &Path,
) -> anyhow::Result<Supervised> {
    let token = run(
        cp.kubectl().args(["create", "token", service_account, "-n", RELEASE_NAMESPACE, "--duration=2h"]),
        "kubectl create token",
    )?;
    let kubeconfig = dir.join("controller.kubeconfig");
    write_kubeconfig(cp, token.trim(), &kubeconfig)?;
    let mut command = Command::new(leasehold);
    command
        .args(["controller", "--leader-elect=false", "--admin-addr=127.0.0.1:0"])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info,kube=warn");
    Supervised::spawn("leasehold-controller", command, &dir.join("controller.log"))
}

/// A kubeconfig for `token` against the control plane.
pub fn write_kubeconfig(cp: &ControlPlane, token: &str, path: &Path) -> anyhow::Result<()> {
    let admin = std::fs::read_to_string(cp.kubeconfig_path())?;
    let mut config: Value = serde_saphyr::from_str(&admin)?;
    config["users"] = serde_json::json!([{"name": "demo", "user": {"token": token}}]);
    if let Some(contexts) = config["contexts"].as_array_mut() {
        for c in contexts {
            c["context"]["user"] = Value::String("demo".into());
        }
    }
    std::fs::write(path, serde_saphyr::to_string(&config)?)?;
    Ok(())
}

/// The demo namespace, its lock and PostgreSQL with the inventory table.
pub struct Stage {
    /// Namespace.
    pub ns: TestNamespace,
    /// PostgreSQL.
    pub pg: Postgres,
    /// A client.
    pub db: tokio_postgres::Client,
}

/// The lock's timing: a short lease, so expiry shows quickly.
pub fn lock_spec() -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: 4,
        renew_deadline_seconds: 2,
        retry_period_seconds: 1,
        ..Default::default()
    }
}

/// Creates the namespace, the lock `inventory` and the table.
pub async fn stage(cp: &ControlPlane, stock: i64) -> anyhow::Result<Stage> {
    let ns = cp.namespace("demo").await;
    let locks: Api<DistributedLock> = Api::namespaced(ns.client.clone(), &ns.name);
    locks.create(&PostParams::default(), &DistributedLock::new(crate::LOCK, lock_spec())).await?;
    let pg = Postgres::start()?;
    let (db, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(&format!(
        "CREATE TABLE inventory (item text PRIMARY KEY, stock bigint NOT NULL, token bigint NOT NULL DEFAULT 0);
         INSERT INTO inventory (item, stock) VALUES ('widget', {stock});"
    ))
    .await?;
    Ok(Stage { ns, pg, db })
}

/// The decrement every worker runs under the lock: applied only with a token at least the
/// highest one seen (the inventory guide's case).
pub const DECREMENT: &str = "UPDATE inventory SET stock = stock - 1, token = $1 WHERE item = 'widget' AND stock > 0 AND token <= $1 RETURNING stock";

/// Waits (by polling a condition with a deadline) until `process` serves `/healthz` at `addr`.
pub async fn wait_healthy(addr: std::net::SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some((200, _)) = crate::http::request(addr, "GET", "/healthz", None).await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{addr} not healthy within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The repository root (for the chart), from this crate's location.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}
