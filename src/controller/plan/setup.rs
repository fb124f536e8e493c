//! Before a plan: the lock Lease to plan from — ours, adopted from an earlier incarnation
//! of the lock, created (draining a hold its deleted predecessor carried), or none to use.

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use crate::controller::build;
use crate::controller::recreate::{self, Orphan, Seen};
use crate::controller::status::{self, Ready};
use crate::controller::view::{self, Ownership};
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

/// The setup for slot `slot` of `lock` given the Lease with its name (`None`: there is
/// none), the highest token known, what the Lease carried as last seen in this leadership
/// term, and now. A slot at or above the lock's permits is never created.
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
        return match (orphan, token::mint(known, now.as_millisecond())) {
            (Some(orphan), Some(raise_to)) => Setup::Create {
                lease: recreate::recreated(lock, slot, raise_to, &orphan, &spec),
                orphan: Some((orphan, raise_to)),
            },
            _ => Setup::Create { lease: build::new_lock_lease(lock, slot, known), orphan: None },
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
