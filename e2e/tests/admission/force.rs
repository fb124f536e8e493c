//! Force release on the real apiserver: audited (who and why), targeted (the token of the
//! hold at admission), refused when there is no hold.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use leasehold::crd::{
    ANNOTATION_FORCE_RELEASE, ANNOTATION_FORCE_RELEASE_BY, ANNOTATION_FORCE_RELEASE_TARGET, DistributedLock,
    DistributedLockSpec,
};
use leasehold_harness::eventually;
use serde_json::json;

use super::fence::fenced_write;
use super::{LOCK, WAIT, denial};
use crate::support::Env;
use crate::support::watch::until;

#[tokio::test]
async fn a_force_release_is_audited_revokes_the_token_and_tells_the_holder() {
    let env = Env::new("adm-force").await;
    let _controller = env.webhook_controller(None, &[]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let sidecar = env.sidecar(&a, &[]).await;
    let (status, held) = sidecar.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200, "{held}");
    let token_a = held["fencingToken"].as_i64().expect("token");
    let mut events = sidecar.events(LOCK).await;
    let cms: Api<ConfigMap> = Api::namespaced(env.ns.client.clone(), env.name());
    fenced_write(&cms, Some(token_a), "10").await.expect("admitted");

    // A named operator with rights on DistributedLocks only.
    let operator = env.pod("operator").await;
    let roles: Api<Role> = Api::namespaced(env.ns.client.clone(), env.name());
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "lock-operator"},
        "rules": [{"apiGroups": ["leasehold.dev"], "resources": ["distributedlocks"], "verbs": ["get", "list", "watch", "patch", "update"]}]});
    roles.patch("lock-operator", &PatchParams::apply("e2e"), &Patch::Apply(&role)).await.expect("role");
    let bindings: Api<RoleBinding> = Api::namespaced(env.ns.client.clone(), env.name());
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "lock-operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lock-operator"},
        "subjects": [{"kind": "ServiceAccount", "name": operator.service_account, "namespace": env.name()}]});
    bindings.patch("lock-operator", &PatchParams::apply("e2e"), &Patch::Apply(&binding)).await.expect("binding");
    let user = format!("system:serviceaccount:{}:{}", env.name(), operator.service_account);

    // An empty reason is refused, naming the annotation; nothing changes.
    let as_operator: Api<DistributedLock> = Api::namespaced(operator.client.clone(), env.name());
    let empty = json!({"metadata": {"annotations": {ANNOTATION_FORCE_RELEASE: " "}}});
    let message = eventually("the operator's RBAC", WAIT, || async {
        match as_operator.patch(LOCK, &PatchParams::default(), &Patch::Merge(&empty)).await {
            Err(kube::Error::Api(s)) if s.code != 403 || s.message.contains(ANNOTATION_FORCE_RELEASE) => Ok(s.message),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(message.contains(ANNOTATION_FORCE_RELEASE) && message.contains("reason"), "{message}");
    assert!(sidecar.view(LOCK).await["held"].as_bool().expect("held"), "an empty request revoked nothing");

    // The CLI, run with the operator's credentials.
    let kubeconfig = env.log_dir().join("kubeconfig-operator");
    env.ns.kubeconfig_for_token(&operator.token, &kubeconfig).expect("kubeconfig");
    let output = tokio::process::Command::new(crate::support::leasehold_bin())
        .args(["release", &format!("{}/{LOCK}", env.name()), "--force", "--reason", "node is gone"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .expect("run leasehold release");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout} {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains(&format!("revoked token {token_a}")) && stdout.contains(&user), "{stdout}");

    let lock = until(&env.locks(), LOCK, WAIT, "the force release recorded", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.last_force_release.as_ref()).is_some()
    })
    .await;
    let record = lock.status.clone().and_then(|s| s.last_force_release).expect("recorded");
    assert_eq!(
        (record.by.as_str(), record.reason.as_str(), record.revoked_token),
        (user.as_str(), "node is gone", Some(token_a))
    );
    assert!(!lock.annotations().contains_key(ANNOTATION_FORCE_RELEASE), "the annotation is cleared");
    assert!(lock.status.expect("status").fencing_token.expect("token") > token_a, "the token was raised");

    let lost = events.expect("lost", WAIT).await;
    assert_eq!(lost["fencingToken"].as_i64(), Some(token_a));
    assert_eq!(sidecar.view(LOCK).await["held"].as_bool(), Some(false));
    let message = denial(fenced_write(&cms, Some(token_a), "9").await);
    assert!(message.contains("stale"), "the revoked token is stale: {message}");

    let events_api: Api<Event> = Api::namespaced(env.ns.client.clone(), env.name());
    let event = eventually("a ForceReleased event", WAIT, || async {
        let list = events_api.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ForceReleased"))
            .ok_or_else(|| "none yet".to_owned())
    })
    .await;
    let note = event.note.unwrap_or_default();
    assert!(note.contains(&user) && note.contains("node is gone"), "{note}");
}

#[tokio::test]
async fn a_force_release_request_is_stamped_with_the_token_of_the_hold_it_is_about() {
    let env = Env::new("adm-force-target").await;
    let _controller = env.webhook_controller(None, &[]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let locks = env.locks();
    let dry_run = PatchParams { dry_run: true, ..PatchParams::default() };
    let request = |extra: serde_json::Value| {
        let mut annotations = json!({ANNOTATION_FORCE_RELEASE: "node is gone"});
        annotations.as_object_mut().expect("a map").extend(extra.as_object().expect("a map").clone());
        json!({"metadata": {"annotations": annotations}})
    };

    // Nobody holds it: nothing to revoke, and no request is left behind to revoke a later
    // holder.
    let message = denial(locks.patch(LOCK, &PatchParams::default(), &Patch::Merge(&request(json!({})))).await);
    assert!(message.contains(&format!("lock {}/{LOCK} is not held", env.name())), "{message}");
    let lock = locks.get(LOCK).await.expect("lock");
    assert!(!lock.annotations().contains_key(ANNOTATION_FORCE_RELEASE), "{:?}", lock.annotations());

    // Held: stamped with who asked and the holder's token, whatever the request said
    // (a dry run shows the admitted object without the controller acting on it).
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires");
    let forged = json!({ANNOTATION_FORCE_RELEASE_BY: "mallory", ANNOTATION_FORCE_RELEASE_TARGET: "1"});
    let admitted = locks.patch(LOCK, &dry_run, &Patch::Merge(&request(forged))).await.expect("admitted");
    let stamped = admitted.annotations();
    assert_eq!(stamped.get(ANNOTATION_FORCE_RELEASE_BY).map(String::as_str), Some("leasehold-admin"), "{stamped:?}");
    assert_eq!(stamped.get(ANNOTATION_FORCE_RELEASE_TARGET), Some(&hold.token().to_string()), "{stamped:?}");
    hold.release().await;
}
