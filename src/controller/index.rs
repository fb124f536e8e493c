//! Which cached objects concern each lock, so that a reconcile reads those of its own lock
//! instead of every cached object: the claims on it ([`ClaimIndex`]: without it each
//! reconcile costs time in proportion to all claims on all locks, the controller's largest
//! cost under contention on many locks), and the slots of its Leases ([`SlotIndex`]: a
//! reconcile looks for a Lease left above the lock's permits only where the cache holds
//! one, instead of asking the cache for each of the [`MAX_PERMITS`] names a slot may have).
//!
//! An index follows its cache's watch events the way the cache does (kube's reflector):
//! objects applied and deleted as they come, a re-list buffered and swapped in whole when
//! it is complete. It holds what names an object only; the objects themselves are read from
//! the cache, so an entry whose object is gone is skipped, and every object read is judged
//! against the lock again.
//!
//! [`MAX_PERMITS`]: crate::lease::slot::MAX_PERMITS

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::runtime::watcher;

use super::context::LockKey;
use crate::crd::LockClaim;
use crate::lease::slot;

/// Entries `T` of cached objects `K`, by the lock each names. An object names one lock by
/// something that never changes (a claim's `spec.lock`, a Lease's name), so the deleted
/// object names the entry to remove.
#[derive(Debug)]
pub struct CacheIndex<K, T> {
    by_lock: HashMap<LockKey, BTreeSet<T>>,
    /// A re-list in progress: its entries, swapped in at its end.
    relist: HashMap<LockKey, BTreeSet<T>>,
    entry: fn(&K) -> Option<(LockKey, T)>,
}

/// Claim names by the lock they claim.
pub type ClaimIndex = CacheIndex<LockClaim, String>;

/// The slots of the cached lock Leases, by lock: a Lease named `<lock>` is slot 0 of
/// `<lock>`, one named `<lock>.<slot>` that slot (the one spelling [`slot::of_lease_name`]
/// accepts). Indexed by name alone, whatever its labels, as the cache is read by name.
pub type SlotIndex = CacheIndex<Lease, u32>;

impl ClaimIndex {
    /// An empty index of claims.
    pub fn claims() -> Self {
        Self::new(|claim: &LockClaim| {
            Some((
                LockKey { namespace: claim.namespace().unwrap_or_default(), name: claim.spec.lock.clone() },
                claim.name_any(),
            ))
        })
    }

    /// The names of the claims on `lock`, in name order.
    pub fn claims_of(&self, lock: &LockKey) -> Vec<String> {
        self.of(lock).cloned().collect()
    }
}

impl SlotIndex {
    /// An empty index of slot Leases.
    pub fn slots() -> Self {
        Self::new(|lease: &Lease| {
            let name = lease.name_any();
            // Lock names are DNS labels: the lock is what comes before the first dot.
            let lock = name.split('.').next().unwrap_or_default();
            let slot = slot::of_lease_name(lock, &name)?;
            Some((LockKey { namespace: lease.namespace().unwrap_or_default(), name: lock.to_owned() }, slot))
        })
    }

    /// The slots of `lock` whose Lease is cached, from `from` up, in order.
    pub fn slots_from(&self, lock: &LockKey, from: u32) -> Vec<u32> {
        self.of(lock).filter(|slot| **slot >= from).copied().collect()
    }
}

impl<K, T: Ord> CacheIndex<K, T> {
    fn new(entry: fn(&K) -> Option<(LockKey, T)>) -> Self {
        Self { by_lock: HashMap::new(), relist: HashMap::new(), entry }
    }

    /// Follows one event of the cache's watch.
    pub fn apply(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(object) => insert(&mut self.by_lock, (self.entry)(object)),
            watcher::Event::Delete(object) => {
                let Some((key, entry)) = (self.entry)(object) else { return };
                if let Some(entries) = self.by_lock.get_mut(&key) {
                    entries.remove(&entry);
                    if entries.is_empty() {
                        self.by_lock.remove(&key);
                    }
                }
            }
            watcher::Event::Init => self.relist = HashMap::new(),
            watcher::Event::InitApply(object) => insert(&mut self.relist, (self.entry)(object)),
            watcher::Event::InitDone => self.by_lock = std::mem::take(&mut self.relist),
        }
    }

    /// The entries of `lock`, in order.
    fn of(&self, lock: &LockKey) -> impl Iterator<Item = &T> {
        self.by_lock.get(lock).into_iter().flatten()
    }

    /// An `inspect` callback that keeps `index` following the cache's watch.
    pub fn follower(index: Arc<Mutex<Self>>) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) {
        move |event| {
            if let Ok(event) = event {
                index.lock().expect("a cache index is never poisoned").apply(event);
            }
        }
    }
}

fn insert<T: Ord>(index: &mut HashMap<LockKey, BTreeSet<T>>, entry: Option<(LockKey, T)>) {
    if let Some((key, entry)) = entry {
        index.entry(key).or_default().insert(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::LockClaimSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::ObjectMeta;

    fn claim(namespace: &str, lock: &str, name: &str) -> LockClaim {
        let now = MicroTime(jiff::Timestamp::UNIX_EPOCH);
        LockClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            spec: LockClaimSpec {
                lock: lock.into(),
                claimant: "claimant".into(),
                pod: None,
                request_time: now.clone(),
                renew_time: now,
                ttl_seconds: 30,
                mode: None,
            },
        }
    }

    fn key(namespace: &str, lock: &str) -> LockKey {
        LockKey { namespace: namespace.into(), name: lock.into() }
    }

    fn index_after(events: Vec<watcher::Event<LockClaim>>) -> ClaimIndex {
        let mut index = ClaimIndex::claims();
        for event in &events {
            index.apply(event);
        }
        index
    }

    /// (case, events, lock asked about, the names expected)
    type Case = (&'static str, Vec<watcher::Event<LockClaim>>, LockKey, Vec<&'static str>);

    #[test]
    fn follows_the_watch_like_the_cache() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let a1 = || claim("ns", "a", "a.1");
        let a2 = || claim("ns", "a", "a.2");
        let b1 = || claim("ns", "b", "b.1");
        let other_ns = || claim("other", "a", "a.9");
        let cases: Vec<Case> = vec![
            ("nothing seen", vec![], key("ns", "a"), vec![]),
            (
                "claims of one lock only",
                vec![Apply(a1()), Apply(b1()), Apply(a2())],
                key("ns", "a"),
                vec!["a.1", "a.2"],
            ),
            ("same lock name, other namespace", vec![Apply(a1()), Apply(other_ns())], key("ns", "a"), vec!["a.1"]),
            ("an update keeps one entry", vec![Apply(a1()), Apply(a1())], key("ns", "a"), vec!["a.1"]),
            ("deleted", vec![Apply(a1()), Apply(a2()), Delete(a1())], key("ns", "a"), vec!["a.2"]),
            ("deleted, never seen", vec![Delete(a1())], key("ns", "a"), vec![]),
            (
                "a re-list in progress changes nothing yet",
                vec![Apply(a1()), Init, InitApply(a2())],
                key("ns", "a"),
                vec!["a.1"],
            ),
            (
                "a complete re-list replaces everything",
                vec![Apply(a1()), Apply(b1()), Init, InitApply(a2()), InitDone],
                key("ns", "a"),
                vec!["a.2"],
            ),
            (
                "a claim gone during a re-list is forgotten",
                vec![Apply(a1()), Apply(b1()), Init, InitApply(a2()), InitDone],
                key("ns", "b"),
                vec![],
            ),
            (
                "a re-list started over keeps only the last",
                vec![Init, InitApply(a1()), Init, InitApply(a2()), InitDone],
                key("ns", "a"),
                vec!["a.2"],
            ),
            (
                "events after a re-list apply on top of it",
                vec![Init, InitApply(a1()), InitDone, Apply(a2()), Delete(a1())],
                key("ns", "a"),
                vec!["a.2"],
            ),
        ];
        for (case, events, lock, expected) in cases {
            let index = index_after(events);
            assert_eq!(index.claims_of(&lock), expected, "{case}");
        }
    }

    #[test]
    fn a_lock_without_claims_leaves_no_entry() {
        let index = index_after(vec![
            watcher::Event::Apply(claim("ns", "a", "a.1")),
            watcher::Event::Delete(claim("ns", "a", "a.1")),
        ]);
        assert!(index.by_lock.is_empty(), "an emptied lock's entry is removed: {:?}", index.by_lock);
    }

    fn lease(namespace: &str, name: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            spec: None,
        }
    }

    /// (case, events, lock asked about, from, the slots expected)
    type SlotCase = (&'static str, Vec<watcher::Event<Lease>>, LockKey, u32, Vec<u32>);

    #[test]
    fn slot_leases_are_indexed_by_the_lock_and_slot_their_name_spells() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let all = |names: &[&str]| names.iter().map(|n| Apply(lease("ns", n))).collect::<Vec<_>>();
        let cases: Vec<SlotCase> = vec![
            ("nothing seen", vec![], key("ns", "a"), 0, vec![]),
            ("the lock Lease is slot 0", all(&["a"]), key("ns", "a"), 0, vec![0]),
            ("slots in order", all(&["a.12", "a", "a.3"]), key("ns", "a"), 0, vec![0, 3, 12]),
            ("from a slot up", all(&["a.12", "a", "a.3"]), key("ns", "a"), 3, vec![3, 12]),
            ("above every slot held", all(&["a", "a.1"]), key("ns", "a"), 2, vec![]),
            ("other locks' Leases", all(&["ab", "ab.1", "b.1", "a.1"]), key("ns", "a"), 0, vec![1]),
            (
                "names that spell no slot",
                all(&["a.0", "a.01", "a.64", "a.x", "a.1.2", "a.", "a-1"]),
                key("ns", "a"),
                0,
                vec![],
            ),
            ("same lock name, other namespace", vec![Apply(lease("other", "a.1"))], key("ns", "a"), 0, vec![]),
            ("deleted", vec![Apply(lease("ns", "a.1")), Delete(lease("ns", "a.1"))], key("ns", "a"), 0, vec![]),
            (
                "a complete re-list replaces everything",
                vec![Apply(lease("ns", "a.1")), Init, InitApply(lease("ns", "a.2")), InitDone],
                key("ns", "a"),
                0,
                vec![2],
            ),
            (
                "a re-list in progress changes nothing yet",
                vec![Apply(lease("ns", "a.1")), Init, InitApply(lease("ns", "a.2"))],
                key("ns", "a"),
                0,
                vec![1],
            ),
        ];
        for (case, events, lock, from, expected) in cases {
            let mut index = SlotIndex::slots();
            for event in &events {
                index.apply(event);
            }
            assert_eq!(index.slots_from(&lock, from), expected, "{case}");
        }
    }
}
