//! What every client did, as a history of operations with times on the test process's
//! monotonic clock (all clients run in this process, so their times compare).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A resource written under the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// PostgreSQL row updated only when the token is at least the highest seen.
    Postgres,
    /// ConfigMap fenced by the admission webhook.
    ConfigMap,
    /// PostgreSQL row updated unconditionally (the contrast: no fencing).
    Unfenced,
}

/// One operation.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// The sidecar answered an acquire with this token; the client believes it holds until
    /// `deadline` unless told more.
    Acquired { token: i64, deadline: Instant },
    /// A view said held with time left (extends the belief) or not held (ends it).
    View { token: i64, held: bool, deadline: Option<Instant> },
    /// The event stream said the hold is lost.
    Lost { token: i64 },
    /// The client asked to release (its belief ends when it asks).
    Release { token: i64 },
    /// The client (its pod or sidecar) died: it believes nothing any more.
    Died,
    /// A write attempt and whether the resource applied it. `stale` marks a write the
    /// client sends on purpose with a token it may have lost (a resumed zombie).
    Write { resource: Resource, token: i64, applied: bool, stale: bool },
}

/// One entry of the history.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// When.
    pub at: Instant,
    /// Which client (pod name).
    pub client: String,
    /// Which lock.
    pub lock: String,
    /// What.
    pub op: Op,
}

/// A fault injected, and when it ended (the system may start recovering).
#[derive(Clone, Debug)]
pub struct Fault {
    /// Kind, e.g. `holder-sigstop`.
    pub kind: &'static str,
    /// Affected locks.
    pub locks: Vec<String>,
    /// Injected at.
    pub start: Instant,
    /// Ended at.
    pub end: Instant,
}

/// The shared history of a run.
#[derive(Clone)]
pub struct History {
    entries: Arc<Mutex<Vec<Entry>>>,
    faults: Arc<Mutex<Vec<Fault>>>,
    changed: tokio::sync::watch::Sender<usize>,
}

impl Default for History {
    fn default() -> History {
        History { entries: Arc::default(), faults: Arc::default(), changed: tokio::sync::watch::channel(0).0 }
    }
}

impl History {
    /// Records an operation now.
    pub fn log(&self, client: &str, lock: &str, op: Op) {
        self.log_at(Instant::now(), client, lock, op);
    }

    /// Records an operation at `at`.
    pub fn log_at(&self, at: Instant, client: &str, lock: &str, op: Op) {
        let entry = Entry { at, client: client.to_owned(), lock: lock.to_owned(), op };
        let n = {
            let mut entries = self.entries.lock().expect("history lock");
            entries.push(entry);
            entries.len()
        };
        self.changed.send_replace(n);
    }

    /// Waits until `lock` is granted after `after`, up to `limit`; returns when, if it was.
    pub async fn wait_grant_after(&self, lock: &str, after: Instant, limit: Duration) -> Option<Instant> {
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(at) = self.first_grant_after(lock, after) {
                return Some(at);
            }
            if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
                return None;
            }
        }
    }

    /// Records a fault.
    pub fn fault(&self, fault: Fault) {
        self.faults.lock().expect("history lock").push(fault);
    }

    /// Everything so far, in time order.
    pub fn entries(&self) -> Vec<Entry> {
        let mut entries = self.entries.lock().expect("history lock").clone();
        entries.sort_by_key(|e| e.at);
        entries
    }

    /// The faults so far.
    pub fn faults(&self) -> Vec<Fault> {
        self.faults.lock().expect("history lock").clone()
    }

    /// Grants of `lock` seen so far after `after`.
    pub fn first_grant_after(&self, lock: &str, after: Instant) -> Option<Instant> {
        self.entries
            .lock()
            .expect("history lock")
            .iter()
            .filter(|e| e.lock == lock && e.at > after && matches!(e.op, Op::Acquired { .. }))
            .map(|e| e.at)
            .min()
    }
}

/// `d` in milliseconds, for reports.
pub fn ms(d: Duration) -> u128 {
    d.as_millis()
}
