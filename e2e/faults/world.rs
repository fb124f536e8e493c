//! The whole system under faults: a dedicated control plane (it gets restarted), two
//! controller replicas, PostgreSQL, and per lock several "pods" — a Pod object, a sidecar
//! process talking to the apiserver through its own fault proxy, and an app task in this
//! process doing critical sections against fenced resources.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use leasehold::crd::{ANNOTATION_TOKEN, DistributedLockSpec};
use leasehold_harness::{ControlPlane, FaultProxy, Postgres};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::history::{History, Op, Resource};
use crate::support::{Env, LeaseholdProcess, TestPod, free_port, http_request, leasehold_bin};

/// The timing of the locks under test: lease 4 s, renew deadline 2 s, retry 1 s.
pub fn timing() -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: 4,
        renew_deadline_seconds: 2,
        retry_period_seconds: 1,
        ..Default::default()
    }
}

/// Workers each lock keeps (set by [`World::start`]).
pub static WORKERS_PER_LOCK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(3);

/// `lease - renewDeadline`: how long beliefs may overlap.
pub const MARGIN: Duration = Duration::from_secs(2);
/// A lease duration.
pub const LEASE: Duration = Duration::from_secs(4);
/// The renew deadline.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(2);

/// How a sidecar's clock is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// The real clock.
    Real,
    /// The wall clock shifted by this many seconds (libfaketime); the monotonic clock is
    /// left alone.
    Shifted(i64),
}

/// One app "pod".
pub struct Worker {
    /// Pod name (the client name in the history).
    pub name: String,
    /// Lock it works on.
    pub lock: String,
    /// Its Pod and credentials.
    pub pod: TestPod,
    /// Its sidecar process.
    pub sidecar: Mutex<Option<LeaseholdProcess>>,
    /// The sidecar's lock API.
    pub api: SocketAddr,
    /// Its path to the apiserver.
    pub proxy: FaultProxy,
    /// Its kubeconfig (through the proxy).
    pub kubeconfig: PathBuf,
    /// The token of its latest hold.
    pub last_token: Mutex<Option<i64>>,
    /// Stops its app task.
    pub stop: CancellationToken,
}

/// The system under test.
pub struct World {
    /// The control plane and the test namespace.
    pub env: Env,
    /// PostgreSQL (held so that the server lives as long as the world).
    #[allow(dead_code)]
    pub pg: Postgres,
    /// A PostgreSQL client.
    pub db: tokio_postgres::Client,
    /// The controller replicas (index 0 serves the webhooks).
    pub controllers: Mutex<[Option<LeaseholdProcess>; 2]>,
    controller_ports: [(SocketAddr, SocketAddr); 2],
    /// Locks.
    pub locks: Vec<String>,
    /// Workers by name.
    pub workers: Mutex<BTreeMap<String, Arc<Worker>>>,
    /// Every worker that ever ran: name → holder identity.
    pub all_workers: Mutex<BTreeMap<String, String>>,
    /// The history.
    pub history: History,
    /// ConfigMap writes applied: (lock, resourceVersion, writer, token).
    pub cm_applied: Mutex<Vec<(String, u64, String, i64)>>,
    /// The binary the sidecars run.
    pub sidecar_bin: String,
    /// Critical-section shape: how many write-and-check steps, and the pause after each.
    pub hold_steps: (usize, Duration),
    /// Every grant each lock Lease went through, from watches.
    pub grant_logs: Mutex<Vec<(String, crate::support::watch::GrantLog)>>,
    generation: Mutex<u32>,
}

const SCHEMA: &str = "
CREATE TABLE fenced (id text PRIMARY KEY, value bigint NOT NULL DEFAULT 0, token bigint NOT NULL DEFAULT 0);
CREATE TABLE fenced_audit (seq bigserial PRIMARY KEY, id text NOT NULL, writer text NOT NULL, token bigint NOT NULL);
CREATE TABLE unfenced (id text PRIMARY KEY, value bigint NOT NULL DEFAULT 0, token bigint NOT NULL DEFAULT 0);
CREATE TABLE unfenced_audit (seq bigserial PRIMARY KEY, id text NOT NULL, writer text NOT NULL, token bigint NOT NULL);
";

/// A fenced write: applied only if the token is at least the highest seen; audited in the
/// same statement (so audit order is commit order for the row).
pub const FENCED_WRITE: &str = "WITH u AS (UPDATE fenced SET value = value + 1, token = $2 WHERE id = $1 AND token <= $2 RETURNING id) \
     INSERT INTO fenced_audit (id, writer, token) SELECT id, $3, $2 FROM u";
/// The contrast: the same write without the token check.
pub const UNFENCED_WRITE: &str = "WITH u AS (UPDATE unfenced SET value = value + 1, token = $2 WHERE id = $1 RETURNING id) \
     INSERT INTO unfenced_audit (id, writer, token) SELECT id, $3, $2 FROM u";

fn controller_args(
    world_ns: &str,
    admin: SocketAddr,
    webhook: Option<(SocketAddr, &PathBuf, &PathBuf)>,
) -> Vec<String> {
    let mut args = vec![
        "controller".to_owned(),
        format!("--namespace={world_ns}"),
        format!("--election-namespace={world_ns}"),
        format!("--admin-addr={admin}"),
        format!("--identity=controller-{}", admin.port()),
        "--election-lease-duration=3s".into(),
        "--election-renew-deadline=2s".into(),
        "--election-retry-period=500ms".into(),
    ];
    if let Some((addr, cert, key)) = webhook {
        args.push(format!("--webhook-addr={addr}"));
        args.push(format!("--tls-cert-file={}", cert.display()));
        args.push(format!("--tls-key-file={}", key.display()));
    }
    args
}

impl World {
    /// Starts everything: `locks` locks with `per_lock` workers each.
    pub async fn start(
        locks: usize,
        per_lock: usize,
        sidecar_bin: Option<String>,
        hold_steps: (usize, Duration),
    ) -> Arc<World> {
        let cp: &'static ControlPlane = Box::leak(Box::new(
            tokio::task::spawn_blocking(ControlPlane::start).await.expect("join").expect("start a control plane"),
        ));
        let ns = cp.namespace("faults").await;
        crate::support::install_crd(&ns.client).await;
        let env = Env { cp, ns };
        let pg = Postgres::start().expect("start PostgreSQL");
        let (db, connection) =
            tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.expect("connect to PostgreSQL");
        tokio::spawn(connection);
        db.batch_execute(SCHEMA).await.expect("schema");

        let dir = env.log_dir();
        let (cert, key) = (dir.join("webhook.crt"), dir.join("webhook.key"));
        crate::support::admission::write_cert(&env, &cert, &key);
        let webhook = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let ports = [
            (SocketAddr::from(([127, 0, 0, 1], free_port())), webhook),
            (SocketAddr::from(([127, 0, 0, 1], free_port())), webhook),
        ];
        let world = Arc::new(World {
            env,
            pg,
            db,
            controllers: Mutex::new([None, None]),
            controller_ports: ports,
            locks: (0..locks).map(|i| format!("lock-{i}")).collect(),
            workers: Mutex::default(),
            all_workers: Mutex::default(),
            history: History::default(),
            cm_applied: Mutex::default(),
            sidecar_bin: sidecar_bin.unwrap_or_else(|| leasehold_bin().to_owned()),
            grant_logs: Mutex::default(),
            hold_steps,
            generation: Mutex::new(0),
        });
        world.start_controller(0).await;
        world.start_controller(1).await;
        world.env.register_webhooks(webhook).await;
        for lock in &world.locks {
            let log = crate::support::watch::GrantLog::start(world.env.leases(), lock);
            world.grant_logs.lock().expect("lock").push((lock.clone(), log));
            world.env.lock(lock, timing()).await;
            world.db.execute("INSERT INTO fenced (id) VALUES ($1)", &[lock]).await.expect("row");
            world.db.execute("INSERT INTO unfenced (id) VALUES ($1)", &[lock]).await.expect("row");
        }
        WORKERS_PER_LOCK.store(per_lock, std::sync::atomic::Ordering::Relaxed);
        for lock in world.locks.clone() {
            world.ensure_workers(&lock, per_lock).await;
        }
        world
    }

    /// Starts (or restarts) controller replica `i` on its fixed ports.
    pub async fn start_controller(&self, i: usize) {
        let (admin, webhook) = self.controller_ports[i];
        let dir = self.env.log_dir();
        let (cert, key) = (dir.join("webhook.crt"), dir.join("webhook.key"));
        let args = controller_args(self.env.name(), admin, (i == 0).then_some((webhook, &cert, &key)));
        let mut command = Command::new(leasehold_bin());
        command.args(&args).env("KUBECONFIG", self.env.cp.kubeconfig_path()).env(
            "RUST_LOG",
            // LEASEHOLD_E2E_CONTROLLER_LOG overrides the controllers' filter, for diagnosis.
            std::env::var("LEASEHOLD_E2E_CONTROLLER_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
        );
        let process = LeaseholdProcess::spawn(&format!("controller-{}", admin.port()), command, admin);
        process.wait_ready().await;
        self.controllers.lock().expect("lock")[i] = Some(process);
    }

    /// Kills controller replica `i` (SIGKILL).
    pub fn kill_controller(&self, i: usize) {
        if let Some(mut c) = self.controllers.lock().expect("lock")[i].take() {
            c.kill();
        }
    }

    /// Which replica leads, if one does.
    pub async fn leader(&self) -> Option<usize> {
        for (i, (admin, _)) in self.controller_ports.iter().enumerate() {
            if let Some((200, body)) = http_request(*admin, "GET", "/metrics", None).await
                && body.lines().any(|l| l.starts_with("leasehold_controller_leader ") && l.ends_with(" 1"))
            {
                return Some(i);
            }
        }
        None
    }

    /// Adds a worker (Pod, proxy, sidecar, app task) on `lock`.
    pub async fn add_worker(self: &Arc<World>, lock: &str, clock: Clock) -> Arc<Worker> {
        let n = {
            let mut g = self.generation.lock().expect("lock");
            *g += 1;
            *g
        };
        let name = format!("w{n}-{lock}");
        let pod = self.env.pod(&name).await;
        self.env.wait_claim_rbac(&pod).await;
        let upstream: SocketAddr =
            self.env.cp.server_url().trim_start_matches("https://").parse().expect("server address");
        let proxy = FaultProxy::start(upstream).expect("start a fault proxy");
        let kubeconfig = self.env.log_dir().join(format!("kubeconfig-{name}"));
        self.env
            .ns
            .kubeconfig_for_token_via(&pod.token, &format!("https://{}", proxy.addr()), &kubeconfig)
            .expect("kubeconfig");
        let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let worker = Arc::new(Worker {
            name: name.clone(),
            lock: lock.to_owned(),
            pod,
            sidecar: Mutex::new(None),
            api,
            proxy,
            kubeconfig,
            last_token: Mutex::new(None),
            stop: CancellationToken::new(),
        });
        self.start_sidecar(&worker, clock).await;
        self.all_workers.lock().expect("lock").insert(name.clone(), worker.pod.identity().id);
        self.workers.lock().expect("lock").insert(name, worker.clone());
        tokio::spawn(super::worker::run(self.clone(), worker.clone()));
        worker
    }

    /// Tops `lock` up to `n` workers. Creating one can fail while the apiserver or etcd
    /// recovers from a fault (the harness helpers panic on errors): retry until it works.
    pub async fn ensure_workers(self: &Arc<World>, lock: &str, n: usize) {
        for _ in 0..20 {
            let count = self.workers.lock().expect("lock").values().filter(|w| w.lock == lock).count();
            if count >= n {
                return;
            }
            let (world, name) = (self.clone(), lock.to_owned());
            if tokio::spawn(async move { world.add_worker(&name, Clock::Real).await }).await.is_err() {
                eprintln!("faults: adding a worker on {lock} failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        panic!("could not keep {n} workers on {lock}");
    }

    /// Starts (or restarts) `worker`'s sidecar, and waits until it is healthy.
    pub async fn start_sidecar(&self, worker: &Worker, clock: Clock) {
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut command = Command::new(&self.sidecar_bin);
        command
            .args(["sidecar", "--listen", &worker.api.to_string(), "--admin-addr", &admin.to_string()])
            .env("KUBECONFIG", &worker.kubeconfig)
            .env("POD_NAMESPACE", self.env.name())
            .env("POD_NAME", &worker.pod.name)
            .env("POD_UID", &worker.pod.uid)
            // LEASEHOLD_E2E_SIDECAR_LOG overrides the sidecars' filter, for diagnosis.
            .env("RUST_LOG", std::env::var("LEASEHOLD_E2E_SIDECAR_LOG").unwrap_or_else(|_| "info,kube=warn".into()));
        if let Clock::Shifted(seconds) = clock {
            let lib = [
                "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
            ]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("libfaketime is installed (Debian package faketime)");
            command
                .env("LD_PRELOAD", lib)
                .env("FAKETIME", format!("{seconds:+}s"))
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_NO_CACHE", "1");
        }
        let process = LeaseholdProcess::spawn(&format!("sidecar-{}-{}", worker.name, admin.port()), command, admin);
        let what = format!("{} healthy", process.name);
        leasehold_harness::eventually(&what, Duration::from_secs(60), || async {
            match process.admin_get("/healthz").await {
                Some((200, _)) => Ok(()),
                other => Err(format!("{other:?}: {}", process.log_tail(5))),
            }
        })
        .await;
        *worker.sidecar.lock().expect("lock") = Some(process);
    }

    /// Signals `worker`'s sidecar.
    pub fn signal_sidecar(&self, worker: &Worker, signal: i32) {
        if let Some(p) = worker.sidecar.lock().expect("lock").as_ref() {
            p.signal(signal);
        }
    }

    /// The worker whose pod holds `lock` now (from the lock Lease).
    pub async fn holder(&self, lock: &str) -> Option<Arc<Worker>> {
        let lease = self.env.leases().get_opt(lock).await.ok()??;
        let holder = leasehold::claim::edit::holder(&lease)?.to_owned();
        self.workers.lock().expect("lock").values().find(|w| w.pod.identity().id == holder).cloned()
    }

    /// A worker on `lock` other than `not`.
    pub fn other_worker(&self, lock: &str, not: Option<&str>) -> Option<Arc<Worker>> {
        self.workers.lock().expect("lock").values().find(|w| w.lock == lock && Some(w.name.as_str()) != not).cloned()
    }

    /// Writes with `token` to all three resources as `worker`; logs each attempt.
    pub async fn write_all(&self, worker: &Worker, token: i64, stale: bool) {
        let lock = &worker.lock;
        let applied =
            self.db.execute(FENCED_WRITE, &[lock, &token, &worker.name]).await.map(|n| n == 1).unwrap_or(false);
        self.history.log(&worker.name, lock, Op::Write { resource: Resource::Postgres, token, applied, stale });
        let applied =
            self.db.execute(UNFENCED_WRITE, &[lock, &token, &worker.name]).await.map(|n| n == 1).unwrap_or(false);
        self.history.log(&worker.name, lock, Op::Write { resource: Resource::Unfenced, token, applied, stale });
        let cms: Api<ConfigMap> = Api::namespaced(self.env.ns.client.clone(), self.env.name());
        let name = format!("inventory-{lock}");
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"leasehold.dev/fenced-by": lock}, "annotations": {ANNOTATION_TOKEN: token.to_string()}},
            "data": {"writer": worker.name},
        });
        let result = tokio::time::timeout(
            Duration::from_secs(5),
            cms.patch(&name, &PatchParams::apply(&worker.name).force(), &Patch::Apply(&cm)),
        )
        .await;
        let applied = match result {
            Ok(Ok(stored)) => {
                let rv = stored.metadata.resource_version.and_then(|rv| rv.parse().ok()).unwrap_or(0);
                self.cm_applied.lock().expect("lock").push((lock.clone(), rv, worker.name.clone(), token));
                true
            }
            _ => false,
        };
        self.history.log(&worker.name, lock, Op::Write { resource: Resource::ConfigMap, token, applied, stale });
    }

    /// What each resource applied, in commit order.
    pub async fn applied(&self) -> super::checker::Applied {
        let mut applied = super::checker::Applied::new();
        for (table, resource) in [("fenced_audit", Resource::Postgres), ("unfenced_audit", Resource::Unfenced)] {
            let rows = self
                .db
                .query(&format!("SELECT id, writer, token FROM {table} ORDER BY seq"), &[])
                .await
                .expect("audit");
            for row in rows {
                applied.entry((row.get(0), resource)).or_default().push((row.get(1), row.get(2)));
            }
        }
        let mut cms = self.cm_applied.lock().expect("lock").clone();
        cms.sort_by_key(|(_, rv, _, _)| *rv);
        for (lock, _, writer, token) in cms {
            applied.entry((lock, Resource::ConfigMap)).or_default().push((writer, token));
        }
        applied
    }

    /// What the lock Leases went through, and who is who.
    pub fn grants(&self) -> super::checker::Grants {
        let by_lock = self
            .grant_logs
            .lock()
            .expect("lock")
            .iter()
            .map(|(lock, log)| (lock.clone(), log.grants().into_iter().map(|g| (g.holder, g.token)).collect()))
            .collect();
        let identities = self.all_workers.lock().expect("lock").iter().map(|(n, i)| (n.clone(), i.clone())).collect();
        let relists =
            self.grant_logs.lock().expect("lock").iter().map(|(lock, log)| (lock.clone(), log.relists())).collect();
        super::checker::Grants { by_lock, identities, relists }
    }

    /// Stops every worker.
    pub fn stop_workers(&self) {
        for w in self.workers.lock().expect("lock").values() {
            w.stop.cancel();
        }
    }

    /// Time since `start`, for progress lines.
    pub fn since(start: Instant) -> String {
        format!("{:>6.1}s", start.elapsed().as_secs_f64())
    }
}
