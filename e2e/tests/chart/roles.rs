//! The chart's aggregated roles on the real control plane: the built-in `edit` and `view`
//! ClusterRoles (filled in by kube-controller-manager's aggregation controller) reach
//! DistributedLocks, so a namespace's editors create and delete locks and its viewers
//! read them, with no Role of their own.

use std::time::Duration;

use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use leasehold::crd::{DistributedLock, DistributedLockSpec, LockClaim};
use serde_json::json;

use super::cluster::ChartCluster;
use crate::support::watch::{until, until_gone};

const WAIT: Duration = Duration::from_secs(30);

/// Binds `user` to the built-in ClusterRole `role` in `namespace`.
async fn bind(cluster: &ChartCluster, namespace: &str, user: &str, role: &str) {
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{user}-{role}"), "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .expect("a RoleBinding");
    Api::<RoleBinding>::namespaced(cluster.admin.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind the user");
}

/// Whether ClusterRole `role` grants `verb` on `resource` of leasehold.dev.
fn grants(role: &ClusterRole, resource: &str, verb: &str) -> bool {
    role.rules.iter().flatten().any(|rule| {
        rule.api_groups.iter().flatten().any(|g| g == "leasehold.dev")
            && rule.resources.iter().flatten().any(|r| r == resource)
            && rule.verbs.iter().any(|v| v == verb)
    })
}

/// The request was refused by RBAC (403 Forbidden) naming `resource`.
fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>, resource: &str, what: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{what}: {status:?}");
            assert!(status.message.contains(resource), "{what}: refused, but not for {resource}: {}", status.message);
        }
        other => panic!("{what} was allowed: {other:?}"),
    }
}

#[tokio::test]
async fn namespace_editors_create_and_delete_locks_and_viewers_only_read_them() {
    let cluster = ChartCluster::start().await;
    cluster.install(&[]).await;
    let app = cluster.cp.namespace("app").await;
    let elsewhere = cluster.cp.namespace("elsewhere").await;
    bind(&cluster, &app.name, "alice", "edit").await;
    bind(&cluster, &app.name, "bob", "view").await;

    // The aggregation controller merges the chart's rules into the built-in roles.
    let cluster_roles: Api<ClusterRole> = Api::all(cluster.admin.clone());
    until(&cluster_roles, "edit", WAIT, "edit to reach DistributedLocks", |r| {
        grants(r, "distributedlocks", "create") && grants(r, "distributedlocks", "delete")
    })
    .await;
    until(&cluster_roles, "view", WAIT, "view to read DistributedLocks and LockClaims", |r| {
        grants(r, "distributedlocks", "list") && grants(r, "lockclaims", "watch")
    })
    .await;
    let view = cluster_roles.get("view").await.expect("view");
    assert!(!grants(&view, "distributedlocks", "create"), "view must not create locks: {:?}", view.rules);
    let edit = cluster_roles.get("edit").await.expect("edit");
    assert!(!grants(&edit, "lockclaims", "create"), "claims are the sidecars': {:?}", edit.rules);
    assert!(!grants(&edit, "distributedlocks/status", "patch"), "status is the controller's: {:?}", edit.rules);

    // The editor creates, changes and deletes a lock.
    let alice: Api<DistributedLock> = Api::namespaced(cluster.impersonating("alice").await, &app.name);
    let lock = DistributedLock::new("orders", DistributedLockSpec::default());
    alice.create(&PostParams::default(), &lock).await.expect("an editor creates a lock");
    let patch = json!({"metadata": {"labels": {"team": "shop"}}});
    alice.patch("orders", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("an editor changes it");
    alice.delete("orders", &DeleteParams::default()).await.expect("an editor deletes it");
    until_gone(&Api::<DistributedLock>::namespaced(cluster.admin.clone(), &app.name), "orders", WAIT, "the lock gone")
        .await;
    alice.create(&PostParams::default(), &lock).await.expect("and creates it again");
    // ... but takes no part in the protocol: claims belong to sidecars.
    let claim: LockClaim = serde_json::from_value(json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "LockClaim",
        "metadata": {"name": "orders.u-alice"},
        "spec": {"lock": "orders", "claimant": "alice/cli", "requestTime": "2026-01-01T00:00:00.000000Z",
            "renewTime": "2026-01-01T00:00:00.000000Z", "ttlSeconds": 30},
    }))
    .expect("a LockClaim");
    forbidden(
        Api::<LockClaim>::namespaced(cluster.impersonating("alice").await, &app.name)
            .create(&PostParams::default(), &claim)
            .await,
        "lockclaims",
        "an editor creating a LockClaim",
    );

    // The viewer reads locks and claims, and changes nothing.
    let bob_client = cluster.impersonating("bob").await;
    let bob: Api<DistributedLock> = Api::namespaced(bob_client.clone(), &app.name);
    let listed = bob.list(&ListParams::default()).await.expect("a viewer lists locks");
    assert_eq!(listed.items.len(), 1);
    bob.get("orders").await.expect("a viewer reads a lock");
    Api::<LockClaim>::namespaced(bob_client.clone(), &app.name)
        .list(&ListParams::default())
        .await
        .expect("a viewer lists the claims");
    let other = DistributedLock::new("stock", DistributedLockSpec::default());
    forbidden(bob.create(&PostParams::default(), &other).await, "distributedlocks", "a viewer creating a lock");
    forbidden(
        bob.patch("orders", &PatchParams::default(), &Patch::Merge(&patch)).await,
        "distributedlocks",
        "a viewer changing a lock",
    );
    forbidden(bob.delete("orders", &DeleteParams::default()).await, "distributedlocks", "a viewer deleting a lock");
    assert!(alice.get_opt("orders").await.expect("read the lock").is_some(), "the lock is still there");

    // The bindings are namespaced: neither reaches another namespace's locks.
    let alice_elsewhere: Api<DistributedLock> = Api::namespaced(cluster.impersonating("alice").await, &elsewhere.name);
    forbidden(
        alice_elsewhere.create(&PostParams::default(), &lock).await,
        "distributedlocks",
        "an editor of another namespace creating a lock",
    );
    forbidden(
        Api::<DistributedLock>::namespaced(bob_client, &elsewhere.name).list(&ListParams::default()).await,
        "distributedlocks",
        "a viewer of another namespace listing locks",
    );
}
