//! `helm install`, `upgrade` and `uninstall` against the real apiserver: the objects
//! exist and work (webhooks registered and failing closed, the Lease guard denying), an
//! upgrade keeps the generated certificate, and `crds.keep` decides whether the CRD — and
//! every lock — survives an uninstall.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use leasehold::crd::{DistributedLock, DistributedLockSpec, ForceReleaseRequest};
use serde_json::json;

use super::cluster::{CRD, ChartCluster};
use super::helm::NAMESPACE;
use crate::support::lifecycle::poll;
use crate::support::watch::until_gone;

const WAIT: Duration = Duration::from_secs(30);

/// The certificate as installed: the Secret's data and every webhook's caBundle.
async fn certificates(cluster: &ChartCluster) -> (BTreeMap<String, Vec<u8>>, Vec<Vec<u8>>) {
    let secret = cluster.tls_secret().await;
    let mutating =
        Api::<MutatingWebhookConfiguration>::all(cluster.admin.clone()).get("leasehold").await.expect("mutating");
    let validating =
        Api::<ValidatingWebhookConfiguration>::all(cluster.admin.clone()).get("leasehold").await.expect("validating");
    let bundles: Vec<Vec<u8>> = mutating
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|w| w.client_config)
        .chain(validating.webhooks.unwrap_or_default().into_iter().map(|w| w.client_config))
        .map(|c| c.ca_bundle.expect("a caBundle").0)
        .collect();
    (secret, bundles)
}

/// The chart's FlowSchema classifies the controller's requests, and only its: the
/// apiserver names the FlowSchema and priority level it chose in every answer.
async fn controller_requests_have_their_own_priority_level(cluster: &ChartCluster) {
    let schema = Api::<FlowSchema>::all(cluster.admin.clone()).get("leasehold-controller").await.expect("FlowSchema");
    let level = Api::<PriorityLevelConfiguration>::all(cluster.admin.clone())
        .get("workload-high")
        .await
        .expect("workload-high");
    let classified = |client: kube::Client| async move {
        let request = http::Request::get(format!("/api/v1/namespaces/{NAMESPACE}/leases?limit=1"))
            .body(Vec::new())
            .expect("a request");
        let answer = client.send(request.map(kube::client::Body::from)).await.expect("an answer");
        let header = |name: &str| answer.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        (header("x-kubernetes-pf-flowschema-uid"), header("x-kubernetes-pf-prioritylevel-uid"))
    };
    let controller = cluster.impersonating(&format!("system:serviceaccount:{NAMESPACE}:leasehold-controller")).await;
    assert_eq!(classified(controller).await, (schema.uid(), level.uid()), "the controller's requests");
    let other = cluster.impersonating(&format!("system:serviceaccount:{NAMESPACE}:default")).await;
    let (other_schema, _) = classified(other).await;
    assert!(other_schema.is_some() && other_schema != schema.uid(), "another ServiceAccount's requests are not its");
}

fn lock(name: &str, annotations: &[(&str, &str)]) -> DistributedLock {
    let mut lock = DistributedLock::new(name, DistributedLockSpec::default());
    lock.meta_mut().annotations = Some(annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
    lock
}

/// Creating `what` fails because `webhook` cannot be called (nothing serves the Service).
fn refused_by(result: Result<impl std::fmt::Debug, kube::Error>, webhook: &str, what: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert!(status.message.contains(webhook), "{what} was refused, but not by {webhook}: {}", status.message)
        }
        other => panic!("{what} was admitted while {webhook} cannot be reached: {other:?}"),
    }
}

#[tokio::test]
async fn install_upgrade_uninstall_keep_the_certificate_and_honour_crds_keep() {
    let cluster = ChartCluster::start().await;
    let admin = cluster.admin.clone();
    let notes = cluster.install(&[]).await;
    assert!(notes.contains("STATUS: deployed") && notes.contains("kept on `helm uninstall`"), "{notes}");

    // Everything is there.
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let crd = crds.get(CRD).await.expect("the CRD");
    assert_eq!(crd.annotations().get("helm.sh/resource-policy").map(String::as_str), Some("keep"));
    let mutating = Api::<MutatingWebhookConfiguration>::all(admin.clone()).get("leasehold").await.expect("mutating");
    assert_eq!(mutating.webhooks.as_ref().map(Vec::len), Some(3));
    let validating =
        Api::<ValidatingWebhookConfiguration>::all(admin.clone()).get("leasehold").await.expect("validating");
    assert_eq!(validating.webhooks.as_ref().map(Vec::len), Some(1));
    let policy =
        Api::<ValidatingAdmissionPolicy>::all(admin.clone()).get("leasehold-lease-guard").await.expect("policy");
    let condition = &policy.spec.and_then(|s| s.match_conditions).expect("match conditions")[0].expression;
    assert!(condition.contains("system:serviceaccount:leasehold-system:leasehold-controller"), "{condition}");
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone()).get("leasehold-lease-guard").await.expect("binding");
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NAMESPACE);
    assert_eq!(
        deployments.get("leasehold-controller").await.expect("Deployment").spec.and_then(|s| s.replicas),
        Some(2)
    );
    controller_requests_have_their_own_priority_level(&cluster).await;
    let (secret, bundles) = certificates(&cluster).await;
    assert_eq!(bundles.len(), 4);
    assert!(bundles.iter().all(|b| Some(b) == secret.get("ca.crt")), "every caBundle is the Secret's CA");

    // The Lease guard is in force: not even the admin may create a lock Lease.
    let app = cluster.cp.namespace("app").await;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &app.name);
    let mut probe: Lease = serde_json::from_value(json!({"metadata": {"name": "probe",
        "labels": {"leasehold.dev/lock": "probe", "leasehold.dev/role": "lock"}}}))
    .expect("a Lease");
    probe.metadata.namespace = Some(app.name.clone());
    poll(WAIT, "the Lease guard to deny", || async {
        match leases.create(&PostParams { dry_run: true, field_manager: None }, &probe).await {
            Err(kube::Error::Api(s)) if s.message.contains("only the Leasehold controller") => Ok(Some(())),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .expect("the guard denies");

    // The webhooks are registered and fail closed. No pod serves them (no kubelet), so
    // every request they must see is refused, and every other one is not slowed down.
    let locks: Api<DistributedLock> = Api::namespaced(admin.clone(), &app.name);
    let params = PostParams::default();
    locks.create(&params, &lock("plain", &[])).await.expect("a plain lock never waits on a webhook");
    refused_by(
        locks.create(&params, &lock("forced", &[("leasehold.dev/force-release", "why")])).await,
        "force-release.leasehold.dev",
        "an unaudited force release",
    );
    let request: ForceReleaseRequest = serde_json::from_value(json!({"metadata": {"name": "stuck"},
        "spec": {"lock": "plain", "reason": "why"}}))
    .expect("a ForceReleaseRequest");
    refused_by(
        Api::<ForceReleaseRequest>::namespaced(admin.clone(), &app.name).create(&params, &request).await,
        "force-release-requests.leasehold.dev",
        "a force-release request nobody stamped",
    );
    let fenced: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "fenced",
        "labels": {"leasehold.dev/fenced-by": "plain"}, "annotations": {"leasehold.dev/fencing-token": "1"}}}))
    .expect("a ConfigMap");
    refused_by(
        Api::<ConfigMap>::namespaced(admin.clone(), &app.name).create(&params, &fenced).await,
        "fenced.leasehold.dev",
        "an unchecked write to a fenced object",
    );
    let opted_in: Pod =
        serde_json::from_value(json!({"metadata": {"name": "app", "labels": {"leasehold.dev/inject": "true"}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]}}))
        .expect("a Pod");
    refused_by(
        Api::<Pod>::namespaced(admin.clone(), &app.name).create(&params, &opted_in).await,
        "inject.leasehold.dev",
        "an opted-in pod without its sidecar",
    );
    // The release namespace is never sent to the webhooks.
    let own: Api<DistributedLock> = Api::namespaced(admin.clone(), NAMESPACE);
    own.create(&params, &lock("kept", &[("leasehold.dev/force-release", "why")]))
        .await
        .expect("the release namespace is excluded from the webhooks");

    // An upgrade changes what it is asked to, and not the certificate.
    let upgraded = cluster.helm_apply("upgrade", &["--reuse-values", "--set", "replicaCount=3"]).await;
    assert!(upgraded.contains("REVISION: 2"), "{upgraded}");
    assert_eq!(
        deployments.get("leasehold-controller").await.expect("Deployment").spec.and_then(|s| s.replicas),
        Some(3)
    );
    assert_eq!(certificates(&cluster).await, (secret.clone(), bundles.clone()), "the upgrade rotated the certificate");

    // Uninstall with crds.keep: the release's objects go, the CRD and the locks stay.
    cluster.uninstall().await;
    until_gone(&Api::<MutatingWebhookConfiguration>::all(admin.clone()), "leasehold", WAIT, "mutating webhooks gone")
        .await;
    until_gone(&Api::<ValidatingAdmissionPolicy>::all(admin.clone()), "leasehold-lease-guard", WAIT, "policy gone")
        .await;
    until_gone(&Api::<Secret>::namespaced(admin.clone(), NAMESPACE), "leasehold-webhook-tls", WAIT, "Secret gone")
        .await;
    assert!(crds.get_opt(CRD).await.expect("read the CRD").is_some(), "crds.keep: the CRD survives uninstall");
    assert!(own.get_opt("kept").await.expect("read the lock").is_some(), "and so do the locks");
    assert!(locks.get_opt("plain").await.expect("read the lock").is_some());

    // Installing again adopts the kept CRD, locks and all; the new install has a new
    // certificate (so the upgrade above kept the old one by looking it up, not by chance).
    cluster.install(&[]).await;
    assert!(own.get_opt("kept").await.expect("read the lock").is_some(), "the locks are still there");
    assert_ne!(cluster.tls_secret().await, secret, "a fresh install has a fresh certificate");
    // Switching crds.keep off drops the keep policy; then an uninstall deletes the CRD and
    // every lock with it.
    cluster.helm_apply("upgrade", &["--reuse-values", "--set", "crds.keep=false"]).await;
    let crd = crds.get(CRD).await.expect("the CRD");
    assert!(!crd.annotations().contains_key("helm.sh/resource-policy"), "{:?}", crd.annotations());
    cluster.uninstall().await;
    until_gone(&crds, CRD, Duration::from_secs(60), "the CRD deleted by uninstall").await;
}
