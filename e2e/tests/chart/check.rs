//! `helm test` of the chart, and its install check: `leasehold check`, run as the chart's
//! hooks would run it (their ServiceAccount and RBAC from `helm get hooks`, the test Pod's
//! and the install Job's arguments) but as a local process — there is no kubelet to run the
//! hooks' Pods. The install check waits while the API server cannot reach the webhooks and
//! passes once the controller serves them; then every check passes (a replica leads, the CA
//! is valid, the guard is installed); with the controller gone, the check fails and names
//! the webhook the API server cannot call, and the install check does so once its wait is
//! over.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::cluster::ChartCluster;
use super::helm::{NAMESPACE, RELEASE, objects, pinned_release};
use super::rbac::{ChartController, point_chart_webhooks};
use crate::support::leasehold_bin;

/// `leasehold` with `args` as `kubeconfig`'s user.
fn command(args: &[String], kubeconfig: &std::path::Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(leasehold_bin());
    command.args(args).env("KUBECONFIG", kubeconfig).stdin(std::process::Stdio::null());
    command
}

/// Runs `leasehold` with `args` as `kubeconfig`'s user: (exit code, stdout and stderr).
async fn leasehold(args: &[String], kubeconfig: &std::path::Path) -> (i32, String) {
    let output = command(args, kubeconfig).output().await.expect("run leasehold check");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), format!("{stdout}{stderr}"))
}

/// The findings `output` prints, one per line.
fn findings(output: &str) -> Vec<&str> {
    output.lines().filter(|l| l.starts_with("ok") || l.starts_with("WARN") || l.starts_with("FAIL")).collect()
}

#[tokio::test]
async fn helm_test_checks_version_crds_certificate_and_that_the_apiserver_reaches_each_webhook() {
    let cluster = ChartCluster::start().await;
    let app = cluster.cp.namespace("app").await;
    cluster.install(&[&format!("tests.probeNamespace={}", app.name)]).await;
    let controller = ChartController::start(&cluster, &app).await;

    // The hooks' objects, as `helm test` and the install check would create them; the test
    // Pod's arguments and the install Job's.
    let hooks = objects(&cluster.helm.must(&["get", "hooks", RELEASE, "--namespace", NAMESPACE]).await);
    let (mut args, mut install_args): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    for hook in &hooks {
        let events = hook["metadata"]["annotations"]["helm.sh/hook"].as_str().expect("a hook");
        match hook["kind"].as_str() {
            Some("Pod") => {
                assert_eq!(events, "test", "{hook}");
                args = serde_json::from_value(hook["spec"]["containers"][0]["args"].clone()).expect("args");
                continue;
            }
            Some("Job") => {
                assert_eq!(events, "post-install,post-upgrade", "{hook}");
                let container = &hook["spec"]["template"]["spec"]["containers"][0];
                install_args = serde_json::from_value(container["args"].clone()).expect("args");
                continue;
            }
            _ => assert_eq!(events, "post-install,post-upgrade,test", "the RBAC serves both: {hook}"),
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
    let mut waiting_args = args.clone();
    waiting_args.push("--wait=2m".to_owned());
    assert_eq!(install_args, waiting_args, "the install check is the test's check, waiting");
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

    // Just installed: the webhooks' Service routes to no replica yet, and the API server's
    // calls are refused (as kube-proxy refuses them until the endpoints reach it; here a
    // closed local port). The install check waits, saying for what, and passes once the
    // controller serves the webhooks.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a closed port");
    point_chart_webhooks(&cluster, closed).await;
    let mut install = command(&install_args, &kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the install check");
    let mut stderr = BufReader::new(install.stderr.take().expect("stderr")).lines();
    let mut waited = Vec::new();
    while !waited.iter().any(|l: &String| l.contains("waiting for") && l.contains("webhook inject.leasehold.dev")) {
        let line = stderr.next_line().await.expect("read its stderr");
        waited.push(
            line.unwrap_or_else(|| panic!("the install check ended without waiting for the webhooks: {waited:?}")),
        );
    }
    controller.serve_chart_webhooks(&cluster, &app).await;
    let output = install.wait_with_output().await.expect("the install check ends");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{waited:?}\ncontroller log:\n{}", controller.log());
    let passed = findings(&stdout);
    assert_eq!(passed.len(), 13, "{stdout}");
    assert!(passed.iter().all(|l| l.starts_with("ok")), "its last round, all passed: {stdout}");

    // Everything in place: every check passes, each on its own line.
    let (code, output) = leasehold(&args, &kubeconfig).await;
    assert_eq!(code, 0, "{output}\ncontroller log:\n{}", controller.log());
    let lines = findings(&output);
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

    // The install check, its wait cut short: it waited for the webhooks, and fails when
    // the wait is over.
    let short: Vec<String> = install_args
        .iter()
        .map(|a| if a.starts_with("--wait=") { "--wait=2s".to_owned() } else { a.clone() })
        .collect();
    let (code, output) = leasehold(&short, &kubeconfig).await;
    assert_eq!(code, 1, "{output}");
    assert!(
        output
            .lines()
            .any(|l| l.starts_with("leasehold check: waiting for") && l.contains("webhook inject.leasehold.dev")),
        "{output}"
    );
    let line = output.lines().find(|l| l.contains("webhook inject.leasehold.dev:")).expect("a finding");
    assert!(line.starts_with("FAIL") && line.contains("no controller replica serves it"), "{line}");
}
