//! The guard policies on the real apiserver, against pods holding the client's RBAC: only
//! the controller creates, deletes or grants a lock Lease; a holder only renews (never
//! while draining), releases, or hands on to the waiter recorded as next ([`super::handoff`]);
//! a claimant has one claim per lock, under its own name, and nobody else changes or
//! deletes it.

use std::path::PathBuf;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use leasehold::claim::AcquireError;
use leasehold::claim::edit;
use leasehold::crd::{
    ANNOTATION_DRAINING, ANNOTATION_FORCE_RELEASE, ANNOTATION_TOKEN, DistributedLock, DistributedLockSpec,
    LABEL_FENCED_BY, LABEL_LOCK, LABEL_ROLE, LockClaim, LockClaimSpec,
};
use leasehold::webhook::guard::Exempt;
use serde_json::json;

use super::{LOCK, WAIT, denial};
use crate::support::watch::until;
use crate::support::{Env, TestPod};

/// The controller's identity: a ServiceAccount with cluster-admin, a kubeconfig and a
/// client for it.
pub struct ControllerIdentity {
    /// Its user name (what the guard exempts).
    pub user: String,
    /// A kubeconfig for the controller process.
    pub kubeconfig: PathBuf,
    /// A client acting as the controller.
    pub client: kube::Client,
}

/// A ServiceAccount with cluster-admin for the controller, and a kubeconfig for it.
pub async fn controller_identity(env: &Env) -> ControllerIdentity {
    admin_identity(env, "leasehold-controller").await
}

/// A ServiceAccount (of a pod named `name`) with cluster-admin, a kubeconfig and a client.
async fn admin_identity(env: &Env, name: &str) -> ControllerIdentity {
    let pod = env.pod(name).await;
    let bindings: Api<ClusterRoleBinding> = Api::all(env.ns.client.clone());
    let binding_name = format!("leasehold-e2e-{}-{name}", env.name());
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": binding_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": pod.service_account, "namespace": env.name()}],
    });
    bindings.patch(&binding_name, &PatchParams::apply("leasehold-e2e"), &Patch::Apply(&binding)).await.expect("bind");
    let kubeconfig = env.log_dir().join(format!("kubeconfig-{name}"));
    env.ns.kubeconfig_for_token(&pod.token, &kubeconfig).expect("kubeconfig");
    ControllerIdentity {
        user: format!("system:serviceaccount:{}:{}", env.name(), pod.service_account),
        kubeconfig,
        client: pod.client,
    }
}

/// A namespace with the guard in force and a controller exempt from it.
pub(super) async fn guarded(prefix: &str) -> (Env, ControllerIdentity, crate::support::LeaseholdProcess) {
    let env = Env::new(prefix).await;
    let controller = controller_identity(&env).await;
    env.apply_lease_guard(&controller.user).await;
    let process = env.controller_as(Some(&controller.kubeconfig), &["--leader-elect=false"]).await;
    (env, controller, process)
}

/// A lock renewed every 400 s: no renewal races the test's own writes (each a
/// compare-and-swap on the version it read, as the product's).
pub(super) fn quiet() -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: 600,
        renew_deadline_seconds: 500,
        retry_period_seconds: 400,
        ..DistributedLockSpec::default()
    }
}

/// Gives `pods` every right on the namespace's Leases, as an app doing its own leader
/// election has: the guard, not RBAC, must stop them.
pub async fn grant_lease_rights(env: &Env, pods: &[&TestPod]) {
    let params = PatchParams::apply("leasehold-e2e");
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "lease-writer"},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]});
    Api::<Role>::namespaced(env.ns.client.clone(), env.name())
        .patch("lease-writer", &params, &Patch::Apply(&role))
        .await
        .expect("role");
    let subjects: Vec<_> = pods
        .iter()
        .map(|p| json!({"kind": "ServiceAccount", "name": p.service_account, "namespace": env.name()}))
        .collect();
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "lease-writer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease-writer"}, "subjects": subjects});
    Api::<RoleBinding>::namespaced(env.ns.client.clone(), env.name())
        .patch("lease-writer", &params, &Patch::Apply(&binding))
        .await
        .expect("binding");
    for pod in pods {
        env.wait_allowed(pod, "delete", "coordination.k8s.io", "leases", None).await;
    }
}

pub(super) const DRY_RUN: PostParams = PostParams { dry_run: true, field_manager: None };

#[tokio::test]
async fn a_client_cannot_delete_or_create_a_lock_lease_nor_write_a_free_one() {
    let (env, _controller, _process) = guarded("adm-guard-lease").await;
    env.lock(LOCK, quiet()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    grant_lease_rights(&env, &[&a, &b]).await;
    let free = until(&env.leases(), LOCK, WAIT, "the lock Lease", |_| true).await;
    let uid = free.uid();
    let as_b: Api<Lease> = Api::namespaced(b.client.clone(), env.name());

    // A free lock Lease is the controller's alone: no renewal, no self-grant.
    let message = denial(as_b.replace(LOCK, &PostParams::default(), &edit::renewed(&free, Timestamp::now())).await);
    assert!(message.contains("is free") && message.contains("only the Leasehold controller writes"), "{message}");
    let mut take = free.clone();
    take.spec.get_or_insert_with(Default::default).holder_identity = Some(b.identity().id);
    let message = denial(as_b.replace(LOCK, &PostParams::default(), &take).await);
    assert!(message.contains("is free"), "{message}");

    // Nobody deletes it, free or held, not even its holder.
    let message = denial(as_b.delete(LOCK, &DeleteParams::default()).await);
    assert!(message.contains("only the Leasehold controller deletes lock Lease"), "{message}");
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a is granted through the guard");
    let message = denial(as_b.delete(LOCK, &DeleteParams::default()).await);
    assert!(message.contains("only the Leasehold controller deletes lock Lease"), "{message}");
    let as_a: Api<Lease> = Api::namespaced(a.client.clone(), env.name());
    refused(as_a.delete(LOCK, &DeleteParams::default()).await, "only the Leasehold controller deletes lock Lease");

    // Nor creates one: not under the lock's name (were it deleted), not under another.
    let mut fake = Lease::default();
    fake.metadata.labels = free.metadata.labels.clone();
    fake.metadata.annotations = Some([(ANNOTATION_TOKEN.to_owned(), "1".to_owned())].into());
    for name in [LOCK, "orders-2"] {
        fake.metadata.name = Some(name.into());
        let message = denial(as_b.create(&DRY_RUN, &fake).await);
        assert!(message.contains("only the Leasehold controller creates lock Leases"), "{name}: {message}");
    }
    // And a lock Lease taken for the label alone is no way around it either.
    let mut unlabelled = as_b.get(LOCK).await.expect("b may read it");
    unlabelled.labels_mut().remove(LABEL_ROLE);
    unlabelled.spec.get_or_insert_with(Default::default).holder_identity = Some(b.identity().id);
    refused(as_b.replace(LOCK, &DRY_RUN, &unlabelled).await, "written only by the Leasehold controller");

    let lease = env.leases().get(LOCK).await.expect("the lock Lease");
    assert_eq!(lease.uid(), uid, "the lock Lease is the one the controller created");
    assert_eq!(edit::holder(&lease), Some(a.identity().id.as_str()));
    assert!(hold.is_held());
    assert!(hold.release().await.was_held);
}

#[tokio::test]
async fn a_holder_may_only_renew_or_release_its_own_hold_and_not_renew_while_draining() {
    let (env, controller, _process) = guarded("adm-guard-holder").await;
    env.lock(LOCK, quiet()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a is granted through the guard");
    let (as_a, as_b): (Api<Lease>, Api<Lease>) =
        (Api::namespaced(a.client.clone(), env.name()), Api::namespaced(b.client.clone(), env.name()));
    let held = as_a.get(LOCK).await.expect("a may read its lock Lease");
    let later = Timestamp::now() + Duration::from_secs(1);

    // Another pod neither takes nor renews a's hold.
    let mut take = held.clone();
    take.spec.as_mut().expect("spec").holder_identity = Some(b.identity().id);
    let message = denial(as_b.replace(LOCK, &DRY_RUN, &take).await);
    assert!(message.contains("only the holder") && message.contains(&a.identity().id), "{message}");
    let message = denial(as_b.replace(LOCK, &DRY_RUN, &edit::renewed(&held, later)).await);
    assert!(message.contains("only the holder"), "{message}");

    // The holder changes nothing but renewTime or holderIdentity, and hands it to nobody.
    let mut forged = held.clone();
    forged.annotations_mut().insert(ANNOTATION_TOKEN.into(), "99999999999999".into());
    let message = denial(as_a.replace(LOCK, &DRY_RUN, &forged).await);
    assert!(message.contains("written only by the Leasehold controller"), "{message}");
    let mut longer = held.clone();
    longer.spec.as_mut().expect("spec").lease_duration_seconds = Some(3600);
    let message = denial(as_a.replace(LOCK, &DRY_RUN, &longer).await);
    assert!(message.contains("leaseDurationSeconds"), "{message}");
    let mut older = held.clone();
    older.spec.as_mut().expect("spec").acquire_time = Some(MicroTime(Timestamp::UNIX_EPOCH));
    refused(as_a.replace(LOCK, &DRY_RUN, &older).await, "acquireTime");
    let mut unlabelled = held.clone();
    unlabelled.metadata.labels = None;
    refused(as_a.replace(LOCK, &DRY_RUN, &unlabelled).await, "written only by the Leasehold controller");
    let mut handed = held.clone();
    handed.spec.as_mut().expect("spec").holder_identity = Some(b.identity().id);
    let message = denial(as_a.replace(LOCK, &DRY_RUN, &handed).await);
    assert!(message.contains("may hand it on only to the waiter") && message.contains("(none)"), "{message}");
    let renewed_and_released = edit::released(&edit::renewed(&held, later));
    let message = denial(as_a.replace(LOCK, &DRY_RUN, &renewed_and_released).await);
    assert!(message.contains("release it (clear holderIdentity alone)"), "{message}");
    as_a.replace(LOCK, &DRY_RUN, &edit::renewed(&held, later)).await.expect("the holder renews");
    as_a.replace(LOCK, &DRY_RUN, &edit::released(&held)).await.expect("the holder releases");

    // Revoked (the controller marks the hold draining): the holder may only let go.
    let as_controller: Api<Lease> = Api::namespaced(controller.client.clone(), env.name());
    let token = hold.token().to_string();
    let draining = json!({"metadata": {"annotations": {ANNOTATION_DRAINING: token}}});
    as_controller
        .patch(LOCK, &PatchParams::default(), &Patch::Merge(&draining))
        .await
        .expect("the controller writes a lock Lease");
    let revoked = as_a.get(LOCK).await.expect("lease");
    let message = denial(as_a.replace(LOCK, &DRY_RUN, &edit::renewed(&revoked, later)).await);
    assert!(message.contains("was revoked") && message.contains(&token), "{message}");
    as_a.replace(LOCK, &DRY_RUN, &edit::released(&revoked)).await.expect("the holder acknowledges");
    let message = denial(as_a.replace(LOCK, &DRY_RUN, &edit::released(&edit::renewed(&revoked, later))).await);
    assert!(message.contains("clear holderIdentity alone"), "{message}");
}

/// Asserts that `result` was refused with a message containing `needle`.
pub(super) fn refused(result: kube::Result<impl std::fmt::Debug>, needle: &str) {
    let message = denial(result);
    assert!(message.contains(needle), "{message} lacks {needle:?}");
}

/// A LockClaim on `lock` named `name`, as `claimant` (`pod` when in a Pod).
fn claim(lock: &str, name: &str, claimant: &str, pod: Option<&str>) -> LockClaim {
    let now = MicroTime(Timestamp::now());
    let spec = LockClaimSpec {
        lock: lock.into(),
        claimant: claimant.into(),
        pod: pod.map(str::to_owned),
        request_time: now.clone(),
        renew_time: now,
        ttl_seconds: 45,
        mode: None,
    };
    let mut claim = LockClaim::new(name, spec);
    claim.labels_mut().insert(LABEL_LOCK.into(), lock.into());
    claim
}

/// A client for ServiceAccount `name` with a token bound to no Pod (as `leasehold run`
/// outside a cluster has), and its user name.
async fn user_client(env: &Env, name: &str) -> (kube::Client, String) {
    env.ns.service_account(name).await;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { audiences: None, bound_object_ref: None, expiration_seconds: Some(3600) }),
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(env.ns.client.clone(), env.name())
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .and_then(|s| s.token)
        .expect("a token in the status");
    (env.cp.client_with_token(&token).await, format!("system:serviceaccount:{}:{name}", env.name()))
}

#[tokio::test]
async fn a_claimant_has_one_claim_per_lock_under_its_own_name_and_only_it_changes_or_deletes_it() {
    let (env, controller, _process) = guarded("adm-guard-claim").await;
    env.lock(LOCK, quiet()).await;
    let (a, b, c) = (env.pod("a").await, env.pod("b").await, env.pod("c").await);
    for pod in [&a, &b] {
        env.wait_allowed(pod, "create", "leasehold.dev", "lockclaims", None).await;
    }
    let (as_a, as_b): (Api<LockClaim>, Api<LockClaim>) =
        (Api::namespaced(a.client.clone(), env.name()), Api::namespaced(b.client.clone(), env.name()));
    let (a_id, b_id, c_id) = (a.identity(), b.identity(), c.identity());
    let own = |id: &leasehold::lease::Identity, pod: &str| claim(LOCK, &id.claim_name(LOCK), &id.id, Some(pod));

    // a claims under its own name; a second place in the queue under another name is
    // refused, whatever the name.
    as_a.create(&PostParams::default(), &own(&a_id, "a")).await.expect("a claims as itself");
    let second = format!("{LOCK}.{}", uuid_like("0"));
    let message = denial(as_a.create(&DRY_RUN, &claim(LOCK, &second, &a_id.id, Some("a"))).await);
    assert!(message.contains(&format!("must be named {LOCK}.{}", a.uid)), "{message}");
    refused(
        as_a.create(&DRY_RUN, &claim(LOCK, &format!("{LOCK}.u-a-2"), &a_id.id, Some("a"))).await,
        &format!("must be named {LOCK}.{}", a.uid),
    );
    refused(
        as_a.create(&DRY_RUN, &claim(LOCK, &format!("{LOCK}.u-a-2"), "x/u-a-2", None)).await,
        &format!("must be named {LOCK}.{}", a.uid),
    );

    // b cannot squat c's place (c has not claimed yet), as c or as itself.
    let message = denial(as_b.create(&DRY_RUN, &own(&c_id, "c")).await);
    assert!(message.contains(&format!("must be named {LOCK}.{}", b.uid)), "{message}");
    refused(
        as_b.create(&DRY_RUN, &claim(LOCK, &c_id.claim_name(LOCK), &b_id.id, Some("b"))).await,
        &format!("must be named {LOCK}.{}", b.uid),
    );
    // Nor claim for another lock under a label that says otherwise.
    let mut mislabelled = own(&b_id, "b");
    mislabelled.labels_mut().insert(LABEL_LOCK.into(), "other".into());
    let message = denial(as_b.create(&DRY_RUN, &mislabelled).await);
    assert!(message.contains("must be its spec.lock"), "{message}");
    as_b.create(&PostParams::default(), &own(&b_id, "b")).await.expect("b claims as itself");

    // Only its claimant changes or deletes a claim.
    let a_claim = a_id.claim_name(LOCK);
    let message = denial(as_b.delete(&a_claim, &DeleteParams::default()).await);
    assert!(message.contains("only its claimant") && message.contains(&a_id.id), "{message}");
    let mut refreshed = as_b.get(&a_claim).await.expect("b may read a's claim");
    refreshed.spec.renew_time = MicroTime(Timestamp::now());
    refused(as_b.replace(&a_claim, &PostParams::default(), &refreshed).await, "only its claimant");
    as_a.replace(&a_claim, &PostParams::default(), &refreshed).await.expect("a refreshes its own claim");
    as_a.delete(&a_claim, &DeleteParams::default()).await.expect("a withdraws its own claim");
    // The controller may delete any claim (a stale one, a revoked holder's).
    let as_controller: Api<LockClaim> = Api::namespaced(controller.client.clone(), env.name());
    as_controller.delete(&b_id.claim_name(LOCK), &DeleteParams::default()).await.expect("the controller deletes");

    // Outside a Pod: `<lock>.u-<suffix>`, claimant `<username>/u-<suffix>`, no pod.
    let (user, username) = user_client(&env, "ci").await;
    grant_claim_rights(&env, "ci").await;
    let as_user: Api<LockClaim> = Api::namespaced(user, env.name());
    let name = format!("{LOCK}.u-laptop-0a1b2c3d");
    let identity = format!("{username}/u-laptop-0a1b2c3d");
    let message = denial(
        as_user.create(&DRY_RUN, &claim(LOCK, &format!("{LOCK}.laptop"), &format!("{username}/laptop"), None)).await,
    );
    assert!(message.contains(&format!("must be named {LOCK}.u-<suffix>")), "{message}");
    refused(
        as_user.create(&DRY_RUN, &claim(LOCK, &name, "system:serviceaccount:other:x/u-laptop-0a1b2c3d", None)).await,
        &format!("must be named {LOCK}.u-<suffix>"),
    );
    refused(
        as_user.create(&DRY_RUN, &claim(LOCK, &name, &identity, Some("a"))).await,
        &format!("must be named {LOCK}.u-<suffix>"),
    );
    refused(
        as_user.create(&DRY_RUN, &claim(LOCK, &a_id.claim_name(LOCK), &identity, None)).await,
        &format!("must be named {LOCK}.u-<suffix>"),
    );
    as_user.create(&PostParams::default(), &claim(LOCK, &name, &identity, None)).await.expect("the user claims");
    refused(as_b.delete(&name, &DeleteParams::default()).await, "only its claimant");
    as_user.delete(&name, &DeleteParams::default()).await.expect("the user withdraws its claim");
}

/// Something shaped like a Pod UID, made of `digit`.
fn uuid_like(digit: &str) -> String {
    [8, 4, 4, 4, 12].map(|n| digit.repeat(n)).join("-")
}

/// Lets ServiceAccount `account` claim (as the client Role's binding would).
async fn grant_claim_rights(env: &Env, account: &str) {
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "claims-ci"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leasehold-client"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": env.name()}]});
    Api::<RoleBinding>::namespaced(env.ns.client.clone(), env.name())
        .patch("claims-ci", &PatchParams::apply("leasehold-e2e"), &Patch::Apply(&binding))
        .await
        .expect("binding");
}

#[tokio::test]
async fn a_lease_squatting_a_locks_name_is_never_taken_for_the_lock_lease() {
    let env = Env::new("adm-guard-squat").await;
    let _controller = env.webhook_controller(None, &[]).await;
    let (a, mallory) = (env.pod("a").await, env.pod("mallory").await);
    grant_lease_rights(&env, &[&mallory]).await;

    // Before the lock exists, another app's account creates a Lease with its name — not
    // labelled as a lock Lease (the guard would refuse that) — "granting" it to a.
    let now = MicroTime(Timestamp::now());
    let squat: Lease = serde_json::from_value(json!({
        "metadata": {"name": LOCK, "annotations": {ANNOTATION_TOKEN: "5"}},
        "spec": {"holderIdentity": a.identity().id, "acquireTime": now, "renewTime": now, "leaseDurationSeconds": 600},
    }))
    .expect("a Lease");
    let as_mallory: Api<Lease> = Api::namespaced(mallory.client.clone(), env.name());
    let squatted = as_mallory.create(&PostParams::default(), &squat).await.expect("an unlabelled Lease is anyone's");
    env.lock(LOCK, quiet()).await;
    until(&env.locks(), LOCK, WAIT, "LeaseConflict reported", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.reason == "LeaseConflict"))
    })
    .await;
    env.wait_claim_rbac(&a).await;

    // a's claimant does not take it for a grant: it is never told it holds.
    let result = a.claimant(env.name()).acquire(LOCK, Duration::from_secs(3)).await;
    match result {
        Err(AcquireError::Timeout { .. }) => {}
        Ok(hold) => panic!("a was told it holds the squatted Lease, with token {}", hold.token()),
        Err(other) => panic!("expected a timeout, got {other}"),
    }
    let lease = env.leases().get(LOCK).await.expect("the squatted Lease");
    assert_eq!(lease.resource_version(), squatted.resource_version(), "a never confirmed the squatted \"grant\"");

    // The webhooks do not take its token or its holder for the lock's: with no Lease of
    // its own, the lock's current token is unknown, and a fenced write carrying the
    // squatter's token is refused as such.
    let cms: Api<ConfigMap> = Api::namespaced(env.ns.client.clone(), env.name());
    let fenced: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "fenced",
        "labels": {LABEL_FENCED_BY: LOCK}, "annotations": {ANNOTATION_TOKEN: "5"}}}))
    .expect("a ConfigMap");
    refused(cms.create(&PostParams::default(), &fenced).await, "has no Lease of its own right now");
    let request = json!({"metadata": {"annotations": {ANNOTATION_FORCE_RELEASE: "squatter"}}});
    refused(
        env.locks().patch(LOCK, &PatchParams::default(), &Patch::Merge(&request)).await,
        &format!("lock {}/{LOCK} is not held", env.name()),
    );
}

#[tokio::test]
async fn the_clusters_cleanup_may_delete_and_drop_owners_and_finalizers_but_nothing_else() {
    let env = Env::new("adm-guard-cleanup").await;
    let controller = controller_identity(&env).await;
    // The harness's kube-controller-manager runs as the admin: a stand-in for the garbage
    // collector, exempt as CLEANUP_USERS are in a cluster.
    let cleanup = admin_identity(&env, "garbage-collector").await;
    env.apply_guard(Exempt { controller: &controller.user, cleanup: &[cleanup.user.as_str()] }).await;
    let _process = env.controller_as(Some(&controller.kubeconfig), &["--leader-elect=false"]).await;
    env.lock(LOCK, quiet()).await;
    let a = env.pod("a").await;
    env.wait_allowed(&a, "create", "leasehold.dev", "lockclaims", None).await;
    let lease = until(&env.leases(), LOCK, WAIT, "the lock Lease", |_| true).await;

    // Orphaning a lock Lease (owner references dropped) and deleting it: allowed. Anything
    // else — a holder — is not.
    let as_cleanup: Api<Lease> = Api::namespaced(cleanup.client.clone(), env.name());
    let orphaned = json!({"metadata": {"ownerReferences": null}});
    let dry_run = PatchParams { dry_run: true, ..PatchParams::default() };
    as_cleanup.patch(LOCK, &dry_run, &Patch::Merge(&orphaned)).await.expect("the cleanup orphans a lock Lease");
    let mut taken = lease.clone();
    taken.spec.get_or_insert_with(Default::default).holder_identity = Some("gc".into());
    refused(as_cleanup.replace(LOCK, &DRY_RUN, &taken).await, "is free");
    as_cleanup.delete(LOCK, &DeleteParams { dry_run: true, ..DeleteParams::default() }).await.expect("deletes");

    // A foreground deletion of a claim: the apiserver adds a finalizer the cleanup then
    // removes. Changing the claim itself stays the claimant's alone.
    let as_a: Api<LockClaim> = Api::namespaced(a.client.clone(), env.name());
    let name = a.identity().claim_name(LOCK);
    as_a.create(&PostParams::default(), &claim(LOCK, &name, &a.identity().id, Some("a"))).await.expect("a claims");
    let claims: Api<LockClaim> = Api::namespaced(cleanup.client.clone(), env.name());
    let mut refreshed = claims.get(&name).await.expect("the claim");
    refreshed.spec.renew_time = MicroTime(Timestamp::now());
    refused(claims.replace(&name, &PostParams::default(), &refreshed).await, "only its claimant");
    claims.delete(&name, &DeleteParams::foreground()).await.expect("the cleanup deletes in the foreground");
    let finishing = json!({"metadata": {"finalizers": null}});
    claims.patch(&name, &PatchParams::default(), &Patch::Merge(&finishing)).await.expect("and finishes it");
    crate::support::watch::until_gone(&claims, &name, WAIT, "the claim deleted").await;
}
