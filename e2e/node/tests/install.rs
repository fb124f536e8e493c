//! `helm install` with default values on the real node: both controller replicas Ready,
//! one leads, the webhooks answer through their Service with the chart's certificate, the
//! metrics scrape; an injected pod's sidecar starts before its app, which acquires with
//! the pod's own token; and the Lease guard refuses a second pod that renews the first
//! one's hold.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::e2e_support::lifecycle::wait_for;
use crate::pods::{acquired_token, acquirer, container_id, identity, lock, logs};
use crate::support::{NAMESPACE, RELEASE, exec, helm, installed, is_ready, node, run, wait_pod};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn helm_install_runs_two_ready_replicas_one_leading_with_webhooks_and_metrics_behind_their_services() {
    let node = node();
    installed();
    let admin = node.admin_client().await;

    // Both replicas ready — waited for, as `helm install --wait` does: other node tests
    // run beside this one on the same installation.
    let deployments = Api::<Deployment>::namespaced(admin.clone(), NAMESPACE);
    let both_ready =
        |d: &Deployment| d.status.as_ref().is_some_and(|s| (s.replicas, s.ready_replicas) == (Some(2), Some(2)));
    wait_for(&deployments, "leasehold-controller", WAIT, "two ready controller replicas", both_ready)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let pods = Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
        .await
        .expect("controller pods");
    assert_eq!(pods.items.len(), 2);
    let image = "ghcr.io/leasehold/leasehold:0.1.0";
    for pod in &pods.items {
        assert!(is_ready(Some(pod)), "{} is not Ready", pod.name_any());
        let spec = pod.spec.clone().unwrap_or_default();
        assert_eq!(spec.containers[0].image.as_deref(), Some(image), "the chart's default image");
        eprintln!("controller {} runs in container {}", pod.name_any(), container_id(pod, "controller"));
    }

    // One leads: the election Lease names one of the two pods.
    let names: Vec<String> = pods.items.iter().map(ResourceExt::name_any).collect();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
    let election = wait_for(&leases, "leasehold-controller", WAIT, "an elected controller", |l: &Lease| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_ref()).is_some_and(|h| names.contains(h))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let leader = election.spec.and_then(|s| s.holder_identity).expect("a holder");

    // The metrics, scraped through the metrics Service (the apiserver's service proxy
    // reaches it over the pod network): the leader says it leads.
    let scraped = node
        .kubectl()
        .args([
            "get",
            "--raw",
            &format!("/api/v1/namespaces/{NAMESPACE}/services/http:leasehold-metrics:8080/proxy/metrics"),
        ])
        .output()
        .expect("kubectl get --raw");
    let metrics = String::from_utf8_lossy(&scraped.stdout);
    assert!(scraped.status.success(), "{}", String::from_utf8_lossy(&scraped.stderr));
    assert!(metrics.contains("leasehold_controller_"), "no Leasehold metrics in the scrape:\n{metrics}");
    let for_leader = node
        .kubectl()
        .args(["get", "--raw", &format!("/api/v1/namespaces/{NAMESPACE}/pods/http:{leader}:8080/proxy/metrics")])
        .output()
        .expect("kubectl get --raw");
    assert!(for_leader.status.success(), "{}", String::from_utf8_lossy(&for_leader.stderr));

    // The validating webhook, through its Service and with the chart's certificate: a
    // fenced object without a token is refused by it (not by a connection error).
    let ns = node.namespace("install").await;
    lock(&admin, &ns.name, "config-writer").await;
    let fenced: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "fenced", "labels": {"leasehold.dev/fenced-by": "config-writer"}},
        "data": {"a": "b"},
    }))
    .expect("a ConfigMap");
    let refused = Api::<ConfigMap>::namespaced(admin.clone(), &ns.name).create(&PostParams::default(), &fenced).await;
    match refused {
        Err(kube::Error::Api(status)) => {
            assert!(
                status.message.contains("leasehold.dev/fencing-token"),
                "refused, but not by the webhook: {status:?}"
            )
        }
        other => panic!("a fenced object without a token was admitted: {other:?}"),
    }
}

#[tokio::test]
async fn an_injected_sidecar_starts_first_and_the_app_acquires_with_its_pods_own_token() {
    let node = node();
    installed();
    let admin = node.admin_client().await;
    let ns = node.namespace("inject").await;
    lock(&admin, &ns.name, "example").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns.name);

    let created =
        pods.create(&PostParams::default(), &acquirer("app-a", "example", "Always")).await.expect("create app-a");
    // The mutating webhook answered through its Service: the sidecar is a native sidecar.
    let init = created.spec.clone().unwrap_or_default().init_containers.unwrap_or_default();
    assert_eq!(init.first().map(|c| c.name.as_str()), Some("leasehold-sidecar"), "injected first");
    assert_eq!(init[0].restart_policy.as_deref(), Some("Always"), "a native sidecar");
    assert_eq!(init[0].image.as_deref(), Some("ghcr.io/leasehold/leasehold:0.1.0"));

    let a = wait_pod(&pods, "app-a", "Ready", |p: Option<&Pod>| is_ready(p)).await;
    let sidecar_id = container_id(&a, "leasehold-sidecar");
    eprintln!("app-a's sidecar runs in container {sidecar_id}");
    let app_log = leasehold_harness::eventually("app-a's app to print its grant", WAIT, || async {
        let log = logs(&ns.name, "app-a", "app");
        if acquired_token(&log).is_some() { Ok(log) } else { Err(format!("log so far: {log}")) }
    })
    .await;
    assert!(app_log.starts_with("sidecar-first"), "the app ran before its sidecar answered:\n{app_log}");
    let token = acquired_token(&app_log).expect("a token");

    // Granted to the pod itself: the sidecar claimed with the pod's projected token.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns.name);
    let held = leases.get("example").await.expect("the lock Lease");
    assert_eq!(held.spec.and_then(|s| s.holder_identity), Some(identity(&a)), "held by app-a's identity");
    let annotations = held.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations.get("leasehold.dev/fencing-token"), Some(&token.to_string()));

    // A second pod, with its own (pod-bound) token, renews app-a's hold: the Lease guard refuses.
    pods.create(&PostParams::default(), &acquirer("app-b", "other", "Always")).await.expect("create app-b");
    wait_pod(&pods, "app-b", "Running", |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()?.phase.clone()).as_deref() == Some("Running")
    })
    .await;
    let token_b = exec(&ns.name, "app-b", "app", &["cat", "/var/run/secrets/kubernetes.io/serviceaccount/token"]);
    assert!(token_b.status.success(), "{}", String::from_utf8_lossy(&token_b.stderr));
    let as_b = ns_client(node, &String::from_utf8_lossy(&token_b.stdout), &ns.name).await;
    let mut lease = Api::<Lease>::namespaced(as_b.clone(), &ns.name).get("example").await.expect("app-b may read it");
    if let Some(spec) = lease.spec.as_mut() {
        spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now()));
    }
    let renewed = Api::<Lease>::namespaced(as_b, &ns.name).replace("example", &PostParams::default(), &lease).await;
    match renewed {
        // The guard's message names the hold's owner and what only it may do.
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains("renew or release") && status.message.contains(&identity(&a)),
            "refused, but not by the Lease guard: {status:?}"
        ),
        other => panic!("app-b renewed app-a's hold: {other:?}"),
    }
}

/// A client for `token` (a pod's), through the node's relay.
async fn ns_client(node: &leasehold_harness::Node, token: &str, namespace: &str) -> kube::Client {
    let dir = node.dir().join("run");
    let path = dir.join(format!("kubeconfig-{namespace}"));
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "node", "cluster": {"server": node.state.server,
            "certificate-authority-data": base64_encode(node.state.ca_pem.as_bytes())}}],
        "users": [{"name": "pod", "user": {"token": token.trim()}}],
        "contexts": [{"name": "node", "context": {"cluster": "node", "user": "pod", "namespace": namespace}}],
        "current-context": "node",
    });
    std::fs::write(&path, kubeconfig.to_string()).expect("write a kubeconfig");
    let parsed = kube::config::Kubeconfig::read_from(&path).expect("a kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(parsed, &kube::config::KubeConfigOptions::default())
        .await
        .expect("a config");
    kube::Client::try_from(config).expect("a client")
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn helm_test_runs_leasehold_check_in_a_pod_and_every_check_passes() {
    installed();
    // The chart's test hook: `leasehold check` in a Pod with the chart's image, its probes
    // sent through the API server to the webhooks behind their Service. The Pod exits 0
    // only if every check passed (a failed one is kept for `kubectl logs`; a passed one is
    // deleted, so helm cannot show its logs).
    let mut test = helm();
    test.args(["test", RELEASE, "--namespace", NAMESPACE, "--timeout", "120s"]);
    let output = run(test, "helm test");
    let text = String::from_utf8_lossy(&output.stdout);
    let suites: Vec<&str> = text.split("TEST SUITE:").skip(1).collect();
    // ServiceAccount, ClusterRole and binding, the probe namespace's Role and binding, the
    // election Lease's Role and binding, and the Pod.
    assert_eq!(suites.len(), 8, "the check's ServiceAccount, RBAC and Pod: {text}");
    assert!(suites.iter().all(|s| s.contains("Phase:          Succeeded")), "{text}");
    let admin = node().admin_client().await;
    let left = Api::<Pod>::namespaced(admin, NAMESPACE).get_opt("leasehold-check").await.expect("read the Pod");
    assert!(left.is_none(), "a passed check leaves no Pod behind");
}
