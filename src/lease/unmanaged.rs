//! Leases read without their field managers.
//!
//! Every change of a lock's Lease reaches every claimant waiting on it, so a claimant
//! parses many more Lease states than it writes. Most of what it would build from each is
//! `metadata.managedFields`: a tree of JSON maps per field manager, which no claimant
//! reads, and which cost as much again to free as to build. [`UnmanagedLease`] parses past
//! them without building anything. A Lease read this way and written back carries no field
//! managers, and the apiserver then keeps the ones it has (as for the controller's trimmed
//! copies). The controller's cache of lock Leases is fed the same way ([`lease_event`]):
//! every renewal of every lock reaches it.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::runtime::watcher;
use serde::{Deserialize, Deserializer};

/// A Lease as the apiserver sends it, with `metadata.managedFields` skipped while parsing.
/// It reads and watches as a Lease does (`kube::Api<UnmanagedLease>` addresses Leases).
#[derive(Clone, Debug)]
pub struct UnmanagedLease(pub Lease);

impl k8s_openapi::Resource for UnmanagedLease {
    const API_VERSION: &'static str = <Lease as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Lease as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Lease as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Lease as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Lease as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Lease as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for UnmanagedLease {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

impl<'de> Deserialize<'de> for UnmanagedLease {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Body { metadata, spec } = Body::deserialize(deserializer)?;
        Ok(UnmanagedLease(Lease { metadata: metadata.into(), spec }))
    }
}

/// A watch event of Leases read without their field managers, as the Leases it carries.
pub fn lease_event(event: watcher::Event<UnmanagedLease>) -> watcher::Event<Lease> {
    match event {
        watcher::Event::Apply(UnmanagedLease(lease)) => watcher::Event::Apply(lease),
        watcher::Event::Delete(UnmanagedLease(lease)) => watcher::Event::Delete(lease),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(UnmanagedLease(lease)) => watcher::Event::InitApply(lease),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// A Lease's fields; `apiVersion` and `kind` are skipped, as the object's type is known.
#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    metadata: Meta,
    spec: Option<LeaseSpec>,
}

/// [`ObjectMeta`]'s fields but `managedFields`, which serde skips as an unknown key. The
/// test `every_field_but_the_managers_is_read` builds an `ObjectMeta` naming every field,
/// so a field added to it fails to compile there until it is added here.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl From<Meta> for ObjectMeta {
    fn from(m: Meta) -> ObjectMeta {
        ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, MicroTime};
    use kube::Resource;

    use super::*;

    fn time(s: &str) -> Time {
        Time(s.parse().expect("a valid timestamp"))
    }

    fn map(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
    }

    /// A Lease with every metadata field set (named one by one: no `..Default::default()`),
    /// and two field managers.
    fn full_lease() -> Lease {
        let manager = |name: &str| ManagedFieldsEntry {
            api_version: Some("coordination.k8s.io/v1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({"f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}}))),
            manager: Some(name.into()),
            operation: Some("Update".into()),
            subresource: None,
            time: Some(time("2026-12-07T04:00:00Z")),
        };
        Lease {
            metadata: ObjectMeta {
                annotations: map(&[("leasehold.dev/fencing-token", "42")]),
                creation_timestamp: Some(time("2026-12-07T03:00:00Z")),
                deletion_grace_period_seconds: Some(0),
                deletion_timestamp: Some(time("2026-12-07T05:00:00Z")),
                finalizers: Some(vec!["leasehold.dev/lease".into()]),
                generate_name: Some("lock-".into()),
                generation: Some(3),
                labels: map(&[("leasehold.dev/lock", "db"), ("leasehold.dev/slot", "0")]),
                managed_fields: Some(vec![manager("leasehold-controller"), manager("leasehold-sidecar")]),
                name: Some("db".into()),
                namespace: Some("apps".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "leasehold.dev/v1alpha1".into(),
                    block_owner_deletion: Some(true),
                    controller: Some(true),
                    kind: "DistributedLock".into(),
                    name: "db".into(),
                    uid: "d1".into(),
                }]),
                resource_version: Some("1234".into()),
                self_link: Some("/apis/coordination.k8s.io/v1/namespaces/apps/leases/db".into()),
                uid: Some("u1".into()),
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("apps/worker-0".into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime("2026-12-07T04:00:01.123456Z".parse().expect("a valid timestamp"))),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn every_field_but_the_managers_is_read() {
        let json = serde_json::to_string(&full_lease()).expect("a Lease serializes");
        let read: UnmanagedLease = serde_json::from_str(&json).expect("the Lease parses");
        let mut expected = full_lease();
        expected.metadata.managed_fields = None;
        assert_eq!(read.0, expected);
    }

    #[test]
    fn what_a_watch_sends_parses_as_its_lease_does() {
        let cases = [
            ("no metadata, no spec", serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"})),
            (
                "nulls",
                serde_json::json!({"metadata": {"name": "db", "managedFields": null, "labels": null}, "spec": null}),
            ),
            (
                "a watch event's object",
                serde_json::json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": "db", "resourceVersion": "7", "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]},
                    "spec": {"holderIdentity": "apps/a", "leaseDurationSeconds": 15}
                }),
            ),
        ];
        for (name, json) in cases {
            let read: UnmanagedLease = serde_json::from_value(json.clone()).expect(name);
            let mut expected: Lease = serde_json::from_value(json).expect(name);
            expected.metadata.managed_fields = None;
            assert_eq!(read.0, expected, "{name}");
        }
    }

    #[test]
    fn it_is_addressed_as_a_lease() {
        assert_eq!(UnmanagedLease::kind(&()), Lease::kind(&()));
        assert_eq!(UnmanagedLease::api_version(&()), Lease::api_version(&()));
        assert_eq!(UnmanagedLease::plural(&()), Lease::plural(&()));
        assert_eq!(UnmanagedLease::url_path(&(), Some("apps")), Lease::url_path(&(), Some("apps")));
    }

    #[test]
    fn a_watch_event_carries_the_same_lease_in_the_same_kind_of_event() {
        let lease = || {
            let mut lease = full_lease();
            lease.metadata.managed_fields = None;
            lease
        };
        let table: [(&str, watcher::Event<UnmanagedLease>, watcher::Event<Lease>); 5] = [
            ("apply", watcher::Event::Apply(UnmanagedLease(lease())), watcher::Event::Apply(lease())),
            ("delete", watcher::Event::Delete(UnmanagedLease(lease())), watcher::Event::Delete(lease())),
            ("init", watcher::Event::Init, watcher::Event::Init),
            ("init apply", watcher::Event::InitApply(UnmanagedLease(lease())), watcher::Event::InitApply(lease())),
            ("init done", watcher::Event::InitDone, watcher::Event::InitDone),
        ];
        for (name, event, expected) in table {
            let got = lease_event(event);
            assert_eq!(std::mem::discriminant(&got), std::mem::discriminant(&expected), "{name}");
            let leases = |e: watcher::Event<Lease>| match e {
                watcher::Event::Apply(l) | watcher::Event::Delete(l) | watcher::Event::InitApply(l) => Some(l),
                watcher::Event::Init | watcher::Event::InitDone => None,
            };
            assert_eq!(leases(got), leases(expected), "{name}");
        }
    }
}
