//! On a real node (`leasehold_harness::node`): the chart installed with the image `make
//! image` built, the controller's and a sidecar's memory read from their containers'
//! cgroups, and failover measured after the holder's app container is killed and after
//! the holder pod is deleted — each from the test's action to the next grant seen on a
//! watch of the lock Lease. A deletion's failover is also split where its app container
//! exited (containerd's exit event): before it, the kubelet's signal and the app's exit;
//! after it, Leasehold's.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use leasehold::crd::{DistributedLock, DistributedLockSpec};
use leasehold_harness::Node;
use leasehold_harness::node::apps::{acquirer, container_id, identity, session_acquirer};
use serde_json::json;

use crate::record::{Memory, Panel, Run, Series};
use crate::support::watch::GrantLog;

const WAIT: Duration = Duration::from_secs(120);

/// The container's cgroup counters, and (for comparison with the other rows) its main
/// process's VmRSS.
fn memory(node: &Node, container: &str, what: &str, params: serde_json::Value) -> anyhow::Result<Vec<Memory>> {
    let process =
        crate::observe::memory(node.container_pid(container)?, &format!("{what} (its process)"), params.clone())?;
    let m = node.container_memory(container)?;
    let cgroup = Memory {
        what: what.to_owned(),
        rss_kib: m.working_set / 1024,
        peak_kib: m.max_usage / 1024,
        anon_kib: m.rss / 1024,
        file_kib: m.cache / 1024,
        params: json!({"source": "container cgroup (v1): working set = usage − inactive file; anon = total_rss; file = total_cache; peak = max_usage", "when": params}),
    };
    Ok(vec![cgroup, process])
}

async fn wait_pod(pods: &Api<Pod>, name: &str, what: &str, ready: fn(&Pod) -> bool) -> anyhow::Result<Pod> {
    let condition = move |p: Option<&Pod>| p.is_some_and(ready);
    match tokio::time::timeout(WAIT, await_condition(pods.clone(), name, condition)).await {
        Ok(Ok(Some(pod))) => Ok(pod),
        other => bail!("pod {name} not {what} within {WAIT:?}: {other:?}"),
    }
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

async fn waiting(locks: &Api<DistributedLock>, lock: &str, who: &str) -> anyhow::Result<()> {
    let condition = |l: Option<&DistributedLock>| {
        l.and_then(|l| l.status.as_ref()).is_some_and(|s| s.waiters.iter().any(|w| w.identity == who))
    };
    tokio::time::timeout(WAIT, await_condition(locks.clone(), lock, condition))
        .await
        .with_context(|| format!("{who} never queued"))??;
    Ok(())
}

/// What ends the holder's hold in one handover.
#[derive(Clone, Copy, PartialEq)]
enum Act {
    /// SIGKILL to the app container of a pod that is never restarted.
    KillApp,
    /// The holder pod deleted, with its grace period; the app took a plain hold.
    DeletePod,
    /// The holder pod deleted, with its grace period; the app's hold is session-bound.
    DeleteSessionPod,
}

/// One handover, as measured.
struct Handover {
    /// From the action to the waiter's grant seen on a watch.
    ms: f64,
    /// The action, in seconds since the epoch (containerd's clock).
    acted_at: f64,
    /// The holder pod, when the action deleted it.
    deleted: Option<Deleted>,
}

/// A holder pod the handover deleted.
struct Deleted {
    pod: String,
    uid: String,
    /// Its app container (`containerd://<id>`).
    app: String,
}

/// One handover: a holder pod and a waiter pod for a fresh lock; `act` on the holder; the
/// time from the action to the waiter's grant.
async fn handover(
    admin: &kube::Client,
    namespace: &str,
    round: usize,
    act: Act,
    node: &Node,
) -> anyhow::Result<Handover> {
    let kill_app = act == Act::KillApp;
    let app = if act == Act::DeleteSessionPod { session_acquirer } else { acquirer };
    let lock = format!("failover-{round}");
    let locks: Api<DistributedLock> = Api::namespaced(admin.clone(), namespace);
    locks.create(&PostParams::default(), &DistributedLock::new(&lock, DistributedLockSpec::default())).await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    let leases: Api<Lease> = Api::namespaced(admin.clone(), namespace);
    let mut grants = GrantLog::start(leases, &lock);
    let restart = if kill_app { "Never" } else { "Always" };
    let (holder, waiter) = (format!("holder-{round}"), format!("waiter-{round}"));
    pods.create(&PostParams::default(), &app(&holder, &lock, restart)).await?;
    wait_pod(&pods, &holder, "Running", running).await?;
    grants.wait_for(1, WAIT).await;
    pods.create(&PostParams::default(), &app(&waiter, &lock, restart)).await?;
    let waiting_pod = wait_pod(&pods, &waiter, "Running", running).await?;
    waiting(&locks, &lock, &identity(&waiting_pod)).await?;
    let pod = pods.get(&holder).await?;
    let app = container_id(&pod, "app");
    let (acted, acted_at) = if kill_app {
        let pid = node.container_pid(&app)?;
        let acted = (Instant::now(), SystemTime::now());
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL)?;
        acted
    } else {
        let acted = (Instant::now(), SystemTime::now());
        pods.delete(&holder, &DeleteParams::default()).await?;
        acted
    };
    let seen = grants.wait_for(2, Duration::from_secs(30)).await;
    anyhow::ensure!(seen[1].holder == identity(&waiting_pod), "the waiter was not next: {seen:?}");
    let _ = pods.delete(&waiter, &DeleteParams::default()).await;
    if kill_app {
        let _ = pods.delete(&holder, &DeleteParams::default()).await;
    }
    let deleted = (!kill_app).then(|| Deleted { pod: holder, uid: pod.metadata.uid.clone().unwrap_or_default(), app });
    Ok(Handover {
        ms: (seen[1].seen - acted).as_secs_f64() * 1000.0,
        acted_at: acted_at.duration_since(UNIX_EPOCH)?.as_secs_f64(),
        deleted,
    })
}

/// Splits deletion handovers at their app container's exit: (action → exited, exited →
/// granted), in ms. Waits until each deleted holder pod is gone, so that containerd has
/// logged its containers' exits.
async fn split_at_app_exit(
    pods: &Api<Pod>,
    node: &Node,
    handovers: &[Handover],
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let (mut before, mut after) = (Vec::new(), Vec::new());
    for h in handovers {
        let Some(Deleted { pod, uid, app }) = &h.deleted else { continue };
        tokio::time::timeout(WAIT, await_condition(pods.clone(), pod, conditions::is_deleted(uid)))
            .await
            .with_context(|| format!("pod {pod} not gone within {WAIT:?}"))??;
        let exited =
            node.container_exited_at(app)?.with_context(|| format!("containerd logged no exit of pod {pod}'s app"))?;
        let ms = (exited - h.acted_at) * 1000.0;
        before.push(ms);
        after.push(h.ms - ms);
    }
    Ok((before, after))
}

/// The node phase: start the node, install the chart, measure, stop the node.
pub async fn run(repo: &Path, samples: usize) -> anyhow::Result<Run> {
    let version = leasehold_image::leasehold::app_version(repo)?;
    let image = repo.join(format!("target/image/leasehold-{version}.oci.tar"));
    let dir = leasehold_harness::node::test_dir().with_file_name("bench");
    let node = tokio::task::spawn_blocking(move || Node::start(&dir, &[image])).await??;
    let mut r = Run::default();
    r.facts.insert("node start-up (s)".into(), json!((node.state.startup_seconds * 10.0).round() / 10.0));

    let tools = Command::new(repo.join("e2e/tools/build.sh")).stdin(Stdio::null()).output()?;
    let helm = String::from_utf8_lossy(&tools.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("helm=").map(str::to_owned))
        .context("e2e/tools/build.sh printed no helm")?;
    let installed = Command::new(helm)
        .args(["install", "leasehold", "charts/leasehold", "--namespace", "leasehold-system", "--create-namespace"])
        .args(["--wait", "--timeout", "5m"])
        .env("KUBECONFIG", node.kubeconfig())
        .env("HELM_CACHE_HOME", node.dir().join("helm/cache"))
        .env("HELM_CONFIG_HOME", node.dir().join("helm/config"))
        .env("HELM_DATA_HOME", node.dir().join("helm/data"))
        .current_dir(repo)
        .stdin(Stdio::null())
        .output()?;
    anyhow::ensure!(installed.status.success(), "helm install: {}", String::from_utf8_lossy(&installed.stderr));

    let admin = node.admin_client().await;
    let controllers = Api::<Pod>::namespaced(admin.clone(), "leasehold-system")
        .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
        .await?;
    let namespace = "bench-node";
    let _ = Command::new(node.state.bin_dir.join("kubectl"))
        .arg(format!("--kubeconfig={}", node.kubeconfig().display()))
        .args(["create", "namespace", namespace])
        .output()?;

    // A sidecar holding a lock, idle.
    let locks: Api<DistributedLock> = Api::namespaced(admin.clone(), namespace);
    locks.create(&PostParams::default(), &DistributedLock::new("held", DistributedLockSpec::default())).await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    pods.create(&PostParams::default(), &acquirer("sidecar-holder", "held", "Always")).await?;
    wait_pod(&pods, "sidecar-holder", "Running", running).await?;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), namespace);
    GrantLog::start(leases, "held").wait_for(1, WAIT).await;
    tokio::time::sleep(Duration::from_secs(10)).await; // a few renewals: steady state, not start-up
    let holder = pods.get("sidecar-holder").await?;
    r.memory.extend(memory(
        &node,
        &container_id(&holder, "leasehold-sidecar"),
        "node: sidecar container holding 1 lock",
        json!("held 10 s"),
    )?);

    let (mut kills, mut deletions, mut session_deletions) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..samples {
        kills.push(handover(&admin, namespace, 3 * round, Act::KillApp, &node).await?);
        deletions.push(handover(&admin, namespace, 3 * round + 1, Act::DeletePod, &node).await?);
        session_deletions.push(handover(&admin, namespace, 3 * round + 2, Act::DeleteSessionPod, &node).await?);
    }
    let (deleted_exit, deleted_grant) = split_at_app_exit(&pods, &node, &deletions).await?;
    let (session_exit, session_grant) = split_at_app_exit(&pods, &node, &session_deletions).await?;
    let ms = |handovers: Vec<Handover>| handovers.into_iter().map(|h| h.ms).collect::<Vec<_>>();
    let (kills, deletions, session_deletions) = (ms(kills), ms(deletions), ms(session_deletions));
    for pod in &controllers.items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let what = format!("node: controller container {name}");
        let when = json!(format!("after {} failovers on {} locks", 3 * samples, 3 * samples + 1));
        r.memory.extend(memory(&node, &container_id(pod, "controller"), &what, when)?);
    }
    let params = json!({"lease_duration_s": 15, "samples": samples, "node": "real (kubelet, containerd)"});
    r.series.push(Series::new(
        "leasehold.node.app_kill.failover",
        "Real pod: holder's app container SIGKILLed (restartPolicy Never) → waiter granted (the pod ends, its sidecar releases)",
        "Leasehold",
        Panel::Failover,
        kills,
        params.clone(),
    ));
    r.series.push(Series::new(
        "leasehold.node.pod_delete.failover",
        "Real pod: holder pod deleted (grace period; the app exits on SIGTERM) → waiter granted",
        "Leasehold",
        Panel::Failover,
        deletions,
        params.clone(),
    ));
    r.series.push(Series::new(
        "leasehold.node.pod_delete_session.failover",
        "Real pod, session-bound hold: holder pod deleted (grace period; the app exits on SIGTERM, closing its session) → waiter granted",
        "Leasehold",
        Panel::Failover,
        session_deletions,
        params.clone(),
    ));
    let mut split = params;
    split["app_exited"] =
        json!("exited_at of containerd's exit event for the holder's app container (containerd's log)");
    for (key, title, samples_ms) in [
        (
            "leasehold.node.pod_delete.app_exit",
            "Real pod: holder pod deleted → its app container exited (the kubelet's signal, the app's exit)",
            deleted_exit,
        ),
        (
            "leasehold.node.pod_delete.after_app_exit",
            "Real pod: holder's app container exited → waiter granted",
            deleted_grant,
        ),
        (
            "leasehold.node.pod_delete_session.app_exit",
            "Real pod, session-bound hold: holder pod deleted → its app container exited (the kubelet's signal, the app's exit)",
            session_exit,
        ),
        (
            "leasehold.node.pod_delete_session.after_app_exit",
            "Real pod, session-bound hold: holder's app container exited → waiter granted",
            session_grant,
        ),
    ] {
        r.series.push(Series::new(key, title, "Leasehold", Panel::Failover, samples_ms, split.clone()));
    }
    drop(node);
    Ok(r)
}
