//! Pure readings of the objects the controller watches: who owns a lock Lease, who holds
//! it, and what a claim Lease says.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;

use crate::claim::edit;
use crate::crd::{ANNOTATION_CLAIM, LABEL_LOCK, LABEL_ROLE, ROLE_CLAIM, ROLE_LOCK};
use crate::lease::{Identity, token};

/// Whose a Lease with a lock's name is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Ours: controlled by this DistributedLock (same UID).
    Ours,
    /// Left by an earlier DistributedLock of the same name (deleted and re-created):
    /// labelled by us and controlled by a DistributedLock of this name with another UID.
    PreviousIncarnation,
    /// Anything else: never touched.
    Foreign(String),
}

/// Classifies the Lease named like lock `lock` whose DistributedLock has UID `uid`.
pub fn ownership(lease: &Lease, lock: &str, uid: &str) -> Ownership {
    let controller = lease.owner_references().iter().find(|o| o.controller == Some(true));
    let labelled = lease.labels().get(LABEL_ROLE).map(String::as_str) == Some(ROLE_LOCK)
        && lease.labels().get(LABEL_LOCK).map(String::as_str) == Some(lock);
    match controller {
        Some(o) if o.kind == "DistributedLock" && o.api_version.starts_with("leasehold.dev/") && o.name == lock => {
            if o.uid == uid {
                Ownership::Ours
            } else if labelled {
                Ownership::PreviousIncarnation
            } else {
                Ownership::Foreign(format!("Lease {lock} is controlled by another DistributedLock (uid {})", o.uid))
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
    /// The holder's claim Lease name, as recorded at grant.
    pub claim: Option<String>,
}

/// The hold on a lock Lease, if any.
pub fn lease_hold(lease: &Lease) -> Option<LeaseHold> {
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
    })
}

/// A claim Lease as the queue sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// Claim Lease name.
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
    /// How long it lives without refresh.
    pub ttl: Duration,
}

/// Reads a claim Lease of `lock`; `None` if it is not a well-formed claim.
pub fn claim(lease: &Lease, lock: &str) -> Option<Claim> {
    if lease.labels().get(LABEL_ROLE).map(String::as_str) != Some(ROLE_CLAIM)
        || lease.labels().get(LABEL_LOCK).map(String::as_str) != Some(lock)
    {
        return None;
    }
    let spec = lease.spec.as_ref()?;
    let created = lease.metadata.creation_timestamp.as_ref()?.0;
    Some(Claim {
        name: lease.name_any(),
        uid: lease.uid()?,
        resource_version: lease.resource_version()?,
        identity: Identity::parse(edit::holder(lease)?),
        created,
        // The claimant's own clock orders claims within the apiserver's second; a clock
        // that is far off must not buy (or cost) more than that second.
        requested: spec.acquire_time.as_ref().map_or(created, |t| {
            let latest = created.checked_add(jiff::SignedDuration::from_millis(999)).unwrap_or(created);
            t.0.clamp(created, latest)
        }),
        renew_time: spec.renew_time.clone(),
        ttl: Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(30).max(1)).unwrap_or(30)),
    })
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

    #[test]
    fn a_claimants_clock_only_orders_within_the_apiservers_second() {
        let claim_at = |requested: &str| {
            let lease: Lease = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "orders.x", "uid": "u", "resourceVersion": "1", "creationTimestamp": "2026-11-30T10:00:05Z",
                             "labels": {LABEL_ROLE: ROLE_CLAIM, LABEL_LOCK: "orders"}},
                "spec": {"holderIdentity": "w", "acquireTime": requested},
            }))
            .expect("a lease");
            claim(&lease, "orders").expect("a claim").requested.to_string()
        };
        assert_eq!(claim_at("2026-11-30T10:00:05.250000Z"), "2026-11-30T10:00:05.25Z");
        // An hour behind or ahead buys no place beyond its second.
        assert_eq!(claim_at("2026-11-30T09:00:05.250000Z"), "2026-11-30T10:00:05Z");
        assert_eq!(claim_at("2026-11-30T11:00:05.250000Z"), "2026-11-30T10:00:05.999Z");
    }

    #[test]
    fn ownership_table() {
        assert_eq!(ownership(&owned_lease("DistributedLock", "orders", "u1", true), "orders", "u1"), Ownership::Ours);
        assert_eq!(
            ownership(&owned_lease("DistributedLock", "orders", "u0", true), "orders", "u1"),
            Ownership::PreviousIncarnation
        );
        // Labels removed: not ours to adopt.
        assert!(matches!(
            ownership(&owned_lease("DistributedLock", "orders", "u0", false), "orders", "u1"),
            Ownership::Foreign(_)
        ));
        assert!(matches!(
            ownership(&owned_lease("Deployment", "orders", "u1", true), "orders", "u1"),
            Ownership::Foreign(_)
        ));
        assert!(matches!(ownership(&Lease::default(), "orders", "u1"), Ownership::Foreign(_)));
    }
}
