//! What a namespace's client RBAC was last applied from, so that a reconcile finds out in
//! constant time whether its lock changes the grant.
//!
//! The grant is the union over every lock of the namespace: recomputing it is work in
//! proportion to the namespace's locks, and reconciles of one namespace take turns at it.
//! Recomputed at every reconcile, that is quadratic in the locks — with 100,000 locks in
//! one namespace, more than a reconcile's time each. So each lock's share of the grant is
//! kept as the cache showed it when the grant was last computed, and a reconcile
//! recomputes only when its own lock's share differs (or was never counted). Every other
//! change has a recheck of its own: another lock's change reconciles that lock, a deleted
//! lock, a Pod with the sidecar appearing or going and a re-list recompute the namespace.

use std::collections::HashMap;

use kube::ResourceExt;

use crate::crd::DistributedLock;

/// What one lock adds to its namespace's grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    /// How many slot Leases it names (slots `0..slots`).
    pub slots: u32,
    /// Its `spec.clients` (empty: every ServiceAccount of the namespace).
    pub clients: Box<[String]>,
}

/// `lock`'s share of its namespace's grant: a slot Lease per permit, and one for every
/// slot above them still held after the lock shrank (its holder must still renew and
/// release it); its clients.
pub fn share(lock: &DistributedLock) -> Share {
    let held_above = lock.status.iter().flat_map(|s| &s.holders).filter_map(|h| u32::try_from(h.slot).ok());
    Share {
        slots: held_above.map(|slot| slot + 1).fold(crate::controller::plan::permits(lock), u32::max),
        clients: lock.spec.clients.clone().into_boxed_slice(),
    }
}

/// A namespace's client RBAC as last applied.
#[derive(Debug, Default)]
pub struct Applied {
    /// A [`print`] of the grant applied.
    pub grant: Option<u64>,
    /// Each lock's share (by name) as the grant applied counted it.
    shares: HashMap<String, Share>,
    /// Per Role of ours (by name), a [`print`] of it and its binding as last applied: a
    /// change of the grant rewrites only the Roles it changes.
    written: HashMap<String, u64>,
    /// Whether the namespace may have Lease Roles: `None` until this process looked.
    pub spread: Option<bool>,
}

/// A hash of `objects` as they would be written (their `Debug` form), for this process to
/// tell whether they changed. The form is fed to the hasher as it is written, never held
/// whole: with 100,000 lock Leases it would be a megabyte.
pub fn print(objects: &impl std::fmt::Debug) -> u64 {
    use std::fmt::Write as _;
    use std::hash::Hasher;
    struct Feed(std::hash::DefaultHasher);
    impl std::fmt::Write for Feed {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.write(s.as_bytes());
            Ok(())
        }
    }
    let mut feed = Feed(std::hash::DefaultHasher::new());
    write!(feed, "{objects:?}").expect("hashing never fails");
    feed.0.finish()
}

impl Applied {
    /// Records the grant applied (its [`print`]), computed from `locks`.
    pub fn record<'a>(&mut self, grant: u64, locks: impl IntoIterator<Item = &'a DistributedLock>) {
        self.grant = Some(grant);
        self.shares = locks.into_iter().map(|l| (l.name_any(), share(l))).collect();
    }

    /// Whether Role `role` and its binding were last applied as `print` shows them.
    pub fn is_current(&self, role: &str, print: u64) -> bool {
        self.written.get(role) == Some(&print)
    }

    /// Records that Role `role` and its binding were applied as `print` shows them.
    pub fn wrote(&mut self, role: String, print: u64) {
        self.written.insert(role, print);
    }

    /// Forgets Role `role` (deleted).
    pub fn forget(&mut self, role: &str) {
        self.written.remove(role);
    }

    /// Whether the grant applied counted `lock` as it is now.
    pub fn counts(&self, lock: &DistributedLock) -> bool {
        self.shares.get(&lock.name_any()).is_some_and(|s| *s == share(lock))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{DistributedLockSpec, DistributedLockStatus, HolderStatus};

    fn lock(name: &str, permits: i32, clients: &[&str]) -> DistributedLock {
        DistributedLock::new(
            name,
            DistributedLockSpec {
                permits,
                clients: clients.iter().map(|c| (*c).into()).collect(),
                ..Default::default()
            },
        )
    }

    fn holding_slot(mut lock: DistributedLock, slot: i32) -> DistributedLock {
        let holder = HolderStatus {
            mode: None,
            identity: "w".into(),
            slot,
            pod: None,
            fencing_token: 1,
            acquired_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
            renewed_at: None,
            expires_at: None,
            waited_seconds: 0.0,
        };
        lock.status = Some(DistributedLockStatus { holders: vec![holder], ..Default::default() });
        lock
    }

    #[test]
    fn a_print_tells_objects_apart_by_what_would_be_written() {
        let orders = lock("orders", 1, &["worker"]);
        assert_eq!(print(&orders), print(&orders.clone()), "the same object");
        let table = [
            ("other clients", lock("orders", 1, &["cron"])),
            ("more permits", lock("orders", 2, &["worker"])),
            ("another name", lock("order", 1, &["worker"])),
        ];
        for (case, other) in table {
            assert_ne!(print(&orders), print(&other), "{case}");
        }
    }

    #[test]
    fn a_lock_is_counted_only_as_it_was_when_the_grant_was_computed() {
        let mut applied = Applied::default();
        let orders = lock("orders", 1, &["worker"]);
        assert!(!applied.counts(&orders), "nothing applied yet");
        applied.record(1, [&orders, &lock("stock", 1, &[])]);
        assert_eq!(applied.grant, Some(1));
        type Row = (&'static str, DistributedLock, bool);
        let table: Vec<Row> = vec![
            ("unchanged", orders.clone(), true),
            ("a status write that holds no slot above the permits", holding_slot(orders.clone(), 0), true),
            ("other clients", lock("orders", 1, &["worker", "cron"]), false),
            ("clients emptied: every ServiceAccount", lock("orders", 1, &[]), false),
            ("more permits", lock("orders", 3, &["worker"]), false),
            ("a slot above the permits still held", holding_slot(orders.clone(), 2), false),
            ("a lock not counted", lock("audit", 1, &["worker"]), false),
        ];
        for (case, now, counted) in table {
            assert_eq!(applied.counts(&now), counted, "{case}");
        }
        // A new computation counts only the locks it was computed from.
        applied.record(2, [&lock("stock", 1, &[])]);
        assert!(!applied.counts(&orders), "a lock gone from the grant is no longer counted");
    }
}
