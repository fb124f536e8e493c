//! A lock's current state as the webhooks see it, read fresh from the apiserver on every
//! admission (a cache could lag a grant): its current token and who holds it.
//!
//! Only the lock's own Lease counts: one labelled `leasehold.dev/role: lock` and
//! `leasehold.dev/lock: <lock>`, controlled by this very DistributedLock (its UID). Anyone
//! allowed to create Leases in the namespace can create a Lease with a lock's name while
//! the lock has none (a squatter: the controller reports `LeaseConflict` and grants
//! nothing); its annotations must never raise the lock's token or name a holder.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};

use crate::crd::{ANNOTATION_DRAINING, DistributedLock, LABEL_LOCK, LABEL_ROLE, ROLE_LOCK};
use crate::lease::{slot, token};

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

/// Whether `lease` is one of `lock`'s own slot Leases.
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
    labelled && controlled && slot::of_lease_name(&name, &lease.name_any()).is_some()
}

/// The state of `lock` given its Lease (if any).
pub fn state(lock: &DistributedLock, lease: Option<&Lease>) -> LockState {
    slot_state(lock, lease, false)
}

/// The state of one slot of `lock` given its slot Lease (if any). Fenced per slot
/// (`per_slot`), the current token is the slot's own; without its Lease (the slot is gone
/// since the lock shrank, or not made yet) it is the lock's highest, which no holder of
/// that slot can present.
fn slot_state(lock: &DistributedLock, lease: Option<&Lease>, per_slot: bool) -> LockState {
    let from_status = lock.status.as_ref().and_then(|s| s.fencing_token).unwrap_or(0);
    let Some(lease) = lease.filter(|l| is_own_lease(l, lock)) else {
        return LockState { token: from_status, hold: Hold::Free };
    };
    let from_status = if per_slot { 0 } else { from_status };
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

/// What an object's `leasehold.dev/fenced-by` names: a lock as a whole (`<lock>`), or
/// one permit slot of it (`<lock>.<slot>`, slot 0 included); `None` if it can name
/// neither.
pub fn fenced_by(value: &str) -> Option<(&str, Option<u32>)> {
    match value.split_once('.') {
        None => Some((value, None)),
        Some((lock, "0")) => Some((lock, Some(0))),
        Some((lock, _)) => slot::of_lease_name(lock, value).map(|s| (lock, Some(s))),
    }
}

/// Reads lock `namespace/name` and its Lease; `Ok(None)` if the lock does not exist.
pub async fn read(client: &kube::Client, namespace: &str, name: &str) -> Result<Option<LockState>, String> {
    let read = read_lease(client, namespace, name).await?;
    Ok(read.map(|(lock, lease, slot)| slot_state(&lock, lease.as_ref(), slot.is_some())))
}

/// For a fenced write: lock `namespace/name`'s current token (and the lock's UID, which
/// an Event about it refers to); `Ok(None)` if the lock does not exist. `Err` while the
/// lock has no Lease of its own for the slot (see [`fencing_state`]).
pub async fn read_identified(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<(LockState, Option<String>)>, String> {
    let Some((lock, lease, slot)) = read_lease(client, namespace, name).await? else { return Ok(None) };
    let state = fencing_state(&lock, lease.as_ref(), slot).map_err(|why| format!("lock {namespace}/{name}: {why}"))?;
    Ok(Some((state, lock.metadata.uid.clone())))
}

/// The current token a fenced write is judged against, from the lock and the Lease of the
/// slot it names (`None`: the lock as a whole, slot 0's Lease). Without a Lease of its own
/// the current token cannot be known: the last one may be on a Lease deleted a moment ago
/// that the lock's status does not show yet (the controller re-creates a deleted Lease
/// with a raised token, and records it in status after), so the write is refused rather
/// than judged against an older token.
pub fn fencing_state(lock: &DistributedLock, lease: Option<&Lease>, slot: Option<u32>) -> Result<LockState, String> {
    if lease.is_some_and(|l| is_own_lease(l, lock)) {
        return Ok(slot_state(lock, lease, slot.is_some()));
    }
    let slot_number = slot.unwrap_or(0);
    let permits = u32::try_from(lock.spec.permits).unwrap_or(1).max(1);
    if slot_number >= permits {
        return Err(format!(
            "it has no slot {slot_number} (its permits are {permits}): nothing holds it, so nothing fenced by it can be written"
        ));
    }
    let which = slot.map_or_else(|| "no Lease".to_owned(), |s| format!("no Lease for slot {s}"));
    Err(format!(
        "it has {which} of its own right now (the controller re-creates a deleted one at once): its current token cannot be read, so the write is refused; try again"
    ))
}

/// Reads lock `namespace/name` (which may name one slot, `<lock>.<slot>`) and that slot's
/// Lease; `Ok(None)` if the lock does not exist.
async fn read_lease(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<(DistributedLock, Option<Lease>, Option<u32>)>, String> {
    // `name` may name one slot of a lock: `<lock>.<slot>`.
    let Some((lock_name, slot)) = fenced_by(name) else { return Ok(None) };
    let lease_name = slot::lease_name(lock_name, slot.unwrap_or(0));
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), namespace);
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let read = locks.get_opt(lock_name).await.map_err(|e| format!("cannot read lock {namespace}/{lock_name}: {e}"))?;
    let Some(lock) = read else { return Ok(None) };
    let lease = leases
        .get_opt(&lease_name)
        .await
        .map_err(|e| format!("cannot read the lock Lease {namespace}/{lease_name}: {e}"))?;
    Ok(Some((lock, lease, slot)))
}

/// The hold on every slot Lease of lock `namespace/name` (one for a mutex); `Ok(None)` if
/// the lock does not exist.
pub async fn read_holds(client: &kube::Client, namespace: &str, name: &str) -> Result<Option<Vec<Hold>>, String> {
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), namespace);
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let read = locks.get_opt(name).await.map_err(|e| format!("cannot read lock {namespace}/{name}: {e}"))?;
    let Some(lock) = read else { return Ok(None) };
    let selector = ListParams::default().labels(&format!("{LABEL_LOCK}={name},{LABEL_ROLE}={ROLE_LOCK}"));
    let listed =
        leases.list(&selector).await.map_err(|e| format!("cannot list the Leases of lock {namespace}/{name}: {e}"))?;
    let holds: Vec<Hold> =
        listed.items.iter().filter(|l| is_own_lease(l, &lock)).map(|l| slot_state(&lock, Some(l), true).hold).collect();
    Ok(Some(if holds.is_empty() { vec![Hold::Free] } else { holds }))
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
    fn a_fenced_write_is_judged_only_against_a_lease_of_the_locks_own() {
        // The lock's status still says 40; the Lease it last raised to 41 is gone.
        let state = fencing_state(&lock(Some(40)), None, None).expect_err("no Lease: unknown");
        assert_eq!(
            state,
            "it has no Lease of its own right now (the controller re-creates a deleted one at once): its current token cannot be read, so the write is refused; try again"
        );
        let squatter = lease(json!({}), "uid-1", Some("mallory"), json!({ANNOTATION_TOKEN: "99"}));
        assert!(fencing_state(&lock(Some(40)), Some(&squatter), None).is_err(), "a squatter's Lease decides nothing");
        let slot = fencing_state(&lock(Some(40)), None, Some(0)).expect_err("no Lease for the slot");
        assert!(slot.contains("no Lease for slot 0"), "{slot}");
        let above = fencing_state(&lock(Some(40)), None, Some(3)).expect_err("no such slot");
        assert!(above.contains("no slot 3 (its permits are 1)"), "{above}");
        let held = lease(own(), "uid-1", Some("a_1"), json!({ANNOTATION_TOKEN: "41"}));
        let state = fencing_state(&lock(Some(40)), Some(&held), None).expect("its own Lease");
        assert_eq!(state, LockState { token: 41, hold: Hold::Held { holder: "a_1".into(), token: 41 } });
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

    #[test]
    fn a_slot_is_fenced_by_its_own_token_and_a_missing_slot_by_the_locks_highest() {
        let mut slot = lease(own(), "uid-1", Some("a_1"), json!({ANNOTATION_TOKEN: "40"}));
        slot.metadata.name = Some("orders.2".into());
        assert!(is_own_lease(&slot, &lock(None)));
        // The lock's status records a higher token, granted on another slot.
        let state = slot_state(&lock(Some(55)), Some(&slot), true);
        assert_eq!(state, LockState { token: 40, hold: Hold::Held { holder: "a_1".into(), token: 40 } });
        // Fenced by the lock as a whole, the lock's highest token counts.
        assert_eq!(slot_state(&lock(Some(55)), Some(&slot), false).token, 55);
        // The slot's Lease gone: nobody presents the lock's highest token for it.
        assert_eq!(slot_state(&lock(Some(55)), None, true), LockState { token: 55, hold: Hold::Free });
        // A Lease named like another lock's slot is not this lock's.
        slot.metadata.name = Some("other.2".into());
        assert!(!is_own_lease(&slot, &lock(None)));
    }

    #[test]
    fn fenced_by_names_a_lock_or_one_of_its_slots_in_one_spelling() {
        assert_eq!(fenced_by("orders"), Some(("orders", None)));
        assert_eq!(fenced_by("orders.0"), Some(("orders", Some(0))));
        assert_eq!(fenced_by("orders.3"), Some(("orders", Some(3))));
        for bad in ["orders.00", "orders.03", "orders.x", "orders.", "orders.64", "orders.-1"] {
            assert_eq!(fenced_by(bad), None, "{bad}");
        }
    }
}
