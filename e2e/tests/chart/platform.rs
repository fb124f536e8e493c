//! The chart's settings for real platforms, on the real control plane: a namespace opts
//! out of sidecar injection by a label (and keeps its fencing), and the chart turns the
//! opt-out off on request.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::cluster::ChartCluster;
use crate::support::lifecycle::poll;

const WAIT: Duration = Duration::from_secs(30);

fn opted_in_pod(name: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"leasehold.dev/inject": "true"}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]}}))
    .expect("a Pod")
}

/// What the webhooks answer for `pod` in `namespace` (a dry run: nothing is stored). No
/// pod serves the chart's webhooks here (no kubelet), so a request a webhook must see is
/// refused naming it, and one it must not see is admitted as sent.
async fn create_pod(cluster: &ChartCluster, namespace: &str, name: &str) -> Result<Pod, String> {
    Api::<Pod>::namespaced(cluster.admin.clone(), namespace)
        .create(&PostParams { dry_run: true, field_manager: None }, &opted_in_pod(name))
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_namespace_labelled_inject_disabled_gets_no_sidecar_and_keeps_its_fencing() {
    let cluster = ChartCluster::start().await;
    cluster.install(&[]).await;
    let opted_out = cluster.cp.namespace("optout").await;
    let regular = cluster.cp.namespace("regular").await;
    let label = json!({"metadata": {"labels": {"leasehold.dev/inject": "disabled"}}});
    Api::<Namespace>::all(cluster.admin.clone())
        .patch(&opted_out.name, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("label the namespace");

    // A regular namespace's opted-in pod must go through injection, which cannot answer.
    let refused = create_pod(&cluster, &regular.name, "app").await.expect_err("injection is required");
    assert!(refused.contains("inject.leasehold.dev"), "{refused}");
    // The opted-out namespace's is never sent to it: admitted as it is, with no sidecar.
    let admitted = create_pod(&cluster, &opted_out.name, "app").await.expect("no injection in an opted-out namespace");
    let spec = admitted.spec.expect("a spec");
    assert_eq!(spec.containers.len(), 1);
    assert!(spec.init_containers.unwrap_or_default().is_empty(), "no sidecar");
    // Fencing still applies there.
    let fenced: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "fenced",
        "labels": {"leasehold.dev/fenced-by": "jobs"}, "annotations": {"leasehold.dev/fencing-token": "1"}}}))
    .expect("a ConfigMap");
    match Api::<ConfigMap>::namespaced(cluster.admin.clone(), &opted_out.name)
        .create(&PostParams::default(), &fenced)
        .await
    {
        Err(kube::Error::Api(s)) => assert!(s.message.contains("fenced.leasehold.dev"), "{}", s.message),
        other => panic!("a fenced write in an opted-out namespace went unchecked: {other:?}"),
    }

    // webhook.inject.namespaceOptOut=false: the label no longer exempts the namespace.
    cluster.helm_apply("upgrade", &["--reuse-values", "--set", "webhook.inject.namespaceOptOut=false"]).await;
    poll(WAIT, "injection required in the labelled namespace", || async {
        match create_pod(&cluster, &opted_out.name, "app").await {
            Err(e) if e.contains("inject.leasehold.dev") => Ok(Some(())),
            Err(e) => Err(e),
            Ok(_) => Ok(None),
        }
    })
    .await
    .expect("the opt-out is off");
}
