//! Pure builders of the lock Lease the controller writes.

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use super::view::Claim;
use crate::crd::{
    ANNOTATION_CLAIM, ANNOTATION_CLAIM_UID, ANNOTATION_DRAINING, ANNOTATION_MODE, ANNOTATION_PERMITS,
    ANNOTATION_REVOKED, ANNOTATION_TOKEN, ClaimMode, DistributedLock, LABEL_LOCK, LABEL_ROLE, MANAGED_LABELS,
    ROLE_LOCK,
};
use crate::lease::{GrantedTiming, granted};

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

/// A new, free Lease of slot `slot` of `lock`, recording `token` as the highest token so
/// far (slot 0 also the lock's permits).
pub fn new_lock_lease(lock: &DistributedLock, slot: u32, token: i64) -> Lease {
    let mut lease = Lease {
        metadata: ObjectMeta {
            name: Some(crate::lease::slot::lease_name(&lock.name_any(), slot)),
            namespace: lock.namespace(),
            labels: Some(
                [(LABEL_LOCK, lock.name_any().as_str()), (LABEL_ROLE, ROLE_LOCK)]
                    .into_iter()
                    .chain(MANAGED_LABELS)
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
            ),
            owner_references: Some(vec![owner(lock)]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec::default()),
    };
    set_token(&mut lease, token);
    if slot == 0 {
        set_permits(&mut lease, super::plan::permits(lock));
    }
    lease
}

/// Records the lock's permits on its slot 0 Lease, where claimants learn which slot
/// Leases to watch (none recorded: one).
pub fn set_permits(lease: &mut Lease, permits: u32) {
    if permits > 1 {
        lease.annotations_mut().insert(ANNOTATION_PERMITS.into(), permits.to_string());
    } else {
        lease.annotations_mut().remove(ANNOTATION_PERMITS);
    }
}

/// A Lease left by an earlier DistributedLock of the same name, taken over: owned by
/// `lock`, nothing else changed. A hold on it stays what it is (its holder may be acting
/// on it) and is judged like any other.
pub fn adopted(lease: &Lease, lock: &DistributedLock) -> Lease {
    let mut lease = lease.clone();
    lease.metadata.owner_references = Some(vec![owner(lock)]);
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

/// The Lease granted to `claim` with `token` under `terms`. `revoked` names why the
/// previous hold ended, when this grant ends it, so its holder learns the reason. A drain
/// the grant follows is over.
pub fn granted(
    lease: &Lease,
    claim: &Claim,
    token: i64,
    terms: &GrantedTiming,
    now: Timestamp,
    revoked: Option<&str>,
) -> Lease {
    let mut lease = lease.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(claim.identity.id.clone());
    spec.acquire_time = Some(MicroTime(now));
    // Equal to acquireTime until the holder confirms (`renewTime != acquireTime`).
    spec.renew_time = Some(MicroTime(now));
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    granted::record(&mut lease, terms);
    set_token(&mut lease, token);
    let annotations = lease.annotations_mut();
    annotations.insert(ANNOTATION_CLAIM.into(), claim.name.clone());
    annotations.insert(ANNOTATION_CLAIM_UID.into(), claim.uid.clone());
    annotations.remove(ANNOTATION_DRAINING);
    match claim.mode {
        ClaimMode::Write => annotations.insert(ANNOTATION_MODE.into(), ClaimMode::Write.as_str().into()),
        ClaimMode::Read => annotations.remove(ANNOTATION_MODE),
    };
    match revoked {
        Some(reason) => annotations.insert(ANNOTATION_REVOKED.into(), reason.into()),
        None => annotations.remove(ANNOTATION_REVOKED),
    };
    lease
}

/// The Lease with its hold revoked for `reason` in one write (a holder that cannot believe
/// it holds) and `raise_to` recorded as the lock's token, so the revoked token is stale at
/// once.
pub fn revoked(lease: &Lease, raise_to: i64, reason: &str) -> Lease {
    let mut lease = lease.clone();
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
    }
    set_token(&mut lease, raise_to);
    let annotations = lease.annotations_mut();
    annotations.remove(ANNOTATION_CLAIM);
    annotations.remove(ANNOTATION_CLAIM_UID);
    annotations.remove(ANNOTATION_DRAINING);
    annotations.insert(ANNOTATION_REVOKED.into(), reason.into());
    lease
}

/// The Lease with the hold with `token` revoked for `reason` while its holder may still
/// believe it holds: `raise_to` recorded (the old token is stale at once), the Lease
/// marked draining `token`, the holder still named until it acknowledges. Nothing else
/// changes.
pub fn draining(lease: &Lease, raise_to: i64, reason: &str, token: Option<i64>) -> Lease {
    let mut lease = lease.clone();
    set_token(&mut lease, raise_to);
    let annotations = lease.annotations_mut();
    // An unreadable token (never a controller's grant) is not drained: see `decide`.
    annotations.insert(ANNOTATION_DRAINING.into(), token.map_or_else(|| "0".into(), |t| t.to_string()));
    annotations.insert(ANNOTATION_REVOKED.into(), reason.into());
    lease
}

/// The Lease free after a drain: no holder, not draining; the token and the reason of the
/// last revocation stay.
pub fn freed(lease: &Lease) -> Lease {
    let mut lease = lease.clone();
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
    }
    let annotations = lease.annotations_mut();
    annotations.remove(ANNOTATION_CLAIM);
    annotations.remove(ANNOTATION_CLAIM_UID);
    annotations.remove(ANNOTATION_DRAINING);
    annotations.remove(ANNOTATION_MODE);
    lease
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::edit;
    use crate::controller::view::{self, LeaseDrain, LeaseState, Ownership};
    use crate::crd::{ANNOTATION_MAX_HOLD, ANNOTATION_RENEW_DEADLINE, DistributedLockSpec};
    use crate::lease::{Identity, token};
    use std::time::Duration;

    fn lock() -> DistributedLock {
        let mut lock = DistributedLock::new("orders", DistributedLockSpec::default());
        lock.metadata.namespace = Some("shop".into());
        lock.metadata.uid = Some("uid-1".into());
        lock
    }

    fn claim(id: &str) -> Claim {
        let t = Timestamp::from_second(5).expect("valid");
        Claim {
            mode: crate::crd::ClaimMode::Read,
            name: format!("orders.{id}"),
            uid: "c1".into(),
            resource_version: "9".into(),
            identity: Identity { id: id.into(), pod: None },
            created: t,
            requested: t,
            renew_time: None,
            ttl: Duration::from_secs(45),
        }
    }

    fn terms() -> GrantedTiming {
        GrantedTiming {
            max_hold: Some(Duration::from_secs(90)),
            ..GrantedTiming::of_spec(&DistributedLockSpec::default())
        }
    }

    #[test]
    fn grant_cycle() {
        let now = Timestamp::from_second(100).expect("valid");
        let fresh = new_lock_lease(&lock(), 0, 41);
        assert_eq!(view::ownership(&fresh, "orders", "uid-1"), Ownership::Ours);
        assert_eq!(token::of_lease(&fresh), Some(41));
        assert_eq!(view::lease_state(&fresh), LeaseState::Free);

        let g = granted(&fresh, &claim("u-w-1"), 42, &terms(), now, None);
        let hold = view::lease_hold(&g).expect("held");
        assert_eq!((hold.identity.id.as_str(), hold.token, hold.confirmed), ("u-w-1", Some(42), false));
        assert_eq!(hold.claim.as_deref(), Some("orders.u-w-1"));
        assert_eq!(g.spec.as_ref().and_then(|s| s.lease_transitions), Some(1));
        assert_eq!(granted::of_lease(&g, &GrantedTiming::of_spec(&DistributedLockSpec::default())), terms());
        assert_eq!(g.annotations().get(ANNOTATION_MAX_HOLD).map(String::as_str), Some("90"));
        assert_eq!(g.annotations().get(ANNOTATION_RENEW_DEADLINE).map(String::as_str), Some("10"));

        // The holder confirms.
        let confirmed = edit::renewed(&g, now);
        assert!(view::lease_hold(&confirmed).expect("held").confirmed);

        let r = revoked(&confirmed, 43, "Expired");
        assert_eq!(view::lease_state(&r), LeaseState::Free);
        assert_eq!(token::of_lease(&r), Some(43));
        assert_eq!(r.annotations().get(ANNOTATION_REVOKED).map(String::as_str), Some("Expired"));

        // A later grant clears the revocation note.
        let g2 = granted(&r, &claim("u-w-2"), 44, &terms(), now, None);
        assert!(!g2.annotations().contains_key(ANNOTATION_REVOKED));
    }

    #[test]
    fn drain_cycle() {
        let now = Timestamp::from_second(100).expect("valid");
        let g = edit::renewed(&granted(&new_lock_lease(&lock(), 0, 41), &claim("u-w-1"), 42, &terms(), now, None), now);
        let d = draining(&g, 43, "Forced", Some(42));
        // The token is raised at once; the holder stays named; nothing else changes.
        assert_eq!(token::of_lease(&d), Some(43));
        assert_eq!(edit::holder(&d), Some("u-w-1"));
        assert_eq!(d.spec, g.spec);
        assert_eq!(
            view::lease_state(&d),
            LeaseState::Draining(LeaseDrain {
                holder: Some(Identity::parse("u-w-1")),
                revoked: Some(42),
                reason: Some("Forced".into()),
                mode: ClaimMode::Read,
            })
        );
        // The holder's acknowledgement is exactly what `given_back` writes.
        let acked = edit::given_back(&d, &Identity::parse("u-w-1"), 42).expect("the holder may acknowledge");
        assert!(matches!(view::lease_state(&acked), LeaseState::Draining(LeaseDrain { holder: None, .. })));
        // Then free, or granted to the next claimant: either way the drain is over.
        let f = freed(&acked);
        assert_eq!(view::lease_state(&f), LeaseState::Free);
        assert_eq!(token::of_lease(&f), Some(43));
        let next = granted(&acked, &claim("u-w-2"), 44, &terms(), now, None);
        assert!(matches!(view::lease_state(&next), LeaseState::Held(h) if h.token == Some(44)));
        // A drain timing out without acknowledgement frees the Lease just the same.
        assert_eq!(view::lease_state(&freed(&d)), LeaseState::Free);
    }

    #[test]
    fn the_token_annotation_never_decreases() {
        let lease = new_lock_lease(&lock(), 0, 50);
        assert_eq!(token::of_lease(&revoked(&lease, 10, "Expired")), Some(50));
        assert_eq!(token::of_lease(&draining(&lease, 10, "Forced", Some(9))), Some(50));
    }

    #[test]
    fn adoption_changes_only_the_owner() {
        let mut old = new_lock_lease(&lock(), 0, 77);
        old.metadata.owner_references.as_mut().expect("owned")[0].uid = "uid-0".into();
        let g = granted(&old, &claim("u-w-1"), 78, &terms(), Timestamp::UNIX_EPOCH, None);
        assert_eq!(view::ownership(&g, "orders", "uid-1"), Ownership::PreviousIncarnation);
        let adopted = adopted(&g, &lock());
        assert_eq!(view::ownership(&adopted, "orders", "uid-1"), Ownership::Ours);
        assert_eq!(view::lease_hold(&adopted), view::lease_hold(&g), "the hold is left as it is");
        assert_eq!((adopted.spec, adopted.metadata.annotations), (g.spec, g.metadata.annotations));
    }
}
