//! Pure edits of lock and claim Leases made by a claimant, and how it reads a lock Lease.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};

use crate::crd::{ANNOTATION_POD, ANNOTATION_REVOKED, LABEL_LOCK, LABEL_ROLE, ROLE_CLAIM};
use crate::lease::{Identity, token};

/// A new claim Lease announcing that `identity` waits for `lock`. Owned by the claimant's
/// Pod, when there is one, so that it goes away with the Pod.
pub fn claim_lease(lock: &str, identity: &Identity, ttl_seconds: i32, now: Timestamp) -> Lease {
    let owner = identity.pod.as_ref().map(|pod| OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        controller: None,
        block_owner_deletion: None,
    });
    Lease {
        metadata: ObjectMeta {
            name: Some(identity.claim_name(lock)),
            labels: Some([(LABEL_LOCK.into(), lock.into()), (LABEL_ROLE.into(), ROLE_CLAIM.into())].into()),
            annotations: identity.pod.as_ref().map(|pod| [(ANNOTATION_POD.into(), pod.name.clone())].into()),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.id.clone()),
            lease_duration_seconds: Some(ttl_seconds),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    }
}

/// The holder named by a Lease, if any.
pub fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// The token of a hold granted to `identity` by this lock Lease, if it names `identity`.
pub fn granted_token(lease: &Lease, identity: &Identity) -> Option<i64> {
    (holder(lease) == Some(identity.id.as_str())).then(|| token::of_lease(lease)).flatten()
}

/// Whether the hold on this Lease was confirmed by its holder (`renewTime != acquireTime`):
/// the controller writes them equal at a grant, the holder's first renewal makes them differ.
pub fn is_confirmed(lease: &Lease) -> bool {
    lease.spec.as_ref().is_some_and(|s| s.renew_time.as_ref().map(|t| t.0) != s.acquire_time.as_ref().map(|t| t.0))
}

/// Why a claimant no longer holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// No renewal succeeded within the renew deadline (self-fenced).
    RenewDeadline,
    /// The controller revoked the hold (expired, forced, ...); the reason it recorded.
    Revoked(String),
    /// The lock Lease is gone (deleted by hand, or the lock was deleted).
    LeaseDeleted,
    /// The apiserver refused a renewal.
    Refused(String),
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LostReason::RenewDeadline => f.write_str("no renewal succeeded before the renew deadline"),
            LostReason::Revoked(why) => write!(f, "the controller revoked the hold ({why})"),
            LostReason::LeaseDeleted => f.write_str("the lock Lease was deleted"),
            LostReason::Refused(why) => write!(f, "the apiserver refused the renewal: {why}"),
        }
    }
}

/// Whether this lock Lease still shows our hold with `token`; if not, why.
pub fn still_ours(lease: Option<&Lease>, identity: &Identity, token: i64) -> Result<(), LostReason> {
    let Some(lease) = lease else { return Err(LostReason::LeaseDeleted) };
    if granted_token(lease, identity) == Some(token) {
        return Ok(());
    }
    let why =
        lease.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_REVOKED)).cloned().unwrap_or_else(|| {
            match holder(lease) {
                Some(other) => format!("now held by {other}"),
                None => "released".to_owned(),
            }
        });
    Err(LostReason::Revoked(why))
}

/// The Lease with its renewal time set to `now`. The controller tells a confirmed grant
/// from an unconfirmed one by `renewTime != acquireTime`, so never write them equal.
pub fn renewed(lease: &Lease, now: Timestamp) -> Lease {
    let mut lease = lease.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let now = match &spec.acquire_time {
        Some(MicroTime(acquired)) if acquired.as_microsecond() == now.as_microsecond() => {
            now.saturating_add(SignedDuration::from_micros(1)).unwrap_or(now)
        }
        _ => now,
    };
    spec.renew_time = Some(MicroTime(now));
    lease
}

/// The lock Lease with our hold given up. The token annotation stays: it is the record
/// the next grant mints from.
pub fn released(lease: &Lease) -> Lease {
    let mut lease = lease.clone();
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
    }
    lease
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::ANNOTATION_TOKEN;

    const UID: &str = "0b8f3a1e-5d2c-4c55-9a57-2f3c1e7b9d10";

    fn lock_lease(holder: Option<&str>, token: Option<&str>, revoked: Option<&str>) -> Lease {
        let mut annotations = std::collections::BTreeMap::new();
        if let Some(t) = token {
            annotations.insert(ANNOTATION_TOKEN.to_owned(), t.to_owned());
        }
        if let Some(r) = revoked {
            annotations.insert(ANNOTATION_REVOKED.to_owned(), r.to_owned());
        }
        Lease {
            metadata: ObjectMeta { annotations: Some(annotations), ..ObjectMeta::default() },
            spec: Some(LeaseSpec { holder_identity: holder.map(str::to_owned), ..LeaseSpec::default() }),
        }
    }

    #[test]
    fn claim_lease_names_and_owns() {
        let me = Identity::for_pod("w-0", UID);
        let lease = claim_lease("orders", &me, 30, Timestamp::UNIX_EPOCH);
        assert_eq!(lease.metadata.name.as_deref(), Some(me.claim_name("orders").as_str()));
        let owner = &lease.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Pod", "w-0", UID));
        assert_eq!(holder(&lease), Some(me.id.as_str()));
        let outside = Identity { id: "host-1".into(), pod: None };
        assert!(claim_lease("orders", &outside, 30, Timestamp::UNIX_EPOCH).metadata.owner_references.is_none());
    }

    #[test]
    fn still_ours_table() {
        let me = Identity::for_pod("w-0", UID);
        let mine = me.id.as_str();
        let cases: [(Option<Lease>, Result<(), LostReason>); 6] = [
            (Some(lock_lease(Some(mine), Some("7"), None)), Ok(())),
            (None, Err(LostReason::LeaseDeleted)),
            (Some(lock_lease(Some(mine), Some("8"), None)), Err(LostReason::Revoked("now held by ".to_owned() + mine))),
            (Some(lock_lease(Some("other"), Some("8"), None)), Err(LostReason::Revoked("now held by other".into()))),
            (Some(lock_lease(None, Some("8"), Some("Expired"))), Err(LostReason::Revoked("Expired".into()))),
            (Some(lock_lease(None, Some("7"), None)), Err(LostReason::Revoked("released".into()))),
        ];
        for (lease, expected) in cases {
            assert_eq!(still_ours(lease.as_ref(), &me, 7), expected, "{lease:?}");
        }
    }

    #[test]
    fn renewal_never_equals_acquire_time() {
        let t = Timestamp::from_second(1_700_000_000).expect("valid");
        let mut lease = lock_lease(Some("me"), Some("1"), None);
        lease.spec.as_mut().expect("spec").acquire_time = Some(MicroTime(t));
        let renewed = renewed(&lease, t);
        let renew = renewed.spec.expect("spec").renew_time.expect("set").0;
        assert!(renew > t);
    }

    #[test]
    fn release_keeps_token() {
        let lease = released(&lock_lease(Some("me"), Some("9"), None));
        assert_eq!(holder(&lease), None);
        assert_eq!(token::of_lease(&lease), Some(9));
    }
}
