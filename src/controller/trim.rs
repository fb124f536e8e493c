//! What the controller keeps of the objects it caches and remembers.
//!
//! Field managers (`metadata.managedFields`) are never read by the controller, and they are
//! the largest part of a small object once parsed (a tree of maps per manager). They are
//! dropped — the list itself, not only its entries, so that no buffer stays behind — from
//! every object a watch cache keeps and from every Lease the controller remembers having
//! written; the lock Lease watch parses its Leases without them in the first place
//! (`lease::unmanaged`), as every renewal of every lock reaches it. Writing such a Lease
//! back is unchanged: the apiserver keeps an object's field managers when an update
//! carries none.
//!
//! `kubectl apply` keeps a copy of the whole applied object in an annotation of its own
//! ([`LAST_APPLIED`]), as large again as what was applied. Nothing here reads it, and the
//! controller writes locks, claims, Pods and force-release requests only by patch, never
//! by writing a cached copy back, so that copy is dropped from their caches too. Leases
//! keep it: the controller replaces them whole, and a Lease written without it would lose
//! it on the apiserver.

use kube::Resource;

/// The annotation `kubectl apply` keeps its last applied copy of an object in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops `object`'s field managers, with the memory they took.
pub fn forget_field_managers<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// Drops what the controller never reads of an object it only ever patches: its field
/// managers and `kubectl apply`'s copy of it.
pub fn forget_unread<K: Resource>(object: &mut K) {
    forget_field_managers(object);
    let meta = object.meta_mut();
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
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

    #[test]
    fn only_field_managers_and_the_applied_copy_are_forgotten() {
        let with = |annotations: Option<&[(&str, &str)]>, managed| {
            let mut l = lease(managed);
            l.metadata.annotations =
                annotations.map(|a| a.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
            l
        };
        let applied = (LAST_APPLIED, r#"{"apiVersion":"leasehold.dev/v1alpha1","kind":"DistributedLock"}"#);
        let claim = ("leasehold.dev/claim", "c1");
        let table: [(&str, Option<&[_]>, Option<&[_]>); 4] = [
            ("the applied copy beside another annotation", Some(&[applied, claim]), Some(&[claim])),
            ("another annotation only", Some(&[claim]), Some(&[claim])),
            ("the applied copy only: no empty map is left", Some(&[applied]), None),
            ("no annotations", None, None),
        ];
        for (case, before, after) in table {
            let mut object = with(before, Some(vec![manager("kubectl-client-side-apply")]));
            forget_unread(&mut object);
            assert_eq!(object, with(after, None), "{case}");
        }
    }
}
