//! What every reconcile shares: clients, watch caches, metrics, and the controller's memory
//! of what it has seen (on its own monotonic clock).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::PatchParams;
use kube::core::PartialObjectMeta;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use crate::crd::{DistributedLock, DistributedLockStatus, ForceReleaseRequest, LockClaim, MANAGER_CONTROLLER};
use crate::lease::clock::Sighting;
use crate::lease::election::Leadership;
use crate::metrics::ControllerMetrics;

/// The parameters of the controller's merge patches: under its own field manager, as its
/// server-side applies are, so that every field it owns names it.
pub fn merge_patch_params() -> PatchParams {
    PatchParams { field_manager: Some(MANAGER_CONTROLLER.into()), ..PatchParams::default() }
}

/// Controller settings that reconciles read.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Revoke grants not confirmed within this.
    pub confirm_timeout: Duration,
    /// Grant sidecar permissions per namespace from each lock's `spec.clients`.
    pub manage_rbac: bool,
    /// Bytes of lock Lease names the client Role holds before they are spread over Lease
    /// Roles.
    pub client_role_lease_bytes: usize,
    /// Approvals a force release needs when a lock does not say
    /// (`spec.forceRelease.approvals`).
    pub force_release_approvals: u32,
    /// The owner of what the controller creates outside its locks (the client Roles and
    /// RoleBindings, the election Lease): the installation's ClusterRole, so that
    /// uninstalling it has the garbage collector delete them.
    pub owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
}

/// A lock's key: namespace and name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct LockKey {
    /// The lock's namespace.
    pub namespace: String,
    /// The lock's name.
    pub name: String,
}

impl LockKey {
    /// The key of `lock`.
    pub fn of(lock: &DistributedLock) -> Self {
        Self { namespace: lock.namespace().unwrap_or_default(), name: lock.name_any() }
    }

    /// The key of lock `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }
}

impl std::fmt::Display for LockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What identifies one renewal of a hold.
pub type HolderKey = (String, Option<i64>, Option<MicroTime>);

/// What identifies one hold (whatever its renewals): holder and token.
pub type HoldKey = (String, Option<i64>);

/// The controller's memory of one slot Lease of a lock, valid for one leadership term.
#[derive(Default)]
pub struct SlotMemory {
    /// Since when the current hold's renewal record has been unchanged.
    pub holder: Option<Sighting<HolderKey>>,
    /// Since when the current hold has existed: our grant, or our first sighting of it.
    pub hold: Option<Sighting<HoldKey>>,
    /// For the drain of the revoked token in `key`: since the last renewal seen before the
    /// revocation (or our first sighting of the drain).
    pub drain: Option<Sighting<Option<i64>>>,
    /// The slot Lease as last written by us, with the resourceVersion it replaced: used
    /// instead of the cache while the cache still shows that older version. Boxed: most
    /// slots' memory holds none for long, and an unboxed Lease is most of its size.
    pub written: Option<Box<(Option<String>, Lease)>>,
    /// The UID of the claim the latest hold on this slot was granted on: a claim is served
    /// once.
    pub served: Option<String>,
    /// What the slot Lease as last decided from or written in this term carried: if it is
    /// deleted, that hold is drained on the re-created one. Only what re-creation reads.
    pub seen: Option<super::recreate::Seen>,
    /// Our latest grant on this slot, by token, with when its write returned, while its
    /// claimant must confirm it before answering and we have not seen it confirmed: how
    /// long that took is recorded when we do ([`super::confirm::Latencies`]). Forgetting it
    /// loses one such time, nothing else.
    pub awaiting: Option<(i64, std::time::Instant)>,
    /// The slot Lease's `leaseTransitions` as last seen or written by us: every grant adds
    /// one, so a rise we did not write counts the grants holders wrote in their releases
    /// (handoffs), even those that ended before we saw them.
    pub transitions: Option<i32>,
}

/// The status a reconcile last applied to a lock: as written until the cached lock shows
/// it, then that cached lock itself — shared with the cache, not a copy of its status. The
/// value is the same either way; only who keeps it changes.
#[derive(Clone, Debug)]
pub enum AppliedStatus {
    /// As written.
    Written(Box<DistributedLockStatus>),
    /// A cached lock whose status is the one written.
    Cached(Arc<DistributedLock>),
}

impl AppliedStatus {
    /// The status applied.
    pub fn status(&self) -> Option<&DistributedLockStatus> {
        match self {
            AppliedStatus::Written(status) => Some(status),
            AppliedStatus::Cached(lock) => lock.status.as_ref(),
        }
    }

    /// Keeps `cached` in place of the status written once it shows that very status.
    pub fn share(&mut self, cached: &Arc<DistributedLock>) {
        if let AppliedStatus::Written(written) = self
            && cached.status.as_ref() == Some(written.as_ref())
        {
            *self = AppliedStatus::Cached(cached.clone());
        }
    }
}

/// What we saw of one claim, on our clock.
pub struct ClaimSeen {
    /// When we first saw it: its claimant sent it before then.
    pub first: std::time::Instant,
    /// Since when its refresh has been unchanged.
    pub refresh: Option<Sighting<Option<MicroTime>>>,
    /// A hold was granted on it (seen held or given back on it): it is never granted
    /// again, however long it outlives the hold.
    pub served: bool,
    /// When we first saw its hold given back by its claimant (a free Lease still naming
    /// it): the claimant deletes it alongside.
    pub given_back: Option<std::time::Instant>,
    /// The resourceVersion at which our delete of it was refused because it had changed:
    /// while our cache still shows that version, a delete would be refused alike.
    pub refused_at: Option<String>,
}

/// The controller's memory of one lock, valid for one leadership term.
#[derive(Default)]
pub struct LockMemory {
    /// The DistributedLock's UID (memory of an earlier incarnation is dropped).
    pub uid: String,
    /// What a reconcile did that status does not show yet (its status write failed):
    /// applied with the next status write, so nothing is lost or counted twice.
    pub pending: Option<super::status::Outcome>,
    /// Per claim UID, when we first saw it and since when its refresh has been unchanged.
    pub claims: HashMap<String, ClaimSeen>,
    /// The status last applied (the cache may not show it yet).
    pub status: Option<AppliedStatus>,
    /// When this process last wrote the lock's status: a change to the waiting queue alone
    /// may wait a moment after it (see [`super::coalesce`]). Forgetting it only lets the
    /// next such change be written at once.
    pub status_written: Option<std::time::Instant>,
    /// Per slot. Boxed: a map node has room for several entries, and a slot's memory
    /// holds a whole Lease.
    pub slots: std::collections::BTreeMap<u32, Box<SlotMemory>>,
    /// Grants revoked in a row, unconfirmed while their claims stood: the next waits
    /// longer for its confirmation ([`super::confirm`]).
    pub misses: super::confirm::Misses,
    /// Per ForceReleaseRequest UID, the status this term last wrote to it, as the
    /// apiserver stored it, until the cache shows it: a reconcile that reads the request
    /// before its cache catches up judges it from this, so an end is written, counted and
    /// put in the lock's history once ([`super::force_requests::current`]).
    pub requests: HashMap<String, crate::crd::ForceReleaseRequestStatus>,
}

impl LockMemory {
    /// The memory of slot `slot`.
    pub fn slot(&mut self, slot: u32) -> &mut SlotMemory {
        self.slots.entry(slot).or_default()
    }

    /// Whether a write of this term is not yet shown by the caches: a status as written,
    /// or a slot Lease as written. Its own watch event settles it.
    pub fn awaits_cache(&self) -> bool {
        matches!(self.status, Some(AppliedStatus::Written(_))) || self.slots.values().any(|s| s.written.is_some())
    }

    /// Whether this memory holds nothing that the next reconcile would not rebuild from
    /// the caches exactly as it is, so that forgetting it changes no decision: nothing
    /// pending, no claim or hold being timed, no write the cache has not caught up with, no
    /// claim served, and a status the cache shows that lists no holder (re-creating a
    /// deleted slot Lease then finds no hold to drain either way). A new leadership term
    /// starts every lock from nothing; an idle lock forgotten here starts the same way and
    /// loses nothing, while 100,000 idle locks no longer each keep a memory.
    pub fn at_rest(&self) -> bool {
        let status_at_rest = match &self.status {
            None => true,
            Some(AppliedStatus::Written(_)) => false,
            Some(AppliedStatus::Cached(lock)) => {
                lock.status.as_ref().is_some_and(|s| super::status::listed(s).is_empty())
            }
        };
        self.pending.is_none()
            && self.claims.is_empty()
            && status_at_rest
            && self.misses.none()
            && self.requests.is_empty()
            && self.slots.values().all(|s| s.at_rest())
    }
}

impl SlotMemory {
    /// Whether this slot's memory is what a first look at a free slot Lease records, and
    /// nothing more (see [`LockMemory::at_rest`]).
    pub fn at_rest(&self) -> bool {
        self.holder.is_none()
            && self.hold.is_none()
            && self.drain.is_none()
            && self.written.is_none()
            && self.served.is_none()
            && self.seen.as_ref().is_none_or(super::recreate::Seen::carries_nothing)
    }
}

/// Shared by all reconciles.
pub struct Context {
    /// Client (admin of what the chart's RBAC allows).
    pub client: Client,
    /// Cached DistributedLocks.
    pub locks: Store<DistributedLock>,
    /// Cached lock Leases.
    pub leases: Store<Lease>,
    /// Cached LockClaims.
    pub claims: Store<LockClaim>,
    /// The cached LockClaims' names by lock.
    pub claim_index: Arc<Mutex<super::index::ClaimIndex>>,
    /// The cached lock Leases' slots by lock.
    pub slot_index: Arc<Mutex<super::index::SlotIndex>>,
    /// Cached ForceReleaseRequests.
    pub requests: Store<ForceReleaseRequest>,
    /// Cached Pod metadata.
    pub pods: Store<PartialObjectMeta<Pod>>,
    /// Metrics.
    pub metrics: Arc<ControllerMetrics>,
    /// Event recorder.
    pub recorder: Recorder,
    /// Settings.
    pub settings: Settings,
    /// Leadership.
    pub leadership: Leadership,
    /// Per-lock memory, reset at every new leadership term. Boxed: a map keeps its
    /// values inline in a table up to twice as large as the map, and a lock's memory is
    /// large next to its key.
    pub memory: Mutex<(u64, HashMap<LockKey, Box<LockMemory>>)>,
    /// The highest token this process has issued per lock. Survives terms and lock
    /// re-creation: one more source that keeps tokens increasing.
    pub tokens: Mutex<HashMap<LockKey, i64>>,
    /// Which locks each holder Pod holds, so a Pod event finds its locks.
    pub holders: Arc<Mutex<HolderIndex>>,
    /// How long grants took to be seen confirmed lately, across every lock.
    pub confirmations: Mutex<super::confirm::Latencies>,
    /// The budget of routine status writes across every lock, past their settle.
    pub status_budget: governor::DefaultDirectRateLimiter,
    /// When each lock last had a routine Event (Granted, Released) recorded.
    pub routine_events: Mutex<HashMap<(String, String, String), std::time::Instant>>,
    /// ServiceAccount of each claimant Pod seen (by Pod UID; immutable for a Pod).
    pub pod_accounts: Mutex<HashMap<String, String>>,
    /// Namespaces whose claimant RBAC is in place, with what it was applied from.
    pub rbac: Mutex<HashMap<String, Arc<tokio::sync::Mutex<super::rbac::applied::Applied>>>>,
}

impl Context {
    /// Runs `f` on the memory of `key`, resetting it first if the leadership term or the
    /// lock's UID changed.
    pub fn with_memory<T>(&self, key: &LockKey, uid: &str, f: impl FnOnce(&mut LockMemory) -> T) -> T {
        let mut guard = self.memory.lock().expect("controller memory is never poisoned");
        let term = self.leadership.term();
        if guard.0 != term {
            *guard = (term, HashMap::new());
        }
        let memory = guard.1.entry(key.clone()).or_default();
        if memory.uid != uid {
            **memory = LockMemory { uid: uid.to_owned(), ..LockMemory::default() };
        }
        f(memory)
    }

    /// Whether `key`'s memory of this term awaits the caches ([`LockMemory::awaits_cache`]).
    pub fn awaits_cache(&self, key: &LockKey) -> bool {
        let guard = self.memory.lock().expect("controller memory is never poisoned");
        guard.0 == self.leadership.term() && guard.1.get(key).is_some_and(|m| m.awaits_cache())
    }

    /// Forgets the memory of `key` if it is at rest ([`LockMemory::at_rest`]).
    pub fn forget_at_rest(&self, key: &LockKey) {
        let mut guard = self.memory.lock().expect("controller memory is never poisoned");
        if guard.1.get(key).is_some_and(|m| m.at_rest()) {
            guard.1.remove(key);
        }
    }

    /// Highest token this process issued for `key`.
    pub fn issued(&self, key: &LockKey) -> i64 {
        self.tokens.lock().expect("token memory is never poisoned").get(key).copied().unwrap_or(0)
    }

    /// Records an issued (or reserved) token.
    pub fn record_issued(&self, key: &LockKey, token: i64) {
        let mut tokens = self.tokens.lock().expect("token memory is never poisoned");
        let t = tokens.entry(key.clone()).or_default();
        *t = (*t).max(token);
    }

    /// Records which Pod holds `key` (or none).
    pub fn record_holder(&self, key: &LockKey, pods: &[&str]) {
        self.holders.lock().expect("holder index is never poisoned").set(key, pods);
    }
}

/// Holder Pods and their locks, both ways.
#[derive(Default)]
pub struct HolderIndex {
    by_lock: HashMap<LockKey, Vec<String>>,
    by_pod: HashMap<(String, String), HashSet<String>>,
}

impl HolderIndex {
    /// Records that `pods` (none: nobody) hold `lock`.
    pub fn set(&mut self, lock: &LockKey, pods: &[&str]) {
        for old in self.by_lock.remove(lock).unwrap_or_default() {
            let pod_key = (lock.namespace.clone(), old);
            if let Some(locks) = self.by_pod.get_mut(&pod_key) {
                locks.remove(&lock.name);
                if locks.is_empty() {
                    self.by_pod.remove(&pod_key);
                }
            }
        }
        if pods.is_empty() {
            return;
        }
        for pod in pods {
            self.by_pod.entry((lock.namespace.clone(), (*pod).to_owned())).or_default().insert(lock.name.clone());
        }
        self.by_lock.insert(lock.clone(), pods.iter().map(|p| (*p).to_owned()).collect());
    }

    /// The locks held by Pod `name` in `namespace`.
    pub fn locks_of(&self, namespace: &str, name: &str) -> Vec<String> {
        self.by_pod
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_index_tracks_moves() {
        let mut index = HolderIndex::default();
        let (a, b) = (LockKey::new("ns", "a"), LockKey::new("ns", "b"));
        index.set(&a, &["p1"]);
        index.set(&b, &["p1"]);
        assert_eq!(index.locks_of("ns", "p1").len(), 2);
        index.set(&a, &["p2"]);
        assert_eq!(index.locks_of("ns", "p1"), vec!["b".to_owned()]);
        assert_eq!(index.locks_of("ns", "p2"), vec!["a".to_owned()]);
        index.set(&b, &[]);
        assert!(index.locks_of("ns", "p1").is_empty());
        assert!(index.locks_of("other", "p2").is_empty());
        // A lock with several permits is held by several Pods.
        index.set(&b, &["p1", "p3"]);
        assert_eq!(
            (index.locks_of("ns", "p1"), index.locks_of("ns", "p3")),
            (vec!["b".to_owned()], vec!["b".to_owned()])
        );
        index.set(&b, &["p3"]);
        assert!(index.locks_of("ns", "p1").is_empty());
    }

    fn lease(holder: Option<&str>) -> Lease {
        let mut lease = Lease::default();
        if let Some(holder) = holder {
            lease.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: Some(holder.into()),
                ..Default::default()
            });
            lease.metadata.annotations = Some([(crate::crd::ANNOTATION_TOKEN.to_owned(), "7".to_owned())].into());
        }
        lease
    }

    fn cached(holder: Option<&str>) -> AppliedStatus {
        let mut lock = DistributedLock::new("orders", crate::crd::DistributedLockSpec::default());
        let holders = holder
            .map(|h| crate::crd::HolderStatus {
                identity: h.into(),
                slot: 0,
                mode: None,
                pod: None,
                fencing_token: 7,
                acquired_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
                renewed_at: None,
                expires_at: None,
                waited_seconds: 0.0,
            })
            .into_iter()
            .collect();
        lock.status = Some(DistributedLockStatus { holders, ..DistributedLockStatus::default() });
        AppliedStatus::Cached(Arc::new(lock))
    }

    #[test]
    fn only_a_memory_the_caches_would_rebuild_is_at_rest() {
        fn sighting<K>(key: K) -> Option<Sighting<K>> {
            Some(Sighting { key, since: std::time::Instant::now() })
        }
        let now = std::time::Instant::now();
        let with = |f: &dyn Fn(&mut LockMemory)| {
            let mut m = LockMemory { uid: "u1".into(), ..LockMemory::default() };
            f(&mut m);
            m
        };
        let free_slot = |m: &mut LockMemory| m.slot(0).seen = Some(super::super::recreate::seen(&lease(None)));
        let table: [(&str, LockMemory, bool); 14] = [
            ("nothing remembered", with(&|_| {}), true),
            ("a free slot Lease looked at", with(&free_slot), true),
            ("status applied, the cache shows it, nobody holds", with(&|m| m.status = Some(cached(None))), true),
            (
                "status written, the cache does not show it yet",
                with(&|m| m.status = Some(AppliedStatus::Written(Box::default()))),
                false,
            ),
            ("status shown, listing a holder", with(&|m| m.status = Some(cached(Some("app")))), false),
            (
                "an outcome waiting for a status write",
                with(&|m| m.pending = Some(super::super::status::Outcome::default())),
                false,
            ),
            (
                "a claim being timed",
                with(&|m| {
                    m.claims.insert(
                        "c1".into(),
                        ClaimSeen { first: now, refresh: None, served: false, given_back: None, refused_at: None },
                    );
                }),
                false,
            ),
            ("a renewal being timed", with(&|m| m.slot(0).holder = sighting(("app".into(), Some(7), None))), false),
            ("a hold being timed", with(&|m| m.slot(0).hold = sighting(("app".into(), Some(7)))), false),
            ("a drain being timed", with(&|m| m.slot(0).drain = sighting(Some(7))), false),
            (
                "a write the cache has not caught up with",
                with(&|m| m.slot(0).written = Some(Box::new((Some("5".into()), lease(None))))),
                false,
            ),
            ("a claim served", with(&|m| m.slot(0).served = Some("c1".into())), false),
            (
                "a slot Lease seen carrying a hold",
                with(&|m| m.slot(0).seen = Some(super::super::recreate::seen(&lease(Some("app"))))),
                false,
            ),
            (
                "a free slot beside a held one",
                with(&|m| {
                    free_slot(m);
                    m.slot(1).hold = sighting(("app".into(), Some(7)));
                }),
                false,
            ),
        ];
        for (case, memory, want) in table {
            assert_eq!(memory.at_rest(), want, "{case}");
        }
    }
}
