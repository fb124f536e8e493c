//! Which locks a watch's events make due, each named once the cache shows what its event
//! brought.
//!
//! kube's reflector applies a watch's events to its cache as they come, except those of a
//! list: they are buffered and swapped in whole at the list's end, as is the claim index
//! ([`super::index`]). A watch lists again whenever it cannot resume (an apiserver
//! restart, a version compacted away). A lock made due by an object of a list still in
//! progress would be judged from the cache as it was before: a lock created while the
//! watch was down not found at all, a claim not seen yet. Nothing would make it due again,
//! and it would wait for an unrelated event. So the locks a list names are held back until
//! its end, and then named together with those of every object the cache held before it:
//! an object deleted while the watch was down leaves the cache at the swap with no event
//! of its own.

use std::collections::BTreeSet;
use std::hash::Hash;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{Lookup, Store};
use kube::runtime::watcher;

use super::context::LockKey;

/// The locks named by a list in progress.
#[derive(Debug, Default)]
pub struct Relist {
    listing: Option<BTreeSet<LockKey>>,
}

impl Relist {
    /// The locks due after `event`, once the cache has applied it. `locks_of` names the
    /// locks an object concerns; `cached` those of every object the cache holds, read when
    /// a list starts (the cache still holds what it held before).
    pub fn due<K>(
        &mut self,
        event: &watcher::Event<K>,
        locks_of: impl Fn(&K) -> Vec<LockKey>,
        cached: impl FnOnce() -> Vec<LockKey>,
    ) -> Vec<LockKey> {
        match event {
            watcher::Event::Apply(object) | watcher::Event::Delete(object) => locks_of(object),
            watcher::Event::Init => {
                self.listing = Some(cached().into_iter().collect());
                Vec::new()
            }
            watcher::Event::InitApply(object) => {
                self.listing.get_or_insert_default().extend(locks_of(object));
                Vec::new()
            }
            watcher::Event::InitDone => self.listing.take().map(|keys| keys.into_iter().collect()).unwrap_or_default(),
        }
    }
}

/// The locks `events` (a watch after its cache `cache`) make due, in [`Relist`]'s order.
/// Errors name none: each watch retries with its own short backoff and reports failures
/// to [`super::caches::Synced`]. Nothing may back off the trigger streams as a whole: they
/// are what keeps every cache current (after an apiserver restart, a stream paused for
/// tens of seconds left the Lease cache missing every new claim).
pub fn due_locks<K, S>(events: S, cache: Store<K>, locks_of: impl Fn(&K) -> Vec<LockKey>) -> impl Stream<Item = LockKey>
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    K: Lookup + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    let mut relist = Relist::default();
    events.flat_map(move |event| {
        let due = match &event {
            Ok(event) => {
                relist.due(event, &locks_of, || cache.state().iter().flat_map(|object| locks_of(object)).collect())
            }
            Err(_) => Vec::new(),
        };
        futures::stream::iter(due)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use watcher::Event;

    fn key(name: &str) -> LockKey {
        LockKey::new("ns", name)
    }

    /// An object naming the locks in its name, `+`-separated ("" names none).
    fn locks_of(object: &&str) -> Vec<LockKey> {
        object.split('+').filter(|name| !name.is_empty()).map(key).collect()
    }

    #[test]
    fn a_lists_locks_are_named_at_its_end_with_those_the_cache_held_before() {
        use Event::*;
        // (event, what the cache held before it, locks due after it)
        type Step = (Event<&'static str>, &'static [&'static str], &'static [&'static str]);
        let cases: &[(&str, &[Step])] = &[
            (
                "events outside a list name their locks at once",
                &[
                    (Apply("a"), &[], &["a"]),
                    (Delete("b"), &[], &["b"]),
                    (Apply("a+c"), &[], &["a", "c"]),
                    (Apply(""), &[], &[]),
                ],
            ),
            (
                "a first list names its objects' locks at its end, once each",
                &[
                    (Init, &[], &[]),
                    (InitApply("b"), &[], &[]),
                    (InitApply("a"), &[], &[]),
                    (InitApply("a+b"), &[], &[]),
                    (InitDone, &[], &["a", "b"]),
                ],
            ),
            (
                "a list again also names the locks of objects gone meanwhile",
                &[
                    (Init, &["a", "gone"], &[]),
                    (InitApply("a"), &[], &[]),
                    (InitApply("new"), &[], &[]),
                    (InitDone, &[], &["a", "gone", "new"]),
                    (Apply("a"), &[], &["a"]),
                ],
            ),
            (
                "a list cut short and started over names what the cache held at the new start",
                &[
                    (Init, &["a"], &[]),
                    (InitApply("b"), &[], &[]),
                    (Init, &["c"], &[]),
                    (InitApply("d"), &[], &[]),
                    (InitDone, &[], &["c", "d"]),
                ],
            ),
            ("the end of no list names nothing", &[(InitDone, &[], &[])]),
        ];
        for (name, steps) in cases {
            let mut relist = Relist::default();
            for (i, (event, before, due)) in steps.iter().enumerate() {
                let cached = || before.iter().flat_map(locks_of).collect();
                let expected: Vec<LockKey> = due.iter().map(|n| key(n)).collect();
                assert_eq!(relist.due(event, locks_of, cached), expected, "{name}: step {i} ({event:?})");
            }
        }
    }
}
