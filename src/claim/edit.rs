//! Pure edits made by a claimant — of its LockClaim and of the lock Lease — and how it
//! reads a lock Lease.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};

use crate::crd::{
    ANNOTATION_DRAINING, ANNOTATION_REVOKED, ClaimMode, LABEL_LOCK, LABEL_ROLE, LockClaim, LockClaimSpec, ROLE_LOCK,
};
use crate::lease::{Identity, Timing, token};

/// A new LockClaim announcing that `identity` waits for `lock`, living `ttl_seconds`
/// without refresh. Owned by the claimant's Pod, when there is one, so that it goes away
/// with the Pod.
pub fn lock_claim(lock: &str, identity: &Identity, ttl_seconds: i32, now: Timestamp) -> LockClaim {
    let owner = identity.pod.as_ref().map(|pod| OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        controller: None,
        block_owner_deletion: None,
    });
    LockClaim {
        metadata: ObjectMeta {
            name: Some(identity.claim_name(lock)),
            labels: Some([(LABEL_LOCK.into(), lock.into())].into()),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: LockClaimSpec {
            lock: lock.to_owned(),
            claimant: identity.id.clone(),
            pod: identity.pod.as_ref().map(|p| p.name.clone()),
            request_time: MicroTime(now),
            renew_time: MicroTime(now),
            ttl_seconds,
            mode: None,
        },
    }
}

/// `claim`, asking for `mode` (`Read`, the default, is left unwritten).
pub fn with_mode(mut claim: LockClaim, mode: ClaimMode) -> LockClaim {
    claim.spec.mode = (mode == ClaimMode::Write).then_some(mode);
    claim
}

/// The claim refreshed at `now`, asking to live what the wait it then shows gives it under
/// `timing` ([`Timing::claim_lifetime`]): the lifetime the controller lets it live.
pub fn refreshed(claim: &LockClaim, timing: &Timing, now: Timestamp) -> LockClaim {
    let mut claim = claim.clone();
    claim.spec.renew_time = MicroTime(now);
    let lifetime = timing.claim_lifetime(wait_shown(&claim.spec));
    claim.spec.ttl_seconds = i32::try_from(lifetime.as_secs()).unwrap_or(i32::MAX);
    claim
}

/// How long the controller lets a claim live without refresh under `timing`: what it asks
/// (a second at least), but no longer than the lifetime a claimant asks after the wait the
/// claim shows ([`Timing::claim_lifetime`]). A new claim that asked more than three lease
/// durations (a first claim, made before its claimant knew the lock's terms) lives three
/// lease durations, 30 s at least.
pub fn allowed_lifetime(spec: &LockClaimSpec, timing: &Timing) -> Duration {
    let asked = Duration::from_secs(u64::try_from(spec.ttl_seconds.max(1)).unwrap_or(1));
    asked.min(timing.claim_lifetime(wait_shown(spec)))
}

/// The wait a claim shows: its latest refresh after its request, both on its claimant's
/// clock (none if the refresh is not later). Claimant and controller read a claim's
/// lifetime from it alike, so a claimant's clock, however far off or stepped, never makes
/// them disagree.
pub fn wait_shown(spec: &LockClaimSpec) -> Duration {
    spec.renew_time.0.duration_since(spec.request_time.0).try_into().unwrap_or(Duration::ZERO)
}

/// Whether a LockClaim found under our claim's name is ours (and for `lock`): anything
/// else is a squatter, to be replaced.
pub fn is_our_claim(claim: &LockClaim, lock: &str, identity: &Identity) -> bool {
    claim.spec.claimant == identity.id && claim.spec.lock == lock
}

/// Whether `existing` is the claim `sent` (one try of an acquisition's first claim) made:
/// same claimant, lock and mode, and the same request time, to the microsecond it is
/// stored with.
pub fn is_claim_of_this_acquisition(existing: &LockClaim, sent: &LockClaim) -> bool {
    let micros = |c: &LockClaim| c.spec.request_time.0.as_microsecond();
    existing.spec.claimant == sent.spec.claimant
        && existing.spec.lock == sent.spec.lock
        && existing.spec.mode.unwrap_or_default() == sent.spec.mode.unwrap_or_default()
        && micros(existing) == micros(sent)
}

/// The holder named by a Lease, if any.
pub fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// Whether this lock Lease is draining a revoked hold, and the revoked token it records
/// (`Some(None)`: draining, the token unreadable).
pub fn draining(lease: &Lease) -> Option<Option<i64>> {
    let value = lease.metadata.annotations.as_ref()?.get(ANNOTATION_DRAINING)?;
    Some(token::parse(value).ok())
}

/// The token of a hold granted to `identity` by this lock Lease, if it names `identity`.
/// Only a Lease labelled as a slot Lease of its lock (`leasehold.dev/role: lock`,
/// `leasehold.dev/lock: <lock>`, named `<lock>` or `<lock>.<slot>`) grants: the guard lets nobody but the controller
/// create one or change its labels, while anyone allowed to create Leases could create an
/// unlabelled one with the lock's name naming us. A draining Lease grants nothing: it
/// names a holder whose hold was revoked.
pub fn granted_token(lease: &Lease, identity: &Identity) -> Option<i64> {
    if !names_us(lease, identity) || draining(lease).is_some() {
        return None;
    }
    token::of_lease(lease)
}

/// Whether `lease` is a lock's slot Lease (labelled as one, for the lock its name is a
/// slot of) whose holder is `identity`.
pub fn names_us(lease: &Lease, identity: &Identity) -> bool {
    slot_of(lease).is_some() && holder(lease) == Some(identity.id.as_str())
}

/// The slot this Lease grants, if it is labelled as a lock Lease for the lock its name is
/// a slot of (`<lock>` is slot 0, `<lock>.<i>` slot `i`). The guard lets nobody but the
/// controller create such a Lease or change its labels.
pub fn slot_of(lease: &Lease) -> Option<u32> {
    let labels = lease.metadata.labels.as_ref()?;
    if labels.get(LABEL_ROLE).map(String::as_str) != Some(ROLE_LOCK) {
        return None;
    }
    crate::lease::slot::of_lease_name(labels.get(LABEL_LOCK)?, lease.metadata.name.as_deref()?)
}

/// The permits slot 0's Lease records: how many slot Leases a waiting claimant watches.
pub fn permits(lease: &Lease) -> u32 {
    let recorded = lease.metadata.annotations.as_ref().and_then(|a| a.get(crate::crd::ANNOTATION_PERMITS));
    recorded.and_then(|p| p.parse().ok()).unwrap_or(1).clamp(1, crate::lease::slot::MAX_PERMITS)
}

/// The Lease with our hold with `token` given up, if it still names it: released while
/// granted, or acknowledged while the controller drains it (`draining` is our token).
/// `None` when the Lease no longer names that hold: there is nothing of ours to clear.
pub fn given_back(lease: &Lease, identity: &Identity, token: i64) -> Option<Lease> {
    if !names_us(lease, identity) {
        return None;
    }
    let ours = match draining(lease) {
        Some(revoked) => revoked == Some(token),
        None => token::of_lease(lease) == Some(token),
    };
    ours.then(|| released(lease))
}

/// [`given_back`], handing a released hold on to the waiter the controller recorded as
/// next, when it recorded one, in the same write ([`crate::lease::next::handed_on`], at
/// `now`). An acknowledgement of a revoked hold only clears the holder.
pub fn given_back_or_handed_on(lease: &Lease, identity: &Identity, token: i64, now: Timestamp) -> Option<Lease> {
    let cleared = given_back(lease, identity, token)?;
    Some(crate::lease::next::handed_on(lease, now).unwrap_or(cleared))
}

/// The UID of the claim the hold on this Lease was granted on, when the grant records it.
pub fn claim_uid(lease: &Lease) -> Option<&str> {
    lease.metadata.annotations.as_ref()?.get(crate::crd::ANNOTATION_CLAIM_UID).map(String::as_str)
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
    /// The apiserver refused a renewal (403: forbidden, or 401: our credentials are no
    /// longer valid — a Pod-bound token whose Pod is gone).
    Refused(String),
    /// The hold reached the maximum age it was granted with (self-fenced).
    MaxHold,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LostReason::RenewDeadline => f.write_str("no renewal succeeded before the renew deadline"),
            LostReason::Revoked(why) => write!(f, "the controller revoked the hold ({why})"),
            LostReason::LeaseDeleted => f.write_str("the lock Lease was deleted"),
            LostReason::Refused(why) => write!(f, "the apiserver refused the renewal: {why}"),
            LostReason::MaxHold => f.write_str("held for the lock's maxHoldSeconds"),
        }
    }
}

/// Whether this lock Lease still shows our hold with `token`; if not, why. A draining
/// Lease naming us means our hold was revoked.
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

    /// A lock's default timing: lease 15 s, renew deadline 10 s, retry 2 s.
    fn default_timing() -> Timing {
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    #[test]
    fn a_claim_is_known_for_this_acquisitions_by_its_request_time() {
        let at = |micros: i64, nanos: i32| Timestamp::new(1_800_000_000, micros as i32 * 1000 + nanos).expect("valid");
        let us = Identity::for_pod("a", UID);
        let other = Identity::for_pod("b", "1c9e4b2f-6e3d-4d66-8b68-3a4d2f8c0e21");
        let sent = with_mode(lock_claim("orders", &us, 45, at(250, 0)), ClaimMode::Write);
        let stored = |identity: &Identity, lock: &str, mode: ClaimMode, asked: Timestamp| {
            with_mode(lock_claim(lock, identity, 45, asked), mode)
        };
        let table = [
            ("the claim as sent", stored(&us, "orders", ClaimMode::Write, at(250, 0)), true),
            (
                "refreshed since",
                refreshed(&stored(&us, "orders", ClaimMode::Write, at(250, 0)), &default_timing(), at(900, 0)),
                true,
            ),
            ("asked a microsecond later", stored(&us, "orders", ClaimMode::Write, at(251, 0)), false),
            ("another claimant", stored(&other, "orders", ClaimMode::Write, at(250, 0)), false),
            ("another lock", stored(&us, "billing", ClaimMode::Write, at(250, 0)), false),
            ("another mode", stored(&us, "orders", ClaimMode::Read, at(250, 0)), false),
        ];
        for (name, existing, expected) in table {
            assert_eq!(is_claim_of_this_acquisition(&existing, &sent), expected, "{name}");
        }
        // Sent with nanoseconds, stored with microseconds: still ours.
        let precise = with_mode(lock_claim("orders", &us, 45, at(250, 999)), ClaimMode::Write);
        assert!(is_claim_of_this_acquisition(&sent, &precise));
    }

    fn lock_lease(holder: Option<&str>, token: Option<&str>, revoked: Option<&str>) -> Lease {
        draining_lease(holder, token, revoked, None)
    }

    fn draining_lease(holder: Option<&str>, token: Option<&str>, revoked: Option<&str>, drain: Option<&str>) -> Lease {
        let mut annotations = std::collections::BTreeMap::new();
        if let Some(t) = token {
            annotations.insert(ANNOTATION_TOKEN.to_owned(), t.to_owned());
        }
        if let Some(r) = revoked {
            annotations.insert(ANNOTATION_REVOKED.to_owned(), r.to_owned());
        }
        if let Some(d) = drain {
            annotations.insert(ANNOTATION_DRAINING.to_owned(), d.to_owned());
        }
        Lease {
            metadata: ObjectMeta {
                name: Some("orders".into()),
                labels: Some([(LABEL_LOCK.into(), "orders".into()), (LABEL_ROLE.into(), ROLE_LOCK.into())].into()),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec { holder_identity: holder.map(str::to_owned), ..LeaseSpec::default() }),
        }
    }

    #[test]
    fn only_a_lease_labelled_as_the_lock_lease_grants() {
        let me = Identity::for_pod("w-0", UID);
        let granted = lock_lease(Some(me.id.as_str()), Some("7"), None);
        assert_eq!(granted_token(&granted, &me), Some(7));
        let mut squatted = granted.clone();
        squatted.metadata.labels = None;
        assert_eq!(granted_token(&squatted, &me), None, "unlabelled");
        let mut claim_role = granted.clone();
        claim_role.metadata.labels.as_mut().expect("labels").insert(LABEL_ROLE.into(), "claim".into());
        assert_eq!(granted_token(&claim_role, &me), None, "not the lock role");
        let mut other_lock = granted;
        other_lock.metadata.labels.as_mut().expect("labels").insert(LABEL_LOCK.into(), "stock".into());
        assert_eq!(granted_token(&other_lock, &me), None, "labelled for another lock");
    }

    #[test]
    fn lock_claim_names_owns_and_refreshes() {
        let me = Identity::for_pod("w-0", UID);
        let t0 = Timestamp::UNIX_EPOCH;
        let claim = lock_claim("orders", &me, 30, t0);
        assert_eq!(claim.metadata.name.as_deref(), Some(format!("orders.{UID}").as_str()));
        assert_eq!(claim.metadata.labels.as_ref().and_then(|l| l.get(LABEL_LOCK)).map(String::as_str), Some("orders"));
        let owner = &claim.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Pod", "w-0", UID));
        assert_eq!((claim.spec.claimant.as_str(), claim.spec.pod.as_deref()), (me.id.as_str(), Some("w-0")));
        assert!(is_our_claim(&claim, "orders", &me));
        assert!(!is_our_claim(&claim, "orders", &Identity::for_pod("w-1", UID)));
        // Lease 15 s: 45 s after a wait of 10 s, three times the wait after one of 20 s.
        let timing = default_timing();
        for (at, ttl) in [(10, 45), (20, 60), (-5, 45)] {
            let later = Timestamp::from_second(at).expect("valid");
            let fresh = refreshed(&claim, &timing, later);
            assert_eq!((fresh.spec.renew_time.0, fresh.spec.request_time.0, fresh.spec.ttl_seconds), (later, t0, ttl));
        }
        let outside = Identity { id: "alice/u-host-1".into(), pod: None };
        let claim = lock_claim("orders", &outside, 30, t0);
        assert!(claim.metadata.owner_references.is_none());
        assert_eq!((claim.metadata.name.as_deref(), claim.spec.pod), (Some("orders.u-host-1"), None));
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
    fn a_draining_lease_naming_us_is_no_grant_and_means_lost() {
        let me = Identity::for_pod("w-0", UID);
        let mine = me.id.as_str();
        let revoked = draining_lease(Some(mine), Some("8"), Some("Forced"), Some("7"));
        assert_eq!(granted_token(&revoked, &me), None, "a draining Lease grants nothing");
        assert_eq!(still_ours(Some(&revoked), &me, 7), Err(LostReason::Revoked("Forced".into())));
        // Even were the raised token ours, a draining Lease is a revocation.
        assert_eq!(still_ours(Some(&revoked), &me, 8), Err(LostReason::Revoked("Forced".into())));
        assert_eq!(granted_token(&lock_lease(Some(mine), Some("7"), None), &me), Some(7));
        assert_eq!(draining(&draining_lease(Some(mine), Some("8"), None, Some("x"))), Some(None));
        assert_eq!(draining(&lock_lease(Some(mine), Some("7"), None)), None);
    }

    #[test]
    fn given_back_only_clears_our_own_hold_or_its_drain() {
        let me = Identity::for_pod("w-0", UID);
        let mine = me.id.as_str();
        // (lease, our token, clears?)
        let cases = [
            (lock_lease(Some(mine), Some("7"), None), true), // held: release
            (draining_lease(Some(mine), Some("8"), Some("Forced"), Some("7")), true), // our drain: ack
            (draining_lease(Some(mine), Some("9"), Some("Forced"), Some("8")), false), // a later hold's drain
            (lock_lease(Some(mine), Some("8"), None), false), // a later grant to us
            (lock_lease(Some("other"), Some("8"), None), false), // someone else's
            (lock_lease(None, Some("8"), None), false),      // already free
            (draining_lease(None, Some("8"), Some("Forced"), Some("7")), false), // already acknowledged
        ];
        for (lease, clears) in cases {
            let back = given_back(&lease, &me, 7);
            assert_eq!(back.is_some(), clears, "{lease:?}");
            if let Some(back) = back {
                assert_eq!(holder(&back), None);
                assert_eq!(back.metadata.annotations, lease.metadata.annotations, "annotations untouched");
            }
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
    fn a_claim_lives_what_it_asks_but_no_longer_than_three_times_the_wait_it_shows_and_three_lease_durations() {
        let s = Duration::from_secs;
        let lease = |secs: u64| Timing { lease_duration: s(secs), renew_deadline: s(secs) * 2 / 3, retry_period: s(1) };
        let at = |secs: i64| Timestamp::from_second(1_800_000_000 + secs).expect("valid");
        // (case, lease duration (s), asked (s), wait shown (s), lifetime)
        let cases = [
            ("a first claim on a 3 s lease: three lease durations cap it, 30 s at least", 3, 45, 0, s(30)),
            ("a first claim on a 15 s lease: what it asks", 15, 45, 0, s(45)),
            ("a first claim on a 30 s lease: what it asks, below three lease durations", 30, 45, 0, s(45)),
            ("refreshed after a minute: three times the wait", 15, 180, 60, s(180)),
            ("asking more than its wait gives", 15, 600, 20, s(60)),
            ("asking nothing: a second", 15, 0, 0, s(1)),
            ("asking less than nothing: a second", 15, -5, 0, s(1)),
        ];
        for (case, lease_secs, asked, waited, expected) in cases {
            let mut claim = lock_claim("orders", &Identity::for_pod("a", UID), asked, at(0));
            claim.spec.request_time = MicroTime(at(0));
            claim.spec.renew_time = MicroTime(at(waited));
            assert_eq!(allowed_lifetime(&claim.spec, &lease(lease_secs)), expected, "{case}");
        }
    }

    #[test]
    fn release_keeps_token() {
        let lease = released(&lock_lease(Some("me"), Some("9"), None));
        assert_eq!(holder(&lease), None);
        assert_eq!(token::of_lease(&lease), Some(9));
    }
}
