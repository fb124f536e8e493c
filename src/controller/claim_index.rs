//! Which cached LockClaims name each lock, so that a reconcile reads the claims of its own
//! lock instead of every cached claim: without it each reconcile costs time in proportion
//! to all claims on all locks, the controller's largest cost under contention on many
//! locks.
//!
//! The index follows the claim cache's watch events the way the cache does (kube's
//! reflector): objects applied and deleted as they come, a re-list buffered and swapped in
//! whole when it is complete. It holds names only; the claims themselves are read from
//! the cache, so a name whose claim is gone is skipped, and every claim read is checked
//! against the lock again ([`super::view::claim`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::runtime::watcher;

use super::context::LockKey;
use crate::crd::LockClaim;

/// Claim names by the lock they claim.
#[derive(Debug, Default)]
pub struct ClaimIndex {
    by_lock: HashMap<LockKey, BTreeSet<String>>,
    /// A re-list in progress: its claims, swapped in at its end.
    relist: HashMap<LockKey, BTreeSet<String>>,
}

impl ClaimIndex {
    /// Follows one event of the claim cache's watch.
    pub fn apply(&mut self, event: &watcher::Event<LockClaim>) {
        match event {
            watcher::Event::Apply(claim) => insert(&mut self.by_lock, claim),
            // `spec.lock` is immutable, so the deleted object names the lock it was indexed
            // under.
            watcher::Event::Delete(claim) => {
                let key = lock_of(claim);
                if let Some(names) = self.by_lock.get_mut(&key) {
                    names.remove(&claim.name_any());
                    if names.is_empty() {
                        self.by_lock.remove(&key);
                    }
                }
            }
            watcher::Event::Init => self.relist = HashMap::new(),
            watcher::Event::InitApply(claim) => insert(&mut self.relist, claim),
            watcher::Event::InitDone => self.by_lock = std::mem::take(&mut self.relist),
        }
    }

    /// The names of the claims on `lock`, in name order.
    pub fn claims_of(&self, lock: &LockKey) -> Vec<String> {
        self.by_lock.get(lock).map(|names| names.iter().cloned().collect()).unwrap_or_default()
    }

    /// An `inspect` callback that keeps `index` following the claim cache's watch.
    pub fn follower(index: Arc<Mutex<ClaimIndex>>) -> impl FnMut(&Result<watcher::Event<LockClaim>, watcher::Error>) {
        move |event| {
            if let Ok(event) = event {
                index.lock().expect("claim index is never poisoned").apply(event);
            }
        }
    }
}

fn lock_of(claim: &LockClaim) -> LockKey {
    LockKey { namespace: claim.namespace().unwrap_or_default(), name: claim.spec.lock.clone() }
}

fn insert(index: &mut HashMap<LockKey, BTreeSet<String>>, claim: &LockClaim) {
    index.entry(lock_of(claim)).or_default().insert(claim.name_any());
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
        let mut index = ClaimIndex::default();
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
}
