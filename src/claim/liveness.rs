//! Which of a waiting acquisition's slot watches have shown a change since its claim's
//! last refresh. A refresh reads a slot's Lease only when its watch has not: a watch that
//! delivers changes is alive, and the read is there for one whose connection died without
//! a word (a restarted apiserver behind a proxy, a dropped network path), which would
//! otherwise hide a grant until its server-side timeout.

use std::collections::HashSet;

/// Per slot: whether its watch has given this acquisition its first state, and whether it
/// has shown a change since the last refresh. The first state does not count as a sign of
/// life: a watch shared with earlier acquisitions gives its latest state at once, however
/// old, and a watch that has since died would give the same.
#[derive(Debug, Default)]
pub struct WatchLife {
    joined: HashSet<u32>,
    changed: HashSet<u32>,
}

impl WatchLife {
    /// Slot `slot`'s watch gave a state.
    pub fn shown(&mut self, slot: u32) {
        if !self.joined.insert(slot) {
            self.changed.insert(slot);
        }
    }

    /// At a refresh that landed: whether slot `slot`'s Lease must be read, because its
    /// watch showed no change since the last such refresh (or since the acquisition
    /// began). Starts the slot's next period.
    pub fn must_read(&mut self, slot: u32) -> bool {
        !self.changed.remove(&slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_read_at_a_refresh_unless_its_watch_showed_a_change_since_the_last_one() {
        // (case, what happens in order: Some(slot) a state of that slot, None a refresh
        // reading slots 0 and 1; what each refresh reads, in order)
        type Case = (&'static str, Vec<Option<u32>>, Vec<[bool; 2]>);
        let cases: Vec<Case> = vec![
            ("no state at all", vec![None], vec![[true, true]]),
            ("only the first state: the watch's latest, perhaps old", vec![Some(0), None], vec![[true, true]]),
            ("a change after the first state", vec![Some(0), Some(0), None], vec![[false, true]]),
            ("changes on both slots", vec![Some(0), Some(1), Some(1), Some(0), None], vec![[false, false]]),
            ("a change counts for one refresh", vec![Some(0), Some(0), None, None], vec![[false, true], [true, true]]),
            (
                "a change after each refresh",
                vec![Some(0), Some(0), None, Some(0), None],
                vec![[false, true], [false, true]],
            ),
            (
                "many changes count once",
                vec![Some(0), Some(0), Some(0), Some(0), None, None],
                vec![[false, true], [true, true]],
            ),
        ];
        for (case, happenings, expected) in cases {
            let mut life = WatchLife::default();
            let mut reads = Vec::new();
            for happening in happenings {
                match happening {
                    Some(slot) => life.shown(slot),
                    None => reads.push([life.must_read(0), life.must_read(1)]),
                }
            }
            assert_eq!(reads, expected, "{case}");
        }
    }
}
