//! A lock's current state as the webhooks see it, read fresh from the apiserver on every
//! admission (a cache could lag a grant): its current token and who holds it.
//!
//! Only the lock's own Lease counts: one labelled `leasehold.dev/role: lock` and
//! `leasehold.dev/lock: <lock>`, controlled by this very DistributedLock (its UID). Anyone
//! allowed to create Leases in the namespace can create a Lease with a lock's name while
//! the lock has none (a squatter: the controller reports `LeaseConflict` and grants
//! nothing); its annotations must never raise the lock's token or name a holder.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::{Resource, ResourceExt};

use crate::crd::{ANNOTATION_DRAINING, DistributedLock, LABEL_LOCK, LABEL_ROLE, ROLE_LOCK};
use crate::lease::token;

/// What the webhooks know about a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockState {
    /// The highest token issued or reserved: `status.fencingToken` or the lock Lease's
    /// token annotation, whichever is higher.
    pub token: i64,
    /// The current hold, if the lock is held.
    pub hold: Hold,
}

/// Whether and how a lock is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Nobody holds it (or it has no Lease of its own).
    Free,
    /// `holder` holds it with `token`.
    Held {
        /// Holder identity.
        holder: String,
        /// The token of the hold.
        token: i64,
    },
    /// The hold with `token` was revoked; its holder may still believe it holds.
    Draining {
        /// The revoked token.
        token: String,
    },
}

/// Whether `lease` is `lock`'s own lock Lease.
pub fn is_own_lease(lease: &Lease, lock: &DistributedLock) -> bool {
    let name = lock.name_any();
    let labelled = lease.labels().get(LABEL_ROLE).map(String::as_str) == Some(ROLE_LOCK)
        && lease.labels().get(LABEL_LOCK) == Some(&name);
    let controlled = lease.owner_references().iter().any(|o| {
        o.controller == Some(true)
            && o.kind == DistributedLock::kind(&())
            && o.api_version == DistributedLock::api_version(&())
            && o.name == name
            && Some(&o.uid) == lock.meta().uid.as_ref()
    });
    labelled && controlled && lease.name_any() == name
}

/// The state of `lock` given its Lease (if any).
pub fn state(lock: &DistributedLock, lease: Option<&Lease>) -> LockState {
    let from_status = lock.status.as_ref().and_then(|s| s.fencing_token).unwrap_or(0);
    let Some(lease) = lease.filter(|l| is_own_lease(l, lock)) else {
        return LockState { token: from_status, hold: Hold::Free };
    };
    let on_lease = token::of_lease(lease);
    let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty());
    let hold = match (holder, lease.annotations().get(ANNOTATION_DRAINING), on_lease) {
        (None, _, _) => Hold::Free,
        (Some(_), Some(revoked), _) => Hold::Draining { token: revoked.clone() },
        (Some(holder), None, Some(token)) => Hold::Held { holder, token },
        // A hold without a token was not written by a controller: nobody holds.
        (Some(_), None, None) => Hold::Free,
    };
    LockState { token: from_status.max(on_lease.unwrap_or(0)), hold }
}

/// Reads lock `namespace/name` and its Lease; `Ok(None)` if the lock does not exist.
pub async fn read(client: &kube::Client, namespace: &str, name: &str) -> Result<Option<LockState>, String> {
    Ok(read_identified(client, namespace, name).await?.map(|(state, _)| state))
}

/// [`read`], with the lock's UID (an Event about the lock refers to it).
pub async fn read_identified(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<(LockState, Option<String>)>, String> {
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), namespace);
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let Some(lock) = locks.get_opt(name).await.map_err(|e| format!("cannot read lock {namespace}/{name}: {e}"))? else {
        return Ok(None);
    };
    let lease =
        leases.get_opt(name).await.map_err(|e| format!("cannot read the lock Lease {namespace}/{name}: {e}"))?;
    Ok(Some((state(&lock, lease.as_ref()), lock.metadata.uid.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{ANNOTATION_TOKEN, DistributedLockSpec, DistributedLockStatus};
    use serde_json::json;

    fn lock(status_token: Option<i64>) -> DistributedLock {
        let mut lock = DistributedLock::new("orders", DistributedLockSpec::default());
        lock.metadata.uid = Some("uid-1".into());
        lock.status = Some(DistributedLockStatus { fencing_token: status_token, ..Default::default() });
        lock
    }

    fn lease(
        labels: serde_json::Value,
        owner_uid: &str,
        holder: Option<&str>,
        annotations: serde_json::Value,
    ) -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": "orders", "labels": labels, "annotations": annotations,
                "ownerReferences": [{"apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLock",
                    "name": "orders", "uid": owner_uid, "controller": true}]},
            "spec": {"holderIdentity": holder},
        }))
        .expect("a Lease")
    }

    fn own() -> serde_json::Value {
        json!({LABEL_ROLE: ROLE_LOCK, LABEL_LOCK: "orders"})
    }

    #[test]
    fn state_table() {
        let held = Hold::Held { holder: "a_1".into(), token: 40 };
        let cases = [
            // No Lease: the status' token, free.
            (lock(Some(30)), None, LockState { token: 30, hold: Hold::Free }),
            // Its own Lease: the higher token, the holder.
            (
                lock(Some(30)),
                Some(lease(own(), "uid-1", Some("a_1"), json!({ANNOTATION_TOKEN: "40"}))),
                LockState { token: 40, hold: held.clone() },
            ),
            (
                lock(Some(50)),
                Some(lease(own(), "uid-1", Some("a_1"), json!({ANNOTATION_TOKEN: "40"}))),
                LockState { token: 50, hold: held },
            ),
            (
                lock(None),
                Some(lease(own(), "uid-1", None, json!({ANNOTATION_TOKEN: "40"}))),
                LockState { token: 40, hold: Hold::Free },
            ),
            (
                lock(None),
                Some(lease(own(), "uid-1", Some("a_1"), json!({ANNOTATION_TOKEN: "41", ANNOTATION_DRAINING: "40"}))),
                LockState { token: 41, hold: Hold::Draining { token: "40".into() } },
            ),
            (lock(None), Some(lease(own(), "uid-1", Some("a_1"), json!({}))), LockState { token: 0, hold: Hold::Free }),
            // A squatter (no labels, or another owner): neither its token nor its holder count.
            (
                lock(Some(30)),
                Some(lease(json!({}), "uid-1", Some("x"), json!({ANNOTATION_TOKEN: "99999"}))),
                LockState { token: 30, hold: Hold::Free },
            ),
            (
                lock(Some(30)),
                Some(lease(own(), "uid-0", Some("x"), json!({ANNOTATION_TOKEN: "99999"}))),
                LockState { token: 30, hold: Hold::Free },
            ),
        ];
        for (lock, lease, expected) in cases {
            assert_eq!(state(&lock, lease.as_ref()), expected, "{lease:?}");
        }
    }
}
