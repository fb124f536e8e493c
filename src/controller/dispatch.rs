//! Which lock to reconcile next, as a pure state machine over values. A lock whose event
//! came in is due at once, with no timer in between (a watch event is the only thing a
//! waiter's grant waits for). A lock being reconciled is never started twice: an event
//! meanwhile runs it again as soon as it ends. A requeue waits for its time unless an
//! event comes first, and of two requeues the earlier wins. At most `limit` run at once,
//! the rest in the order they fell due, except that a lock whose own writes are not yet
//! settled (the caller says so: its memory holds a write its caches do not show yet) is
//! served ahead of them, every other start. Its event is most often the echo of that
//! write, and its reconcile is what lets the controller forget the copy it keeps: served
//! in arrival order behind a burst of new locks, those copies would pile up by the
//! thousand, and the allocator keeps their pages once they are freed. Every other start,
//! not every start: on contended locks nearly every reconcile writes and another event of
//! the lock comes in while it runs, so the same locks are settling again and again, and
//! served always first they kept every other due lock waiting for tens of seconds (a lock
//! its holder had released among them). Taking turns, a lock due in arrival order waits
//! at most twice its place in the queue. A due lock has exactly one place: the one it was
//! given when it fell due, or, put ahead as settling, that one instead. A place it leaves
//! behind stays void even once the lock is due again, so a lock served out of turn never
//! comes back to its old place ahead of the locks that fell due after it (kept alive,
//! such places let busy locks run ten times over while a lock its holder had released
//! waited minutes). A lock with nothing due or running keeps no entry, so idle locks cost
//! the queue nothing.

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
    /// Due now, in the order they became due: each with the number of its place.
    ready: VecDeque<(u64, K)>,
    /// Due now and served ahead of `ready`, every other start: locks whose own writes are
    /// not yet settled.
    settling: VecDeque<(u64, K)>,
    /// Whether the last start was of a settling lock: the next one, if any is due in
    /// arrival order, is not.
    took_settling: bool,
    /// The due locks: each one's place (its number, and whether it is among the
    /// settling). An entry of the queues whose number is not its lock's here is void.
    queued: HashMap<K, Place>,
    /// The number the next place gets.
    places: u64,
    /// An event came while it ran: it runs again when it ends.
    again: HashSet<K>,
    /// Requeued for later: when, per key, and ordered by when.
    later: HashMap<K, Instant>,
    by_time: BTreeSet<(Instant, K)>,
}

/// A due lock's place in the queues.
#[derive(Clone, Copy, Debug)]
struct Place {
    number: u64,
    settling: bool,
}

impl<K: Clone + Eq + Hash + Ord> Dispatch<K> {
    /// An empty queue that runs at most `limit` at once (0: no limit).
    pub fn new(limit: usize) -> Self {
        Dispatch {
            limit,
            running: HashSet::new(),
            ready: VecDeque::new(),
            settling: VecDeque::new(),
            took_settling: false,
            queued: HashMap::new(),
            places: 0,
            again: HashSet::new(),
            later: HashMap::new(),
            by_time: BTreeSet::new(),
        }
    }

    /// An event for `key`: due at once (or again once its running reconcile ends), ahead
    /// of the others if `settling`. A requeue it had is superseded.
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
            let settling = !self.settling.is_empty() && (!self.took_settling || self.ready.is_empty());
            let (number, key) = if settling { self.settling.pop_front() } else { self.ready.pop_front() }?;
            if self.queued.get(&key).is_some_and(|place| place.number == number) {
                self.queued.remove(&key);
                self.took_settling = settling;
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

    /// Makes `key` due. A key already due keeps its place, unless it is settling now and
    /// its place is in arrival order: then it takes a place among the settling instead.
    fn make_ready(&mut self, key: K, settling: bool) {
        if self.queued.get(&key).is_some_and(|place| place.settling || !settling) {
            return;
        }
        let number = self.places;
        self.places += 1;
        self.queued.insert(key.clone(), Place { number, settling });
        if settling {
            self.settling.push_back((number, key));
        } else {
            self.ready.push_back((number, key));
        }
    }

    /// Requeues `key` at `at`, unless it is due sooner already.
    fn schedule(&mut self, key: K, at: Instant) {
        if self.queued.contains_key(&key) || self.again.contains(&key) {
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
    fn a_settling_lock_goes_ahead_every_other_start_and_still_runs_once() {
        let t = Instant::now();
        let mut q = Dispatch::new(1);
        for k in ["a", "b", "c"] {
            q.trigger(k, false);
        }
        q.trigger("c", true);
        q.trigger("d", true);
        assert_eq!(q.start(t), Some("c"), "settling, and due already: put ahead");
        q.finished("c", None, false);
        assert_eq!(q.start(t), Some("a"), "then the first due in arrival order");
        q.finished("a", None, false);
        assert_eq!(q.start(t), Some("d"));
        q.finished("d", None, false);
        assert_eq!(q.start(t), Some("b"));
        q.finished("b", None, false);
        assert_eq!(q.start(t), None, "c's place in arrival order is skipped: it ran");
        q.trigger("a", false);
        assert_eq!(q.start(t), Some("a"));
        q.trigger("a", false);
        q.finished("a", None, true);
        assert_eq!(q.start(t), Some("a"), "an event while it ran, its write not settled: ahead again");
        q.finished("a", None, false);
        assert!(q.is_empty());
    }

    #[test]
    fn locks_that_keep_settling_take_turns_with_the_others_and_never_starve_them() {
        let t = Instant::now();
        let mut q = Dispatch::new(1);
        for k in ["x", "y"] {
            q.trigger(k, false);
        }
        for k in ["h1", "h2", "h3"] {
            q.trigger(k, true);
        }
        let mut order = Vec::new();
        for _ in 0..6 {
            let key = q.start(t).expect("something is due");
            order.push(key);
            if key.starts_with('h') {
                // A contended lock: an event came while it ran, and its write is not in
                // the caches yet.
                q.trigger(key, false);
                q.finished(key, None, true);
            } else {
                q.finished(key, None, false);
            }
        }
        assert_eq!(order, ["h1", "x", "h2", "y", "h3", "h1"]);
    }

    #[test]
    fn a_lock_served_out_of_turn_leaves_no_place_behind_to_jump_the_queue_with() {
        let t = Instant::now();
        let mut q = Dispatch::new(1);
        q.trigger("h", false);
        q.trigger("h", true);
        assert_eq!(q.start(t), Some("h"), "settling: ahead of its place in arrival order");
        q.trigger("c", false);
        q.trigger("h", false);
        q.finished("h", None, false);
        assert_eq!(q.start(t), Some("c"), "h fell due again after c: its old place is void");
        q.finished("c", None, false);
        assert_eq!(q.start(t), Some("h"));
        q.finished("h", None, false);
        assert_eq!(q.start(t), None);
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

#[cfg(test)]
mod model {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Random events, starts and ends, settling or not, with requeues: every lock
    /// triggered after it last started is started again once everything running ends.
    #[test]
    fn no_lock_triggered_is_left_unstarted() {
        let t = Instant::now();
        for seed in 0..2000u64 {
            let mut r = StdRng::seed_from_u64(seed);
            let mut q = Dispatch::new(r.random_range(1..5));
            let (mut running, mut owed): (Vec<u32>, HashSet<u32>) = (Vec::new(), HashSet::new());
            for _ in 0..200 {
                match r.random_range(0..3) {
                    0 => {
                        let key = r.random_range(0..6);
                        q.trigger(key, r.random_bool(0.5));
                        owed.insert(key);
                    }
                    1 if !running.is_empty() => {
                        let key = running.swap_remove(r.random_range(0..running.len()));
                        let requeue = r.random_bool(0.3).then_some(t);
                        q.finished(key, requeue, r.random_bool(0.5));
                    }
                    _ => {
                        if let Some(key) = q.start(t) {
                            owed.remove(&key);
                            running.push(key);
                        }
                    }
                }
            }
            while !running.is_empty() || q.next_due().is_some() || !owed.is_empty() {
                while let Some(key) = q.start(t) {
                    owed.remove(&key);
                    running.push(key);
                }
                match running.pop() {
                    Some(key) => q.finished(key, None, false),
                    None => break,
                }
            }
            assert!(owed.is_empty(), "seed {seed}: triggered, never started again: {owed:?}");
        }
    }
}
