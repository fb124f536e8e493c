//! The health of the controller's watch caches: which have completed their first list,
//! which have been failing and for how long. A cache that keeps failing is said again
//! every [`WATCH_FAILURE_GRACE`] with how long and how many attempts, and its recovery is
//! said too, so a cache that stays stale never goes quiet in the log after its first
//! failure; past the grace it also makes the replica unready.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::watcher;
use tracing::{info, warn};

/// A cache failing for this long makes the replica unready (its view of locks is stale),
/// and a failure still going on is said again this often.
pub const WATCH_FAILURE_GRACE: Duration = Duration::from_secs(30);

/// The health of one watch cache.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CacheHealth {
    synced: bool,
    failing: Option<Failing>,
}

/// A run of failed watch attempts, ended by the next event.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Failing {
    since: Instant,
    attempts: u32,
    said_at: Instant,
}

/// What to say about a cache after one item of its watch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Say {
    /// Nothing changed.
    Nothing,
    /// Its first complete list.
    Synced,
    /// The first failure of a run.
    Failing,
    /// A run still going on.
    StillFailing {
        /// Since the run's first failure.
        failing_for: Duration,
        /// Attempts failed in the run.
        attempts: u32,
    },
    /// A run ended by an event.
    Recovered {
        /// How long the run lasted.
        after: Duration,
        /// Attempts failed in the run.
        attempts: u32,
    },
}

impl CacheHealth {
    /// An event of the watch at `now` (`init_done`: the end of a complete list).
    pub fn event(&mut self, init_done: bool, now: Instant) -> Say {
        let ended = self.failing.take();
        if init_done && !self.synced {
            self.synced = true;
            return Say::Synced;
        }
        match ended {
            Some(f) => Say::Recovered { after: now.saturating_duration_since(f.since), attempts: f.attempts },
            None => Say::Nothing,
        }
    }

    /// A failed watch attempt at `now`.
    pub fn failure(&mut self, now: Instant) -> Say {
        let Some(f) = self.failing.as_mut() else {
            self.failing = Some(Failing { since: now, attempts: 1, said_at: now });
            return Say::Failing;
        };
        f.attempts = f.attempts.saturating_add(1);
        if now.saturating_duration_since(f.said_at) < WATCH_FAILURE_GRACE {
            return Say::Nothing;
        }
        f.said_at = now;
        Say::StillFailing { failing_for: now.saturating_duration_since(f.since), attempts: f.attempts }
    }

    /// What keeps the cache from being well at `now`, if anything.
    pub fn problem(&self, now: Instant) -> Option<String> {
        if !self.synced {
            return Some("not synced".into());
        }
        let failing_for = now.saturating_duration_since(self.failing?.since);
        (failing_for > WATCH_FAILURE_GRACE).then(|| format!("watch failing for {}s", failing_for.as_secs()))
    }
}

/// Which watch caches have completed their first list, and which have been failing.
#[derive(Clone, Default)]
pub struct Synced(Arc<Mutex<[CacheHealth; 5]>>);

impl Synced {
    const NAMES: [&'static str; 5] = ["distributedlocks", "forcereleaserequests", "leases", "lockclaims", "pods"];

    /// An `inspect` callback tracking cache `name` and saying what changes.
    pub fn marker<K>(&self, name: &'static str) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) + use<K> {
        let index = Self::NAMES.iter().position(|n| *n == name).expect("a known cache");
        let health = self.0.clone();
        move |item| {
            let now = Instant::now();
            let mut health = health.lock().expect("cache health is never poisoned");
            match item {
                Ok(event) => match health[index].event(matches!(event, watcher::Event::InitDone), now) {
                    Say::Synced => info!(cache = name, "watch cache synced"),
                    Say::Recovered { after, attempts } => {
                        info!(cache = name, failed_for_ms = after.as_millis() as u64, attempts, "watch recovered");
                    }
                    _ => {}
                },
                Err(error) => match health[index].failure(now) {
                    Say::Failing => warn!(cache = name, %error, "watch failing"),
                    Say::StillFailing { failing_for, attempts } => {
                        warn!(cache = name, %error, failing_for_s = failing_for.as_secs(), attempts, "watch still failing");
                    }
                    _ => {}
                },
            }
        }
    }

    /// `Ok` once every cache has synced and none has been failing for long; else names
    /// those that are not well.
    pub fn check(&self) -> Result<(), String> {
        let health = *self.0.lock().expect("cache health is never poisoned");
        let now = Instant::now();
        let problems: Vec<String> = Self::NAMES
            .iter()
            .zip(health)
            .filter_map(|(name, cache)| cache.problem(now).map(|p| format!("{name}: {p}")))
            .collect();
        if problems.is_empty() { Ok(()) } else { Err(format!("watch caches not well: {}", problems.join("; "))) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_run_of_failures_is_said_first_then_every_grace_then_at_its_end() {
        let t = Instant::now();
        let mut h = CacheHealth::default();
        let steps: [(&str, u32, Say); 8] = [
            ("list done", 0, Say::Synced),
            ("fail", 1, Say::Failing),
            ("fail", 2, Say::Nothing),
            ("fail", 30, Say::Nothing),
            ("fail", 31, Say::StillFailing { failing_for: 30 * S, attempts: 4 }),
            ("fail", 60, Say::Nothing),
            ("fail", 61, Say::StillFailing { failing_for: 60 * S, attempts: 6 }),
            ("event", 62, Say::Recovered { after: 61 * S, attempts: 6 }),
        ];
        for (what, at, expected) in steps {
            let now = t + at * S;
            let said = match what {
                "list done" => h.event(true, now),
                "event" => h.event(false, now),
                _ => h.failure(now),
            };
            assert_eq!(said, expected, "{what} at {at}s");
        }
        assert_eq!(h.event(false, t + 63 * S), Say::Nothing, "a healthy watch's events say nothing");
        assert_eq!(h.failure(t + 64 * S), Say::Failing, "a new run is said at once");
    }

    #[test]
    fn a_failure_before_the_first_list_leaves_the_cache_unsynced_until_its_list() {
        let t = Instant::now();
        let mut h = CacheHealth::default();
        assert_eq!(h.failure(t), Say::Failing);
        assert_eq!(h.problem(t + 40 * S).as_deref(), Some("not synced"));
        assert_eq!(h.event(false, t + 41 * S), Say::Recovered { after: 41 * S, attempts: 1 });
        assert_eq!(h.event(true, t + 42 * S), Say::Synced);
        assert_eq!(h.problem(t + 42 * S), None);
    }

    #[test]
    fn only_a_run_longer_than_the_grace_is_a_problem() {
        let t = Instant::now();
        let mut h = CacheHealth::default();
        h.event(true, t);
        h.failure(t + S);
        let cases = [(1, None), (31, None), (32, Some("watch failing for 31s"))];
        for (at, expected) in cases {
            assert_eq!(h.problem(t + at * S).as_deref(), expected, "at {at}s");
        }
        h.event(false, t + 33 * S);
        assert_eq!(h.problem(t + 100 * S), None, "recovered");
    }
}
