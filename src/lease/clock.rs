//! Judging expiry on one's own monotonic clock.
//!
//! Nobody compares another machine's wall-clock `renewTime` with their own clock: a
//! holder is expired when *we* have not seen its renewal change for a lease duration. The
//! clock starts at our first sighting, so a fresh observer (a restarted or newly elected
//! controller) waits a full lease duration before expiring anyone: never early.

use std::time::{Duration, Instant};

/// When we first saw a value (a holder's renewal record) unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting<K> {
    /// What we saw: anything that changes on every renewal.
    pub key: K,
    /// When we first saw it.
    pub since: Instant,
}

impl<K: PartialEq> Sighting<K> {
    /// Records that `key` was observed at `now`: keeps the old sighting if unchanged,
    /// starts a new one otherwise. Returns the time since which `key` has been seen.
    pub fn observe(slot: &mut Option<Sighting<K>>, key: K, now: Instant) -> Instant {
        match slot {
            Some(s) if s.key == key => s.since,
            _ => {
                *slot = Some(Sighting { key, since: now });
                now
            }
        }
    }

    /// [`Sighting::observe`] for one of many observed things, kept in a map by id.
    pub fn observe_in<Q: std::hash::Hash + Eq + Clone>(
        map: &mut std::collections::HashMap<Q, Sighting<K>>,
        id: &Q,
        key: K,
        now: Instant,
    ) -> Instant {
        let mut slot = map.remove(id);
        let since = Sighting::observe(&mut slot, key, now);
        if let Some(s) = slot {
            map.insert(id.clone(), s);
        }
        since
    }

    /// Time left before this sighting is `duration` old (zero when it is).
    pub fn remaining(&self, duration: Duration, now: Instant) -> Duration {
        (self.since + duration).saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unchanged_key_keeps_first_sighting_changed_key_restarts() {
        let t0 = Instant::now();
        let mut slot = None;
        assert_eq!(Sighting::observe(&mut slot, 1, t0), t0);
        assert_eq!(Sighting::observe(&mut slot, 1, t0 + Duration::from_secs(5)), t0);
        let t9 = t0 + Duration::from_secs(9);
        assert_eq!(Sighting::observe(&mut slot, 2, t9), t9);
        let s = slot.expect("observed");
        assert_eq!(s.remaining(Duration::from_secs(15), t9 + Duration::from_secs(10)), Duration::from_secs(5));
        assert_eq!(s.remaining(Duration::from_secs(15), t9 + Duration::from_secs(20)), Duration::ZERO);
    }
}
