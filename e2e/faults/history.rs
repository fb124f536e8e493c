//! What every app did, as a history of operations with times on the test process's
//! monotonic clock (every app runs in this process, and what the `leasehold run`
//! commands did is read back from PostgreSQL's own clock and mapped onto it), and the
//! faults injected.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A resource written under the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// PostgreSQL row updated only when the token is at least the highest it has seen.
    Postgres,
    /// ConfigMap fenced by the admission webhook (the token must be the lock's current one).
    ConfigMap,
    /// PostgreSQL row updated unconditionally (the contrast: no fencing).
    Unfenced,
}

/// How an app learned that its hold is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// A `lost` event.
    LostEvent,
    /// A `released` event it had not asked for (its sidecar gave the hold up).
    ReleasedEvent,
    /// Its event stream closed (the sidecar went away).
    StreamClosed,
}

/// One operation of an app, as the app saw it.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// The app received a grant of `token` — an acquire answered 200, or a hold-mode app
    /// finding a new token — and believes it holds the lock until `until` (receipt +
    /// `remainingMs`; `None`: until told otherwise) unless told otherwise.
    Granted {
        /// The token.
        token: i64,
        /// How long the answer lets the app count on the hold.
        until: Option<Instant>,
    },
    /// An answer saying the app's hold `token` is held: a view with `remainingMs` (until
    /// receipt + `remainingMs`), or a hold file that passes its validity check (`None`:
    /// until the app reads otherwise).
    Held {
        /// The token.
        token: i64,
        /// How long the answer lets the app count on the hold.
        until: Option<Instant>,
    },
    /// An answer saying the app does not hold the lock (a view, a missing or invalid hold
    /// file, another token): every belief of the app in this lock ends.
    NotHeld,
    /// The app learned that its hold `token` is gone.
    Lost {
        /// The token.
        token: i64,
        /// How.
        how: Learned,
    },
    /// The app let go of `token` (it calls release from here on).
    Release {
        /// The token.
        token: i64,
    },
    /// The app stopped (its container ended): it believes nothing any more.
    Stopped,
    /// The client acted under `token` at this instant: a write by a `leasehold run`
    /// command, which believes it holds the lock for as long as it runs.
    Act {
        /// The token.
        token: i64,
    },
    /// A write attempt, answered at the entry's time, and whether the resource applied it.
    Write {
        /// Which resource.
        resource: Resource,
        /// The token presented.
        token: i64,
        /// Applied.
        applied: bool,
        /// The writer believed it held `token` when it sent the write; `false` for a
        /// zombie write (sent on purpose after the belief ended).
        believed: bool,
        /// When it was sent.
        sent: Instant,
    },
    /// The apiserver refused the app's pod's token (HTTP 401) from this instant on: its
    /// Pod is gone and the token's authentication is no longer cached. Its sidecar's next
    /// renewal is refused too.
    TokenRefused,
    /// A write no holder may make, attempted with a worker pod's own credentials, and what
    /// the apiserver answered.
    Adversary {
        /// The fault kind.
        kind: &'static str,
        /// The apiserver accepted it.
        accepted: bool,
        /// Status and message.
        answer: String,
    },
}

/// One entry of the history.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// When.
    pub at: Instant,
    /// Which app (a worker pod, a hold-mode pod's app, a `leasehold run` command).
    pub client: String,
    /// Which lock.
    pub lock: String,
    /// What.
    pub op: Op,
}

/// A fault injected, and from when recovery is measured.
#[derive(Clone, Debug)]
pub struct Fault {
    /// Kind, e.g. `holder-sigstop`.
    pub kind: &'static str,
    /// Affected locks.
    pub locks: Vec<String>,
    /// Injected at.
    pub start: Instant,
    /// Recovery is measured from here (the injection for faults that take a hold away,
    /// the end of an outage or pause for the rest).
    pub recover_from: Instant,
    /// The lease duration the affected holds were granted under (liveness bounds count it).
    pub lease: Duration,
    /// The app the fault hit, if one (for checks about what it was told afterwards).
    pub victim: Option<String>,
    /// What happened, for the report (e.g. the apiserver's answer).
    pub note: String,
}

/// The shared history of a run.
#[derive(Clone)]
pub struct History {
    entries: Arc<Mutex<Vec<Entry>>>,
    faults: Arc<Mutex<Vec<Fault>>>,
    /// Per lock, the latest time an app was told it holds it (a grant or a held answer).
    told_held: Arc<Mutex<std::collections::HashMap<String, Instant>>>,
    changed: tokio::sync::watch::Sender<usize>,
}

impl Default for History {
    fn default() -> History {
        History {
            entries: Arc::default(),
            faults: Arc::default(),
            told_held: Arc::default(),
            changed: tokio::sync::watch::channel(0).0,
        }
    }
}

impl History {
    /// Records an operation now.
    pub fn log(&self, client: &str, lock: &str, op: Op) {
        self.log_at(Instant::now(), client, lock, op);
    }

    /// Records an operation at `at`.
    pub fn log_at(&self, at: Instant, client: &str, lock: &str, op: Op) {
        if matches!(op, Op::Granted { .. } | Op::Held { .. }) {
            let mut told = self.told_held.lock().expect("history lock");
            let latest = told.entry(lock.to_owned()).or_insert(at);
            *latest = (*latest).max(at);
        }
        let entry = Entry { at, client: client.to_owned(), lock: lock.to_owned(), op };
        let n = {
            let mut entries = self.entries.lock().expect("history lock");
            entries.push(entry);
            entries.len()
        };
        self.changed.send_replace(n);
    }

    /// Waits until an app is told it holds `lock` (a grant, or an answer saying held) after
    /// `after`, up to `limit`; returns whether one was.
    pub async fn wait_told_held(&self, lock: &str, after: Instant, limit: Duration) -> bool {
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if self.told_held.lock().expect("history lock").get(lock).is_some_and(|t| *t > after) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
                return false;
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
}

/// `d` in milliseconds, for reports.
pub fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// Signed milliseconds from `from` to `to`, for reports.
pub fn signed_ms(from: Instant, to: Instant) -> i128 {
    if to >= from { (to - from).as_millis() as i128 } else { -((from - to).as_millis() as i128) }
}
