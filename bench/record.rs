//! What one run records: latency series, throughput, apiserver writes, memory, facts and
//! notes. Serialised as `raw.json`; `report.rs` renders it as Markdown.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::stats::Summary;

/// Which plot panel a series belongs to.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Panel {
    /// Floors, acquire and grant latency: milliseconds.
    Fast,
    /// Voluntary handoffs.
    Handoff,
    /// Failovers.
    Failover,
}

/// One latency distribution, in milliseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    /// Stable key, e.g. `leasehold.handoff`.
    pub key: String,
    /// What was measured, in words.
    pub title: String,
    /// `Leasehold`, `floor` or the peer library with its version.
    pub subject: String,
    /// Plot panel.
    pub panel: Panel,
    /// Samples, ms.
    pub samples_ms: Vec<f64>,
    /// Their summary.
    pub summary: Summary,
    /// How they were taken.
    pub params: Value,
}

impl Series {
    /// A series from its samples.
    pub fn new(key: &str, title: &str, subject: &str, panel: Panel, samples_ms: Vec<f64>, params: Value) -> Series {
        let summary = Summary::of(&samples_ms);
        Series { key: key.into(), title: title.into(), subject: subject.into(), panel, samples_ms, summary, params }
    }
}

/// Aggregate lock cycles per second with some locks and clients.
#[derive(Clone, Debug, Serialize)]
pub struct Throughput {
    /// Locks.
    pub locks: usize,
    /// Clients per lock.
    pub clients_per_lock: usize,
    /// Permits per lock (1: a mutex).
    pub permits: u32,
    /// Clients per lock acquiring in write mode.
    pub writers_per_lock: usize,
    /// Cycles (acquire returned) inside the window.
    pub cycles: usize,
    /// Window, seconds.
    pub seconds: f64,
    /// Seconds from the claimants' start until as many claims had been created as there
    /// are claimants (`None`: not within the limit); the window starts after it.
    pub all_claimed_s: Option<f64>,
    /// Seconds from then until every claimant had been granted once more, a turn of every
    /// queue (`None`: not within the limit); the window starts after it too.
    pub turned_s: Option<f64>,
    /// Cycles per second in a window as long that starts where the window used to: after
    /// the warm-up and once every claimant had claimed, without waiting for the turn.
    pub first_per_second: f64,
    /// Cycles per second.
    pub per_second: f64,
    /// Failed acquisitions in the window.
    pub errors: usize,
    /// What they were: category, count, an example.
    pub error_kinds: Vec<String>,
    /// Apiserver writes per cycle, that is per grant, in the window (background removed).
    pub writes_per_cycle: f64,
    /// CAS conflicts (409) per cycle (per grant).
    pub conflicts_per_cycle: f64,
    /// Writes by kind per cycle.
    pub breakdown: String,
    /// Every apiserver request per cycle (reads, watches and refusals too; background not
    /// removed).
    pub requests_per_cycle: f64,
    /// Those by `VERB resource code` per cycle.
    pub requests: String,
    /// The same, by `VERB resource code`: requests per cycle.
    pub request_counts: BTreeMap<String, f64>,
    /// Acquire latency (request to hold, including queueing) in the window.
    pub acquire_ms: Summary,
    /// Release latency (the claim withdrawn and the holder cleared, both answered) of the
    /// releases that returned in the window: how long a lock stays held after its
    /// holder lets go.
    pub release_ms: Summary,
    /// CPU time of the apiserver, etcd, the controller and this process in the window.
    pub cpu: crate::cpu::Usage,
}

/// What one request of a kind costs the apiserver, from one client sending that kind back
/// to back.
#[derive(Clone, Debug, Serialize)]
pub struct RequestCost {
    /// The kind, as `apiserver_request_total` names it: `VERB resource code`.
    pub key: String,
    /// What was sent.
    pub what: String,
    /// Requests timed.
    pub requests: usize,
    /// kube-apiserver CPU time per request, ms.
    pub apiserver_ms: f64,
    /// etcd CPU time per request, ms.
    pub etcd_ms: f64,
    /// Each request's round trip, ms.
    pub wall_ms: Summary,
}

/// The apiserver's write ceiling: raw Lease compare-and-swaps per second from some
/// clients, each on a Lease of its own.
#[derive(Clone, Debug, Serialize)]
pub struct Ceiling {
    /// Clients, one Lease each (as many as the throughput run with that many locks has).
    pub clients: usize,
    /// Watches of each Lease (0: none), as a contended lock's claimants watch its Lease.
    pub watchers_per_lease: usize,
    /// How each watch selects the changes it is sent.
    pub selection: crate::ceiling::Selection,
    /// Changes the watches received per write, over the whole run (warm-up included).
    pub watch_events_per_write: f64,
    /// Successful writes (replace returned) inside the window.
    pub writes: usize,
    /// Window, seconds.
    pub seconds: f64,
    /// Successful writes per second.
    pub per_second: f64,
    /// Writes refused with 409 in the window (none expected: no Lease is shared).
    pub conflicts: usize,
    /// Other failed requests in the window.
    pub errors: usize,
    /// The first of them, to say what went wrong.
    pub first_error: Option<String>,
    /// Writes per second by the apiserver's own counters, background removed.
    pub apiserver_writes_per_second: f64,
    /// Those writes by kind, per second.
    pub breakdown: String,
    /// Latency of one replace under that load.
    pub cas_ms: Summary,
    /// CPU time of the apiserver, etcd, the controller and this process in the window.
    pub cpu: crate::cpu::Usage,
}

impl Ceiling {
    /// How the report names this ceiling's window.
    pub fn label(&self) -> String {
        match (self.watchers_per_lease, self.selection) {
            (0, _) => format!("ceiling, {} clients", self.clients),
            (w, crate::ceiling::Selection::Name) => {
                format!("ceiling, {} clients, {w} watchers per Lease", self.clients)
            }
            (w, crate::ceiling::Selection::Holder) => {
                format!("ceiling, {} clients, {w} watchers per Lease, by holder label", self.clients)
            }
        }
    }
}

/// A count of apiserver writes.
#[derive(Clone, Debug, Serialize)]
pub struct WriteCount {
    /// What it counts.
    pub what: String,
    /// The value.
    pub value: f64,
    /// Its unit, e.g. `writes/cycle`.
    pub unit: String,
    /// By kind.
    pub breakdown: String,
    /// Window and background.
    pub params: Value,
}

/// One resident-memory reading.
#[derive(Clone, Debug, Serialize)]
pub struct Memory {
    /// Which process in which state.
    pub what: String,
    /// VmRSS, KiB.
    pub rss_kib: u64,
    /// VmHWM (peak RSS so far), KiB.
    pub peak_kib: u64,
    /// RssAnon (heap, stacks: the process's own), KiB.
    pub anon_kib: u64,
    /// RssFile (mapped pages of the binary and libraries, shareable), KiB.
    pub file_kib: u64,
    /// Circumstances.
    pub params: Value,
}

/// One phase of the run.
#[derive(Clone, Debug, Serialize)]
pub struct Phase {
    /// Its name.
    pub name: String,
    /// Wall time, seconds.
    pub seconds: f64,
    /// `/proc/loadavg` (1, 5, 15 min) when it started.
    pub load_start: String,
    /// `/proc/loadavg` when it ended.
    pub load_end: String,
}

/// Everything one run recorded.
#[derive(Debug, Default, Serialize)]
pub struct Run {
    /// Latency series.
    pub series: Vec<Series>,
    /// Throughput runs.
    pub throughput: Vec<Throughput>,
    /// The apiserver's write ceiling, measured beside the throughput runs.
    pub ceilings: Vec<Ceiling>,
    /// Write counts.
    pub writes: Vec<WriteCount>,
    /// Memory readings.
    pub memory: Vec<Memory>,
    /// CPU time per 1,000 grants, one row per process.
    pub cpu: Vec<WriteCount>,
    /// The apiserver's CPU time per request, by kind.
    pub request_costs: Vec<RequestCost>,
    /// Versions, machine facts, parameters, sizes.
    pub facts: BTreeMap<String, Value>,
    /// Phases: wall time and the load they ran under.
    pub phases: Vec<Phase>,
    /// Things worth knowing when reading the numbers (noise, failures, choices).
    pub notes: Vec<String>,
    /// Phases that failed.
    pub failures: Vec<String>,
}

impl Run {
    /// The ceiling without watchers from `clients` clients: the one throughput is read against.
    pub fn ceiling(&self, clients: usize) -> Option<&Ceiling> {
        self.ceilings.iter().find(|c| c.clients == clients && c.watchers_per_lease == 0)
    }

    /// The series with `key`.
    pub fn series(&self, key: &str) -> Option<&Series> {
        self.series.iter().find(|s| s.key == key)
    }

    /// Adds everything `other` recorded.
    pub fn merge(&mut self, other: Run) {
        self.series.extend(other.series);
        self.throughput.extend(other.throughput);
        self.ceilings.extend(other.ceilings);
        self.writes.extend(other.writes);
        self.memory.extend(other.memory);
        self.cpu.extend(other.cpu);
        self.request_costs.extend(other.request_costs);
        self.facts.extend(other.facts);
        self.notes.extend(other.notes);
        self.failures.extend(other.failures);
    }
}

/// The parameters of one part of a split series: `params`, with what the `part` holds and
/// the `clock`s the split reads.
pub fn part_params(params: &Value, part: &str, clock: &str) -> Value {
    let mut p = params.clone();
    p["part"] = serde_json::json!(part);
    p["clock"] = serde_json::json!(clock);
    p
}
