//! Claimant permissions, prepared per namespace so app pods need no hand-written RBAC.
//!
//! For every namespace with locks, the controller applies a Role `leasehold-client`
//! (Leases: read, watch, create, update, delete; DistributedLocks: read, watch) and a
//! RoleBinding to the lock's `spec.clients` ServiceAccounts — all of the namespace's
//! ServiceAccounts when any lock there leaves `clients` empty. RBAC cannot say "this
//! Lease name only" for create, so the binding is per namespace: the union of the
//! namespace's locks' clients.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::context::Context;
use super::error::Error;
use crate::crd::{DistributedLock, MANAGER_CONTROLLER};

/// Name of the Role and RoleBinding in each namespace.
pub const CLIENT_ROLE: &str = "leasehold-client";

/// Who is bound: ServiceAccount names, or every ServiceAccount of the namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Clients {
    /// Every ServiceAccount in the namespace.
    All,
    /// These ServiceAccounts.
    Named(BTreeSet<String>),
}

/// The clients of a namespace's locks, together.
pub fn clients<'a>(locks: impl IntoIterator<Item = &'a DistributedLock>) -> Clients {
    let mut named = BTreeSet::new();
    for lock in locks {
        if lock.spec.clients.is_empty() {
            return Clients::All;
        }
        named.extend(lock.spec.clients.iter().cloned());
    }
    Clients::Named(named)
}

/// The Role granted to claimants.
pub fn role(namespace: &str) -> Role {
    let rule = |group: &str, resource: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    Role {
        metadata: ObjectMeta {
            name: Some(CLIENT_ROLE.into()),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![
            rule("coordination.k8s.io", "leases", &["get", "list", "watch", "create", "update", "delete"]),
            rule("leasehold.dev", "distributedlocks", &["get", "list", "watch"]),
        ]),
    }
}

/// The RoleBinding of `clients` to the Role.
pub fn binding(namespace: &str, clients: &Clients) -> RoleBinding {
    let subjects = match clients {
        Clients::All => vec![Subject {
            kind: "Group".into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            name: format!("system:serviceaccounts:{namespace}"),
            namespace: None,
        }],
        Clients::Named(names) => names
            .iter()
            .map(|n| Subject {
                kind: "ServiceAccount".into(),
                api_group: None,
                name: n.clone(),
                namespace: Some(namespace.into()),
            })
            .collect(),
    };
    RoleBinding {
        metadata: ObjectMeta {
            name: Some(CLIENT_ROLE.into()),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: CLIENT_ROLE.into(),
        },
        subjects: Some(subjects),
    }
}

/// Applies the Role and RoleBinding of `namespace` if its clients changed since last time.
pub async fn ensure(ctx: &Context, namespace: &str) -> Result<(), Error> {
    let locks = ctx.locks.state();
    let clients = clients(locks.iter().filter(|l| l.namespace().as_deref() == Some(namespace)).map(|l| l.as_ref()));
    let fingerprint = format!("{clients:?}");
    let known = ctx.rbac.lock().expect("rbac memory is never poisoned").get(namespace).cloned();
    if known.as_deref() == Some(fingerprint.as_str()) {
        return Ok(());
    }
    let params = PatchParams::apply(MANAGER_CONTROLLER).force();
    let err = |kind, source| Error::Rbac { kind, namespace: namespace.into(), name: CLIENT_ROLE.into(), source };
    let roles: Api<Role> = Api::namespaced(ctx.client.clone(), namespace);
    let mut role = role(namespace);
    role.metadata.managed_fields = None;
    let body = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": role.metadata, "rules": role.rules});
    roles.patch(CLIENT_ROLE, &params, &Patch::Apply(body)).await.map_err(|e| err("Role", e))?;
    let bindings: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), namespace);
    let binding = binding(namespace, &clients);
    let body = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": binding.metadata, "roleRef": binding.role_ref, "subjects": binding.subjects});
    bindings.patch(CLIENT_ROLE, &params, &Patch::Apply(body)).await.map_err(|e| err("RoleBinding", e))?;
    ctx.rbac.lock().expect("rbac memory is never poisoned").insert(namespace.to_owned(), fingerprint);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::DistributedLockSpec;

    fn lock(clients: &[&str]) -> DistributedLock {
        DistributedLock::new(
            "l",
            DistributedLockSpec { clients: clients.iter().map(|c| (*c).into()).collect(), ..Default::default() },
        )
    }

    #[test]
    fn clients_table() {
        assert_eq!(clients([&lock(&["a"]), &lock(&["b", "a"])]), Clients::Named(["a".into(), "b".into()].into()));
        assert_eq!(clients([&lock(&["a"]), &lock(&[])]), Clients::All);
        assert_eq!(clients([]), Clients::Named(BTreeSet::new()));
    }

    #[test]
    fn binding_subjects() {
        let all = binding("shop", &Clients::All);
        assert_eq!(all.subjects.expect("subjects")[0].name, "system:serviceaccounts:shop");
        let named = binding("shop", &Clients::Named(["worker".into()].into()));
        let s = &named.subjects.expect("subjects")[0];
        assert_eq!(
            (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()),
            ("ServiceAccount", "worker", Some("shop"))
        );
    }
}
