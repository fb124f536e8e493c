//! The whole system under faults: a dedicated control plane (it gets restarted), two
//! controller replicas running as their own ServiceAccount behind the Lease guard, each
//! under a wall clock the suite can move (libfaketime), PostgreSQL, and the apps:
//! worker pods with a sidecar on the ordinary locks and on a lock with a short
//! `maxHoldSeconds`, hold-mode pods on a leader lock, and `leasehold run` pods on a job
//! lock. Every sidecar talks to the apiserver through its own fault proxy, under its own
//! movable wall clock.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use leasehold::crd::{ANNOTATION_TOKEN, DistributedLockSpec};
use leasehold_harness::{ControlPlane, FaultProxy, Postgres};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::history::{History, Op, Resource};
use super::record::{ConfigMapLog, LeaseLog, LeaseState, version_of};
use crate::support::{Env, LeaseholdProcess, TestPod, free_port, http_request, leasehold_bin, sidecar_bin};

/// The timing of the locks under test: lease 5 s, renew deadline 4 s, retry 1 s.
pub fn timing() -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: 5,
        renew_deadline_seconds: 4,
        retry_period_seconds: 1,
        ..Default::default()
    }
}

/// The permits of `lock`, if it has several.
pub fn permits_of(lock: &str) -> Option<usize> {
    matches!(lock, SEMAPHORE_LOCK | RW_LOCK).then_some(PERMITS)
}

/// The lease duration of [`timing`].
pub const LEASE: Duration = Duration::from_secs(5);
/// The controllers' election lease.
pub const ELECTION: Duration = Duration::from_secs(3);
/// A `maxHoldSeconds` shorter than every critical section on the max-hold lock.
pub const MAX_HOLD_SECONDS: i32 = 3;

/// The lock every hold-mode pod holds for its life.
pub const HOLD_LOCK: &str = "leader";
/// The lock `leasehold run` commands run under.
pub const JOB_LOCK: &str = "job";
/// The lock whose holds all end by `maxHoldSeconds`.
pub const MAX_HOLD_LOCK: &str = "maxhold";
/// A semaphore: [`PERMITS`] permits, every worker a reader.
pub const SEMAPHORE_LOCK: &str = "sem";
/// A read-write lock with [`PERMITS`] permits: some workers write, the others read.
pub const RW_LOCK: &str = "rw";
/// The permits of the semaphore and the read-write lock.
pub const PERMITS: usize = 2;
/// Worker pods on each lock with several permits: more than its permits.
const PERMIT_WORKERS: usize = 4;
/// A lock nobody uses (its Lease stays free): a target for adversarial writes.
pub const IDLE_LOCK: &str = "idle";
/// The caller TTL of heartbeat apps.
pub const CALLER_TTL: Duration = Duration::from_secs(2);

/// How an app learns about its hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppKind {
    /// Acquires through the sidecar and follows its event stream.
    Events,
    /// Acquires through the sidecar and trusts only answers (`remainingMs`, views).
    Views,
    /// Acquires a session-bound hold and follows the session's lines; lets go by closing it.
    Session,
    /// Acquires a heartbeat hold (a caller TTL) and keeps it alive at every step.
    Heartbeat,
    /// A hold-mode pod: one app trusting the hold file, one trusting the API.
    Hold,
    /// Runs commands under `leasehold run`.
    Run,
}

/// Critical sections: a mix of lengths, a good share longer than a lease duration (the
/// app checks its view at every step while it works).
#[derive(Clone, Debug)]
pub struct Sections {
    /// (weight, shortest, longest) in milliseconds.
    pub mix: Vec<(u32, u64, u64)>,
    /// The pause between steps, ms (shortest, longest).
    pub step: (u64, u64),
}

impl Sections {
    /// Short, medium and long sections; 35% last longer than the lease duration.
    pub fn mixed() -> Sections {
        Sections { mix: vec![(40, 100, 500), (25, 1000, 3000), (35, 6000, 10_000)], step: (250, 500) }
    }

    /// Every section longer than the lease duration.
    pub fn long() -> Sections {
        Sections { mix: vec![(1, 6000, 10_000)], step: (250, 500) }
    }

    /// A length drawn from the mix.
    pub fn pick(&self) -> Duration {
        let total: u32 = self.mix.iter().map(|(w, _, _)| w).sum();
        let mut roll = u32::try_from(random(u64::from(total.max(1)))).unwrap_or(0);
        for (weight, lo, hi) in &self.mix {
            if roll < *weight {
                return Duration::from_millis(lo + random(hi - lo + 1));
            }
            roll -= weight;
        }
        Duration::from_millis(self.mix.last().map_or(100, |m| m.1))
    }

    /// A pause between steps.
    pub fn pause(&self) -> Duration {
        Duration::from_millis(self.step.0 + random(self.step.1 - self.step.0 + 1))
    }
}

/// A number in `0..n` (workload variety, not cryptography).
pub fn random(n: u64) -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now()) % n.max(1)
}

/// What to run: which locks and workers, and which binaries.
#[derive(Clone, Debug)]
pub struct Layout {
    /// Ordinary locks (`lock-0`, ...), each with `per_lock` worker pods.
    pub locks: usize,
    /// Worker pods per ordinary lock (and on the max-hold lock).
    pub per_lock: usize,
    /// The max-hold lock with its workers.
    pub max_hold: bool,
    /// The hold-mode lock with two hold-mode pods.
    pub hold: bool,
    /// The job lock with two `leasehold run` pods.
    pub job: bool,
    /// The semaphore and the read-write lock, with their workers.
    pub permits: bool,
    /// Critical sections on the ordinary locks.
    pub sections: Sections,
    /// Every worker on the sidecar locks trusts only answers (no event stream).
    pub views_only: bool,
    /// The sidecar binary (`leasehold-sidecar`); `leasehold run` runs the `leasehold`
    /// built beside it.
    pub holder_bin: Option<String>,
    /// The binary the controllers (and the webhooks) run.
    pub controller_bin: Option<String>,
    /// The `leasehold` binary whose `lease-guard` the world applies (`None`: this build's
    /// guard).
    pub guard_bin: Option<String>,
    /// The controllers' `--confirm-timeout` (`None`: their default).
    pub confirm_timeout: Option<Duration>,
}

impl Layout {
    /// `locks` ordinary locks with `per_lock` workers and mixed sections; nothing else.
    pub fn plain(locks: usize, per_lock: usize) -> Layout {
        Layout {
            locks,
            per_lock,
            max_hold: false,
            hold: false,
            job: false,
            permits: false,
            sections: Sections::mixed(),
            views_only: false,
            holder_bin: None,
            controller_bin: None,
            guard_bin: None,
            confirm_timeout: None,
        }
    }

    /// Everything.
    pub fn full(locks: usize, per_lock: usize) -> Layout {
        Layout { max_hold: true, hold: true, job: true, permits: true, ..Layout::plain(locks, per_lock) }
    }
}

/// One app "pod".
pub struct Worker {
    /// Pod name (the app's name in the history).
    pub name: String,
    /// Lock it works on.
    pub lock: String,
    /// What kind of app runs in it.
    pub kind: AppKind,
    /// Critical sections.
    pub sections: Sections,
    /// Its Pod and credentials.
    pub pod: TestPod,
    /// Whether its app takes holds in write mode (on the read-write lock).
    pub writer: bool,
    /// Its sidecar process (none for `leasehold run` pods).
    pub sidecar: Mutex<Option<LeaseholdProcess>>,
    /// The sidecar's lock API.
    pub api: SocketAddr,
    /// Its path to the apiserver.
    pub proxy: FaultProxy,
    /// Its kubeconfig (through the proxy).
    pub kubeconfig: PathBuf,
    /// The libfaketime timestamp file of its sidecar's wall clock.
    pub clock: PathBuf,
    /// Hold mode: the hold file.
    pub hold_file: Option<PathBuf>,
    /// What its app believes now.
    pub belief: Mutex<AppBelief>,
    /// Wakes the app when it learns something from its event stream.
    pub learned: tokio::sync::Notify,
    /// Tokens the event stream reported gone before the app's grant answer arrived.
    pub gone: Mutex<Vec<i64>>,
    /// The token of its latest hold.
    pub last_token: Mutex<Option<i64>>,
    /// Set when its app hangs: it makes no call until then, then writes once as a zombie.
    pub hung_until: Mutex<Option<Instant>>,
    /// Stops its app (at the end of the run, or when the pod goes away).
    pub stop: CancellationToken,
    /// Its app tasks.
    pub apps: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// `leasehold run` pods: the `leasehold run` process running now.
    pub run: Mutex<Option<leasehold_harness::Supervised>>,
}

/// What an app believes now (the app's own bookkeeping, mirrored by the history).
#[derive(Clone, Copy, Debug, Default)]
pub struct AppBelief {
    /// The token it believes it holds.
    pub token: Option<i64>,
    /// Until when (receipt + `remainingMs` of the latest answer).
    pub until: Option<Instant>,
    /// It learned the hold is gone.
    pub lost: bool,
}

impl AppBelief {
    /// The token it may act under now, if any.
    pub fn acting(&self, now: Instant) -> Option<i64> {
        self.token.filter(|_| !self.lost && self.until.is_some_and(|u| now < u))
    }
}

/// The controller replicas: processes, ports and clocks.
struct Controllers {
    processes: Mutex<[Option<LeaseholdProcess>; 2]>,
    ports: [(SocketAddr, SocketAddr); 2],
    clocks: [PathBuf; 2],
    kubeconfig: PathBuf,
    bin: String,
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
    /// (test clock before, test clock after, PostgreSQL clock in µs) readings, to map
    /// PostgreSQL's timestamps onto the test's clock.
    pub anchors: Mutex<Vec<(Instant, Instant, i64)>>,
    controllers: Controllers,
    /// What runs.
    pub layout: Layout,
    /// Ordinary locks.
    pub locks: Vec<String>,
    /// Workers by name.
    pub workers: Mutex<BTreeMap<String, Arc<Worker>>>,
    /// Every app that ever ran: app name → claimant identity.
    pub identities: Mutex<BTreeMap<String, String>>,
    /// Every app that ever took its holds in write mode.
    pub writers: Mutex<std::collections::BTreeSet<String>>,
    /// The history.
    pub history: History,
    /// Every state of every lock Lease.
    pub leases: LeaseLog,
    /// Every version of every ConfigMap.
    pub configmaps: ConfigMapLog,
    /// ConfigMap writes whose client saw them fail: (ConfigMap, writer, token).
    pub cm_failed: Mutex<Vec<(String, String, i64)>>,
    /// The binary the sidecars run (`leasehold-sidecar`, as injected into app pods).
    pub holder_bin: String,
    /// The binary `leasehold run` runs: `leasehold`, beside the sidecar's.
    pub run_bin: String,
    /// Process groups of `leasehold run` commands (killed at the end).
    pub groups: Mutex<Vec<i32>>,
    generation: Mutex<u32>,
}

const SCHEMA: &str = "
CREATE TABLE fenced (id text PRIMARY KEY, value bigint NOT NULL DEFAULT 0, token bigint NOT NULL DEFAULT 0);
CREATE TABLE fenced_audit (seq bigserial PRIMARY KEY, id text NOT NULL, writer text NOT NULL, token bigint NOT NULL);
CREATE TABLE unfenced (id text PRIMARY KEY, value bigint NOT NULL DEFAULT 0, token bigint NOT NULL DEFAULT 0);
CREATE TABLE unfenced_audit (seq bigserial PRIMARY KEY, id text NOT NULL, writer text NOT NULL, token bigint NOT NULL);
CREATE TABLE run_writes (seq bigserial PRIMARY KEY, run text NOT NULL, writer text NOT NULL, token bigint NOT NULL,
    applied boolean NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
";

/// A fenced write: applied only if the token is at least the highest seen; audited in the
/// same statement (so audit order is commit order for the row).
pub const FENCED_WRITE: &str = "WITH u AS (UPDATE fenced SET value = value + 1, token = $2 WHERE id = $1 AND token <= $2 RETURNING id) \
     INSERT INTO fenced_audit (id, writer, token) SELECT id, $3, $2 FROM u";
/// The contrast: the same write without the token check.
pub const UNFENCED_WRITE: &str = "WITH u AS (UPDATE unfenced SET value = value + 1, token = $2 WHERE id = $1 RETURNING id) \
     INSERT INTO unfenced_audit (id, writer, token) SELECT id, $3, $2 FROM u";

pub use crate::support::clock::{set_clock, under_clock};

impl World {
    /// Starts everything in `layout`.
    pub async fn start(layout: Layout) -> Arc<World> {
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
        let clocks = [dir.join("clock-controller-0"), dir.join("clock-controller-1")];
        for c in &clocks {
            set_clock(c, "+0");
        }
        let (controller_user, controller_kubeconfig) = controller_identity(&env).await;
        match &layout.guard_bin {
            Some(bin) => env.apply_lease_guard_of(bin, &controller_user).await,
            None => env.apply_lease_guard(&controller_user).await,
        }
        fenced_writer_rbac(&env).await;
        let leases = LeaseLog::start(env.leases());
        let configmaps = ConfigMapLog::start(Api::namespaced(env.ns.client.clone(), env.name()));
        let world = Arc::new(World {
            pg,
            db,
            anchors: Mutex::default(),
            controllers: Controllers {
                processes: Mutex::new([None, None]),
                ports,
                clocks,
                kubeconfig: controller_kubeconfig,
                bin: layout.controller_bin.clone().unwrap_or_else(|| leasehold_bin().to_owned()),
            },
            locks: (0..layout.locks).map(|i| format!("lock-{i}")).collect(),
            workers: Mutex::default(),
            identities: Mutex::default(),
            writers: Mutex::default(),
            history: History::default(),
            leases,
            configmaps,
            cm_failed: Mutex::default(),
            holder_bin: layout.holder_bin.clone().unwrap_or_else(|| sidecar_bin().to_owned()),
            run_bin: match &layout.holder_bin {
                Some(sidecar) => Path::new(sidecar).with_file_name("leasehold").display().to_string(),
                None => leasehold_bin().to_owned(),
            },
            groups: Mutex::default(),
            generation: Mutex::new(0),
            layout,
            env,
        });
        world.anchor().await;
        world.start_controller(0).await;
        world.start_controller(1).await;
        world.env.register_webhooks(webhook).await;
        for lock in world.all_locks() {
            let mut spec = timing();
            if lock == MAX_HOLD_LOCK {
                spec.max_hold_seconds = Some(MAX_HOLD_SECONDS);
            }
            if let Some(permits) = permits_of(&lock) {
                spec.permits = i32::try_from(permits).expect("a few permits");
            }
            world.env.lock(&lock, spec).await;
            for table in ["fenced", "unfenced"] {
                world.db.execute(&format!("INSERT INTO {table} (id) VALUES ($1)"), &[&lock]).await.expect("row");
            }
        }
        world.env.lock(IDLE_LOCK, timing()).await;
        let mut starting = Vec::new();
        for lock in world.all_locks() {
            let (world, lock) = (world.clone(), lock.clone());
            starting.push(tokio::spawn(async move { world.ensure_workers(&lock).await }));
        }
        for s in starting {
            s.await.expect("start workers");
        }
        // The idle lock is granted once (through a worker's sidecar, as an app would), so
        // that its Lease carries a token: adversaries present it when moving a fenced
        // object to that lock.
        let any =
            world.workers.lock().expect("lock").values().find(|w| w.sidecar.lock().expect("lock").is_some()).cloned();
        if let Some(w) = any {
            let path = format!("/v1/locks/{IDLE_LOCK}/acquire");
            let answer =
                super::app::call(&w, "POST", &path, Some(r#"{"waitSeconds": 30}"#), Duration::from_secs(40)).await;
            assert!(matches!(answer, Some((200, _))), "the idle lock is granted once: {answer:?}");
            let path = format!("/v1/locks/{IDLE_LOCK}/release");
            super::app::call(&w, "POST", &path, None, Duration::from_secs(10)).await;
        }
        world
    }

    /// Every lock with workers: the ordinary ones, then the max-hold, hold and job locks.
    pub fn all_locks(&self) -> Vec<String> {
        let mut all = self.locks.clone();
        for (on, lock) in
            [(self.layout.max_hold, MAX_HOLD_LOCK), (self.layout.hold, HOLD_LOCK), (self.layout.job, JOB_LOCK)]
        {
            if on {
                all.push(lock.to_owned());
            }
        }
        if self.layout.permits {
            all.extend([SEMAPHORE_LOCK.to_owned(), RW_LOCK.to_owned()]);
        }
        all
    }

    /// The kind of worker `n` on `lock` (alternating on the sidecar locks).
    fn kind_for(&self, lock: &str, n: u32) -> AppKind {
        match lock {
            HOLD_LOCK => AppKind::Hold,
            JOB_LOCK => AppKind::Run,
            _ if self.layout.views_only => AppKind::Views,
            // Every ownership mode on every lock over the run (workers are replaced).
            _ => match n % 4 {
                0 => AppKind::Events,
                1 => AppKind::Views,
                2 => AppKind::Session,
                _ => AppKind::Heartbeat,
            },
        }
    }

    fn workers_for(&self, lock: &str) -> usize {
        match lock {
            HOLD_LOCK | JOB_LOCK => 2,
            SEMAPHORE_LOCK | RW_LOCK => PERMIT_WORKERS,
            _ => self.layout.per_lock,
        }
    }

    /// Reads PostgreSQL's clock against the test's (an anchor for mapping its timestamps).
    pub async fn anchor(&self) {
        let before = Instant::now();
        let Ok(row) = self.db.query_one("SELECT (extract(epoch from clock_timestamp()) * 1000000)::bigint", &[]).await
        else {
            return;
        };
        let after = Instant::now();
        self.anchors.lock().expect("lock").push((before, after, row.get(0)));
    }

    /// A PostgreSQL timestamp (µs since the epoch) on the test's clock, from the nearest
    /// anchor.
    pub fn pg_instant(&self, micros: i64) -> Option<Instant> {
        let anchors = self.anchors.lock().expect("lock");
        let (before, after, at) = anchors.iter().min_by_key(|(_, _, at)| (at - micros).unsigned_abs())?;
        let mid = *before + (*after - *before) / 2;
        let offset = micros - at;
        if offset >= 0 {
            mid.checked_add(Duration::from_micros(offset.unsigned_abs()))
        } else {
            mid.checked_sub(Duration::from_micros(offset.unsigned_abs()))
        }
    }

    /// Starts (or restarts) controller replica `i` on its fixed ports, under its clock.
    pub async fn start_controller(&self, i: usize) {
        let c = &self.controllers;
        let (admin, webhook) = c.ports[i];
        let dir = self.env.log_dir();
        let (cert, key) = (dir.join("webhook.crt"), dir.join("webhook.key"));
        let mut command = Command::new(&c.bin);
        command
            .args([
                "controller".to_owned(),
                format!("--namespace={}", self.env.name()),
                format!("--election-namespace={}", self.env.name()),
                format!("--admin-addr={admin}"),
                format!("--identity=controller-{}", admin.port()),
                "--election-lease-duration=3s".into(),
                "--election-renew-deadline=2s".into(),
                "--election-retry-period=500ms".into(),
            ])
            .env("KUBECONFIG", &c.kubeconfig)
            .env(
                "RUST_LOG",
                // LEASEHOLD_E2E_CONTROLLER_LOG overrides the controllers' filter, for diagnosis.
                std::env::var("LEASEHOLD_E2E_CONTROLLER_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
            );
        if let Some(timeout) = self.layout.confirm_timeout {
            command.arg(format!("--confirm-timeout={}ms", timeout.as_millis()));
        }
        if i == 0 {
            command.args([
                format!("--webhook-addr={webhook}"),
                format!("--tls-cert-file={}", cert.display()),
                format!("--tls-key-file={}", key.display()),
            ]);
        }
        under_clock(&mut command, &c.clocks[i]);
        let process = LeaseholdProcess::spawn(&format!("controller-{}", admin.port()), command, admin);
        process.wait_ready().await;
        c.processes.lock().expect("lock")[i] = Some(process);
    }

    /// Kills controller replica `i` (SIGKILL).
    pub fn kill_controller(&self, i: usize) {
        if let Some(mut c) = self.controllers.processes.lock().expect("lock")[i].take() {
            c.kill();
        }
    }

    /// Signals controller replica `i`.
    pub fn signal_controller(&self, i: usize, signal: i32) {
        if let Some(c) = self.controllers.processes.lock().expect("lock")[i].as_ref() {
            c.signal(signal);
        }
    }

    /// The timestamp file of controller replica `i`'s wall clock.
    pub fn controller_clock(&self, i: usize) -> &Path {
        &self.controllers.clocks[i]
    }

    /// Which replica leads, if one does.
    pub async fn leader(&self) -> Option<usize> {
        for (i, (admin, _)) in self.controllers.ports.iter().enumerate() {
            if let Some((200, body)) = http_request(*admin, "GET", "/metrics", None).await
                && body.lines().any(|l| l.starts_with("leasehold_controller_leader ") && l.ends_with(" 1"))
            {
                return Some(i);
            }
        }
        None
    }

    /// Adds a worker pod on `lock`, and starts its app(s).
    pub async fn add_worker(self: &Arc<World>, lock: &str) -> Arc<Worker> {
        let n = {
            let mut g = self.generation.lock().expect("lock");
            *g += 1;
            *g
        };
        let kind = self.kind_for(lock, n);
        let name = format!("w{n}-{lock}");
        // One writer among the read-write lock's workers, the others readers. Each one
        // queues again soon after it lets go, so under a fair queue they settle into a
        // rotation: with two writers it can alternate reader, writer, reader, writer and
        // never let two readers share, while with one writer two readers always queue
        // side by side somewhere in it. When the writer is retired, the next worker added
        // writes in its place.
        let writer =
            lock == RW_LOCK && !self.workers.lock().expect("lock").values().any(|w| w.lock == RW_LOCK && w.writer);
        if writer {
            self.writers.lock().expect("lock").insert(name.clone());
        }
        let pod = self.env.pod(&name).await;
        self.env.wait_claim_rbac(&pod).await;
        let upstream: SocketAddr =
            self.env.cp.server_url().trim_start_matches("https://").parse().expect("server address");
        let proxy = FaultProxy::start(upstream).expect("start a fault proxy");
        let dir = self.env.log_dir();
        let kubeconfig = dir.join(format!("kubeconfig-{name}"));
        self.env
            .ns
            .kubeconfig_for_token_via(&pod.token, &format!("https://{}", proxy.addr()), &kubeconfig)
            .expect("kubeconfig");
        let clock = dir.join(format!("clock-{name}"));
        set_clock(&clock, "+0");
        let sections = if lock == MAX_HOLD_LOCK { Sections::long() } else { self.layout.sections.clone() };
        let worker = Arc::new(Worker {
            name: name.clone(),
            lock: lock.to_owned(),
            kind,
            sections,
            writer,
            pod,
            sidecar: Mutex::new(None),
            api: SocketAddr::from(([127, 0, 0, 1], free_port())),
            proxy,
            kubeconfig,
            clock,
            hold_file: (kind == AppKind::Hold).then(|| dir.join(format!("hold-{name}.json"))),
            belief: Mutex::default(),
            learned: tokio::sync::Notify::new(),
            gone: Mutex::default(),
            last_token: Mutex::new(None),
            hung_until: Mutex::new(None),
            stop: CancellationToken::new(),
            apps: Mutex::default(),
            run: Mutex::new(None),
        });
        if kind != AppKind::Run {
            self.start_sidecar(&worker).await;
        }
        let identity = worker.pod.identity().id;
        let apps = match kind {
            AppKind::Events | AppKind::Views | AppKind::Session | AppKind::Heartbeat => {
                self.identities.lock().expect("lock").insert(name.clone(), identity);
                vec![tokio::spawn(super::app::run(self.clone(), worker.clone()))]
            }
            AppKind::Hold => {
                let mut ids = self.identities.lock().expect("lock");
                ids.insert(super::holdapp::file_app(&name), identity.clone());
                ids.insert(super::holdapp::api_app(&name), identity);
                drop(ids);
                vec![
                    tokio::spawn(super::holdapp::trust_file(self.clone(), worker.clone())),
                    tokio::spawn(super::holdapp::trust_api(self.clone(), worker.clone())),
                ]
            }
            AppKind::Run => vec![tokio::spawn(super::runjob::run(self.clone(), worker.clone()))],
        };
        *worker.apps.lock().expect("lock") = apps;
        self.workers.lock().expect("lock").insert(name, worker.clone());
        worker
    }

    /// Tops `lock` up to its number of workers. Creating one can fail while the apiserver
    /// or etcd recovers from a fault (the harness helpers panic on errors): try again.
    pub async fn ensure_workers(self: &Arc<World>, lock: &str) {
        let n = self.workers_for(lock);
        for _ in 0..20 {
            let count = self.workers.lock().expect("lock").values().filter(|w| w.lock == lock).count();
            if count >= n {
                return;
            }
            let (world, name) = (self.clone(), lock.to_owned());
            if tokio::spawn(async move { world.add_worker(&name).await }).await.is_err() {
                eprintln!("faults: adding a worker on {lock} failed; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        panic!("could not keep {n} workers on {lock}");
    }

    /// Starts (or restarts) `worker`'s sidecar under its clock, and waits until it is healthy.
    pub async fn start_sidecar(&self, worker: &Worker) {
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut command = Command::new(&self.holder_bin);
        command
            .args(["sidecar", "--listen", &worker.api.to_string(), "--admin-addr", &admin.to_string()])
            .env("KUBECONFIG", &worker.kubeconfig)
            .env("POD_NAMESPACE", self.env.name())
            .env("POD_NAME", &worker.pod.name)
            .env("POD_UID", &worker.pod.uid)
            // LEASEHOLD_E2E_SIDECAR_LOG overrides the sidecars' filter, for diagnosis.
            .env("RUST_LOG", std::env::var("LEASEHOLD_E2E_SIDECAR_LOG").unwrap_or_else(|_| "info,kube=warn".into()));
        if let Some(file) = &worker.hold_file {
            command.args(["--hold", &worker.lock, "--hold-file", &file.display().to_string()]);
        }
        under_clock(&mut command, &worker.clock);
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

    /// SIGKILLs `worker`'s sidecar, if it runs.
    pub fn kill_sidecar(&self, worker: &Worker) {
        let process = worker.sidecar.lock().expect("lock").take();
        if let Some(mut p) = process {
            p.kill();
        }
    }

    /// The worker whose pod holds `lock` now (a grant on the lock Lease, not one being
    /// drained), from the Lease watch.
    pub fn holder(&self, lock: &str) -> Option<Arc<Worker>> {
        let state = self.leases.current(lock).filter(|s| s.is_grant())?;
        let holder = state.holder?;
        self.workers.lock().expect("lock").values().find(|w| w.pod.identity().id == holder).cloned()
    }

    /// The holder of `lock`, waiting up to 10 s for one (locks are busy).
    pub async fn wait_holder(&self, lock: &str) -> Option<Arc<Worker>> {
        let state = self.leases.wait_for(lock, Duration::from_secs(10), |s| s.is_grant()).await?;
        let holder = state.holder?;
        self.workers.lock().expect("lock").values().find(|w| w.pod.identity().id == holder).cloned()
    }

    /// The holder of `lock` once it is a worker whose app is of `kind`, waiting up to
    /// `limit` for one to be granted.
    pub async fn wait_holder_of(&self, lock: &str, kind: AppKind, limit: Duration) -> Option<Arc<Worker>> {
        let ids: Vec<String> = self
            .workers
            .lock()
            .expect("lock")
            .values()
            .filter(|w| w.lock == lock && w.kind == kind)
            .map(|w| w.pod.identity().id)
            .collect();
        let grant = |s: &LeaseState| s.is_grant() && s.holder.as_ref().is_some_and(|h| ids.contains(h));
        let holder = self.leases.wait_for(lock, limit, grant).await?.holder?;
        self.workers.lock().expect("lock").values().find(|w| w.pod.identity().id == holder).cloned()
    }

    /// The app of `worker` is killed (SIGKILL) and its container restarts it: the dead
    /// app believes nothing from then on, and its connections close with it.
    pub async fn restart_app(self: &Arc<World>, worker: &Arc<Worker>) {
        let apps = std::mem::take(&mut *worker.apps.lock().expect("lock"));
        for app in apps {
            app.abort();
            let _ = app.await;
        }
        *worker.belief.lock().expect("lock") = AppBelief::default();
        self.history.log(&worker.name, &worker.lock, Op::Stopped);
        *worker.apps.lock().expect("lock") = vec![tokio::spawn(super::app::run(self.clone(), worker.clone()))];
    }

    /// A worker on `lock` other than `not`.
    pub fn other_worker(&self, lock: &str, not: Option<&str>) -> Option<Arc<Worker>> {
        self.workers.lock().expect("lock").values().find(|w| w.lock == lock && Some(w.name.as_str()) != not).cloned()
    }

    /// Writes with `token` to the three resources as app `client` of `worker`, each write
    /// only while `acting()` says the app still acts under `token` (a zombie write skips
    /// that check); logs each attempt.
    pub async fn write_all(&self, worker: &Worker, client: &str, token: i64, acting: impl Fn() -> bool, zombie: bool) {
        let lock = &worker.lock;
        // Holders of a lock with several permits hold at once: their checks are on what
        // they believe (the checker's permits), not on one shared fenced resource.
        if permits_of(lock).is_some() {
            return;
        }
        for (statement, resource) in [(FENCED_WRITE, Resource::Postgres), (UNFENCED_WRITE, Resource::Unfenced)] {
            let believed = acting();
            if !believed && !zombie {
                return;
            }
            let sent = Instant::now();
            let applied =
                tokio::time::timeout(Duration::from_secs(5), self.db.execute(statement, &[lock, &token, &client]))
                    .await
                    .is_ok_and(|r| r.is_ok_and(|n| n == 1));
            self.history.log(client, lock, Op::Write { resource, token, applied, believed, sent });
        }
        let believed = acting();
        if !believed && !zombie {
            return;
        }
        let cms: Api<ConfigMap> = Api::namespaced(worker.pod.client.clone(), self.env.name());
        let name = format!("inventory-{lock}");
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"leasehold.dev/fenced-by": lock}, "annotations": {ANNOTATION_TOKEN: token.to_string()}},
            "data": {"writer": client},
        });
        let sent = Instant::now();
        let result = tokio::time::timeout(
            Duration::from_secs(5),
            cms.patch(&name, &PatchParams::apply(&worker.name).force(), &Patch::Apply(&cm)),
        )
        .await;
        let applied = match result {
            Ok(Ok(stored)) => {
                if let Some(v) = version_of(&stored, false) {
                    self.configmaps.add(v);
                }
                true
            }
            _ => {
                self.cm_failed.lock().expect("lock").push((name, client.to_owned(), token));
                false
            }
        };
        self.history.log(client, lock, Op::Write { resource: Resource::ConfigMap, token, applied, believed, sent });
    }

    /// Stops every worker's apps and waits for them (each logs that it stopped), then
    /// ends every `leasehold run` command and whatever it left behind.
    pub async fn stop_workers(&self) {
        let workers: Vec<Arc<Worker>> = self.workers.lock().expect("lock").values().cloned().collect();
        for w in &workers {
            w.stop.cancel();
        }
        for w in &workers {
            let apps = std::mem::take(&mut *w.apps.lock().expect("lock"));
            for app in apps {
                let _ = tokio::time::timeout(Duration::from_secs(30), app).await;
            }
        }
        self.kill_groups();
    }

    /// SIGKILLs every process group a `leasehold run` command ran in.
    pub fn kill_groups(&self) {
        for group in self.groups.lock().expect("lock").drain(..) {
            super::runjob::kill_group(group);
        }
    }

    /// Takes `worker` out of the world: stops its app (which then logs that it stopped),
    /// kills its sidecar.
    pub async fn retire(&self, worker: &Worker) {
        worker.stop.cancel();
        let apps = std::mem::take(&mut *worker.apps.lock().expect("lock"));
        for app in apps {
            let _ = tokio::time::timeout(Duration::from_secs(30), app).await;
        }
        self.kill_sidecar(worker);
        self.workers.lock().expect("lock").remove(&worker.name);
    }

    /// Time since `start`, for progress lines.
    pub fn since(start: Instant) -> String {
        format!("{:>6.1}s", start.elapsed().as_secs_f64())
    }
}

/// A ServiceAccount for the controllers, bound to cluster-admin, and a kubeconfig with a
/// token for it: the controllers run as their own user, as the chart deploys them, so
/// that the Lease guard exempts them and nobody else.
async fn controller_identity(env: &Env) -> (String, PathBuf) {
    let sa = "leasehold-controller";
    env.ns.service_account(sa).await;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("leasehold-controller-{}", env.name())},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": env.name()}],
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(env.ns.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind the controllers' ServiceAccount");
    let request: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(json!({"spec": {"expirationSeconds": 6 * 3600}})).expect("token request");
    let issued = Api::<ServiceAccount>::namespaced(env.ns.client.clone(), env.name())
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .expect("a token for the controllers");
    let token = issued.status.and_then(|s| s.token).expect("a token");
    let kubeconfig = env.log_dir().join("kubeconfig-controller");
    env.ns.kubeconfig_for_token(&token, &kubeconfig).expect("the controllers' kubeconfig");
    (format!("system:serviceaccount:{}:{sa}", env.name()), kubeconfig)
}

/// Lets every ServiceAccount of the namespace write ConfigMaps there, as an app that
/// keeps its state in a fenced ConfigMap needs to: the webhook, not RBAC, then decides.
async fn fenced_writer_rbac(env: &Env) {
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "fenced-writer"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}],
    }))
    .expect("role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "fenced-writer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "fenced-writer"},
        "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": format!("system:serviceaccounts:{}", env.name())}],
    }))
    .expect("binding");
    let pp = PostParams::default();
    Api::<Role>::namespaced(env.ns.client.clone(), env.name()).create(&pp, &role).await.expect("role");
    Api::<RoleBinding>::namespaced(env.ns.client.clone(), env.name()).create(&pp, &binding).await.expect("binding");
}
