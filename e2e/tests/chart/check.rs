//! `helm test` of the chart: `leasehold check`, run as the chart's test hook would run it
//! (its ServiceAccount and RBAC from `helm get hooks`, the hook Pod's arguments) but as a
//! local process — there is no kubelet to run the hook Pod. With the controller serving
//! the chart's webhooks every check passes (a replica leads, the CA is valid, the guard is
//! installed); with it gone, the check fails and names the
//! webhook the API server cannot call.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::GroupVersionKind;

use super::cluster::ChartCluster;
use super::helm::{NAMESPACE, RELEASE, objects, pinned_release};
use super::rbac::ChartController;
use crate::support::leasehold_bin;

/// Runs `leasehold` with `args` as `kubeconfig`'s user: (exit code, stdout).
async fn leasehold(args: &[String], kubeconfig: &std::path::Path) -> (i32, String) {
    let output = tokio::process::Command::new(leasehold_bin())
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run leasehold check");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), format!("{stdout}{stderr}"))
}

#[tokio::test]
async fn helm_test_checks_version_crds_certificate_and_that_the_apiserver_reaches_each_webhook() {
    let cluster = ChartCluster::start().await;
    let app = cluster.cp.namespace("app").await;
    cluster.install(&[&format!("tests.probeNamespace={}", app.name)]).await;
    let controller = ChartController::start(&cluster, &app).await;
    controller.serve_chart_webhooks(&cluster, &app).await;

    // The test hook's objects, as `helm test` would create them; the Pod's arguments.
    let hooks = objects(&cluster.helm.must(&["get", "hooks", RELEASE, "--namespace", NAMESPACE]).await);
    let mut args: Vec<String> = Vec::new();
    for hook in &hooks {
        assert_eq!(hook["metadata"]["annotations"]["helm.sh/hook"], "test", "{hook}");
        if hook["kind"] == "Pod" {
            args = serde_json::from_value(hook["spec"]["containers"][0]["args"].clone()).expect("args");
            continue;
        }
        let (group, version) = match hook["apiVersion"].as_str().expect("apiVersion").split_once('/') {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (String::new(), hook["apiVersion"].as_str().expect("apiVersion").to_owned()),
        };
        let gvk = GroupVersionKind::gvk(&group, &version, hook["kind"].as_str().expect("kind"));
        let (resource, _) = kube::discovery::pinned_kind(&cluster.admin, &gvk).await.expect("a known kind");
        let object: DynamicObject = serde_json::from_value(hook.clone()).expect("an object");
        let api: Api<DynamicObject> = match hook["metadata"]["namespace"].as_str() {
            Some(namespace) => Api::namespaced_with(cluster.admin.clone(), namespace, &resource),
            None => Api::all_with(cluster.admin.clone(), &resource),
        };
        api.create(&PostParams::default(), &object).await.unwrap_or_else(|e| panic!("create {hook}: {e}"));
    }
    assert_eq!(args.first().map(String::as_str), Some("check"), "the hook Pod runs leasehold check: {args:?}");
    let account = hooks
        .iter()
        .find(|h| h["kind"] == "ServiceAccount")
        .and_then(|h| h["metadata"]["name"].as_str())
        .expect("the hook's ServiceAccount");
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..TokenRequestSpec::default() }),
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(cluster.admin.clone(), NAMESPACE)
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .and_then(|s| s.token)
        .expect("a token in the status");
    let kubeconfig = std::env::temp_dir().join("leasehold-e2e").join(format!("check-{}", app.name));
    app.kubeconfig_for_token(&token, &kubeconfig).expect("write the kubeconfig");

    // Everything in place: every check passes, each on its own line.
    let (code, output) = leasehold(&args, &kubeconfig).await;
    assert_eq!(code, 0, "{output}\ncontroller log:\n{}", controller.log());
    let lines: Vec<&str> =
        output.lines().filter(|l| l.starts_with("ok") || l.starts_with("WARN") || l.starts_with("FAIL")).collect();
    assert_eq!(lines.len(), 13, "{output}");
    assert!(lines.iter().all(|l| l.starts_with("ok")), "{output}");
    for expected in [
        format!("kubernetes version: {}", pinned_release()),
        "crd distributedlocks.leasehold.dev: established".to_owned(),
        "crd lockclaims.leasehold.dev: established".to_owned(),
        "crd forcereleaserequests.leasehold.dev: established".to_owned(),
        "mutatingwebhookconfiguration leasehold: 3 webhooks, each with a CA bundle".to_owned(),
        "validatingwebhookconfiguration leasehold: 1 webhooks, each with a CA bundle".to_owned(),
        "webhook certificates: 4 CA bundles valid".to_owned(),
        "controller leader: ".to_owned(),
        "lease guard: policies and bindings present: leasehold-lease-guard, leasehold-claim-guard".to_owned(),
        "webhook inject.leasehold.dev: reached".to_owned(),
        "webhook fenced.leasehold.dev: reached".to_owned(),
        "webhook force-release.leasehold.dev: reached".to_owned(),
        "webhook force-release-requests.leasehold.dev: reached".to_owned(),
    ] {
        assert!(output.contains(&expected), "{expected:?} in\n{output}");
    }

    // No controller: the API server cannot call the webhooks, and the check says so.
    drop(controller);
    let (code, output) = leasehold(&args, &kubeconfig).await;
    assert_eq!(code, 1, "{output}");
    for webhook in [
        "inject.leasehold.dev",
        "fenced.leasehold.dev",
        "force-release.leasehold.dev",
        "force-release-requests.leasehold.dev",
    ] {
        let line = output.lines().find(|l| l.contains(&format!("webhook {webhook}:"))).expect("a finding");
        assert!(line.starts_with("FAIL") && line.contains("failed calling webhook"), "{line}");
        assert!(line.contains("no controller replica serves it"), "the cause named: {line}");
    }
    assert!(output.lines().any(|l| l.starts_with("ok    kubernetes version")), "{output}");
}
