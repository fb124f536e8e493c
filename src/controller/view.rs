//! Pure readings of the objects the controller watches: who owns a lock Lease, who holds
//! it, and what a LockClaim says.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;

use crate::claim::edit;
use crate::crd::{
    ANNOTATION_CLAIM, ANNOTATION_MODE, ANNOTATION_REVOKED, ClaimMode, LABEL_LOCK, LABEL_ROLE, LockClaim, ROLE_LOCK,
};
use crate::lease::{Identity, Timing, token};

/// Whose a Lease with a lock's name is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Ours: labelled as this lock's Lease and controlled by this DistributedLock (same UID).
    Ours,
    /// Left by an earlier DistributedLock of the same name (deleted and re-created):
    /// labelled as this lock's Lease and controlled by a DistributedLock of this name with
    /// another UID.
    PreviousIncarnation,
    /// Anything else: never touched.
    Foreign(String),
}

/// Classifies the Lease named like lock `lock` whose DistributedLock has UID `uid`. It is
/// ours only when everything says so: the labels (`leasehold.dev/lock=<lock>`,
/// `leasehold.dev/role=lock`) and the controller owner reference.
pub fn ownership(lease: &Lease, lock: &str, uid: &str) -> Ownership {
    let controller = lease.owner_references().iter().find(|o| o.controller == Some(true));
    let labelled = lease.labels().get(LABEL_ROLE).map(String::as_str) == Some(ROLE_LOCK)
        && lease.labels().get(LABEL_LOCK).map(String::as_str) == Some(lock);
    match controller {
        Some(o) if o.kind == "DistributedLock" && o.api_version.starts_with("leasehold.dev/") && o.name == lock => {
            if !labelled {
                Ownership::Foreign(format!(
                    "Lease {lock} is controlled by a DistributedLock {lock} but lacks the labels {LABEL_LOCK}={lock}, {LABEL_ROLE}={ROLE_LOCK}"
                ))
            } else if o.uid == uid {
                Ownership::Ours
            } else {
                Ownership::PreviousIncarnation
            }
        }
        Some(o) => Ownership::Foreign(format!("Lease {lock} is controlled by {} {}", o.kind, o.name)),
        None => Ownership::Foreign(format!("Lease {lock} exists and is not owned by this DistributedLock")),
    }
}

/// The hold recorded on a lock Lease.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseHold {
    /// Holder identity.
    pub identity: Identity,
    /// Token of the hold (`None` if the annotation is missing or malformed: such a hold
    /// was not written by a controller and is revoked).
    pub token: Option<i64>,
    /// When granted.
    pub acquire_time: Option<Timestamp>,
    /// Latest renewal.
    pub renew_time: Option<MicroTime>,
    /// The holder renewed at least once since the grant (`renewTime != acquireTime`).
    pub confirmed: bool,
    /// The holder's LockClaim name, as recorded at grant.
    pub claim: Option<String>,
    /// The UID of the LockClaim the hold was granted on, as recorded at grant: a later
    /// claim in the holder's name (a new acquisition, after it lost this hold) is another
    /// object, with the same name.
    pub claim_uid: Option<String>,
    /// Granted to a reader or to a writer.
    pub mode: ClaimMode,
}

/// A revoked hold being drained.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseDrain {
    /// The revoked holder, until it acknowledges (clears itself).
    pub holder: Option<Identity>,
    /// The revoked token (`None`: unreadable).
    pub revoked: Option<i64>,
    /// Why it was revoked.
    pub reason: Option<String>,
    /// The mode the revoked hold was granted in: a draining writer still keeps everyone out.
    pub mode: ClaimMode,
}

/// What a lock Lease says.
#[derive(Clone, Debug, PartialEq)]
pub enum LeaseState {
    /// Nobody holds it.
    Free,
    /// Granted.
    Held(LeaseHold),
    /// A revoked hold is being drained.
    Draining(LeaseDrain),
}

/// The state of a lock Lease.
pub fn lease_state(lease: &Lease) -> LeaseState {
    if let Some(revoked) = edit::draining(lease) {
        return LeaseState::Draining(LeaseDrain {
            holder: edit::holder(lease).map(Identity::parse),
            revoked,
            reason: lease.annotations().get(ANNOTATION_REVOKED).cloned(),
            mode: mode_of(lease),
        });
    }
    lease_hold(lease).map_or(LeaseState::Free, LeaseState::Held)
}

/// The hold granted by a lock Lease, if any: a holder on a Lease that is not draining.
pub fn lease_hold(lease: &Lease) -> Option<LeaseHold> {
    if edit::draining(lease).is_some() {
        return None;
    }
    let holder = edit::holder(lease)?;
    let spec = lease.spec.as_ref()?;
    let acquire = spec.acquire_time.as_ref().map(|t| t.0);
    Some(LeaseHold {
        identity: Identity::parse(holder),
        token: token::of_lease(lease),
        acquire_time: acquire,
        renew_time: spec.renew_time.clone(),
        confirmed: edit::is_confirmed(lease),
        claim: lease.annotations().get(ANNOTATION_CLAIM).cloned(),
        claim_uid: edit::claim_uid(lease).map(str::to_owned),
        mode: mode_of(lease),
    })
}

impl LeaseHold {
    /// Whether `claim` is the one this hold was granted on: in the holder's name, and the
    /// very object where the grant recorded its UID (any claim of that name where it did
    /// not).
    pub fn granted_on(&self, claim: &Claim) -> bool {
        claim.identity == self.identity
            && self.claim.as_ref().is_none_or(|name| *name == claim.name)
            && self.claim_uid.as_ref().is_none_or(|uid| *uid == claim.uid)
    }
}

/// The claim among `found` that a slot Lease shows a hold was granted on: the hold's, or,
/// on a Lease its holder gave back, the one the Lease still names. Such a claim has been
/// served.
pub fn served_on<'a>(lease: &Lease, state: &LeaseState, found: &'a [Claim]) -> Option<&'a Claim> {
    match state {
        LeaseState::Held(h) if h.claim.is_some() => found.iter().find(|c| h.granted_on(c)),
        LeaseState::Free => edit::claim_uid(lease).and_then(|uid| found.iter().find(|c| c.uid == uid)),
        _ => None,
    }
}

/// The mode a slot Lease was granted in: `Write` only when it says so.
pub fn mode_of(lease: &Lease) -> ClaimMode {
    match lease.annotations().get(ANNOTATION_MODE).map(String::as_str) {
        Some("Write") => ClaimMode::Write,
        _ => ClaimMode::Read,
    }
}

/// A LockClaim as the queue sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// LockClaim name.
    pub name: String,
    /// Its UID (a re-created claim is a new claim).
    pub uid: String,
    /// Its resourceVersion, for precondition deletes.
    pub resource_version: String,
    /// The claimant.
    pub identity: Identity,
    /// Server-side creation time (seconds).
    pub created: Timestamp,
    /// The claimant's own claim time (microseconds), the tie-breaker within a second.
    pub requested: Timestamp,
    /// Latest refresh (what changes when the claimant refreshes it).
    pub renew_time: Option<MicroTime>,
    /// How long it lives without refresh (its `ttlSeconds`, capped).
    pub ttl: Duration,
    /// What it asks for.
    pub mode: ClaimMode,
}

/// Reads a LockClaim of `lock` with the lock's `timing`; `None` if it is not a
/// well-formed claim on `lock`: its name must be the one its claimant's identity gives
/// (`<lock>.<pod-uid>`, or `<lock>.u-...` for a claimant outside a Pod) and, for a Pod,
/// `spec.pod` must name the Pod of the identity. Anything else is never served. Its TTL is
/// what it asks, capped at the lifetime a claimant asks after the wait the claim shows
/// (its latest refresh after its request, both on the claimant's own clock:
/// [`Timing::claim_lifetime`]): a claim refreshed after a long wait may live long, but a
/// new one never outlives three lease durations (30 s at least) unrefreshed, whatever it
/// asks.
pub fn claim(object: &LockClaim, lock: &str, timing: &Timing) -> Option<Claim> {
    let spec = &object.spec;
    if spec.lock != lock {
        return None;
    }
    let identity = Identity::parse(&spec.claimant);
    let name = object.name_any();
    let well_named = match &identity.pod {
        Some(pod) => spec.pod.as_deref() == Some(pod.name.as_str()),
        None => spec.pod.is_none() && name.strip_prefix(lock).is_some_and(|s| s.starts_with(".u-")),
    };
    if !well_named || name != identity.claim_name(lock) {
        return None;
    }
    let created = object.metadata.creation_timestamp.as_ref()?.0;
    // The claimant's own clock orders claims within the apiserver's second; a clock that
    // is far off must not buy (or cost) more than that second.
    let latest = created.checked_add(jiff::SignedDuration::from_millis(999)).unwrap_or(created);
    let ttl = edit::allowed_lifetime(spec, timing);
    Some(Claim {
        name,
        uid: object.uid()?,
        resource_version: object.resource_version()?,
        identity,
        created,
        requested: spec.request_time.0.clamp(created, latest),
        renew_time: Some(spec.renew_time.clone()),
        ttl,
        mode: spec.mode.unwrap_or_default(),
    })
}

/// A claim by `u-<who>` (UID `uid-<who>`) made at second `created_s`, for tests.
#[cfg(test)]
pub(crate) fn test_claim(who: &str, created_s: i64) -> Claim {
    let t = Timestamp::from_second(created_s).expect("valid");
    Claim {
        mode: ClaimMode::Read,
        name: format!("orders.u-{who}"),
        uid: format!("uid-{who}"),
        resource_version: "1".into(),
        identity: Identity::parse(&format!("u-{who}")),
        created: t,
        requested: t,
        renew_time: None,
        ttl: Duration::from_secs(30),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn owned_lease(kind: &str, name: &str, uid: &str, labelled: bool) -> Lease {
        let labels =
            labelled.then(|| [(LABEL_ROLE.into(), ROLE_LOCK.into()), (LABEL_LOCK.into(), "orders".into())].into());
        Lease {
            metadata: ObjectMeta {
                name: Some("orders".into()),
                labels,
                owner_references: Some(vec![OwnerReference {
                    api_version: "leasehold.dev/v1alpha1".into(),
                    kind: kind.into(),
                    name: name.into(),
                    uid: uid.into(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            spec: None,
        }
    }

    const UID: &str = "0b8f3a1e-5d2c-4c55-9a57-2f3c1e7b9d10";

    #[test]
    fn the_claim_a_hold_was_granted_on_is_served_while_held_and_once_given_back() {
        use crate::controller::build;
        use crate::lease::GrantedTiming;
        let lock = crate::crd::DistributedLock::new("orders", crate::crd::DistributedLockSpec::default());
        let terms = GrantedTiming::of_spec(&lock.spec);
        let t = Timestamp::from_second(1_000).expect("valid");
        let free = build::new_lock_lease(&lock, 0, 7);
        let (a, b) = (test_claim("a", 1_000), test_claim("b", 1_000));
        let granted = build::granted(&free, &a, 8, &terms, t, None);
        let given_back = edit::given_back(&granted, &a.identity, 8).expect("a's hold is given back");
        let revoked = build::draining(&granted, 9, "Expired", Some(8));
        let found = [b.clone(), a.clone()];
        // (case, Lease, claims found, the claim served)
        let cases: [(&str, &Lease, &[Claim], Option<&str>); 6] = [
            ("held on a", &granted, &found, Some("uid-a")),
            ("held on a, a's claim gone", &granted, std::slice::from_ref(&b), None),
            ("given back by a, naming its claim", &given_back, &found, Some("uid-a")),
            ("given back by a, a's claim gone", &given_back, std::slice::from_ref(&b), None),
            ("never granted", &free, &found, None),
            ("revoked: drained, not served by a release", &revoked, &found, None),
        ];
        for (case, lease, found, want) in cases {
            let got = served_on(lease, &lease_state(lease), found).map(|c| c.uid.as_str());
            assert_eq!(got, want, "{case}");
        }
    }

    fn lock_claim(name: &str, spec: serde_json::Value) -> LockClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": "u", "resourceVersion": "1", "creationTimestamp": "2026-11-30T10:00:05Z"},
            "spec": spec,
        }))
        .expect("a LockClaim")
    }

    fn spec(claimant: &str, pod: Option<&str>, requested: &str, ttl: i32) -> serde_json::Value {
        let mut spec = serde_json::json!({"lock": "orders", "claimant": claimant, "requestTime": requested,
                                          "renewTime": requested, "ttlSeconds": ttl});
        if let Some(pod) = pod {
            spec["pod"] = serde_json::json!(pod);
        }
        spec
    }

    #[test]
    fn a_claimants_clock_only_orders_within_the_apiservers_second() {
        let claim_at = |requested: &str| {
            let object = lock_claim("orders.u-h-1", spec("alice/u-h-1", None, requested, 45));
            claim(&object, "orders", &fast()).expect("a claim").requested.to_string()
        };
        assert_eq!(claim_at("2026-11-30T10:00:05.250000Z"), "2026-11-30T10:00:05.25Z");
        // An hour behind or ahead buys no place beyond its second.
        assert_eq!(claim_at("2026-11-30T09:00:05.250000Z"), "2026-11-30T10:00:05Z");
        assert_eq!(claim_at("2026-11-30T11:00:05.250000Z"), "2026-11-30T10:00:05.999Z");
    }

    /// The fastest timing: lease 3 s, so a new claim lives 30 s at most.
    fn fast() -> Timing {
        Timing {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_claim_lives_what_it_asks_up_to_three_times_the_wait_it_shows_between_30_s_and_10_min() {
        let requested = "2026-11-30T10:00:05.250000Z";
        // (renewTime, ttlSeconds asked, TTL read)
        let cases = [
            ("2026-11-30T10:00:05.250000Z", 3600, 30), // new: the first lifetime
            ("2026-11-30T10:00:05.250000Z", 20, 20),   // asks less: what it asks
            ("2026-11-30T10:00:25.250000Z", 3600, 60), // refreshed after 20 s: three times that
            ("2026-11-30T10:00:25.250000Z", 45, 45),
            ("2026-11-30T10:02:05.250000Z", 3600, 360),
            ("2026-11-30T11:00:05.250000Z", 3600, 600), // the cap
            ("2026-11-30T09:00:05.250000Z", 3600, 30),  // a refresh before its request: no wait
        ];
        for (renewed, asked, expected) in cases {
            let mut spec = spec("alice/u-h-1", None, requested, asked);
            spec["renewTime"] = serde_json::json!(renewed);
            let read = claim(&lock_claim("orders.u-h-1", spec), "orders", &fast()).expect("a claim");
            assert_eq!(read.ttl.as_secs(), expected, "renewed {renewed}, asked {asked}");
        }
    }

    #[test]
    fn claim_reading_table() {
        let t = "2026-11-30T10:00:05.250000Z";
        let pod_id = format!("w-0_{UID}");
        let cap = fast();
        // (name, spec, expected TTL if well-formed)
        let cases = [
            (format!("orders.{UID}"), spec(&pod_id, Some("w-0"), t, 20), Some(20)),
            (format!("orders.{UID}"), spec(&pod_id, Some("w-0"), t, 3600), Some(30)), // capped
            ("orders.u-h-1".to_owned(), spec("alice/u-h-1", None, t, 45), Some(30)),
            ("orders.u-h-1".to_owned(), spec("u-h-1", None, t, 10), Some(10)), // no user name: still its own
            (format!("orders.{UID}"), spec(&pod_id, Some("w-1"), t, 20), None), // pod differs from identity
            (format!("orders.{UID}"), spec(&pod_id, None, t, 20), None),       // pod missing
            ("orders.other".to_owned(), spec(&pod_id, Some("w-0"), t, 20), None), // name not the claimant's
            ("orders.u-h-2".to_owned(), spec("alice/u-h-1", None, t, 45), None), // another claimant's name
            ("orders.h-1".to_owned(), spec("alice/h-1", None, t, 45), None),   // suffix without u-
            ("orders.u-h-1".to_owned(), spec("alice/u-h-1", Some("p"), t, 45), None), // pod on a non-pod claimant
        ];
        for (name, spec, expected) in cases {
            let read = claim(&lock_claim(&name, spec.clone()), "orders", &cap);
            assert_eq!(read.as_ref().map(|c| c.ttl.as_secs()), expected, "{name} {spec}");
            assert!(claim(&lock_claim(&name, spec), "billing", &cap).is_none(), "a claim on another lock");
        }
    }

    #[test]
    fn ownership_table() {
        let ours = |kind: &str, uid: &str, labelled: bool| {
            ownership(&owned_lease(kind, "orders", uid, labelled), "orders", uid)
        };
        assert_eq!(ours("DistributedLock", "u1", true), Ownership::Ours);
        assert_eq!(
            ownership(&owned_lease("DistributedLock", "orders", "u0", true), "orders", "u1"),
            Ownership::PreviousIncarnation
        );
        // Labels removed: neither ours nor ours to adopt, whatever the owner reference says.
        assert!(
            matches!(ours("DistributedLock", "u1", false), Ownership::Foreign(why) if why.contains("lacks the labels"))
        );
        assert!(matches!(
            ownership(&owned_lease("DistributedLock", "orders", "u0", false), "orders", "u1"),
            Ownership::Foreign(_)
        ));
        // Labelled for another lock, or with another role.
        let mut other = owned_lease("DistributedLock", "orders", "u1", true);
        other.labels_mut().insert(LABEL_LOCK.into(), "billing".into());
        assert!(matches!(ownership(&other, "orders", "u1"), Ownership::Foreign(_)));
        let mut role = owned_lease("DistributedLock", "orders", "u1", true);
        role.labels_mut().insert(LABEL_ROLE.into(), "claim".into());
        assert!(matches!(ownership(&role, "orders", "u1"), Ownership::Foreign(_)));
        // Controlled by something else, or by nothing.
        assert!(matches!(ours("Deployment", "u1", true), Ownership::Foreign(_)));
        let mut not_controller = owned_lease("DistributedLock", "orders", "u1", true);
        not_controller.owner_references_mut()[0].controller = None;
        assert!(matches!(ownership(&not_controller, "orders", "u1"), Ownership::Foreign(_)));
        assert!(matches!(ownership(&Lease::default(), "orders", "u1"), Ownership::Foreign(_)));
    }

    fn lock_lease(holder: Option<&str>, annotations: &[(&str, &str)]) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "orders", "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>()},
            "spec": {"holderIdentity": holder, "acquireTime": "2026-11-30T10:00:05.000000Z", "renewTime": "2026-11-30T10:00:06.000000Z"},
        }))
        .expect("a Lease")
    }

    #[test]
    fn lease_state_table() {
        use crate::crd::{ANNOTATION_DRAINING, ANNOTATION_TOKEN};
        let holder = format!("w-0_{UID}");
        let free = lock_lease(None, &[(ANNOTATION_TOKEN, "7")]);
        assert_eq!(lease_state(&free), LeaseState::Free);
        let held = lock_lease(Some(&holder), &[(ANNOTATION_TOKEN, "7"), (ANNOTATION_CLAIM, "orders.x")]);
        let LeaseState::Held(hold) = lease_state(&held) else { panic!("held") };
        assert_eq!((hold.token, hold.confirmed, hold.claim.as_deref()), (Some(7), true, Some("orders.x")));
        assert_eq!(hold.identity.pod.expect("a pod").name, "w-0");
        let revoked = [(ANNOTATION_TOKEN, "8"), (ANNOTATION_DRAINING, "7"), (ANNOTATION_REVOKED, "Forced")];
        let draining = lock_lease(Some(&holder), &revoked);
        assert_eq!(
            lease_state(&draining),
            LeaseState::Draining(LeaseDrain {
                holder: Some(Identity::parse(&holder)),
                revoked: Some(7),
                reason: Some("Forced".into()),
                mode: ClaimMode::Read,
            })
        );
        assert_eq!(lease_hold(&draining), None, "a draining Lease grants nothing");
        let acknowledged = lock_lease(None, &revoked);
        assert!(matches!(
            lease_state(&acknowledged),
            LeaseState::Draining(LeaseDrain { holder: None, revoked: Some(7), .. })
        ));
        let garbled = lock_lease(Some(&holder), &[(ANNOTATION_TOKEN, "8"), (ANNOTATION_DRAINING, "seven")]);
        assert!(matches!(lease_state(&garbled), LeaseState::Draining(LeaseDrain { revoked: None, .. })));
    }

    #[test]
    fn a_hold_is_granted_on_the_claim_object_its_grant_recorded() {
        use crate::crd::{ANNOTATION_CLAIM_UID, ANNOTATION_TOKEN};
        let holder = format!("w-0_{UID}");
        let claim = |name: &str, uid: &str, claimant: &str| Claim {
            mode: ClaimMode::Read,
            name: name.into(),
            uid: uid.into(),
            resource_version: "1".into(),
            identity: Identity::parse(claimant),
            created: Timestamp::UNIX_EPOCH,
            requested: Timestamp::UNIX_EPOCH,
            renew_time: None,
            ttl: Duration::from_secs(30),
        };
        let recorded = [(ANNOTATION_TOKEN, "7"), (ANNOTATION_CLAIM, "orders.x"), (ANNOTATION_CLAIM_UID, "uid-1")];
        let name_only = [(ANNOTATION_TOKEN, "7"), (ANNOTATION_CLAIM, "orders.x")];
        let neither = [(ANNOTATION_TOKEN, "7")];
        type Annotations<'a> = &'a [(&'a str, &'a str)];
        let cases: [(&str, Annotations, Claim, bool); 7] = [
            ("the granted claim", &recorded, claim("orders.x", "uid-1", &holder), true),
            ("a later claim in the holder's name", &recorded, claim("orders.x", "uid-2", &holder), false),
            ("another claimant's claim", &recorded, claim("orders.x", "uid-1", "w-1_other"), false),
            ("another name", &recorded, claim("orders.y", "uid-1", &holder), false),
            ("no UID recorded: by name", &name_only, claim("orders.x", "uid-2", &holder), true),
            ("no UID recorded, another name", &name_only, claim("orders.y", "uid-2", &holder), false),
            ("nothing recorded: by claimant", &neither, claim("orders.y", "uid-2", &holder), true),
        ];
        for (name, annotations, claim, expected) in cases {
            let hold = lease_hold(&lock_lease(Some(&holder), annotations)).expect("held");
            assert_eq!(hold.granted_on(&claim), expected, "{name}");
        }
    }
}
