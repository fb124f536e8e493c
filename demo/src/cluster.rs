//! `make demo-cluster`: the demo on a real node, with real pods. The chart is installed with
//! the image `make image` built; three worker pods (the sidecar injected by the webhook)
//! take the lock `inventory` in turn and write a ConfigMap fenced by it, stamped with their
//! token. After a few handoffs the holder pod is frozen (its app and sidecar stopped) right
//! after its grant: its lease expires, the next worker is granted a higher token and writes;
//! when the frozen worker is thawed and writes with its old token, the fencing webhook
//! rejects it.
//!
//! Uses the node `make cluster` runs in `.cluster` when there is one, otherwise starts one
//! there for the demo's duration.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{AsyncBufReadExt as _, StreamExt as _};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams, PostParams};
use leasehold::crd::{DistributedLock, DistributedLockSpec};
use leasehold_harness::Node;
use leasehold_harness::node::images::busybox;
use leasehold_image::Entry;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The demo's namespace on the node.
const NAMESPACE: &str = "leasehold-demo";
/// The workers' image: busybox with kubectl.
const WORKER_IMAGE: &str = "leasehold.test/kubectl-shell:1";

/// What `make demo-cluster` is given.
pub struct ClusterOptions {
    /// The image archive (`make image`).
    pub image: PathBuf,
    /// helm.
    pub helm: PathBuf,
    /// The repository (chart, `.cluster`).
    pub repo: PathBuf,
    /// Stop on its own once the stale write is rejected.
    pub scripted: bool,
}

/// What the demo on the node showed.
#[derive(Debug, Default)]
pub struct ClusterOutcome {
    /// Grants in order: (pod, token).
    pub grants: Vec<(String, i64)>,
    /// The frozen pod and its token.
    pub frozen: Option<(String, i64)>,
    /// The frozen pod's write, refused.
    pub stale_rejected: Option<String>,
}

fn say(out: &mut dyn Write, started: Instant, line: &str) {
    let _ = writeln!(out, "[{:>6.1}s] {line}", started.elapsed().as_secs_f64());
    let _ = out.flush();
}

/// The worker's loop: acquire, hold a second, write the fenced ConfigMap with the token,
/// release.
const WORKER: &str = r#"trap 'exit 0' TERM
while true; do
  answer=$(wget -q -O- --post-data '{"waitSeconds": 60}' "$LEASEHOLD_URL/v1/locks/inventory/acquire") || { sleep 1; continue; }
  token=$(echo "$answer" | sed -n 's/.*"fencingToken":\([0-9]*\).*/\1/p')
  echo "holding token $token"
  sleep 1
  if kubectl create configmap stock --from-literal=writer="$POD_NAME" --dry-run=client -o yaml |
     kubectl label --local -f - leasehold.dev/fenced-by=inventory -o yaml |
     kubectl annotate --local -f - leasehold.dev/fencing-token="$token" -o yaml |
     kubectl apply --server-side --force-conflicts --field-manager=worker -f - >/dev/null 2>/tmp/error; then
    echo "WROTE stock with token $token"
  else
    echo "REJECTED write with token $token: $(tail -n 1 /tmp/error)"
  fi
  wget -q -O /dev/null --post-data '' "$LEASEHOLD_URL/v1/locks/inventory/release"
  sleep 1
done"#;

fn worker(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"leasehold.dev/inject": "true", "app": "worker"}},
        "spec": {"terminationGracePeriodSeconds": 5, "containers": [{
            "name": "app", "image": WORKER_IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", WORKER],
            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        }]},
    }))
    .expect("a valid Pod")
}

fn run_checked(mut command: Command, what: &str) -> anyhow::Result<String> {
    let output = command.stdin(Stdio::null()).output().with_context(|| format!("failed to run {what}"))?;
    if !output.status.success() {
        bail!("{what} failed: {}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Stops or resumes every process of `pod`'s containers.
fn signal_pod(node: &Node, pod: &Pod, signal: nix::sys::signal::Signal) -> anyhow::Result<()> {
    let status = pod.status.clone().unwrap_or_default();
    for container in
        status.init_container_statuses.into_iter().flatten().chain(status.container_statuses.into_iter().flatten())
    {
        if let Some(id) = container.container_id {
            let pid = node.container_pid(&id)?;
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)?;
        }
    }
    Ok(())
}

/// Runs the demo until `stop` (or, scripted, until the stale write is rejected).
pub async fn run(
    options: ClusterOptions,
    out: &mut (dyn Write + Send),
    stop: CancellationToken,
) -> anyhow::Result<ClusterOutcome> {
    let started = Instant::now();
    let dir = options.repo.join(".cluster");
    let node = match Node::attach(&dir) {
        Ok(node) => {
            say(out, started, &format!("using the node of `make cluster` ({})", dir.display()));
            node
        }
        Err(_) => {
            say(out, started, "starting a node (kubelet, containerd, the control plane) in .cluster ...");
            let image = options.image.clone();
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || Node::start(&dir, &[image])).await??
        }
    };
    node.import(&options.image)?;
    let kubectl = node.state.bin_dir.join("kubectl");
    let kubeconfig = node.kubeconfig().to_owned();
    let tool = |program: &Path| {
        let mut command = Command::new(program);
        command.env("KUBECONFIG", &kubeconfig).current_dir(&options.repo);
        command
    };
    let mut spec = busybox(WORKER_IMAGE)?;
    spec.entries.push(Entry::from_host("/usr/local/bin/kubectl", 0o755, &kubectl)?);
    node.build_and_import(&spec)?;

    let mut status = tool(&options.helm);
    status.args(["status", "leasehold", "--namespace", "leasehold-system"]);
    if run_checked(status, "helm status").is_err() {
        let mut install = tool(&options.helm);
        install.args([
            "install",
            "leasehold",
            "charts/leasehold",
            "--namespace",
            "leasehold-system",
            "--create-namespace",
            "--wait",
        ]);
        run_checked(install, "helm install")?;
        say(out, started, "helm install leasehold charts/leasehold: 2 controller replicas Ready");
    }
    let mut namespace = tool(&kubectl);
    namespace.args(["create", "namespace", NAMESPACE]);
    let _ = run_checked(namespace, "kubectl create namespace");
    let mut rbac = tool(&kubectl);
    rbac.args([
        "-n",
        NAMESPACE,
        "create",
        "rolebinding",
        "workers-edit",
        "--clusterrole=edit",
        &format!("--serviceaccount={NAMESPACE}:default"),
    ]);
    let _ = run_checked(rbac, "kubectl create rolebinding");

    let admin = node.admin_client().await;
    let locks: Api<DistributedLock> = Api::namespaced(admin.clone(), NAMESPACE);
    if locks.get_opt("inventory").await?.is_none() {
        locks
            .create(&PostParams::default(), &DistributedLock::new("inventory", DistributedLockSpec::default()))
            .await?;
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let (lines, mut incoming) = mpsc::unbounded_channel::<(String, String)>();
    for name in ["worker-1", "worker-2", "worker-3"] {
        if pods.get_opt(name).await?.is_none() {
            pods.create(&PostParams::default(), &worker(name)).await?;
        }
    }
    for name in ["worker-1", "worker-2", "worker-3"] {
        let ready = |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref()?.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        };
        tokio::time::timeout(Duration::from_secs(120), kube::runtime::wait::await_condition(pods.clone(), name, ready))
            .await
            .with_context(|| format!("{name} was not Ready within 2 minutes"))??;
        let (pods, lines, name) = (pods.clone(), lines.clone(), name.to_owned());
        tokio::spawn(async move {
            let params = LogParams { container: Some("app".into()), follow: true, ..LogParams::default() };
            if let Ok(stream) = pods.log_stream(&name, &params).await {
                let mut stream = stream.lines();
                while let Some(Ok(line)) = stream.next().await {
                    let _ = lines.send((name.clone(), line));
                }
            }
        });
    }
    say(
        out,
        started,
        &format!(
            "three worker pods Ready in namespace {NAMESPACE}, each with an injected sidecar; they contend for the lock inventory (lease 15 s)"
        ),
    );

    let leases: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
    let mut outcome = ClusterOutcome::default();
    let mut frozen_at: Option<Instant> = None;
    let mut ticker = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            line = incoming.recv() => {
                let Some((pod, line)) = line else { break };
                say(out, started, &format!("{pod}: {line}"));
                if let Some((frozen, _)) = &outcome.frozen
                    && *frozen == pod
                    && line.starts_with("REJECTED")
                {
                    outcome.stale_rejected = Some(line.clone());
                    if options.scripted {
                        break;
                    }
                }
            }
            _ = ticker.tick() => {
                let Some(lease) = leases.get_opt("inventory").await? else { continue };
                let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default();
                let token: i64 = lease.metadata.annotations.as_ref().and_then(|a| a.get("leasehold.dev/fencing-token")).and_then(|t| t.parse().ok()).unwrap_or(0);
                let pod = holder.split('_').next().unwrap_or_default().to_owned();
                if holder.is_empty() || outcome.grants.last().is_some_and(|(_, t)| *t == token) {
                    continue;
                }
                say(out, started, &format!("GRANTED  {pod} token={token}"));
                outcome.grants.push((pod.clone(), token));
                if let Some((frozen, _)) = outcome.frozen.clone()
                    && frozen_at.is_some()
                    && frozen != pod
                {
                    let waited = frozen_at.take().map(|t| t.elapsed().as_secs_f64()).unwrap_or_default();
                    say(out, started, &format!("EXPIRED  {frozen}'s hold ran out ({waited:.1} s frozen); {pod} holds a higher token. THAW {frozen}: it will write with its old token"));
                    signal_pod(&node, &pods.get(&frozen).await?, nix::sys::signal::Signal::SIGCONT)?;
                }
                if outcome.frozen.is_none() && outcome.grants.len() > 3 {
                    signal_pod(&node, &pods.get(&pod).await?, nix::sys::signal::Signal::SIGSTOP)?;
                    outcome.frozen = Some((pod.clone(), token));
                    frozen_at = Some(Instant::now());
                    say(out, started, &format!("FREEZE   {pod} (token {token}) right after its grant: app and sidecar stopped before its write"));
                }
            }
        }
    }
    if let Some((frozen, _)) = &outcome.frozen
        && frozen_at.is_some()
    {
        let _ = signal_pod(&node, &pods.get(frozen).await?, nix::sys::signal::Signal::SIGCONT);
    }
    let mut cleanup = tool(&kubectl);
    cleanup.args(["delete", "namespace", NAMESPACE, "--wait=false"]);
    let _ = run_checked(cleanup, "kubectl delete namespace");
    Ok(outcome)
}
