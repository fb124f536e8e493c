//! `make demo`: Leasehold end to end on a local control plane.
//!
//! It starts a real kube-apiserver and etcd, installs the chart's cluster objects (CRD,
//! RBAC, the Lease guard), runs the controller with the chart's own ServiceAccount,
//! creates the lock `inventory`, and starts three worker "pods" (Pod objects, each with a
//! real sidecar process) that decrement a stock in PostgreSQL under the lock, fenced by
//! the token. After a few handoffs it freezes one holder in the middle of its critical
//! section: the lease expires, the next worker gets a higher token, and when the frozen
//! worker wakes up and writes with its old token, the database rejects the write.

pub mod cluster;
pub mod http;
pub mod setup;
pub mod workers;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::api::Api;
use leasehold::crd::DistributedLock;
use leasehold_harness::ControlPlane;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use workers::{Happened, Worker};

/// The lock the workers contend for.
pub const LOCK: &str = "inventory";

/// Demo settings.
pub struct Options {
    /// The `leasehold` binary.
    pub leasehold: PathBuf,
    /// The `helm` binary.
    pub helm: PathBuf,
    /// The chart directory.
    pub chart: PathBuf,
    /// Scripted: stop on its own after the stale write is rejected (for tests and CI).
    pub scripted: bool,
    /// Redraw a live view (a terminal); otherwise print one line per event.
    pub live: bool,
    /// Handoffs before the freeze.
    pub handoffs_before_freeze: usize,
}

/// What the demo showed.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Grants in order: (worker, token).
    pub grants: Vec<(String, i64)>,
    /// The frozen worker and its token.
    pub frozen: Option<(String, i64)>,
    /// Who got the lock while it was frozen, and with what token.
    pub expired_to: Option<(String, i64)>,
    /// The frozen worker's stale write: its token, and the token the table had.
    pub stale_rejected: Option<(i64, i64)>,
    /// Stock at the end.
    pub stock: i64,
    /// Every process the demo started (all gone when [`run`] returns).
    pub processes: Vec<u32>,
}

/// One line of the event log.
fn say(out: &mut dyn Write, started: Instant, line: &str) {
    let _ = writeln!(out, "[{:>6.1}s] {line}", started.elapsed().as_secs_f64());
    let _ = out.flush();
}

/// A snapshot of the lock for the live view.
async fn view(locks: &Api<DistributedLock>, db: &tokio_postgres::Client) -> String {
    let now = jiff::Timestamp::now();
    let mut lines = vec![format!(
        "{:<12} {:<16} {:<15} {:<22} {:>8} {:>10} {:>6}",
        "LOCK", "HOLDER", "TOKEN", "QUEUE", "HELD", "LAST-WAIT", "STOCK"
    )];
    let stock = db.query_one("SELECT stock FROM inventory", &[]).await.map(|r| r.get::<_, i64>(0)).unwrap_or(-1);
    if let Ok(lock) = locks.get(LOCK).await {
        let status = lock.status.unwrap_or_default();
        let holder = status.holder.as_ref().and_then(|h| h.pod.clone()).unwrap_or_else(|| "-".into());
        let held = status
            .holder
            .as_ref()
            .map(|h| format!("{:.1}s", now.duration_since(h.acquired_at.0).as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        let queue: Vec<String> = status.waiters.iter().filter_map(|w| w.pod.clone()).collect();
        let wait = status.stats.last_wait_seconds.map(|w| format!("{w:.2}s")).unwrap_or_else(|| "-".into());
        lines.push(format!(
            "{:<12} {:<16} {:<15} {:<22} {:>8} {:>10} {:>6}",
            LOCK,
            holder,
            status.fencing_token.map(|t| t.to_string()).unwrap_or_default(),
            if queue.is_empty() { "-".into() } else { queue.join(",") },
            held,
            wait,
            stock
        ));
    }
    lines.join("\n")
}

/// Runs the demo until `stop` (or, scripted, until it has shown everything).
pub async fn run(options: Options, out: &mut (dyn Write + Send), stop: CancellationToken) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    say(out, started, "starting a local control plane (etcd, kube-apiserver, kube-controller-manager)...");
    let cp = Arc::new(tokio::task::spawn_blocking(ControlPlane::start).await??);
    say(out, started, &format!("control plane {} at {}", cp.version(), cp.server_url()));
    let dir = std::env::temp_dir().join(format!("leasehold-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let service_account =
        setup::install_chart(&cp, &options.helm, &options.chart).context("installing the chart's cluster objects")?;
    say(
        out,
        started,
        &format!(
            "installed the chart's CRD, RBAC and Lease guard; controller ServiceAccount {}/{service_account}",
            setup::RELEASE_NAMESPACE
        ),
    );
    let controller = setup::start_controller(&cp, &options.leasehold, &service_account, &dir)?;
    let stage = setup::stage(&cp, 1000).await?;
    let mut processes = cp.child_pids();
    processes.push(controller.pid());
    processes.extend(stage.pg.pid());
    let locks: Api<DistributedLock> = Api::namespaced(stage.ns.client.clone(), &stage.ns.name);
    // The controller is up once it has reconciled the lock (its status appears).
    tokio::time::timeout(
        Duration::from_secs(60),
        kube::runtime::wait::await_condition(locks.clone(), LOCK, |l: Option<&DistributedLock>| {
            l.is_some_and(|l| l.status.is_some())
        }),
    )
    .await
    .context("the controller did not reconcile the lock within 60 s (see its log)")??;
    say(
        out,
        started,
        &format!(
            "controller running; lock {}/{LOCK} created (lease 4 s, renew deadline 2 s); stock 1000",
            stage.ns.name
        ),
    );
    stage.ns.service_account("worker").await;
    let mut pool = Vec::new();
    for name in ["worker-1", "worker-2", "worker-3"] {
        pool.push(Arc::new(Worker::start(&stage.ns, &options.leasehold, name, &dir).await?));
    }
    for w in &pool {
        processes.extend(w.sidecar.lock().expect("not poisoned").as_ref().map(|s| s.pid()));
    }
    say(out, started, "three worker pods started, each with its own sidecar; they contend for the lock");

    let db = Arc::new(stage.db);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let workers_stop = stop.child_token();
    for w in &pool {
        tokio::spawn(workers::run(w.clone(), db.clone(), tx.clone(), workers_stop.clone()));
    }
    drop(tx);

    let mut outcome = Outcome { processes, ..Outcome::default() };
    let mut redraw = tokio::time::interval(Duration::from_millis(500));
    let deadline =
        tokio::time::Instant::now() + Duration::from_secs(if options.scripted { 150 } else { 365 * 24 * 3600 });
    let mut after_stale = 0;
    let mut frozen_proceed = None;
    loop {
        let happened = tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(deadline) => { say(out, started, "the scripted demo ran out of time"); break }
            _ = redraw.tick(), if options.live => {
                let _ = write!(out, "\x1b[s\x1b[H\x1b[2K{}\x1b[u", view(&locks, &db).await.replace('\n', "\n\x1b[2K"));
                continue;
            }
            h = rx.recv() => match h { Some(h) => h, None => break },
        };
        match happened {
            Happened::Acquired { worker, token, waited, proceed } => {
                say(out, started, &format!("GRANTED  {worker} token={token} (waited {:.2}s)", waited.as_secs_f64()));
                outcome.grants.push((worker.clone(), token));
                if outcome.frozen.is_none() && outcome.grants.len() > options.handoffs_before_freeze {
                    // Freeze this holder in the middle of its critical section: its sidecar
                    // (SIGSTOP) and its app (it waits before its write).
                    let victim = pool.iter().find(|w| w.name == worker).context("a known worker")?.clone();
                    victim.signal(libc::SIGSTOP);
                    outcome.frozen = Some((worker.clone(), token));
                    say(
                        out,
                        started,
                        &format!(
                            "FREEZE   {worker} (token {token}) is paused before its write: sidecar stopped, app stalled"
                        ),
                    );
                    // It is thawed below, once someone else holds the lock.
                    frozen_proceed = Some(proceed);
                    continue;
                }
                if let Some((frozen, old)) = outcome.frozen.clone()
                    && outcome.expired_to.is_none()
                    && worker != frozen
                {
                    say(
                        out,
                        started,
                        &format!(
                            "EXPIRED  {frozen}'s hold (token {old}) was revoked after the lease; {worker} holds token {token} > {old}"
                        ),
                    );
                    outcome.expired_to = Some((worker.clone(), token));
                    // The frozen worker wakes up once the new holder has written.
                }
                let _ = proceed.send(());
                if outcome.stale_rejected.is_some() {
                    after_stale += 1;
                    if options.scripted && after_stale >= 2 {
                        break;
                    }
                }
            }
            Happened::Decremented { worker, token, stock } => {
                say(out, started, &format!("WRITE    {worker} token={token}: stock -> {stock}"));
                outcome.stock = stock;
                if outcome.expired_to.as_ref() == Some(&(worker.clone(), token))
                    && let (Some(resume), Some((frozen, old))) = (frozen_proceed.take(), outcome.frozen.clone())
                {
                    let victim = pool.iter().find(|w| w.name == frozen).context("a known worker")?.clone();
                    victim.signal(libc::SIGCONT);
                    say(out, started, &format!("THAW     {frozen} wakes up and writes with its old token {old}"));
                    let _ = resume.send(());
                }
            }
            Happened::SoldOut { worker } => {
                say(out, started, &format!("SOLD-OUT {worker}: no stock left"));
            }
            Happened::Rejected { worker, token, current } => {
                say(
                    out,
                    started,
                    &format!(
                        "REJECTED {worker}'s stale write: token {token} < {current}, the highest token the table has seen"
                    ),
                );
                if outcome.frozen.as_ref().is_some_and(|(w, _)| *w == worker) {
                    outcome.stale_rejected = Some((token, current));
                }
            }
            Happened::Released { worker, token, was_held } => {
                let note = if was_held { "" } else { " (it had already lost the hold: the sidecar says so)" };
                say(out, started, &format!("RELEASED {worker} token={token}{note}"));
            }
        }
    }
    workers_stop.cancel();
    outcome.stock =
        db.query_one("SELECT stock FROM inventory", &[]).await.map(|r| r.get::<_, i64>(0)).unwrap_or(outcome.stock);
    say(out, started, &format!("done: {} grants, stock {}; stopping everything", outcome.grants.len(), outcome.stock));
    // Wake the frozen sidecar so that it can be stopped cleanly.
    for w in &pool {
        w.signal(libc::SIGCONT);
    }
    drop(pool);
    drop(controller);
    drop(stage.pg);
    drop(stage.ns);
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(outcome)
}
