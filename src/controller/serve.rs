//! Who is served next, and on which slot: a pure function of the slots' states, the
//! lock's permits and the waiters in claim order.
//!
//! - A shared waiter (a semaphore's claimant, a reader) takes one free slot below the
//!   lock's permits, the lowest one, while fewer slots than the permits are taken (held
//!   or draining: a drained holder may still believe it holds).
//! - An exclusive waiter (a writer) takes slot 0, and only when every slot Lease is free:
//!   none granted, none draining, none above the permits still held after a shrink. Once
//!   it holds, nobody else is served — nor while its revoked hold drains.
//! - Under FIFO, serving stops at the first waiter that cannot be served now: a writer at
//!   the head waits for the readers ahead of it to leave, and the readers that queued
//!   behind it wait for it, so writers do not starve. Without an ordering promise, the
//!   waiters behind it may be served meanwhile.
//! - A slot at or above the permits (the lock shrank) is never granted again; a hold on
//!   it runs its course, and counts against the permits meanwhile.

use crate::crd::Fairness;

/// Test only (`broken-writer-shares`): a writer waits for slot 0 alone, and so holds beside
/// the readers of the other slots.
const WRITER_SHARES: bool = cfg!(feature = "broken-writer-shares");

/// How a waiter holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One permit, beside other shared holders.
    Shared,
    /// Every permit: nobody else holds meanwhile.
    Exclusive,
}

/// A slot's state, as serving sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Nobody holds it, and nothing drains on it.
    Free,
    /// Granted, in this mode.
    Held(Mode),
    /// A revoked hold, taken in this mode, drains on it: its holder may still believe it
    /// holds, so a draining writer keeps everyone out as a holding one does.
    Draining(Mode),
}

/// A waiter served: its index in the queue, and its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    /// Its index in the queue.
    pub waiter: usize,
    /// The slot it is granted.
    pub slot: usize,
}

/// The waiters to serve, in queue order, given every slot's state (slot 0 first, every
/// slot Lease the lock has, including any above `permits`), the lock's permits, its
/// fairness, and the waiters' modes in claim order.
pub fn serve(slots: &[Slot], permits: usize, fairness: Fairness, queue: &[Mode]) -> Vec<Served> {
    let mut taken: Vec<bool> = slots.iter().map(|s| *s != Slot::Free).collect();
    if slots.iter().any(|s| matches!(s, Slot::Held(Mode::Exclusive) | Slot::Draining(Mode::Exclusive))) {
        return Vec::new();
    }
    let grantable = permits.min(slots.len());
    let mut served = Vec::new();
    for (waiter, mode) in queue.iter().enumerate() {
        let slot = match mode {
            Mode::Shared if taken.iter().filter(|t| **t).count() < permits => (0..grantable).find(|i| !taken[*i]),
            Mode::Shared => None,
            Mode::Exclusive => {
                let waits = if WRITER_SHARES { taken.first().copied().unwrap_or(false) } else { taken.contains(&true) };
                (grantable > 0 && !waits).then_some(0)
            }
        };
        match slot {
            Some(slot) => {
                taken[slot] = true;
                served.push(Served { waiter, slot });
                if *mode == Mode::Exclusive {
                    break;
                }
            }
            None if fairness == Fairness::Fifo => break,
            None => continue,
        }
    }
    served
}

#[cfg(test)]
mod tests {
    use super::Mode::{Exclusive as W, Shared as R};
    use super::Slot::{Draining, Free, Held};
    use super::*;

    fn pairs(served: &[Served]) -> Vec<(usize, usize)> {
        served.iter().map(|s| (s.waiter, s.slot)).collect()
    }

    #[test]
    fn serving_follows_the_table() {
        use Fairness::{Fifo, None as Unordered};
        #[allow(clippy::type_complexity)]
        let rows: &[(&str, &[Slot], usize, Fairness, &[Mode], &[(usize, usize)])] = &[
            // A mutex is one permit.
            ("mutex, free: the head", &[Free], 1, Fifo, &[R, R], &[(0, 0)]),
            ("mutex, held: nobody", &[Held(R)], 1, Fifo, &[R], &[]),
            ("mutex, draining: nobody", &[Draining(R)], 1, Fifo, &[R], &[]),
            ("mutex, a writer is the head", &[Free], 1, Fifo, &[W, R], &[(0, 0)]),
            ("mutex, nobody waits", &[Free], 1, Fifo, &[], &[]),
            // A semaphore: up to its permits, lowest free slot first, in claim order.
            (
                "3 permits, all free: three served",
                &[Free, Free, Free],
                3,
                Fifo,
                &[R, R, R, R],
                &[(0, 0), (1, 1), (2, 2)],
            ),
            ("3 permits, the middle one held", &[Free, Held(R), Free], 3, Fifo, &[R, R, R], &[(0, 0), (1, 2)]),
            ("3 permits, all held", &[Held(R), Held(R), Held(R)], 3, Fifo, &[R], &[]),
            ("a draining slot is not free", &[Draining(R), Free], 2, Fifo, &[R, R], &[(0, 1)]),
            ("a writer's drain keeps readers out", &[Draining(W), Free, Free], 3, Fifo, &[R, R], &[]),
            ("the same, unordered", &[Draining(W), Free], 2, Unordered, &[R, W], &[]),
            // Shrunk from 3 to 1: slots above are never granted again.
            ("shrunk: slot 1 and 2 are not granted", &[Held(R), Free, Free], 1, Fifo, &[R], &[]),
            ("shrunk: a hold above still counts", &[Free, Held(R), Free], 1, Fifo, &[R, R], &[]),
            ("shrunk to 2: one more while one above holds", &[Free, Free, Held(R)], 2, Fifo, &[R, R], &[(0, 0)]),
            ("a drain counts against the permits", &[Free, Free, Draining(R)], 2, Fifo, &[R, R], &[(0, 0)]),
            // Grown from 1 to 3 before the new slot Leases exist: only those that do.
            ("grown, new slots not yet created", &[Held(R)], 3, Fifo, &[R], &[]),
            // Readers and writers.
            ("readers share", &[Free, Free], 2, Fifo, &[R, R], &[(0, 0), (1, 1)]),
            ("a writer needs every slot free", &[Held(R), Free], 2, Fifo, &[W], &[]),
            ("a writer takes slot 0 and nobody follows", &[Free, Free], 2, Fifo, &[W, R, R], &[(0, 0)]),
            ("while a writer holds, nobody", &[Held(W), Free, Free], 3, Fifo, &[R, R], &[]),
            ("readers behind a waiting writer wait for it", &[Held(R), Free, Free], 3, Fifo, &[W, R], &[]),
            (
                "readers ahead of a writer are served, the writer waits",
                &[Free, Free, Free],
                3,
                Fifo,
                &[R, W, R],
                &[(0, 0)],
            ),
            ("a writer waits for a drain on any slot", &[Free, Draining(R)], 2, Fifo, &[W], &[]),
            ("a writer waits for a hold above the permits", &[Free, Held(R)], 1, Fifo, &[W], &[]),
            // Without an ordering promise, a waiter that cannot be served is passed.
            (
                "unordered: readers pass a waiting writer",
                &[Held(R), Free, Free],
                3,
                Unordered,
                &[W, R, R, R],
                &[(1, 1), (2, 2)],
            ),
            ("unordered: a writer that can be served still ends it", &[Free, Free], 2, Unordered, &[W, R], &[(0, 0)]),
        ];
        for (name, slots, permits, fairness, queue, expected) in rows {
            assert_eq!(pairs(&serve(slots, *permits, *fairness, queue)), *expected, "{name}");
        }
    }

    /// Never more holders than permits; never a writer beside anyone; never a slot taken
    /// twice — over every small state.
    #[test]
    fn no_state_is_served_past_its_permits_or_beside_a_writer() {
        let states = [Free, Held(R), Held(W), Draining(R), Draining(W)];
        let modes = [R, W];
        for permits in 1..=3usize {
            for len in 1..=3usize {
                for code in 0..states.len().pow(len as u32) {
                    let slots: Vec<Slot> =
                        (0..len).map(|i| states[code / states.len().pow(i as u32) % states.len()]).collect();
                    for q in 0..(1usize << 3) {
                        let queue: Vec<Mode> = (0..3).map(|i| modes[(q >> i) & 1]).collect();
                        for fairness in [Fairness::Fifo, Fairness::None] {
                            let served = serve(&slots, permits, fairness, &queue);
                            let mut after = slots.clone();
                            for s in &served {
                                assert_eq!(after[s.slot], Free, "{slots:?} {queue:?}: slot {} taken twice", s.slot);
                                assert!(s.slot < permits, "{slots:?}: slot {} is above the permits", s.slot);
                                after[s.slot] = Held(queue[s.waiter]);
                            }
                            // A draining writer may still believe it holds: it is a writer.
                            let writers = after.iter().filter(|s| matches!(s, Held(W) | Draining(W))).count();
                            let occupied = after.iter().filter(|s| **s != Free).count();
                            if !served.is_empty() {
                                assert!(
                                    occupied <= permits,
                                    "{slots:?} {queue:?}: {occupied} taken, {permits} permits"
                                );
                                assert!(writers == 0 || occupied == 1, "{slots:?} {queue:?}: a writer beside others");
                            }
                        }
                    }
                }
            }
        }
    }
}
