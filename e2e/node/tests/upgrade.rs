//! `helm upgrade` to a changed image while locks are held and contended, then `helm
//! uninstall`, on a real node: a test binary of its own (its own node), since it replaces
//! and removes the release the other node tests share.
//!
//! During the controller's rolling update, tokens keep increasing, the Lease never names
//! two holders, a long hold survives (same holder, same token, still held in its sidecar's
//! view) and grants go on; afterwards only the kept CRDs (and the locks) remain: not the
//! Role and RoleBinding the controller created in the app namespace, nor its election
//! Lease (owned by the release's ClusterRole, so the garbage collector deletes them).

use leasehold_e2e_support as e2e_support;

#[allow(dead_code, unused_imports)]
mod pods;
mod support;

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use leasehold::crd::DistributedLock;
use leasehold_image::{Reference, leasehold as image};
use serde_json::json;

use e2e_support::watch::{GrantLog, until_gone};
use pods::{acquired_token, identity, lock, logs};
use support::{NAMESPACE, RELEASE, exec, helm, installed, node, repo, run, wait_pod};

/// The release's label on every object the chart renders.
const INSTANCE: &str = "app.kubernetes.io/instance=leasehold";
/// The changed image's tag.
const NEXT_TAG: &str = "0.1.0-next";

/// An app that takes the lock over and over: acquire, hold briefly, release.
fn contender(name: &str, lock: &str) -> Pod {
    let script = format!(
        r#"trap 'exit 0' TERM
while true; do
  if answer=$(wget -q -O- --post-data '{{"waitSeconds": 60}}' "$LEASEHOLD_URL/v1/locks/{lock}/acquire"); then
    echo "acquired $answer"
    sleep 0.3
    wget -q -O- --post-data '' "$LEASEHOLD_URL/v1/locks/{lock}/release" >/dev/null
  fi
done"#
    );
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"leasehold.dev/inject": "true"}},
        "spec": {"terminationGracePeriodSeconds": 5, "containers": [{
            "name": "app", "image": leasehold_harness::node::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", script],
        }]},
    }))
    .expect("a valid Pod")
}

/// The sidecar's view of `lock` in `pod`, through the app container.
fn view(namespace: &str, pod: &str, lock: &str) -> serde_json::Value {
    let output = exec(namespace, pod, "app", &["sh", "-c", &format!("wget -q -O- \"$LEASEHOLD_URL/v1/locks/{lock}\"")]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("JSON")
}

#[tokio::test]
async fn helm_upgrade_under_contention_keeps_holds_and_tokens_and_uninstall_keeps_only_the_crds() {
    let node = node();
    installed();
    let admin = node.admin_client().await;
    // The README's `helm install` returned once its install check passed: the API server
    // reaches the injection webhook through its Service, so an opted-in Pod created now,
    // with no wait, gets its sidecar.
    let right_after = e2e_support::admission::injects(&Api::namespaced(admin.clone(), "default"), "probe").await;
    assert_eq!(right_after, Ok(true), "an opted-in Pod created right after helm install");
    let ns = node.namespace("upgrade").await;
    lock(&admin, &ns.name, "long").await;
    lock(&admin, &ns.name, "busy").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns.name);
    let leases = Api::namespaced(admin.clone(), &ns.name);
    let mut busy = GrantLog::start(leases.clone(), "busy");

    // A long hold, taken before the upgrade.
    pods.create(&PostParams::default(), &pods::acquirer("holder", "long", "Always")).await.expect("holder");
    let holder = wait_pod(&pods, "holder", "Ready", |p: Option<&Pod>| support::is_ready(p)).await;
    let long_token = leasehold_harness::eventually("the long hold", Duration::from_secs(60), || async {
        acquired_token(&logs(&ns.name, "holder", "app")).ok_or("not yet")
    })
    .await;
    // Contention on another lock.
    for name in ["c1", "c2", "c3"] {
        pods.create(&PostParams::default(), &contender(name, "busy")).await.expect("contender");
    }
    let before = busy.wait_for(6, Duration::from_secs(60)).await.len();

    // The changed image: the same binaries, another tag and label, so another digest.
    let binary = repo().join("target/x86_64-unknown-linux-gnu/release/leasehold");
    let sidecar = repo().join("target/x86_64-unknown-linux-gnu/release/leasehold-sidecar");
    let reference = Reference::parse(&format!("ghcr.io/leasehold/leasehold:{NEXT_TAG}")).expect("reference");
    let mut spec = image::spec(repo(), &binary, &sidecar, Some(reference)).expect("the image spec");
    spec.labels.insert("org.opencontainers.image.version".into(), NEXT_TAG.into());
    let built = node.build_and_import(&spec).expect("import the changed image");
    eprintln!("upgrading to {} ({})", built.name, built.digest);

    let mut upgrade = helm();
    // As docs/upgrading.md says to upgrade.
    upgrade.args(["upgrade", RELEASE, "charts/leasehold", "--namespace", NAMESPACE, "--reset-then-reuse-values"]);
    upgrade.args(["--set", &format!("image.tag={NEXT_TAG}"), "--wait", "--timeout", "5m"]);
    run(upgrade, "helm upgrade");

    let controllers = Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
        .await
        .expect("controller pods");
    let running: Vec<Option<String>> = controllers
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.spec.clone().unwrap_or_default().containers[0].image.clone())
        .collect();
    let next = format!("ghcr.io/leasehold/leasehold:{NEXT_TAG}");
    assert_eq!(running, vec![Some(next.clone()), Some(next)], "both replicas run the new image");

    // Grants go on after the rolling update; every grant's token is higher than the last,
    // and each names one holder.
    let after = busy.wait_for(before + 6, Duration::from_secs(90)).await;
    assert!(after.windows(2).all(|w| w[1].token > w[0].token), "tokens increase across the upgrade: {after:?}");
    let mut contenders = Vec::new();
    for name in ["c1", "c2", "c3"] {
        contenders.push(identity(&pods.get(name).await.expect("a contender")));
    }
    assert!(after.iter().all(|g| contenders.contains(&g.holder)), "only the contenders held: {after:?}");

    // The long hold survived: same holder and token on the Lease, still held in its sidecar.
    let lease: k8s_openapi::api::coordination::v1::Lease = leases.get("long").await.expect("the long Lease");
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), Some(identity(&holder)));
    let annotations = lease.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations.get("leasehold.dev/fencing-token"), Some(&long_token.to_string()));
    let seen = view(&ns.name, "holder", "long");
    assert_eq!((seen["held"].as_bool(), seen["fencingToken"].as_i64()), (Some(true), Some(long_token)), "{seen}");

    // What the controller created outside the release: owned by its ClusterRole.
    let roles: Api<Role> = Api::namespaced(admin.clone(), &ns.name);
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), &ns.name);
    let elections: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
    let owner = Api::<ClusterRole>::all(admin.clone()).get("leasehold-controller").await.expect("the ClusterRole");
    let owned = |meta: &kube::api::ObjectMeta| {
        meta.owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "ClusterRole" && o.uid.as_str() == owner.metadata.uid.as_deref().unwrap_or_default())
    };
    assert!(owned(&roles.get("leasehold-client").await.expect("the client Role").metadata), "the Role is owned");
    assert!(owned(&bindings.get("leasehold-client").await.expect("the RoleBinding").metadata), "the RoleBinding too");

    // Uninstall: only the kept CRDs, and with them the locks, remain.
    let mut uninstall = helm();
    uninstall.args(["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"]).stdin(Stdio::null());
    run(uninstall, "helm uninstall");
    let labelled = ListParams::default().labels(INSTANCE);
    let left = [
        (
            "Deployments",
            Api::<Deployment>::namespaced(admin.clone(), NAMESPACE).list(&labelled).await.map(|l| l.items.len()),
        ),
        ("Services", Api::<Service>::namespaced(admin.clone(), NAMESPACE).list(&labelled).await.map(|l| l.items.len())),
        ("Secrets", Api::<Secret>::namespaced(admin.clone(), NAMESPACE).list(&labelled).await.map(|l| l.items.len())),
        (
            "ServiceAccounts",
            Api::<ServiceAccount>::namespaced(admin.clone(), NAMESPACE).list(&labelled).await.map(|l| l.items.len()),
        ),
        ("ClusterRoles", Api::<ClusterRole>::all(admin.clone()).list(&labelled).await.map(|l| l.items.len())),
        (
            "ClusterRoleBindings",
            Api::<ClusterRoleBinding>::all(admin.clone()).list(&labelled).await.map(|l| l.items.len()),
        ),
        (
            "MutatingWebhookConfigurations",
            Api::<MutatingWebhookConfiguration>::all(admin.clone()).list(&labelled).await.map(|l| l.items.len()),
        ),
        (
            "ValidatingWebhookConfigurations",
            Api::<ValidatingWebhookConfiguration>::all(admin.clone()).list(&labelled).await.map(|l| l.items.len()),
        ),
        (
            "ValidatingAdmissionPolicies",
            Api::<ValidatingAdmissionPolicy>::all(admin.clone()).list(&labelled).await.map(|l| l.items.len()),
        ),
        (
            "ValidatingAdmissionPolicyBindings",
            Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone()).list(&labelled).await.map(|l| l.items.len()),
        ),
    ];
    for (kind, count) in left {
        assert_eq!(
            count.unwrap_or_else(|e| panic!("list {kind}: {e}")),
            0,
            "{kind} of the release left after uninstall"
        );
    }
    let gone = Duration::from_secs(60);
    until_gone(&roles, "leasehold-client", gone, "the client Role deleted by the garbage collector").await;
    until_gone(&bindings, "leasehold-client", gone, "the client RoleBinding deleted by the garbage collector").await;
    until_gone(&elections, "leasehold-controller", gone, "the election Lease deleted by the garbage collector").await;
    let crds = Api::<CustomResourceDefinition>::all(admin.clone()).list(&labelled).await.expect("CRDs");
    let kept: Vec<String> = crds.items.iter().filter_map(|c| c.metadata.name.clone()).collect();
    assert_eq!(
        kept,
        ["distributedlocks.leasehold.dev", "forcereleaserequests.leasehold.dev", "lockclaims.leasehold.dev"],
        "the CRDs are kept (crds.keep)"
    );
    let locks = Api::<DistributedLock>::namespaced(admin, &ns.name).list(&ListParams::default()).await.expect("locks");
    assert_eq!(locks.items.len(), 2, "the locks survive with their CRD");
}
