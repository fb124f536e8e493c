//! What the controller keeps of the objects it caches and remembers.
//!
//! Field managers (`metadata.managedFields`) are never read by the controller, and they are
//! the largest part of a small object once parsed (a tree of maps per manager). They are
//! dropped — the list itself, not only its entries, so that no buffer stays behind — from
//! every object a watch cache keeps and from every Lease the controller remembers having
//! written. Writing such a Lease back is unchanged: the apiserver keeps an object's field
//! managers when an update carries none.

use kube::Resource;

/// Drops `object`'s field managers, with the memory they took.
pub fn forget_field_managers<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta, OwnerReference};
    use serde_json::json;

    fn lease(managed: Option<Vec<ManagedFieldsEntry>>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("orders".into()),
                namespace: Some("shop".into()),
                uid: Some("u1".into()),
                resource_version: Some("42".into()),
                labels: Some([("leasehold.dev/lock".to_owned(), "orders".to_owned())].into()),
                annotations: Some([("leasehold.dev/claim".to_owned(), "c1".to_owned())].into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "leasehold.dev/v1alpha1".into(),
                    kind: "DistributedLock".into(),
                    name: "orders".into(),
                    uid: "l1".into(),
                    ..OwnerReference::default()
                }]),
                managed_fields: managed,
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec { holder_identity: Some("app-0".into()), ..LeaseSpec::default() }),
        }
    }

    fn manager(name: &str) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(name.into()),
            operation: Some("Update".into()),
            fields_v1: Some(FieldsV1(json!({"f:spec": {"f:holderIdentity": {}}}))),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn only_field_managers_are_dropped() {
        let table = [
            ("no field managers", None),
            ("an empty list", Some(vec![])),
            ("one manager", Some(vec![manager("leasehold-controller")])),
            ("two managers", Some(vec![manager("leasehold-controller"), manager("leasehold-sidecar")])),
        ];
        for (case, managed) in table {
            let mut trimmed = lease(managed);
            forget_field_managers(&mut trimmed);
            assert_eq!(trimmed, lease(None), "{case}: everything else is kept, the list is gone");
        }
    }
}
