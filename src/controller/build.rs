//! Pure builders of the lock Lease the controller writes.

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use super::view::Claim;
use crate::crd::{
    ANNOTATION_CLAIM, ANNOTATION_REVOKED, ANNOTATION_TOKEN, DistributedLock, LABEL_LOCK, LABEL_ROLE, ROLE_LOCK,
};
use crate::lease::Timing;

fn owner(lock: &DistributedLock) -> OwnerReference {
    OwnerReference {
        api_version: DistributedLock::api_version(&()).into_owned(),
        kind: DistributedLock::kind(&()).into_owned(),
        name: lock.name_any(),
        uid: lock.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// A new, free lock Lease recording `token` as the highest token so far.
pub fn new_lock_lease(lock: &DistributedLock, token: i64) -> Lease {
    let mut lease = Lease {
        metadata: ObjectMeta {
            name: Some(lock.name_any()),
            namespace: lock.namespace(),
            labels: Some([(LABEL_LOCK.into(), lock.name_any()), (LABEL_ROLE.into(), ROLE_LOCK.into())].into()),
            owner_references: Some(vec![owner(lock)]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec::default()),
    };
    set_token(&mut lease, token);
    lease
}

/// A Lease left by an earlier DistributedLock of the same name, taken over: owned by
/// `lock`, any hold revoked, its token kept (raised to `token` if that is higher).
pub fn adopted(lease: &Lease, lock: &DistributedLock, token: i64) -> Lease {
    let mut lease = lease.clone();
    lease.metadata.owner_references = Some(vec![owner(lock)]);
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
    }
    set_token(&mut lease, token);
    lease.annotations_mut().insert(ANNOTATION_REVOKED.into(), "LockRecreated".into());
    lease
}

/// Records `token` on the Lease unless it already records a higher one: the annotation
/// never decreases.
fn set_token(lease: &mut Lease, token: i64) {
    let token = token.max(crate::lease::token::of_lease(lease).unwrap_or(0));
    if token > 0 {
        lease.annotations_mut().insert(ANNOTATION_TOKEN.into(), token.to_string());
    }
}

/// The Lease granted to `claim` with `token`. `revoked` names why the previous hold ended,
/// when this grant ends it, so its holder learns the reason.
pub fn granted(
    lease: &Lease,
    claim: &Claim,
    token: i64,
    timing: &Timing,
    now: Timestamp,
    revoked: Option<&str>,
) -> Lease {
    let mut lease = lease.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(claim.identity.id.clone());
    spec.acquire_time = Some(MicroTime(now));
    // Equal to acquireTime until the holder confirms (`renewTime != acquireTime`).
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = i32::try_from(timing.lease_duration.as_secs()).ok();
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    set_token(&mut lease, token);
    let annotations = lease.annotations_mut();
    annotations.insert(ANNOTATION_CLAIM.into(), claim.name.clone());
    match revoked {
        Some(reason) => annotations.insert(ANNOTATION_REVOKED.into(), reason.into()),
        None => annotations.remove(ANNOTATION_REVOKED),
    };
    lease
}

/// The Lease with its hold revoked for `reason` and `raise_to` recorded as the lock's
/// token, so the revoked token is stale at once.
pub fn revoked(lease: &Lease, raise_to: i64, reason: &str) -> Lease {
    let mut lease = lease.clone();
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
    }
    set_token(&mut lease, raise_to);
    let annotations = lease.annotations_mut();
    annotations.remove(ANNOTATION_CLAIM);
    annotations.insert(ANNOTATION_REVOKED.into(), reason.into());
    lease
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::edit;
    use crate::controller::view::{self, Ownership};
    use crate::crd::DistributedLockSpec;
    use crate::lease::{Identity, token};
    use std::time::Duration;

    fn lock() -> DistributedLock {
        let mut lock = DistributedLock::new("orders", DistributedLockSpec::default());
        lock.metadata.namespace = Some("shop".into());
        lock.metadata.uid = Some("uid-1".into());
        lock
    }

    fn claim() -> Claim {
        let t = Timestamp::from_second(5).expect("valid");
        Claim {
            name: "orders.abc".into(),
            uid: "c1".into(),
            resource_version: "9".into(),
            identity: Identity { id: "w-1".into(), pod: None },
            created: t,
            requested: t,
            renew_time: None,
            ttl: Duration::from_secs(45),
        }
    }

    #[test]
    fn grant_cycle() {
        let timing = Timing::of(&DistributedLockSpec::default());
        let now = Timestamp::from_second(100).expect("valid");
        let fresh = new_lock_lease(&lock(), 41);
        assert_eq!(view::ownership(&fresh, "orders", "uid-1"), Ownership::Ours);
        assert_eq!(token::of_lease(&fresh), Some(41));
        assert!(view::lease_hold(&fresh).is_none());

        let g = granted(&fresh, &claim(), 42, &timing, now, None);
        let hold = view::lease_hold(&g).expect("held");
        assert_eq!((hold.identity.id.as_str(), hold.token, hold.confirmed), ("w-1", Some(42), false));
        assert_eq!(hold.claim.as_deref(), Some("orders.abc"));
        assert_eq!(g.spec.as_ref().and_then(|s| s.lease_transitions), Some(1));

        // The holder confirms.
        let confirmed = edit::renewed(&g, now);
        assert!(view::lease_hold(&confirmed).expect("held").confirmed);

        let r = revoked(&confirmed, 43, "Expired");
        assert!(view::lease_hold(&r).is_none());
        assert_eq!(token::of_lease(&r), Some(43));
        assert_eq!(r.annotations().get(ANNOTATION_REVOKED).map(String::as_str), Some("Expired"));

        // A later grant clears the revocation note.
        let g2 = granted(&r, &claim(), 44, &timing, now, None);
        assert!(!g2.annotations().contains_key(ANNOTATION_REVOKED));
    }

    #[test]
    fn adoption_revokes_and_keeps_the_higher_token() {
        let mut old = new_lock_lease(&lock(), 77);
        old.metadata.owner_references.as_mut().expect("owned")[0].uid = "uid-0".into();
        let g = granted(&old, &claim(), 78, &Timing::of(&DistributedLockSpec::default()), Timestamp::UNIX_EPOCH, None);
        assert_eq!(view::ownership(&g, "orders", "uid-1"), Ownership::PreviousIncarnation);
        let adopted = adopted(&g, &lock(), 50);
        assert_eq!(view::ownership(&adopted, "orders", "uid-1"), Ownership::Ours);
        assert!(view::lease_hold(&adopted).is_none());
        assert_eq!(token::of_lease(&adopted), Some(78));
    }
}
