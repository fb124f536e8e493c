//! The waiter a held lock Lease names as next, and the handoff to it.
//!
//! While a mutex is held and others wait, the controller records on its Lease the waiter
//! it would grant next — identity, LockClaim name and UID, mode — and a token it minted
//! for that grant. Releasing, the holder writes that grant itself in the same
//! compare-and-swap that clears it: the next waiter hears of its grant one write after the
//! release instead of two, without the controller seeing the release first. The guard
//! lets a holder write nothing else as a grant, so the controller still picks who is next
//! and mints every token; it judges a handed-on hold as it judges its own unconfirmed
//! grants.

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;

use super::token;
use crate::crd::{
    ANNOTATION_CLAIM, ANNOTATION_CLAIM_UID, ANNOTATION_DRAINING, ANNOTATION_MODE, ANNOTATION_NEXT_CLAIM,
    ANNOTATION_NEXT_CLAIM_UID, ANNOTATION_NEXT_HOLDER, ANNOTATION_NEXT_MODE, ANNOTATION_NEXT_TOKEN, ANNOTATION_REVOKED,
    ANNOTATION_TOKEN,
};

/// Every annotation that records the next waiter.
pub const ANNOTATIONS: [&str; 5] = [
    ANNOTATION_NEXT_HOLDER,
    ANNOTATION_NEXT_CLAIM,
    ANNOTATION_NEXT_CLAIM_UID,
    ANNOTATION_NEXT_TOKEN,
    ANNOTATION_NEXT_MODE,
];

/// The waiter a Lease names as next, with the token minted for its grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Next {
    /// Its claimant identity.
    pub holder: String,
    /// Its LockClaim's name.
    pub claim: String,
    /// Its LockClaim's UID.
    pub claim_uid: String,
    /// The token its grant records.
    pub token: i64,
    /// Its mode annotation, when it is a writer.
    pub mode: Option<String>,
}

/// The next waiter a Lease records, if it records one completely with a readable token.
pub fn of_lease(lease: &Lease) -> Option<Next> {
    let annotations = lease.metadata.annotations.as_ref()?;
    let get = |key: &str| annotations.get(key).filter(|v| !v.is_empty()).cloned();
    Some(Next {
        holder: get(ANNOTATION_NEXT_HOLDER)?,
        claim: get(ANNOTATION_NEXT_CLAIM)?,
        claim_uid: get(ANNOTATION_NEXT_CLAIM_UID)?,
        token: token::parse(annotations.get(ANNOTATION_NEXT_TOKEN)?).ok()?,
        mode: get(ANNOTATION_NEXT_MODE),
    })
}

/// Whether the Lease carries any next-waiter annotation (complete or not).
pub fn any_recorded(lease: &Lease) -> bool {
    lease.metadata.annotations.as_ref().is_some_and(|a| ANNOTATIONS.iter().any(|k| a.contains_key(*k)))
}

/// The Lease naming `next` as the next waiter (`None`: naming nobody).
pub fn record(lease: &mut Lease, next: Option<&Next>) {
    let annotations = lease.annotations_mut();
    for key in ANNOTATIONS {
        annotations.remove(key);
    }
    if let Some(next) = next {
        annotations.insert(ANNOTATION_NEXT_HOLDER.into(), next.holder.clone());
        annotations.insert(ANNOTATION_NEXT_CLAIM.into(), next.claim.clone());
        annotations.insert(ANNOTATION_NEXT_CLAIM_UID.into(), next.claim_uid.clone());
        annotations.insert(ANNOTATION_NEXT_TOKEN.into(), next.token.to_string());
        if let Some(mode) = &next.mode {
            annotations.insert(ANNOTATION_NEXT_MODE.into(), mode.clone());
        }
    }
}

/// The Lease handed on by its holder to the next waiter it records, at `now` (the writer's
/// clock): the grant the controller would write, as the guard admits it — the next
/// waiter named holder, with its claim, mode and token; `acquireTime` and `renewTime`
/// equal (an unconfirmed grant); one more transition; the last revocation's reason and
/// the next-waiter record gone; nothing else changed. `None` when there is nobody to hand
/// on to: no complete record, a token not above the Lease's, a draining Lease (a revoked
/// hold only acknowledges), or a next waiter that is the holder itself.
pub fn handed_on(lease: &Lease, now: Timestamp) -> Option<Lease> {
    let next = of_lease(lease)?;
    let annotations = lease.metadata.annotations.as_ref()?;
    let current = annotations.get(ANNOTATION_TOKEN).and_then(|t| token::parse(t).ok()).unwrap_or(0);
    let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref());
    if next.token <= current || annotations.contains_key(ANNOTATION_DRAINING) || holder == Some(next.holder.as_str()) {
        return None;
    }
    let mut lease = lease.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(next.holder.clone());
    spec.acquire_time = Some(MicroTime(now));
    spec.renew_time = Some(MicroTime(now));
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    record(&mut lease, None);
    let annotations = lease.annotations_mut();
    annotations.insert(ANNOTATION_TOKEN.into(), next.token.to_string());
    annotations.insert(ANNOTATION_CLAIM.into(), next.claim);
    annotations.insert(ANNOTATION_CLAIM_UID.into(), next.claim_uid);
    annotations.remove(ANNOTATION_REVOKED);
    match next.mode {
        Some(mode) => annotations.insert(ANNOTATION_MODE.into(), mode),
        None => annotations.remove(ANNOTATION_MODE),
    };
    Some(lease)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn held(annotations: &[(&str, &str)]) -> Lease {
        Lease {
            metadata: ObjectMeta {
                annotations: Some(annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("a".into()),
                lease_transitions: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    fn next(token: i64) -> Next {
        Next { holder: "b".into(), claim: "orders.b".into(), claim_uid: "uid-b".into(), token, mode: None }
    }

    fn with_next(annotations: &[(&str, &str)], n: &Next) -> Lease {
        let mut lease = held(annotations);
        record(&mut lease, Some(n));
        lease
    }

    #[test]
    fn a_recorded_next_reads_back_and_is_removed_whole() {
        let mut lease = with_next(&[(ANNOTATION_TOKEN, "7")], &Next { mode: Some("Write".into()), ..next(8) });
        assert_eq!(of_lease(&lease), Some(Next { mode: Some("Write".into()), ..next(8) }));
        record(&mut lease, None);
        assert!(!any_recorded(&lease));
        assert_eq!(lease.annotations().get(ANNOTATION_TOKEN).map(String::as_str), Some("7"));
    }

    #[test]
    fn an_incomplete_or_unreadable_record_names_nobody() {
        let mut lease = with_next(&[], &next(8));
        lease.annotations_mut().insert(ANNOTATION_NEXT_TOKEN.into(), "08".into());
        assert_eq!(of_lease(&lease), None);
        assert!(any_recorded(&lease));
        let mut lease = with_next(&[], &next(8));
        lease.annotations_mut().remove(ANNOTATION_NEXT_CLAIM_UID);
        assert_eq!(of_lease(&lease), None);
    }

    #[test]
    fn the_handoff_is_the_grant_the_controller_recorded() {
        let now = Timestamp::from_second(100).expect("valid");
        let before = with_next(
            &[
                (ANNOTATION_TOKEN, "7"),
                (ANNOTATION_CLAIM, "orders.a"),
                (ANNOTATION_CLAIM_UID, "uid-a"),
                (ANNOTATION_REVOKED, "Expired"),
                (ANNOTATION_MODE, "Write"),
                ("leasehold.dev/renew-deadline-seconds", "10"),
            ],
            &next(8),
        );
        let after = handed_on(&before, now).expect("handed on");
        let spec = after.spec.as_ref().expect("a spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));
        assert_eq!(spec.renew_time, spec.acquire_time, "an unconfirmed grant");
        assert_eq!(spec.lease_transitions, Some(4));
        let a = after.annotations();
        assert_eq!(a.get(ANNOTATION_TOKEN).map(String::as_str), Some("8"));
        assert_eq!(a.get(ANNOTATION_CLAIM).map(String::as_str), Some("orders.b"));
        assert_eq!(a.get(ANNOTATION_CLAIM_UID).map(String::as_str), Some("uid-b"));
        assert!(!a.contains_key(ANNOTATION_MODE), "a reader's grant records no mode");
        assert!(!a.contains_key(ANNOTATION_REVOKED));
        assert!(!any_recorded(&after));
        assert_eq!(a.get("leasehold.dev/renew-deadline-seconds").map(String::as_str), Some("10"), "terms kept");
    }

    #[test]
    fn nobody_is_handed_a_lease_the_record_does_not_allow() {
        let now = Timestamp::from_second(100).expect("valid");
        // No record; a token not above the Lease's; a draining Lease; the holder itself.
        assert_eq!(handed_on(&held(&[(ANNOTATION_TOKEN, "7")]), now), None);
        assert_eq!(handed_on(&with_next(&[(ANNOTATION_TOKEN, "8")], &next(8)), now), None);
        assert_eq!(handed_on(&with_next(&[(ANNOTATION_TOKEN, "9")], &next(8)), now), None);
        assert_eq!(handed_on(&with_next(&[(ANNOTATION_TOKEN, "7"), (ANNOTATION_DRAINING, "7")], &next(8)), now), None);
        assert_eq!(
            handed_on(&with_next(&[(ANNOTATION_TOKEN, "7")], &Next { holder: "a".into(), ..next(8) }), now),
            None
        );
        assert!(handed_on(&with_next(&[(ANNOTATION_TOKEN, "7")], &next(8)), now).is_some());
    }
}
