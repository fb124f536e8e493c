//! Client RBAC on the real apiserver: the `leasehold-client` Role reaches the namespace's
//! lock Leases by name and nothing else of its Leases, follows the locks, its binding
//! follows their clients, names too many to hold are spread over Lease Roles and gathered
//! again, and everything the controller creates in an app namespace is labelled as
//! Leasehold's.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use leasehold::controller::rbac::CLIENT_ROLE;
use leasehold::controller::rbac::shards::{self, SHARDS};
use leasehold::crd::{DistributedLockSpec, MANAGED_LABELS};
use serde_json::json;
use std::collections::BTreeMap;

use super::{LOCK, WAIT};
use crate::support::Env;
use crate::support::watch::{until, until_gone};

/// The code of the apiserver's refusal of `result`; panics if it was allowed.
fn refusal_code(result: kube::Result<impl std::fmt::Debug>) -> u16 {
    match result {
        Err(kube::Error::Api(status)) => status.code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The Lease names the client Role grants, if it has a Lease rule.
fn lease_names(role: &Role) -> Option<Vec<String>> {
    role.rules
        .iter()
        .flatten()
        .find(|r| r.resources.as_ref().is_some_and(|r| r.iter().any(|r| r == "leases")))
        .map(|r| r.resource_names.clone().unwrap_or_default())
}

#[tokio::test]
async fn another_apps_lease_is_out_of_a_clients_reach_and_its_lock_lease_in_reach_by_name() {
    let env = Env::new("adm-rbac-reach").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    until(&env.leases(), LOCK, WAIT, "the lock Lease", |_| true).await;

    // Another application's leader-election Lease in the same namespace.
    let theirs: Lease = serde_json::from_value(json!({"metadata": {"name": "app-leader"},
        "spec": {"holderIdentity": "app-0", "leaseDurationSeconds": 15}}))
    .expect("a Lease");
    let stored = env.leases().create(&PostParams::default(), &theirs).await.expect("the app's Lease");
    let as_a: Api<Lease> = Api::namespaced(a.client.clone(), env.name());
    assert_eq!(refusal_code(as_a.get("app-leader").await), 403, "read (for a write)");
    let mut taken = stored.clone();
    taken.spec.as_mut().expect("spec").holder_identity = Some(a.identity().id);
    assert_eq!(refusal_code(as_a.replace("app-leader", &PostParams::default(), &taken).await), 403, "update");
    assert_eq!(refusal_code(as_a.delete("app-leader", &DeleteParams::default()).await), 403, "delete");
    let named = |name: &str| ListParams::default().fields(&format!("metadata.name={name}"));
    assert_eq!(refusal_code(as_a.list(&named("app-leader")).await), 403, "list by name");
    assert_eq!(refusal_code(as_a.list(&ListParams::default()).await), 403, "list all");
    let mut squatter = theirs.clone();
    squatter.metadata.name = Some("stock".into());
    assert_eq!(refusal_code(as_a.create(&PostParams::default(), &squatter).await), 403, "create");
    let untouched = env.leases().get("app-leader").await.expect("still there");
    assert_eq!(untouched.spec.and_then(|s| s.holder_identity).as_deref(), Some("app-0"));

    // The lock Lease: read, and listed and watched by name (as the claimant watches it).
    as_a.get(LOCK).await.expect("a reads the lock Lease");
    let listed = as_a.list(&named(LOCK)).await.expect("a lists the lock Lease by name");
    assert_eq!(listed.items.iter().map(|l| l.name_any()).collect::<Vec<_>>(), [LOCK]);
    let watch = WatchParams::default().fields(&format!("metadata.name={LOCK}"));
    let mut events = as_a.watch(&watch, "0").await.expect("a watches the lock Lease by name").boxed();
    let first = tokio::time::timeout(WAIT, events.try_next()).await.expect("an event in time").expect("a watch event");
    assert!(matches!(first, Some(WatchEvent::Added(ref l)) if l.name_any() == LOCK), "{first:?}");
    assert_eq!(refusal_code(as_a.watch(&WatchParams::default(), "0").await.map(|_| ())), 403, "watch all");
}

#[tokio::test]
async fn the_client_role_names_exactly_the_lock_leases_and_follows_the_locks() {
    let env = Env::new("adm-rbac-follow").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    let roles: Api<Role> = Api::namespaced(env.ns.client.clone(), env.name());
    let bindings: Api<RoleBinding> = Api::namespaced(env.ns.client.clone(), env.name());
    let names =
        |expected: &'static [&'static str]| move |role: &Role| lease_names(role).is_some_and(|names| names == expected);

    env.lock(LOCK, DistributedLockSpec::default()).await;
    until(&roles, CLIENT_ROLE, WAIT, "the Role naming the lock Lease", names(&[LOCK])).await;
    env.lock("stock", DistributedLockSpec::default()).await;
    until(&roles, CLIENT_ROLE, WAIT, "the Role naming both lock Leases", names(&[LOCK, "stock"])).await;
    env.locks().delete(LOCK, &DeleteParams::default()).await.expect("delete a lock");
    until(&roles, CLIENT_ROLE, WAIT, "the deleted lock's Lease no longer named", names(&["stock"])).await;
    // The last lock gone: no Lease at all (the Role stays, and its binding, for a lock
    // re-created there).
    env.locks().delete("stock", &DeleteParams::default()).await.expect("delete the last lock");
    until(&roles, CLIENT_ROLE, WAIT, "no Lease rule without locks", |r: &Role| lease_names(r).is_none()).await;
    bindings.get(CLIENT_ROLE).await.expect("the RoleBinding stays");
}

/// The subjects the client RoleBinding binds, as `kind:name`.
fn subjects(binding: &RoleBinding) -> Vec<String> {
    binding.subjects.iter().flatten().map(|s| format!("{}:{}", s.kind, s.name)).collect()
}

#[tokio::test]
async fn the_client_binding_follows_each_change_of_a_locks_clients() {
    let env = Env::new("adm-rbac-clients").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    let bindings: Api<RoleBinding> = Api::namespaced(env.ns.client.clone(), env.name());
    let bound = |expected: Vec<String>| move |b: &RoleBinding| subjects(b) == expected;
    let accounts = |names: &[&str]| names.iter().map(|n| format!("ServiceAccount:{n}")).collect::<Vec<_>>();
    let clients = |names: &[&str]| json!({"spec": {"clients": names}});
    let patch = |body: serde_json::Value| {
        let locks = env.locks();
        async move {
            let params = kube::api::PatchParams::default();
            locks.patch(LOCK, &params, &kube::api::Patch::Merge(body)).await.expect("change the lock's clients");
        }
    };

    env.lock(LOCK, DistributedLockSpec { clients: vec!["web".into()], ..DistributedLockSpec::default() }).await;
    env.lock("stock", DistributedLockSpec { clients: vec!["web".into()], ..DistributedLockSpec::default() }).await;
    until(&bindings, CLIENT_ROLE, WAIT, "web bound", bound(accounts(&["web"]))).await;
    // Each change of one lock's clients, with nothing else changing in the namespace.
    patch(clients(&["web", "cron"])).await;
    until(&bindings, CLIENT_ROLE, WAIT, "cron bound too", bound(accounts(&["cron", "web"]))).await;
    patch(clients(&["cron"])).await;
    until(&bindings, CLIENT_ROLE, WAIT, "both still bound (stock names web)", bound(accounts(&["cron", "web"]))).await;
    patch(clients(&[])).await;
    let everyone = vec![format!("Group:system:serviceaccounts:{}", env.name())];
    until(&bindings, CLIENT_ROLE, WAIT, "every ServiceAccount bound", bound(everyone)).await;
    patch(clients(&["web"])).await;
    until(&bindings, CLIENT_ROLE, WAIT, "back to web alone", bound(accounts(&["web"]))).await;
}

/// The Lease names of every Lease Role, by index (`None`: that Role does not exist).
async fn lease_roles(roles: &Api<Role>) -> Vec<Option<Vec<String>>> {
    let mut found = Vec::new();
    for name in shards::names() {
        let role = roles.get_opt(&name).await.expect("read a Lease Role");
        found.push(role.map(|r| lease_names(&r).unwrap_or_default()));
    }
    found
}

#[tokio::test]
async fn past_the_budget_lock_leases_are_spread_over_lease_roles_and_gathered_again_once_they_fit() {
    let env = Env::new("adm-rbac-spread").await;
    // "orders" and "stock" take 8 and 7 bytes of a Role: one fits in 12, both do not.
    let mut controller = env.controller(&["--leader-elect=false", "--client-role-lease-bytes=12"]).await;
    let roles: Api<Role> = Api::namespaced(env.ns.client.clone(), env.name());
    let bindings: Api<RoleBinding> = Api::namespaced(env.ns.client.clone(), env.name());
    let names =
        |expected: &'static [&'static str]| move |role: &Role| lease_names(role).is_some_and(|names| names == expected);
    let spread = |role: &Role| lease_names(role).is_none();

    env.lock(LOCK, DistributedLockSpec::default()).await;
    until(&roles, CLIENT_ROLE, WAIT, "the client Role naming the lock Lease", names(&[LOCK])).await;
    assert_eq!(lease_roles(&roles).await, vec![None; SHARDS], "no Lease Roles while the names fit");

    // Past the budget: the Lease Roles are written before the client Role lets go.
    env.lock("stock", DistributedLockSpec::default()).await;
    until(&roles, CLIENT_ROLE, WAIT, "no Lease rule in the client Role", spread).await;
    let by_role = |index: usize| [LOCK, "stock"].into_iter().filter(move |n| shards::of(n) == index).map(String::from);
    let expected: Vec<Option<Vec<String>>> = (0..SHARDS).map(|index| Some(by_role(index).collect())).collect();
    assert_eq!(lease_roles(&roles).await, expected, "each name in its Lease Role, and only there");
    let clients = subjects(&bindings.get(CLIENT_ROLE).await.expect("the client RoleBinding"));
    for name in shards::names() {
        let binding = bindings.get(&name).await.expect("a RoleBinding per Lease Role");
        assert_eq!(binding.role_ref.name, name);
        assert_eq!(subjects(&binding), clients, "{name} binds the clients of the client Role");
    }

    // A client reaches both lock Leases through them, holds a lock, and reaches nothing else.
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    until(&env.leases(), "stock", WAIT, "the second lock Lease", |_| true).await;
    let as_a: Api<Lease> = Api::namespaced(a.client.clone(), env.name());
    for lease in [LOCK, "stock"] {
        as_a.get(lease).await.unwrap_or_else(|e| panic!("a reads lock Lease {lease}: {e}"));
    }
    let theirs: Lease = serde_json::from_value(json!({"metadata": {"name": "app-leader"},
        "spec": {"holderIdentity": "app-0", "leaseDurationSeconds": 15}}))
    .expect("a Lease");
    env.leases().create(&PostParams::default(), &theirs).await.expect("another app's Lease");
    assert_eq!(refusal_code(as_a.get("app-leader").await), 403, "another app's Lease");
    for lock in [LOCK, "stock"] {
        let hold =
            a.claimant(env.name()).acquire(lock, WAIT).await.unwrap_or_else(|e| panic!("a acquires {lock}: {e}"));
        hold.release().await;
    }

    // Back within the budget: the client Role names the lock Lease before the Lease Roles go.
    env.locks().delete("stock", &DeleteParams::default()).await.expect("delete a lock");
    until(&roles, CLIENT_ROLE, WAIT, "the client Role naming the lock Lease again", names(&[LOCK])).await;
    for name in shards::names() {
        until_gone(&roles, &name, WAIT, "a Lease Role").await;
        until_gone(&bindings, &name, WAIT, "a Lease Role's binding").await;
    }

    // Spread again; then a controller with a larger budget, which has never seen them,
    // finds the Lease Roles its predecessor left and removes them.
    env.lock("stock", DistributedLockSpec::default()).await;
    until(&roles, CLIENT_ROLE, WAIT, "no Lease rule in the client Role again", spread).await;
    assert!(lease_roles(&roles).await.iter().all(Option::is_some), "all Lease Roles written");
    controller.kill();
    let _controller = env.controller(&["--leader-elect=false", "--client-role-lease-bytes=15"]).await;
    until(&roles, CLIENT_ROLE, WAIT, "both lock Leases in the client Role", names(&[LOCK, "stock"])).await;
    for name in shards::names() {
        until_gone(&roles, &name, WAIT, "a Lease Role left by the last controller").await;
        until_gone(&bindings, &name, WAIT, "its binding").await;
    }
}

#[tokio::test]
async fn everything_the_controller_creates_in_an_app_namespace_is_labelled_as_leaseholds() {
    let env = Env::new("adm-rbac-labels").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires");
    hold.release().await;

    let labelled = |labels: &BTreeMap<String, String>| {
        MANAGED_LABELS.iter().all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
    };
    let selector = ListParams::default().labels(&format!("{}={}", MANAGED_LABELS[0].0, MANAGED_LABELS[0].1));
    let roles: Api<Role> = Api::namespaced(env.ns.client.clone(), env.name());
    let bindings: Api<RoleBinding> = Api::namespaced(env.ns.client.clone(), env.name());
    for role in roles.list(&ListParams::default()).await.expect("roles").items {
        assert!(labelled(role.labels()), "Role {} is not labelled: {:?}", role.name_any(), role.labels());
    }
    for binding in bindings.list(&ListParams::default()).await.expect("bindings").items {
        assert!(
            labelled(binding.labels()),
            "RoleBinding {} is not labelled: {:?}",
            binding.name_any(),
            binding.labels()
        );
    }
    let lease = env.leases().get(LOCK).await.expect("the lock Lease");
    assert!(labelled(lease.labels()), "the lock Lease is not labelled: {:?}", lease.labels());
    // And the label finds them all (what an uninstall removes).
    assert_eq!(roles.list(&selector).await.expect("roles").items.len(), 1);
    assert_eq!(bindings.list(&selector).await.expect("bindings").items.len(), 1);
    assert_eq!(env.leases().list(&selector).await.expect("leases").items.len(), 1);
}
