//! How long the controller waits for a grant's confirmation: `--confirm-timeout`, doubled
//! for each grant of the lock revoked in a row because it was not confirmed in time while
//! its claim stood, at most a lease duration; back to `--confirm-timeout` once a later
//! grant of the lock is seen answered (confirmed, or released or given back). Never less
//! than twice the slowest confirmation seen in the last minute on any lock (at most a
//! lease duration): a lock granted every few seconds misses rarely enough that its own
//! misses keep resetting, while a slow apiserver delays every lock's confirmations alike.
//!
//! A confirmation takes a watch event to the claimant, its compare-and-swap, and a watch
//! event back to the controller. On an apiserver slow enough that this takes longer than
//! the timeout, a fixed timeout revokes every grant to a waiter with an old claim before its
//! confirmation can be seen: the lock goes from waiter to waiter and is never held, and each
//! revocation adds writes (the Lease, the claim dropped, the claim made again) to an
//! apiserver already too busy. Waiting longer only after misses keeps the quick revocation
//! of a dead waiter wherever the apiserver keeps up.
//!
//! Safety does not rest on it: a waiter whose claim is that old confirms before it reports
//! the lock held, and a confirmation after the revocation fails its compare-and-swap. The
//! cost is liveness: after misses, a dead waiter holds the lock up for longer, a lease
//! duration at most.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a confirmation's time is remembered.
const REMEMBERED: Duration = Duration::from_secs(60);

/// The most confirmation times remembered (the oldest go first).
const KEPT: usize = 512;

/// A lock's grants revoked unconfirmed in a row, in the controller's memory of the lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Misses {
    /// How many in a row.
    count: u32,
    /// The token of the last grant missed: an answered grant must be newer to end the run
    /// (a hold confirmed before the misses, on another slot, says nothing about them).
    after: i64,
}

impl Misses {
    /// The grant with `token` was revoked unconfirmed (its claim still there).
    pub fn missed(&mut self, token: i64) {
        self.count = self.count.saturating_add(1);
        self.after = self.after.max(token);
    }

    /// The grant with `token` was answered: its hold is seen confirmed, or released or
    /// given back by its claimant. If it came after the last miss, the run is over.
    pub fn answered(&mut self, token: i64) {
        if self.count > 0 && token > self.after {
            *self = Misses::default();
        }
    }

    /// Whether no miss is remembered (the memory of the lock may then be dropped).
    pub fn none(&self) -> bool {
        self.count == 0
    }

    /// How many in a row.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// How long to wait for the next confirmation: `base` doubled per miss, at most
    /// `lease_duration` (or `base`, if that is longer).
    pub fn window(&self, base: Duration, lease_duration: Duration) -> Duration {
        if self.count == 0 {
            return base;
        }
        let factor = 1u32 << self.count.min(20);
        base.saturating_mul(factor).min(lease_duration.max(base))
    }
}

/// How long grants took to be seen confirmed lately, across every lock: from our grant's
/// write returning to our first sight of it confirmed, for grants whose claimant had to
/// confirm before answering (its claim first seen a lease duration before the grant or
/// more). A grant answered first confirms only a retry period later, on purpose, and says
/// nothing of the apiserver's pace.
#[derive(Debug, Default)]
pub struct Latencies {
    /// When each was seen, and how long it took; oldest first.
    seen: VecDeque<(Instant, Duration)>,
}

impl Latencies {
    /// A grant written at `written` was seen confirmed at `now`.
    pub fn record(&mut self, written: Instant, now: Instant) {
        self.seen.push_back((now, now.saturating_duration_since(written)));
        while self.seen.len() > KEPT
            || self.seen.front().is_some_and(|(at, _)| now.saturating_duration_since(*at) > REMEMBERED)
        {
            self.seen.pop_front();
        }
    }

    /// Twice the slowest confirmation seen in the last minute before `now` (zero: none).
    pub fn floor(&self, now: Instant) -> Duration {
        let recent = self.seen.iter().filter(|(at, _)| now.saturating_duration_since(*at) <= REMEMBERED);
        recent.map(|(_, took)| *took).max().unwrap_or_default().saturating_mul(2)
    }
}

/// The confirmation window of a lock: its own misses' ([`Misses::window`]), and no less
/// than `floor` ([`Latencies::floor`]) capped at a lease duration.
pub fn window(misses: &Misses, floor: Duration, base: Duration, lease_duration: Duration) -> Duration {
    misses.window(base, lease_duration).max(floor.min(lease_duration))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn after(misses: &[i64]) -> Misses {
        let mut m = Misses::default();
        for raised in misses {
            m.missed(*raised);
        }
        m
    }

    #[test]
    fn the_window_doubles_per_miss_up_to_a_lease_duration() {
        let table = [
            ("no miss: the timeout", vec![], S, 15 * S, S),
            ("one miss", vec![5], S, 15 * S, 2 * S),
            ("three misses", vec![5, 6, 7], S, 15 * S, 8 * S),
            ("four misses: capped at a lease duration", vec![5, 6, 7, 8], S, 15 * S, 15 * S),
            ("many misses: no overflow", (1..100).collect(), S, 15 * S, 15 * S),
            ("a timeout above the lease duration stays", vec![5], 20 * S, 15 * S, 20 * S),
        ];
        for (case, misses, base, lease, expected) in table {
            assert_eq!(after(&misses).window(base, lease), expected, "{case}");
        }
    }

    #[test]
    fn the_window_is_at_least_twice_the_slowest_recent_confirmation_up_to_a_lease_duration() {
        let table = [
            ("nothing seen: the timeout", vec![], vec![], S, 15 * S, S),
            ("fast confirmations: the timeout", vec![], vec![(10, 100)], S, 15 * S, S),
            ("one slow confirmation: twice it", vec![], vec![(10, 100), (20, 1_500)], S, 15 * S, 3 * S),
            ("the slowest counts, not the latest", vec![], vec![(10, 2_000), (20, 100)], S, 15 * S, 4 * S),
            ("older than a minute: forgotten", vec![], vec![(0, 2_000), (70, 100)], S, 15 * S, S),
            ("capped at a lease duration", vec![], vec![(10, 9_000)], S, 15 * S, 15 * S),
            ("the lock's misses may ask for more", vec![5, 6], vec![(10, 1_500)], S, 15 * S, 4 * S),
            ("a timeout above the lease duration stays", vec![], vec![(10, 30_000)], 20 * S, 15 * S, 20 * S),
        ];
        for (case, misses, seen, base, lease, expected) in table {
            let start = Instant::now();
            let mut latencies = Latencies::default();
            let mut now = start;
            for (at_s, took_ms) in seen {
                now = start + Duration::from_secs(at_s) + Duration::from_millis(took_ms);
                latencies.record(now - Duration::from_millis(took_ms), now);
            }
            let floor = latencies.floor(now);
            assert_eq!(window(&after(&misses), floor, base, lease), expected, "{case}");
        }
    }

    #[test]
    fn only_the_latest_confirmations_are_kept() {
        let start = Instant::now();
        let mut latencies = Latencies::default();
        latencies.record(start, start + 5 * S);
        for i in 0..KEPT {
            let at = start + 6 * S + Duration::from_millis(i as u64);
            latencies.record(at - Duration::from_millis(10), at);
        }
        assert_eq!(latencies.seen.len(), KEPT);
        assert_eq!(latencies.floor(start + 7 * S), Duration::from_millis(20), "the slow one was pushed out");
    }

    #[test]
    fn only_a_grant_answered_after_the_last_miss_ends_the_run() {
        let table = [
            ("a hold confirmed before the misses (another slot)", 4, false),
            ("the grant last missed", 7, false),
            ("a grant after the last miss", 8, true),
        ];
        for (case, token, ends) in table {
            let mut m = after(&[6, 7]);
            m.answered(token);
            assert_eq!(m.none(), ends, "{case}");
            assert_eq!(m.count(), if ends { 0 } else { 2 }, "{case}");
        }
        let mut none = Misses::default();
        none.answered(1);
        assert!(none.none(), "nothing to end");
    }
}
