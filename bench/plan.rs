//! How much to measure. The full plan fits `make bench` in 20 minutes on the 2-core
//! machine (warm builds); `LEASEHOLD_BENCH_QUICK=1` is a smoke test of the driver.

use std::time::Duration;

use serde::{Serialize, Serializer};

/// Serialises a duration as seconds.
fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The pause in a voluntary handoff between the waiter being seen queued and the holder
/// letting go: uniform in `[min_ms, max_ms)`. Every handoff series that can take it uses
/// the same one, so that no subject is measured with a waiter less settled than another's.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Settle {
    /// Shortest pause, ms.
    pub min_ms: u64,
    /// Longest pause (exclusive), ms.
    pub max_ms: u64,
}

impl Settle {
    /// The steady state of a queue: the etcd peer's own settle (`waiterSettle` plus up to
    /// 100 ms of jitter in bench/peers/go/etcd.go), which outlasts etcd's 100 ms watch
    /// resync so that its waiter is blocked on a synced watch. Every handoff series uses it.
    pub const STEADY: Settle = Settle { min_ms: 150, max_ms: 250 };
    /// A waiter that has only just queued: Leasehold's sidecar handoff is measured with it
    /// too, to show whether a fresh waiter changes the result.
    pub const SHORT: Settle = Settle { min_ms: 50, max_ms: 100 };

    /// One pause, drawn at random.
    pub fn pause(self) -> Duration {
        use rand::Rng as _;
        Duration::from_millis(rand::rng().random_range(self.min_ms..self.max_ms))
    }

    /// `U[150,250) ms`.
    pub fn describe(self) -> String {
        format!("U[{},{}) ms", self.min_ms, self.max_ms)
    }
}

/// Sample counts, windows and sizes of one run.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// The quick (smoke-test) profile.
    pub quick: bool,
    /// Untimed cycles before the acquire and CAS loops.
    pub warmup: usize,
    /// Untimed cycles before the handoff and grant loops.
    pub handoff_warmup: usize,
    /// Samples of acquire, handoff, grant latency and the CAS floors.
    pub samples: usize,
    /// Rounds those series are interleaved in (each takes a share of every series).
    pub rounds: usize,
    /// Quiet window measuring background apiserver writes.
    #[serde(serialize_with = "secs")]
    pub baseline_window: Duration,
    /// Locks held by one sidecar while counting renewal writes.
    pub held_locks: usize,
    /// Window of that count.
    #[serde(serialize_with = "secs")]
    pub held_window: Duration,
    /// Pod-deletion failover samples.
    pub pod_deletions: usize,
    /// App crash failover samples (session-bound holds).
    pub app_crashes: usize,
    /// Lock counts of the throughput runs (and of the apiserver ceiling's clients).
    pub throughput_locks: Vec<usize>,
    /// Contending clients per lock.
    pub clients_per_lock: usize,
    /// Runs on one lock with several permits: (permits, clients, of which writers).
    pub permit_runs: Vec<(u32, usize, usize)>,
    /// Throughput warm-up before the window.
    #[serde(serialize_with = "secs")]
    pub throughput_warmup: Duration,
    /// Throughput window.
    #[serde(serialize_with = "secs")]
    pub throughput_window: Duration,
    /// Requests of each kind per round when measuring what each costs the apiserver (in
    /// `rounds` rounds).
    pub cost_requests: usize,
    /// Crash-failover lock pairs run in parallel.
    pub crash_pairs: usize,
    /// Crash-failover rounds per pair.
    pub crash_rounds: usize,
    /// Peer sample counts.
    pub etcd_put: usize,
    /// etcd lock handoff samples.
    pub etcd_handoff: usize,
    /// client-go handoff samples (~8.5 s each).
    pub clientgo_handoff: usize,
    /// client-go failover samples (~24 s each).
    pub clientgo_failover: usize,
    /// etcd lock failover samples (~16 s each with TTL 15).
    pub etcd_failover: usize,
    /// kube-lease-manager handoff samples (~30 s each).
    pub klm_handoff: usize,
    /// kube-lease-manager failover samples (~31 s each).
    pub klm_failover: usize,
    /// Lock counts at which controller memory is read.
    pub scale_counts: Vec<usize>,
    /// Lock creates in flight.
    pub create_concurrency: usize,
    /// Quiet window with the most idle locks.
    #[serde(serialize_with = "secs")]
    pub idle_window: Duration,
    /// Longest wait for the controller to reconcile one scale step, per 10,000 locks the
    /// step creates (at least once).
    #[serde(serialize_with = "secs")]
    pub scale_timeout: Duration,
    /// Failover samples of each kind on the real node (app container killed, pod deleted).
    pub node_failovers: usize,
    /// Lock counts whose ceiling is measured again with each Lease watched by
    /// `clients_per_lock` watches.
    pub watched_ceilings: Vec<usize>,
    /// Whether each ceiling and throughput window also takes a CPU profile of the apiserver
    /// (`LEASEHOLD_BENCH_APISERVER_PROFILE`): sampling costs the apiserver a little CPU of
    /// its own, so runs compared with earlier ones go without.
    pub apiserver_profiles: bool,
}

impl Plan {
    /// The full plan, or the quick one when `LEASEHOLD_BENCH_QUICK` is set (and not `0`);
    /// `LEASEHOLD_BENCH_SCALE_COUNTS` (comma-separated lock counts, ascending) replaces the
    /// scale phase's counts; `LEASEHOLD_BENCH_APISERVER_PROFILE` (not `0`) turns the
    /// apiserver's profiles on.
    pub fn from_env() -> anyhow::Result<Plan> {
        let quick = switched_on("LEASEHOLD_BENCH_QUICK");
        let mut plan = if quick { Plan::quick() } else { Plan::full() };
        plan.apiserver_profiles = switched_on(PROFILES);
        if let Some(counts) = std::env::var(SCALE_COUNTS).ok().filter(|v| !v.trim().is_empty()) {
            plan.scale_counts = scale_counts(&counts).map_err(|e| anyhow::anyhow!("invalid {SCALE_COUNTS}: {e}"))?;
        }
        Ok(plan)
    }

    fn full() -> Plan {
        Plan {
            quick: false,
            warmup: 20,
            handoff_warmup: 10,
            samples: 200,
            rounds: 5,
            baseline_window: Duration::from_secs(20),
            held_locks: 10,
            held_window: Duration::from_secs(30),
            pod_deletions: 20,
            app_crashes: 30,
            throughput_locks: vec![1, 10, 100, 1_000],
            clients_per_lock: 10,
            // A semaphore of 10 permits with 30 clients; a read-write lock, readers-heavy.
            permit_runs: vec![(10, 30, 0), (10, 30, 3)],
            throughput_warmup: Duration::from_secs(8),
            throughput_window: Duration::from_secs(20),
            cost_requests: 100,
            crash_pairs: 4,
            crash_rounds: 8,
            etcd_put: 500,
            etcd_handoff: 100,
            clientgo_handoff: 20,
            clientgo_failover: 8,
            etcd_failover: 8,
            klm_handoff: 6,
            klm_failover: 6,
            scale_counts: vec![1_000, 10_000],
            create_concurrency: 16,
            idle_window: Duration::from_secs(30),
            scale_timeout: Duration::from_secs(600),
            node_failovers: 10,
            watched_ceilings: vec![10, 100],
            apiserver_profiles: false,
        }
    }

    fn quick() -> Plan {
        Plan {
            quick: true,
            warmup: 3,
            handoff_warmup: 2,
            samples: 15,
            rounds: 3,
            baseline_window: Duration::from_secs(5),
            // As many as the full plan: the sidecar memory target is stated for 10 held locks.
            held_locks: 10,
            held_window: Duration::from_secs(6),
            pod_deletions: 3,
            app_crashes: 3,
            throughput_locks: vec![1, 10],
            clients_per_lock: 10,
            permit_runs: vec![(3, 9, 0), (3, 9, 1)],
            throughput_warmup: Duration::from_secs(3),
            throughput_window: Duration::from_secs(5),
            cost_requests: 20,
            crash_pairs: 2,
            crash_rounds: 1,
            etcd_put: 100,
            etcd_handoff: 10,
            clientgo_handoff: 2,
            clientgo_failover: 1,
            etcd_failover: 1,
            klm_handoff: 1,
            klm_failover: 1,
            scale_counts: vec![100, 500],
            create_concurrency: 16,
            idle_window: Duration::from_secs(5),
            scale_timeout: Duration::from_secs(240),
            node_failovers: 2,
            watched_ceilings: vec![10],
            apiserver_profiles: false,
        }
    }
}

/// Whether variable `name` is set to anything but nothing or `0`.
fn switched_on(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The variable that turns the apiserver's CPU profiles on.
const PROFILES: &str = "LEASEHOLD_BENCH_APISERVER_PROFILE";

/// The variable that replaces the scale phase's lock counts.
const SCALE_COUNTS: &str = "LEASEHOLD_BENCH_SCALE_COUNTS";

/// Lock counts from `1000,10000,100000`: positive, strictly ascending (each step creates
/// the locks the one before did not).
fn scale_counts(text: &str) -> Result<Vec<usize>, String> {
    let counts = text
        .split(',')
        .map(|c| {
            let c = c.trim().replace('_', "");
            c.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| format!("{c:?} is not a positive lock count"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if counts.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("the counts must ascend: {counts:?}"));
    }
    Ok(counts)
}
