//! Claimant permissions, prepared per namespace so app pods need no hand-written RBAC.
//!
//! For every namespace with locks, the controller applies a Role `leasehold-client` and a
//! RoleBinding to the locks' `spec.clients` ServiceAccounts (all of the namespace's
//! ServiceAccounts when any lock there leaves `clients` empty; RBAC cannot say "this
//! lock only" for a claim, so the binding is the union of the namespace's locks' clients):
//! - LockClaims: create, get, list, watch, update, patch, delete (the claim guard lets
//!   each claimant touch only its own);
//! - DistributedLocks: get, list, watch;
//! - Leases: get, list, watch, update — only the namespace's lock Leases, by
//!   `resourceNames` (a list or watch with the field selector `metadata.name=<lock>` is
//!   authorized by name). Other Leases of the namespace (other apps' leader elections) are
//!   out of a client's reach. Names too many for one Role are spread over Lease Roles of
//!   their own, bound to the same clients ([`shards`]).
//! - Pods: get, list, watch — only the namespace's Pods that run the sidecar (labelled
//!   `leasehold.dev/inject: "true"`), by `resourceNames`: each sidecar reads its own Pod's
//!   container statuses (a list and watch by name) to release holds of an app container
//!   that restarted. Other Pods of the namespace are out of reach.
//!
//! The names follow the locks and the Pods: recomputed from the caches when a reconcile's
//! lock adds something else to them than when they were last computed ([`applied`]), when
//! a lock is deleted, and when a Pod with the sidecar appears or goes; applied only when
//! they change. A namespace whose last lock is
//! deleted keeps its Role without a Lease rule (and its RoleBinding, so that a lock
//! re-created there is claimable at once). Both carry [`MANAGED_LABELS`], which find them,
//! and, when the controller is given one (`--owner-cluster-role`), an owner reference to
//! the installation's ClusterRole: uninstalling the chart deletes that ClusterRole, and
//! the garbage collector then deletes every client Role and RoleBinding in every namespace
//! — with no uninstall hook, no pod to schedule at uninstall time, and the same result
//! when a GitOps tool prunes the release. One written after the owner is gone (a replica
//! still shutting down) names an owner that no longer exists, and the garbage collector
//! deletes it too.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::context::{Context, LockKey};
use super::error::Error;
use crate::crd::{DistributedLock, LABEL_INJECT, MANAGED_LABELS, MANAGER_CONTROLLER};

pub mod applied;
pub mod shards;

use applied::Applied;
use shards::Layout;

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

/// What a namespace's claimants are given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Who; `None` when the namespace has no locks (the binding is left as it was, so
    /// that a lock re-created under the same name finds its clients still bound).
    pub clients: Option<Clients>,
    /// The slot Lease names of every lock (slot 0 named like the lock), for
    /// `resourceNames`.
    pub leases: BTreeSet<String>,
    /// The names of the namespace's Pods that run the sidecar, for `resourceNames`.
    pub pods: BTreeSet<String>,
}

/// The grant of a namespace with `locks` (including locks being deleted: their holder may
/// still have to let go of its hold).
pub fn grant<'a>(locks: impl IntoIterator<Item = &'a DistributedLock>) -> Grant {
    let mut named = BTreeSet::new();
    let mut all = false;
    let mut leases = BTreeSet::new();
    for lock in locks {
        let share = applied::share(lock);
        leases.extend(crate::lease::slot::lease_names(&lock.name_any(), share.slots));
        all |= share.clients.is_empty();
        named.extend(share.clients);
    }
    let clients = if all { Clients::All } else { Clients::Named(named) };
    Grant { clients: (!leases.is_empty()).then_some(clients), leases, pods: BTreeSet::new() }
}

/// Whether a Pod runs the sidecar (opted in to injection).
pub fn runs_sidecar(labels: &std::collections::BTreeMap<String, String>) -> bool {
    labels.get(LABEL_INJECT).is_some_and(|v| v == "true")
}

fn metadata(name: &str, namespace: &str, owner: Option<&OwnerReference>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        labels: Some(MANAGED_LABELS.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
        owner_references: owner.map(|o| vec![o.clone()]),
        ..ObjectMeta::default()
    }
}

fn rule(group: &str, resource: &str, verbs: &[&str], names: Option<&BTreeSet<String>>) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        resource_names: names.map(|n| n.iter().cloned().collect()),
        ..PolicyRule::default()
    }
}

/// The rule reaching Leases `leases` by name; none for no names (an empty `resourceNames`
/// would mean every Lease).
fn lease_rule(leases: &BTreeSet<String>) -> Option<PolicyRule> {
    (!leases.is_empty())
        .then(|| rule("coordination.k8s.io", "leases", &["get", "list", "watch", "update"], Some(leases)))
}

/// The Role granted to claimants of `namespace`, whose lock Leases are `leases` (none when
/// they are spread over Lease Roles, [`shards`]) and whose Pods with the sidecar are
/// `pods`, owned by `owner`.
pub fn role(
    namespace: &str,
    leases: &BTreeSet<String>,
    pods: &BTreeSet<String>,
    owner: Option<&OwnerReference>,
) -> Role {
    let mut rules = vec![
        rule("leasehold.dev", "lockclaims", &["create", "get", "list", "watch", "update", "patch", "delete"], None),
        rule("leasehold.dev", "distributedlocks", &["get", "list", "watch"], None),
    ];
    rules.extend(lease_rule(leases));
    // An empty `resourceNames` would mean every Pod: no names, no rule.
    if !pods.is_empty() {
        rules.push(rule("", "pods", &["get", "list", "watch"], Some(pods)));
    }
    Role { metadata: metadata(CLIENT_ROLE, namespace, owner), rules: Some(rules) }
}

/// Lease Role `index` of `namespace`: its share `leases` of the lock Leases, and nothing
/// else.
pub fn lease_role(namespace: &str, index: usize, leases: &BTreeSet<String>, owner: Option<&OwnerReference>) -> Role {
    Role {
        metadata: metadata(&shards::name(index), namespace, owner),
        rules: Some(lease_rule(leases).into_iter().collect()),
    }
}

/// The RoleBinding of `clients` to Role `role` (named like it), owned by `owner`.
pub fn binding(namespace: &str, role: &str, clients: &Clients, owner: Option<&OwnerReference>) -> RoleBinding {
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
        metadata: metadata(role, namespace, owner),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: role.into(),
        },
        subjects: Some(subjects),
    }
}

/// The turn of `namespace`: one writer per namespace at a time, and the locks read under
/// that turn. Two reconciles of one namespace's locks computing from caches of different
/// ages could otherwise land their patches in one order and record them in the other,
/// leaving a Role that lacks a lock Lease while the memory says it is current.
fn gate(ctx: &Context, namespace: &str) -> Arc<tokio::sync::Mutex<Applied>> {
    ctx.rbac.lock().expect("rbac memory is never poisoned").entry(namespace.to_owned()).or_default().clone()
}

/// Makes the Role and RoleBinding of `namespace` follow its locks (as cached), if they
/// changed since last applied.
pub async fn ensure(ctx: &Context, namespace: &str) -> Result<(), Error> {
    let gate = gate(ctx, namespace);
    let mut known = gate.lock().await;
    apply(ctx, namespace, &mut known).await
}

/// [`ensure`] for a reconcile of lock `key`: nothing to do when the grant last applied
/// counted that lock as the cache shows it now (whatever else changed has a recheck of
/// its own, [`applied`]).
pub async fn ensure_for(ctx: &Context, key: &LockKey) -> Result<(), Error> {
    let gate = gate(ctx, &key.namespace);
    let mut known = gate.lock().await;
    let cached = ctx.locks.get(&kube::runtime::reflector::ObjectRef::new(&key.name).within(&key.namespace));
    if cached.is_some_and(|lock| known.counts(&lock)) {
        return Ok(());
    }
    apply(ctx, &key.namespace, &mut known).await
}

/// Computes the grant of `namespace` from the caches and applies it if it differs from
/// `known`, the one last applied.
async fn apply(ctx: &Context, namespace: &str, known: &mut Applied) -> Result<(), Error> {
    let locks: Vec<_> = ctx.locks.state().into_iter().filter(|l| l.namespace().as_deref() == Some(namespace)).collect();
    let mut grant = grant(locks.iter().map(|l| l.as_ref()));
    // Sidecars read their Pods only while the namespace has locks.
    let with_locks = !grant.leases.is_empty();
    grant.pods = ctx
        .pods
        .state()
        .iter()
        .filter(|p| with_locks && p.namespace().as_deref() == Some(namespace) && runs_sidecar(p.labels()))
        .map(|p| p.name_any())
        .collect();
    let print = applied::print(&grant);
    if known.grant == Some(print) {
        known.record(print, locks.iter().map(|l| l.as_ref()));
        return Ok(());
    }
    let owner = ctx.settings.owner.as_ref();
    let bound = |role: &str| grant.clients.as_ref().map(|clients| binding(namespace, role, clients, owner));
    let layout = shards::layout(&grant.leases, ctx.settings.client_role_lease_bytes);
    let spread = matches!(layout, Layout::Spread(_));
    match layout {
        // Every name reaches its Lease Role before it leaves the client Role: Lease Roles
        // first, Lease Role 0 first of all (it marks that there are any).
        Layout::Spread(by_role) => {
            known.spread = Some(true);
            for (index, leases) in by_role.iter().enumerate() {
                let name = shards::name(index);
                write(ctx, namespace, known, lease_role(namespace, index, leases, owner), bound(&name)).await?;
            }
            write(ctx, namespace, known, role(namespace, &BTreeSet::new(), &grant.pods, owner), bound(CLIENT_ROLE))
                .await?;
        }
        // And back: the client Role names them all before any Lease Role goes.
        Layout::Together => {
            write(ctx, namespace, known, role(namespace, &grant.leases, &grant.pods, owner), bound(CLIENT_ROLE))
                .await?;
            remove_lease_roles(ctx, namespace, known).await?;
        }
    }
    info!(namespace, leases = grant.leases.len(), spread, pods = grant.pods.len(), clients = ?grant.clients, "client RBAC applied");
    known.record(print, locks.iter().map(|l| l.as_ref()));
    Ok(())
}

/// Applies `role` and its `binding` (none: leave the binding as it is) unless they are what
/// was last applied to them.
async fn write(
    ctx: &Context,
    namespace: &str,
    known: &mut Applied,
    role: Role,
    binding: Option<RoleBinding>,
) -> Result<(), Error> {
    let name = role.metadata.name.clone().unwrap_or_default();
    let print = applied::print(&(&role, &binding));
    if known.is_current(&name, print) {
        return Ok(());
    }
    let err =
        |kind, source| Error::Rbac { verb: "apply", kind, namespace: namespace.into(), name: name.clone(), source };
    let params = PatchParams::apply(MANAGER_CONTROLLER).force();
    let body = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": role.metadata, "rules": role.rules});
    let roles: Api<Role> = Api::namespaced(ctx.client.clone(), namespace);
    roles.patch(&name, &params, &Patch::Apply(body)).await.map_err(|e| err("Role", e))?;
    if let Some(binding) = binding {
        let body = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": binding.metadata, "roleRef": binding.role_ref, "subjects": binding.subjects});
        let bindings: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), namespace);
        bindings.patch(&name, &params, &Patch::Apply(body)).await.map_err(|e| err("RoleBinding", e))?;
    }
    known.wrote(name, print);
    Ok(())
}

/// `result` of a delete, with the object already gone counted as done.
fn gone<T>(result: kube::Result<T>) -> kube::Result<()> {
    match result {
        Err(e) if crate::lease::cas::status_code(&e) == Some(404) => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Deletes the Lease Roles of `namespace` and their bindings, if there may be any: when
/// this process does not know, Lease Role 0 tells (the first written, the last deleted).
async fn remove_lease_roles(ctx: &Context, namespace: &str, known: &mut Applied) -> Result<(), Error> {
    let err = |verb, kind, name: &str, source| Error::Rbac {
        verb,
        kind,
        namespace: namespace.into(),
        name: name.into(),
        source,
    };
    let roles: Api<Role> = Api::namespaced(ctx.client.clone(), namespace);
    let bindings: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), namespace);
    if known.spread.is_none() {
        let first = shards::name(0);
        let found = roles.get_opt(&first).await.map_err(|e| err("read", "Role", &first, e))?;
        known.spread = Some(found.is_some());
    }
    if known.spread == Some(false) {
        return Ok(());
    }
    for name in shards::names().rev() {
        gone(bindings.delete(&name, &DeleteParams::default()).await)
            .map_err(|e| err("delete", "RoleBinding", &name, e))?;
        gone(roles.delete(&name, &DeleteParams::default()).await).map_err(|e| err("delete", "Role", &name, e))?;
        known.forget(&name);
    }
    known.spread = Some(false);
    info!(namespace, "lease roles removed: the client Role names every lock Lease again");
    Ok(())
}

/// The owner reference to ClusterRole `name`, read once at start-up (its UID is what the
/// garbage collector compares).
pub async fn owner(client: &kube::Client, name: &str) -> anyhow::Result<OwnerReference> {
    use anyhow::Context as _;
    let role = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone())
        .get_opt(name)
        .await
        .with_context(|| format!("cannot read ClusterRole {name} (--owner-cluster-role)"))?
        .with_context(|| format!("ClusterRole {name} (--owner-cluster-role) does not exist"))?;
    Ok(owner_reference(name, &role.uid().with_context(|| format!("ClusterRole {name} has no UID"))?))
}

/// An owner reference to ClusterRole `name` with `uid`. It does not block the owner's
/// deletion (that would need delete rights on the owner, and nothing should wait on it).
pub fn owner_reference(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: "ClusterRole".into(),
        name: name.into(),
        uid: uid.into(),
        controller: None,
        block_owner_deletion: None,
    }
}

/// Namespaces whose client RBAC must be looked at again, beyond reconciles (which cover
/// namespaces with locks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recheck {
    /// A lock of this namespace was deleted.
    Namespace(String),
    /// A Pod with the sidecar appeared in, or went from, this namespace (looked at only if
    /// the namespace has locks).
    Pods(String),
    /// The locks cache re-listed (a deletion may have gone unseen).
    All,
}

/// A callback for the locks watch stream, after the cache was updated: asks for a recheck
/// on every deletion and every re-list.
pub fn on_lock_event(
    tx: mpsc::UnboundedSender<Recheck>,
) -> impl FnMut(&Result<watcher::Event<DistributedLock>, watcher::Error>) {
    move |event| {
        let recheck = match event {
            Ok(watcher::Event::Delete(lock)) => Recheck::Namespace(lock.namespace().unwrap_or_default()),
            Ok(watcher::Event::InitDone) => Recheck::All,
            _ => return,
        };
        // The receiver lives as long as the controller; a send fails only at shutdown.
        let _ = tx.send(recheck);
    }
}

/// A callback for the Pods watch stream, after the cache was updated: asks for a recheck of
/// the namespace when a Pod with the sidecar appears or goes — deleted, or its label taken
/// off — (not on its status updates), and of every namespace on a re-list.
pub fn on_pod_event(
    tx: mpsc::UnboundedSender<Recheck>,
) -> impl FnMut(&Result<watcher::Event<kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Pod>>, watcher::Error>)
{
    let mut known: std::collections::HashSet<(String, String)> = std::collections::HashSet::new();
    move |event| {
        let recheck = match event {
            Ok(watcher::Event::Apply(pod)) if runs_sidecar(pod.labels()) => {
                let key = (pod.namespace().unwrap_or_default(), pod.name_any());
                if !known.insert(key.clone()) {
                    return;
                }
                Recheck::Pods(key.0)
            }
            Ok(watcher::Event::Apply(pod) | watcher::Event::Delete(pod)) => {
                let key = (pod.namespace().unwrap_or_default(), pod.name_any());
                if !known.remove(&key) {
                    return;
                }
                Recheck::Pods(key.0)
            }
            Ok(watcher::Event::InitDone) => Recheck::All,
            _ => return,
        };
        // The receiver lives as long as the controller; a send fails only at shutdown.
        let _ = tx.send(recheck);
    }
}

/// How long a failed recheck waits before the next attempt.
const RETRY: Duration = Duration::from_secs(2);

/// Keeps client RBAC current where reconciles do not reach: namespaces whose locks were
/// deleted. On every (re)gained leadership and re-list, every namespace with a Role of
/// ours is looked at too (only `namespace` when the controller watches one).
pub async fn follow(
    ctx: Arc<Context>,
    namespace: Option<String>,
    mut rechecks: mpsc::UnboundedReceiver<Recheck>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut pending: BTreeSet<String> = BTreeSet::new();
    let mut regains = ctx.leadership.regains();
    let mut sweep = true;
    // Nothing is judged before the locks cache has listed once: an empty cache would take
    // every lock Lease out of its clients' reach.
    let mut synced = false;
    loop {
        if synced && ctx.leadership.is_leading() {
            if std::mem::take(&mut sweep) {
                match managed_namespaces(&ctx.client, namespace.as_deref()).await {
                    Ok(found) => pending.extend(found),
                    Err(error) => {
                        warn!(%error, "cannot list the client Roles; retrying");
                        sweep = true;
                    }
                }
            }
            let mut failed = BTreeSet::new();
            for namespace in std::mem::take(&mut pending) {
                if let Err(error) = ensure(&ctx, &namespace).await {
                    warn!(%error, "client RBAC not updated; retrying");
                    failed.insert(namespace);
                }
            }
            pending = failed;
        }
        let retry = synced && (!pending.is_empty() || sweep);
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            Ok(()) = regains.changed() => sweep = true,
            received = rechecks.recv() => match received {
                Some(Recheck::Namespace(namespace)) => { pending.insert(namespace); }
                Some(Recheck::Pods(namespace)) => {
                    if ctx.locks.state().iter().any(|l| l.namespace().as_deref() == Some(namespace.as_str())) {
                        pending.insert(namespace);
                    }
                }
                Some(Recheck::All) => {
                    synced = true;
                    sweep = true;
                }
                None => return Ok(()),
            },
            _ = tokio::time::sleep(RETRY), if retry => {}
        }
    }
}

/// Namespaces (all, or only `namespace`) that have a client Role of ours.
async fn managed_namespaces(client: &kube::Client, namespace: Option<&str>) -> kube::Result<Vec<String>> {
    let roles: Api<Role> = match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let (key, value) = MANAGED_LABELS[0];
    let params =
        ListParams::default().labels(&format!("{key}={value}")).fields(&format!("metadata.name={CLIENT_ROLE}"));
    Ok(roles.list_metadata(&params).await?.items.into_iter().filter_map(|r| r.metadata.namespace).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::DistributedLockSpec;

    fn lock(name: &str, clients: &[&str]) -> DistributedLock {
        DistributedLock::new(
            name,
            DistributedLockSpec { clients: clients.iter().map(|c| (*c).into()).collect(), ..Default::default() },
        )
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn grant_table() {
        let named = |list: &[&str]| Clients::Named(names(list));
        assert_eq!(
            grant([&lock("a", &["x"]), &lock("b", &["y", "x"])]),
            Grant { clients: Some(named(&["x", "y"])), leases: names(&["a", "b"]), pods: BTreeSet::new() }
        );
        assert_eq!(
            grant([&lock("a", &["x"]), &lock("b", &[])]),
            Grant { clients: Some(Clients::All), leases: names(&["a", "b"]), pods: BTreeSet::new() }
        );
        assert_eq!(grant([]), Grant { clients: None, leases: BTreeSet::new(), pods: BTreeSet::new() });
    }

    #[test]
    fn every_slot_lease_is_named_and_a_slot_still_held_after_a_shrink_too() {
        let mut semaphore = lock("pool", &[]);
        semaphore.spec.permits = 3;
        assert_eq!(grant([&semaphore]).leases, names(&["pool", "pool.1", "pool.2"]));
        // Shrunk to 1 while slot 2 is still held: its holder must still renew and release.
        semaphore.spec.permits = 1;
        let held = |slot| crate::crd::HolderStatus {
            mode: None,
            identity: "w".into(),
            slot,
            pod: None,
            fencing_token: 1,
            acquired_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
            renewed_at: None,
            expires_at: None,
            waited_seconds: 0.0,
        };
        semaphore.status =
            Some(crate::crd::DistributedLockStatus { holders: vec![held(0), held(2)], ..Default::default() });
        assert_eq!(grant([&semaphore]).leases, names(&["pool", "pool.1", "pool.2"]));
        semaphore.status = None;
        assert_eq!(grant([&semaphore]).leases, names(&["pool"]));
    }

    #[test]
    fn the_role_reaches_only_the_lock_leases_and_the_pods_with_the_sidecar() {
        let role = role("shop", &names(&["orders", "stock"]), &names(&["worker-0", "worker-1"]), None);
        let rules = role.rules.expect("rules");
        let leases = rules.iter().find(|r| r.resources == Some(vec!["leases".into()])).expect("a Lease rule");
        assert_eq!(leases.resource_names, Some(vec!["orders".into(), "stock".into()]));
        assert_eq!(leases.verbs, ["get", "list", "watch", "update"]);
        let claims = rules.iter().find(|r| r.resources == Some(vec!["lockclaims".into()])).expect("a claim rule");
        assert_eq!(claims.verbs, ["create", "get", "list", "watch", "update", "patch", "delete"]);
        assert!(claims.resource_names.is_none());
        let locks = rules.iter().find(|r| r.resources == Some(vec!["distributedlocks".into()])).expect("locks");
        assert_eq!(locks.verbs, ["get", "list", "watch"]);
        let pods = rules.iter().find(|r| r.resources == Some(vec!["pods".into()])).expect("a Pod rule");
        assert_eq!(pods.api_groups, Some(vec![String::new()]));
        assert_eq!(pods.resource_names, Some(vec!["worker-0".into(), "worker-1".into()]));
        assert_eq!(pods.verbs, ["get", "list", "watch"]);
        assert_eq!(rules.len(), 4, "nothing else: {rules:?}");
        // No names would mean every Lease (every Pod): then there is no such rule at all.
        let empty = super::role("shop", &BTreeSet::new(), &BTreeSet::new(), None).rules.expect("rules");
        assert!(empty.iter().all(|r| r.resources != Some(vec!["leases".into()])), "{empty:?}");
        assert!(empty.iter().all(|r| r.resources != Some(vec!["pods".into()])), "{empty:?}");
    }

    #[test]
    fn a_lease_role_reaches_only_its_share_of_the_lock_leases_and_its_binding_names_it() {
        let role = lease_role("shop", 3, &names(&["orders", "stock"]), None);
        assert_eq!(role.metadata.name.as_deref(), Some("leasehold-client-leases-3"));
        let rules = role.rules.expect("rules");
        assert_eq!(rules.len(), 1, "the Lease rule alone: {rules:?}");
        assert_eq!(rules[0].resources, Some(vec!["leases".into()]));
        assert_eq!(rules[0].resource_names, Some(vec!["orders".into(), "stock".into()]));
        assert_eq!(rules[0].verbs, ["get", "list", "watch", "update"]);
        // A Lease Role with no names has no rule (an empty `resourceNames` is every Lease).
        assert_eq!(lease_role("shop", 0, &BTreeSet::new(), None).rules, Some(vec![]));
        let bound = binding("shop", "leasehold-client-leases-3", &Clients::All, None);
        assert_eq!(bound.metadata.name.as_deref(), Some("leasehold-client-leases-3"));
        assert_eq!((bound.role_ref.kind.as_str(), bound.role_ref.name.as_str()), ("Role", "leasehold-client-leases-3"));
    }

    #[test]
    fn pods_with_the_sidecar_are_those_opted_in() {
        let labels = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        assert!(runs_sidecar(&labels(&[(LABEL_INJECT, "true"), ("app", "web")])));
        assert!(!runs_sidecar(&labels(&[(LABEL_INJECT, "false")])));
        assert!(!runs_sidecar(&labels(&[("app", "web")])));
    }

    #[test]
    fn a_pod_recheck_comes_when_a_pod_with_the_sidecar_appears_or_goes_not_on_its_other_updates() {
        let pod = |name: &str, inject: bool| {
            let mut meta = kube::core::PartialObjectMeta::<k8s_openapi::api::core::v1::Pod>::default();
            meta.metadata.name = Some(name.into());
            meta.metadata.namespace = Some("shop".into());
            if inject {
                meta.metadata.labels = Some([(LABEL_INJECT.to_owned(), "true".to_owned())].into());
            }
            meta
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut on_event = on_pod_event(tx);
        for event in [
            watcher::Event::Apply(pod("w-0", true)),
            watcher::Event::Apply(pod("w-0", true)), // a status update
            watcher::Event::Apply(pod("other", false)),
            watcher::Event::Delete(pod("other", false)),
            watcher::Event::Delete(pod("w-0", true)),
            watcher::Event::Apply(pod("w-1", true)),
            watcher::Event::Apply(pod("w-1", false)), // its label taken off
            watcher::Event::Apply(pod("w-1", false)),
            watcher::Event::InitDone,
        ] {
            on_event(&Ok(event));
        }
        let mut seen = Vec::new();
        while let Ok(recheck) = rx.try_recv() {
            seen.push(recheck);
        }
        let shop = || Recheck::Pods("shop".into());
        assert_eq!(seen, [shop(), shop(), shop(), shop(), Recheck::All]);
    }

    #[test]
    fn everything_is_labelled_and_owned_by_the_installation_when_it_has_an_owner() {
        let expected: std::collections::BTreeMap<String, String> =
            MANAGED_LABELS.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let owner = owner_reference("leasehold-controller", "0d1f5f0e-1111-2222-3333-444455556666");
        for owner in [None, Some(&owner)] {
            let role = role("shop", &names(&["a"]), &BTreeSet::new(), owner);
            let lease_role = lease_role("shop", 1, &names(&["a"]), owner);
            let binding = binding("shop", CLIENT_ROLE, &Clients::All, owner);
            for meta in [&role.metadata, &lease_role.metadata, &binding.metadata] {
                assert_eq!(meta.labels, Some(expected.clone()));
                assert_eq!(meta.owner_references, owner.map(|o| vec![o.clone()]));
            }
        }
    }

    #[test]
    fn binding_subjects() {
        let all = binding("shop", CLIENT_ROLE, &Clients::All, None);
        assert_eq!(all.subjects.expect("subjects")[0].name, "system:serviceaccounts:shop");
        let named = binding("shop", CLIENT_ROLE, &Clients::Named(["worker".into()].into()), None);
        let s = &named.subjects.expect("subjects")[0];
        assert_eq!(
            (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()),
            ("ServiceAccount", "worker", Some("shop"))
        );
    }
}
