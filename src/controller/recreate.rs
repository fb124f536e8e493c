//! A lock Lease deleted under a hold (by an administrator, or by anything else allowed to
//! delete it) is re-created *draining* that hold, never free: its holder may still be
//! acting inside the time it was told it had, so the next grant waits for the holder's
//! acknowledgement or for the hold's lease duration, exactly as for any other revocation
//! of a holder that may be alive. A hold known only from status (the Lease was deleted
//! before this leader saw it) may not be the newest: status may trail the grants while
//! claimants wait. Its drain is then acknowledged by nobody and runs for its whole lease
//! duration, so whichever hold the deleted Lease carried has ended by then.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use super::build;
use crate::crd::{ANNOTATION_MODE, ClaimMode, DistributedLock, HolderStatus};
use crate::lease::{GrantedTiming, granted};

/// The revocation reason recorded on a Lease re-created under a hold.
pub const REASON: &str = "LeaseDeleted";

/// The hold a deleted lock Lease carried, as best known.
#[derive(Clone, Debug, PartialEq)]
pub struct Orphan {
    /// The holder's identity.
    pub identity: String,
    /// The token it was granted.
    pub token: i64,
    /// The longest lease duration it may have been granted under.
    pub lease_duration: Duration,
    /// The mode it was granted in: the re-created Lease drains a writer as a writer.
    pub mode: ClaimMode,
    /// Whether it is the hold the Lease carried as last seen (its holder may acknowledge
    /// the drain), not one read from status, which may trail the Lease.
    pub exact: bool,
}

/// What re-creation needs of a slot Lease as last seen, and no more: the hold it carried
/// (`None`: none that could be drained — no holder, or no readable token), with the lease
/// duration the Lease itself records (zero when it records none: the spec's applies).
/// Kept in place of the Lease, which is many times its size.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen(Option<Orphan>);

impl Seen {
    /// Whether the Lease carried no hold that re-creation would drain.
    pub fn carries_nothing(&self) -> bool {
        self.0.is_none()
    }
}

/// What `lease` (a slot Lease as seen) tells re-creation.
pub fn seen(lease: &Lease) -> Seen {
    // No fallback: a Lease that records no lease duration takes the spec's at re-creation.
    const RECORDED_ONLY: GrantedTiming = GrantedTiming {
        timing: crate::lease::Timing {
            lease_duration: Duration::ZERO,
            renew_deadline: Duration::ZERO,
            retry_period: Duration::ZERO,
        },
        max_hold: None,
    };
    let carried = || {
        let identity = crate::claim::edit::holder(lease)?.to_owned();
        let token = match crate::claim::edit::draining(lease) {
            Some(revoked) => revoked?,
            None => crate::lease::token::of_lease(lease)?,
        };
        Some(Orphan {
            identity,
            token,
            lease_duration: granted::of_lease(lease, &RECORDED_ONLY).timing.lease_duration,
            mode: super::view::mode_of(lease),
            exact: true,
        })
    };
    Seen(carried())
}

/// The hold the deleted Lease carried: the one on the Lease as we last decided from it
/// in this leadership term (`seen`), or — if we had not looked at it yet — the one status
/// records, which may be an older hold of the slot than the Lease's last (status written
/// while claimants waited may trail it, never past a hold of at least as long a lease
/// duration on the same slot). `None` when it carried none. A holder that released after
/// status was written makes the next grant wait for one lease duration: a cost, never a
/// second holder.
pub fn orphan(seen: Option<&Seen>, status: Option<&HolderStatus>, spec: &GrantedTiming) -> Option<Orphan> {
    let mut found = match seen {
        Some(Seen(carried)) => carried.clone()?,
        None => {
            let h = status?;
            Orphan {
                identity: h.identity.clone(),
                token: h.fencing_token,
                lease_duration: granted_for(h).unwrap_or_default(),
                mode: h.mode.unwrap_or_default(),
                exact: false,
            }
        }
    };
    found.lease_duration = found.lease_duration.max(spec.timing.lease_duration);
    Some(found)
}

/// The lease duration the holder `h` was granted under, as status records it.
pub fn granted_for(h: &HolderStatus) -> Option<Duration> {
    match (&h.renewed_at, &h.expires_at) {
        (Some(renewed), Some(expires)) => Duration::try_from(expires.0.duration_since(renewed.0)).ok(),
        _ => None,
    }
}

/// Slot `slot`'s Lease re-created draining `orphan`: the holder still named, the token raised
/// to `raise_to` (the orphan's token is stale at once), the drain timed by the orphan's
/// lease duration. An orphan known exactly is drained under its own token, which its holder
/// acknowledges on letting go; one read from status under `raise_to`, a token no claimant
/// was handed, so that no acknowledgement ends the drain early: the hold status names may be
/// an older one than the Lease carried, whose holder would acknowledge a drain of a hold it
/// no longer has while the newer holder may still believe it holds.
pub fn recreated(lock: &DistributedLock, slot: u32, raise_to: i64, orphan: &Orphan, spec: &GrantedTiming) -> Lease {
    let mut lease = build::new_lock_lease(lock, slot, raise_to);
    let mut terms = *spec;
    terms.timing.lease_duration = orphan.lease_duration;
    granted::record(&mut lease, &terms);
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = Some(orphan.identity.clone());
    }
    if orphan.mode == ClaimMode::Write {
        lease.annotations_mut().insert(ANNOTATION_MODE.into(), ClaimMode::Write.as_str().into());
    }
    let drained = if orphan.exact { orphan.token } else { raise_to };
    build::draining(&lease, raise_to, REASON, Some(drained))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::view::{self, LeaseDrain, LeaseState};
    use crate::crd::DistributedLockSpec;
    use crate::lease::Identity;
    use jiff::Timestamp;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn lock() -> DistributedLock {
        let mut lock = DistributedLock::new("db", DistributedLockSpec::default());
        lock.metadata.namespace = Some("ns".into());
        lock.metadata.uid = Some("uid-1".into());
        lock
    }

    fn held_by(holder: &str, token: i64, lease_seconds: i32) -> Lease {
        let mut lease = build::new_lock_lease(&lock(), 0, token);
        let spec = lease.spec.as_mut().unwrap();
        spec.holder_identity = Some(holder.into());
        spec.lease_duration_seconds = Some(lease_seconds);
        lease
    }

    fn status(holder: &str, token: i64, lease_seconds: i64) -> HolderStatus {
        let renewed = Timestamp::from_second(1_000).unwrap();
        HolderStatus {
            mode: None,
            slot: 0,
            identity: holder.into(),
            pod: None,
            fencing_token: token,
            acquired_at: Time(renewed),
            renewed_at: Some(Time(renewed)),
            expires_at: Some(Time(Timestamp::from_second(1_000 + lease_seconds).unwrap())),
            waited_seconds: 0.0,
        }
    }

    #[test]
    fn the_orphaned_hold_is_the_newest_known() {
        let spec = GrantedTiming::of_spec(&DistributedLockSpec { lease_duration_seconds: 5, ..Default::default() });
        let secs = Duration::from_secs;
        let orphan_of = |id: &str, token, s| {
            Some(Orphan { identity: id.into(), token, lease_duration: secs(s), mode: ClaimMode::Read, exact: true })
        };
        let from_status = |id: &str, token, s| Some(Orphan { exact: false, ..orphan_of(id, token, s).unwrap() });
        let drained = build::draining(&held_by("a_1", 7, 9), 8, "Forced", Some(7));
        let free = build::new_lock_lease(&lock(), 0, 7);
        let mut unrecorded = held_by("a_1", 7, 9);
        unrecorded.spec.as_mut().unwrap().lease_duration_seconds = None;
        let mut writer = held_by("a_1", 7, 9);
        writer.annotations_mut().insert(ANNOTATION_MODE.into(), ClaimMode::Write.as_str().into());
        let mut tokenless = held_by("a_1", 7, 9);
        tokenless.annotations_mut().remove(crate::crd::ANNOTATION_TOKEN);
        type Row = (&'static str, Option<Lease>, Option<HolderStatus>, Option<Orphan>);
        let table: Vec<Row> = vec![
            ("nothing known", None, None, None),
            ("the Lease as seen names a holder", Some(held_by("a_1", 7, 9)), None, orphan_of("a_1", 7, 9)),
            ("not seen in this term: status", None, Some(status("b_2", 6, 12)), from_status("b_2", 6, 12)),
            ("seen, status ignored", Some(held_by("a_1", 7, 9)), Some(status("b_2", 6, 12)), orphan_of("a_1", 7, 9)),
            ("seen free after status was written", Some(free), Some(status("b_2", 6, 12)), None),
            ("a drain still unacknowledged", Some(drained), None, orphan_of("a_1", 7, 9)),
            ("never shorter than the spec", Some(held_by("a_1", 7, 2)), None, orphan_of("a_1", 7, 5)),
            ("no lease duration on the Lease: the spec's", Some(unrecorded.clone()), None, orphan_of("a_1", 7, 5)),
            (
                "a writer stays a writer",
                Some(writer),
                None,
                Some(Orphan { mode: ClaimMode::Write, ..orphan_of("a_1", 7, 9).unwrap() }),
            ),
            ("a holder without a readable token: none", Some(tokenless), Some(status("b_2", 6, 12)), None),
            (
                "status without timing: the spec's",
                None,
                Some(HolderStatus { expires_at: None, ..status("b_2", 6, 1) }),
                from_status("b_2", 6, 5),
            ),
        ];
        for (name, written, status, want) in table {
            assert_eq!(orphan(written.map(|l| seen(&l)).as_ref(), status.as_ref(), &spec), want, "{name}");
        }
    }

    #[test]
    fn a_recreated_lease_drains_the_orphan_under_a_raised_token() {
        let spec = GrantedTiming::of_spec(&DistributedLockSpec { lease_duration_seconds: 5, ..Default::default() });
        let orphan = Orphan {
            identity: "pod-a_uid-a".into(),
            token: 7,
            lease_duration: Duration::from_secs(9),
            mode: ClaimMode::Read,
            exact: true,
        };
        let lease = recreated(&lock(), 0, 8, &orphan, &spec);
        assert_eq!(crate::lease::token::of_lease(&lease), Some(8), "the old token is stale at once");
        assert_eq!(
            view::lease_state(&lease),
            LeaseState::Draining(LeaseDrain {
                holder: Some(Identity::parse("pod-a_uid-a")),
                revoked: Some(7),
                reason: Some(REASON.into()),
                mode: ClaimMode::Read,
            })
        );
        assert_eq!(granted::of_lease(&lease, &spec).timing.lease_duration, Duration::from_secs(9));
        // A writer's Lease is re-created draining a writer: it keeps the readers out.
        let writer = recreated(&lock(), 0, 8, &Orphan { mode: ClaimMode::Write, ..orphan.clone() }, &spec);
        assert!(matches!(view::lease_state(&writer), LeaseState::Draining(d) if d.mode == ClaimMode::Write));
        assert!(view::lease_hold(&lease).is_none(), "a re-created Lease grants nothing");
        let holder = Identity::parse("pod-a_uid-a");
        assert!(crate::claim::edit::given_back(&lease, &holder, 7).is_some(), "its holder may acknowledge");
    }

    #[test]
    fn a_hold_known_from_status_is_drained_to_its_end() {
        let spec = GrantedTiming::of_spec(&DistributedLockSpec { lease_duration_seconds: 5, ..Default::default() });
        let told = status("pod-a_uid-a", 7, 9);
        let orphan = orphan(None, Some(&told), &spec).expect("status names a holder");
        let lease = recreated(&lock(), 0, 8, &orphan, &spec);
        assert_eq!(crate::lease::token::of_lease(&lease), Some(8));
        assert!(
            matches!(view::lease_state(&lease), LeaseState::Draining(d) if d.revoked == Some(8) && d.holder == Some(Identity::parse("pod-a_uid-a"))),
            "drained under the raised token, the holder status names still named"
        );
        assert_eq!(granted::of_lease(&lease, &spec).timing.lease_duration, Duration::from_secs(9));
        // Status may name an older hold than the Lease's last: nobody's acknowledgement —
        // not that holder's, whatever token below the raised one it was handed — ends the
        // drain early.
        let named = Identity::parse("pod-a_uid-a");
        for token in [6, 7] {
            assert!(crate::claim::edit::given_back(&lease, &named, token).is_none(), "token {token}");
        }
        assert!(view::lease_hold(&lease).is_none(), "a re-created Lease grants nothing");
    }
}
