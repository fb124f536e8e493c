//! Which lock to reconcile next, as a pure state machine over values. A lock whose event
//! came in is due at once, with no timer in between (a watch event is the only thing a
//! waiter's grant waits for). A lock being reconciled is never started twice: an event
//! meanwhile runs it again as soon as it ends. A requeue waits for its time unless an
//! event comes first, and of two requeues the earlier wins. At most `limit` run at once,
//! the rest in the order they fell due, except that a lock whose own writes are not yet
//! settled (the caller says so: its memory holds a write its caches do not show yet) goes
//! before the others. Its event is most often the echo of that write, and its reconcile is
//! what lets the controller forget the copy it keeps: served in arrival order behind a
//! burst of new locks, those copies would pile up by the thousand, and the allocator keeps
//! their pages once they are freed. A settling lock gets its place only from a reconcile
//! of its own that wrote, so it cannot keep others waiting for long. A lock with nothing
//! due or running keeps no entry, so idle locks cost the queue nothing.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// What a finished reconcile asks for: to be looked at again after this long even if no
/// event comes, or (`None`) only on an event.
pub type Recheck = Option<Duration>;

/// The dispatcher's state. `K` names a lock.
pub struct Dispatch<K> {
    limit: usize,
    running: HashSet<K>,
    /// Due now, in the order they became due.
    ready: VecDeque<K>,
    /// Due now and served before `ready`: locks whose own writes are not yet settled.
    settling: VecDeque<K>,
    queued: HashSet<K>,
    /// An event came while it ran: it runs again when it ends.
    again: HashSet<K>,
    /// Requeued for later: when, per key, and ordered by when.
    later: HashMap<K, Instant>,
    by_time: BTreeSet<(Instant, K)>,
}

impl<K: Clone + Eq + Hash + Ord> Dispatch<K> {
    /// An empty queue that runs at most `limit` at once (0: no limit).
    pub fn new(limit: usize) -> Self {
        Dispatch {
            limit,
            running: HashSet::new(),
            ready: VecDeque::new(),
            settling: VecDeque::new(),
            queued: HashSet::new(),
            again: HashSet::new(),
            later: HashMap::new(),
            by_time: BTreeSet::new(),
        }
    }

    /// An event for `key`: due at once (or again once its running reconcile ends), before
    /// the unsettled ones if `settling`. A requeue it had is superseded.
    pub fn trigger(&mut self, key: K, settling: bool) {
        self.forget_later(&key);
        if self.running.contains(&key) {
            self.again.insert(key);
        } else {
            self.make_ready(key, settling);
        }
    }

    /// `key`'s reconcile ended; it asked to be looked at again at `requeue`, and its writes
    /// are `settling` or not. An event that came while it ran wins: it runs again at once.
    pub fn finished(&mut self, key: K, requeue: Option<Instant>, settling: bool) {
        self.running.remove(&key);
        if self.again.remove(&key) {
            self.make_ready(key, settling);
        } else if let Some(at) = requeue {
            self.schedule(key, at);
        }
    }

    /// The next lock to start at `now`, if one is due and the limit allows: it counts as
    /// running until [`Dispatch::finished`].
    pub fn start(&mut self, now: Instant) -> Option<K> {
        while let Some((at, key)) = self.by_time.first().cloned() {
            if at > now {
                break;
            }
            self.forget_later(&key);
            self.make_ready(key, false);
        }
        if self.limit != 0 && self.running.len() >= self.limit {
            return None;
        }
        let key = loop {
            let key = match self.settling.pop_front() {
                Some(key) => key,
                None => self.ready.pop_front()?,
            };
            if self.queued.remove(&key) {
                break key;
            }
        };
        self.running.insert(key.clone());
        Some(key)
    }

    /// When the earliest requeue falls due.
    pub fn next_due(&self) -> Option<Instant> {
        self.by_time.first().map(|(at, _)| *at)
    }

    /// Whether nothing is running, due or requeued (every entry is gone).
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
            && self.ready.is_empty()
            && self.settling.is_empty()
            && self.queued.is_empty()
            && self.again.is_empty()
            && self.later.is_empty()
            && self.by_time.is_empty()
    }

    /// Makes `key` due. A settling key already due in arrival order is also put first; its
    /// later place is skipped once it has run.
    fn make_ready(&mut self, key: K, settling: bool) {
        let new = self.queued.insert(key.clone());
        if settling {
            self.settling.push_back(key);
        } else if new {
            self.ready.push_back(key);
        }
    }

    /// Requeues `key` at `at`, unless it is due sooner already.
    fn schedule(&mut self, key: K, at: Instant) {
        if self.queued.contains(&key) || self.again.contains(&key) {
            return;
        }
        match self.later.get(&key) {
            Some(current) if *current <= at => {}
            _ => {
                self.forget_later(&key);
                self.later.insert(key.clone(), at);
                self.by_time.insert((at, key));
            }
        }
    }

    fn forget_later(&mut self, key: &K) {
        if let Some(at) = self.later.remove(key) {
            self.by_time.remove(&(at, key.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(base: Instant, n: u64) -> Instant {
        base + Duration::from_millis(n)
    }

    #[test]
    fn an_event_is_due_at_once_and_a_running_lock_is_never_started_twice() {
        let t = Instant::now();
        let mut q = Dispatch::new(0);
        q.trigger("a", false);
        assert_eq!(q.start(t), Some("a"));
        q.trigger("a", false);
        q.trigger("a", false);
        assert_eq!(q.start(t), None, "a is running: its events wait for it");
        q.finished("a", None, false);
        assert_eq!(q.start(t), Some("a"), "the events that came meanwhile run it once more");
        q.finished("a", None, false);
        assert_eq!(q.start(t), None);
        assert!(q.is_empty(), "nothing left of a");
    }

    #[test]
    fn a_requeue_waits_for_its_time_unless_an_event_comes_first() {
        let t = Instant::now();
        let mut q = Dispatch::new(0);
        q.trigger("a", false);
        q.start(t);
        q.finished("a", Some(ms(t, 100)), false);
        assert_eq!(q.next_due(), Some(ms(t, 100)));
        assert_eq!(q.start(ms(t, 99)), None);
        assert_eq!(q.start(ms(t, 100)), Some("a"));
        q.finished("a", Some(ms(t, 500)), false);
        q.trigger("a", false);
        assert_eq!(q.next_due(), None, "the event superseded the requeue");
        assert_eq!(q.start(ms(t, 101)), Some("a"));
        q.finished("a", None, false);
        assert!(q.is_empty());
    }

    #[test]
    fn an_event_while_running_wins_over_the_requeue_it_asks_for() {
        let t = Instant::now();
        let mut q = Dispatch::new(0);
        q.trigger("a", false);
        q.start(t);
        q.trigger("a", false);
        q.finished("a", Some(ms(t, 1000)), false);
        assert_eq!(q.next_due(), None);
        assert_eq!(q.start(t), Some("a"));
    }

    #[test]
    fn the_earlier_of_two_requeues_is_kept() {
        let t = Instant::now();
        let mut q = Dispatch::new(0);
        q.schedule("a", ms(t, 300));
        q.schedule("a", ms(t, 200));
        q.schedule("a", ms(t, 400));
        assert_eq!(q.next_due(), Some(ms(t, 200)));
        assert_eq!(q.start(ms(t, 200)), Some("a"));
        assert_eq!(q.next_due(), None);
    }

    #[test]
    fn a_settling_lock_goes_before_the_others_and_still_runs_once() {
        let t = Instant::now();
        let mut q = Dispatch::new(1);
        for k in ["a", "b", "c"] {
            q.trigger(k, false);
        }
        q.trigger("c", true);
        q.trigger("d", true);
        assert_eq!(q.start(t), Some("c"), "settling, and due already: put first");
        q.finished("c", None, false);
        assert_eq!(q.start(t), Some("d"));
        q.finished("d", None, false);
        assert_eq!(q.start(t), Some("a"));
        q.trigger("a", false);
        q.finished("a", None, true);
        assert_eq!(q.start(t), Some("a"), "an event while it ran, its write not settled: first again");
        q.finished("a", None, false);
        assert_eq!(q.start(t), Some("b"));
        q.finished("b", None, false);
        assert_eq!(q.start(t), None, "c's place in arrival order is skipped: it ran");
        assert!(q.is_empty());
    }

    #[test]
    fn at_most_the_limit_run_at_once_in_the_order_they_became_due() {
        let t = Instant::now();
        let mut q = Dispatch::new(2);
        for k in ["a", "b", "c", "a"] {
            q.trigger(k, false);
        }
        assert_eq!(q.start(t), Some("a"));
        assert_eq!(q.start(t), Some("b"));
        assert_eq!(q.start(t), None, "the limit");
        q.finished("b", None, false);
        assert_eq!(q.start(t), Some("c"));
        q.finished("a", None, false);
        q.finished("c", None, false);
        assert_eq!(q.start(t), None, "a's second event came before it started: one run");
        assert!(q.is_empty());
    }
}
