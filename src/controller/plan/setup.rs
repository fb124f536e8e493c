//! Before a plan: the lock Lease to plan from — ours, adopted from an earlier incarnation
//! of the lock, created (draining a hold its deleted predecessor carried), or none to use.

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use crate::controller::recreate::{self, Orphan, Seen};
use crate::controller::status::{self, Ready};
use crate::controller::view::{self, Ownership};
use crate::controller::{build, coalesce};
use crate::crd::DistributedLock;
use crate::lease::{GrantedTiming, token};

/// What to do about the lock Lease before planning.
#[derive(Clone, Debug, PartialEq)]
pub enum Setup {
    /// It is ours: plan from it.
    Use,
    /// Create it, then plan from it.
    Create {
        /// The Lease to create.
        lease: Lease,
        /// The hold a deleted predecessor carried, drained on the new Lease, with the
        /// token it was raised to.
        orphan: Option<(Orphan, i64)>,
    },
    /// Take over the Lease of an earlier lock of the same name (this write), then plan.
    Adopt(Lease),
    /// There is no Lease for this slot, and none is needed: the lock is going, or the
    /// slot is above its permits.
    Finish,
    /// The Lease with the lock's name is not ours: nothing can be granted.
    Conflict(Ready),
}

/// Whether a missing Lease for slot `slot` of `lock` would be created from what status
/// says: the lock stays, the slot is within its permits, and status records a token.
pub fn from_status(lock: &DistributedLock, slot: u32) -> bool {
    lock.metadata.deletion_timestamp.is_none()
        && slot < super::permits(lock)
        && lock.status.as_ref().is_some_and(|s| s.fencing_token.is_some())
}

/// The setup for slot `slot` of `lock` given the Lease with its name (`None`: there is
/// none), the highest token known, what the Lease carried as last seen in this leadership
/// term, and now. A slot at or above the lock's permits is never created. A Lease created
/// where there is none carries a token above every one that may have been issued: status
/// may trail the grants by a margin of tokens ([`coalesce::recovery_floor`]).
pub fn setup(
    lock: &DistributedLock,
    slot: u32,
    lease: Option<&Lease>,
    known: i64,
    seen: Option<&Seen>,
    now: Timestamp,
) -> Setup {
    let deleting = lock.metadata.deletion_timestamp.is_some();
    let Some(lease) = lease else {
        if deleting || slot >= super::permits(lock) {
            return Setup::Finish;
        }
        let spec = GrantedTiming::of_spec(&lock.spec);
        let listed = lock.status.as_ref().map(status::listed);
        let status = listed.unwrap_or_default().into_iter().find(|h| u32::try_from(h.slot).ok() == Some(slot));
        let orphan = recreate::orphan(seen, status, &spec);
        let floor = known.max(coalesce::recovery_floor(lock.status.as_ref()));
        return match (orphan, token::mint(floor, now.as_millisecond())) {
            (Some(orphan), Some(raise_to)) => Setup::Create {
                lease: recreate::recreated(lock, slot, raise_to, &orphan, &spec),
                orphan: Some((orphan, raise_to)),
            },
            _ => Setup::Create { lease: build::new_lock_lease(lock, slot, floor), orphan: None },
        };
    };
    match view::ownership(lease, &lock.name_any(), &lock.uid().unwrap_or_default()) {
        Ownership::Ours => Setup::Use,
        Ownership::PreviousIncarnation => Setup::Adopt(build::adopted(lease, lock)),
        // A Lease that is not ours is left alone, also when the lock goes.
        Ownership::Foreign(_) if deleting => Setup::Finish,
        Ownership::Foreign(why) => Setup::Conflict(Ready::LeaseConflict(why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{DistributedLockSpec, DistributedLockStatus, HolderStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn lock(status: Option<DistributedLockStatus>) -> DistributedLock {
        let mut lock = DistributedLock::new("db", DistributedLockSpec::default());
        lock.metadata.namespace = Some("ns".into());
        lock.metadata.uid = Some("uid-1".into());
        lock.status = status;
        lock
    }

    fn held(token: i64) -> DistributedLockStatus {
        let at = Time(Timestamp::from_second(1_000).unwrap());
        let holder = HolderStatus {
            identity: "pod-a_uid-a".into(),
            slot: 0,
            mode: None,
            pod: None,
            fencing_token: token,
            acquired_at: at.clone(),
            renewed_at: Some(at),
            expires_at: Some(Time(Timestamp::from_second(1_015).unwrap())),
            waited_seconds: 0.0,
        };
        DistributedLockStatus { holders: vec![holder], fencing_token: Some(token), ..Default::default() }
    }

    #[test]
    fn a_lease_created_where_there_is_none_carries_a_token_above_what_status_may_trail() {
        // A wall clock behind the tokens (a leader whose clock is behind the last one's).
        let now = Timestamp::from_second(1).unwrap();
        let floor = 500 + coalesce::TRAILING_TOKENS;
        let free = DistributedLockStatus { fencing_token: Some(500), ..Default::default() };
        // (case, lock status, known, expected token, whether it drains)
        let table: Vec<(&str, Option<DistributedLockStatus>, i64, i64, bool)> = vec![
            ("a new lock: what we know", None, 0, 0, false),
            ("status shows it free: above its token and the margin", Some(free.clone()), 500, floor, false),
            ("our memory above that", Some(free), floor + 7, floor + 7, false),
            ("status names a holder: drained under a token above the margin", Some(held(500)), 500, floor + 1, true),
        ];
        for (case, status, known, want, drains) in table {
            let setup = setup(&lock(status), 0, None, known, None, now);
            let Setup::Create { lease, orphan } = setup else { panic!("{case}: created, got {setup:?}") };
            assert_eq!(token::of_lease(&lease).unwrap_or(0), want, "{case}");
            assert_eq!(orphan.is_some(), drains, "{case}");
        }
    }

    #[test]
    fn only_a_lock_that_issued_tokens_recovers_a_missing_lease_from_status() {
        let mut going = lock(Some(held(5)));
        going.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let table: Vec<(&str, DistributedLock, u32, bool)> = vec![
            ("a new lock", lock(None), 0, false),
            ("status without a token", lock(Some(DistributedLockStatus::default())), 0, false),
            ("status with a token", lock(Some(held(5))), 0, true),
            ("a slot above the permits", lock(Some(held(5))), 1, false),
            ("a lock being deleted", going, 0, false),
        ];
        for (case, lock, slot, want) in table {
            assert_eq!(from_status(&lock, slot), want, "{case}");
        }
    }
}
