//! The chart's RBAC, proven: the controller runs as a local process with a token of the
//! chart's own ServiceAccount (bound to a Pod made from the chart's pod template, as a
//! ReplicaSet would make it), started with the template's own arguments, and passes the
//! lifecycle scenario, serves the webhooks, and prepares namespaces so that app sidecars
//! can claim, also through Lease Roles — with one rule fewer, it is Forbidden.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use leasehold::controller::rbac::{CLIENT_ROLE, shards};
use leasehold::crd::{DistributedLock, DistributedLockSpec};
use leasehold_harness::TestNamespace;
use serde_json::json;

use super::cluster::ChartCluster;
use super::helm::NAMESPACE;
use crate::support::lifecycle::{LOCK, Stage, lifecycle, poll, wait_for};
use crate::support::watch::until_gone;
use crate::support::{LeaseholdProcess, free_port, leasehold_bin};

const WAIT: Duration = Duration::from_secs(30);
const CONTROLLER: &str = "leasehold-controller";

/// The controller as the chart would run it, but as a local process.
pub(super) struct ChartController {
    process: LeaseholdProcess,
    webhook: SocketAddr,
}

/// The arguments of the chart's controller container, with the listen addresses and
/// certificate paths made local; everything else (election, sidecar image and resources,
/// RBAC management) as the chart renders it.
fn local_args(template: &[String], admin: SocketAddr, webhook: SocketAddr, cert: &str, key: &str) -> Vec<String> {
    let local = [
        ("--admin-addr=", admin.to_string()),
        ("--webhook-addr=", webhook.to_string()),
        ("--tls-cert-file=", cert.to_owned()),
        ("--tls-key-file=", key.to_owned()),
    ];
    template
        .iter()
        .map(|arg| match local.iter().find(|(flag, _)| arg.starts_with(flag)) {
            Some((flag, value)) => format!("{flag}{value}"),
            None => arg.clone(),
        })
        .collect()
}

impl ChartController {
    /// Starts the controller with a token of the chart's ServiceAccount, bound to a Pod
    /// created from the chart's template in the release namespace (which enforces the
    /// `restricted` Pod Security Standard). `ns` only lends its kubeconfig writer.
    pub(super) async fn start(cluster: &ChartCluster, ns: &TestNamespace) -> ChartController {
        ChartController::start_with(cluster, ns, &[]).await
    }

    /// [`ChartController::start`], with `extra` arguments after the template's.
    pub(super) async fn start_with(cluster: &ChartCluster, ns: &TestNamespace, extra: &[&str]) -> ChartController {
        let deployment = Api::<Deployment>::namespaced(cluster.admin.clone(), NAMESPACE)
            .get(CONTROLLER)
            .await
            .expect("the chart's Deployment");
        let template = deployment.spec.expect("spec").template;
        let pod_spec = template.spec.expect("a pod spec");
        let container = pod_spec.containers[0].clone();
        let service_account = pod_spec.service_account_name.clone().expect("a ServiceAccount");
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(format!("{CONTROLLER}-local")),
                labels: template.metadata.and_then(|m| m.labels),
                ..ObjectMeta::default()
            },
            spec: Some(pod_spec),
            ..Pod::default()
        };
        let pod = Api::<Pod>::namespaced(cluster.admin.clone(), NAMESPACE)
            .create(&PostParams::default(), &pod)
            .await
            .expect("the chart's pod template is admitted under the restricted Pod Security Standard");
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: None,
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
                expiration_seconds: Some(3600),
            }),
            ..TokenRequest::default()
        };
        let token = Api::<ServiceAccount>::namespaced(cluster.admin.clone(), NAMESPACE)
            .create_token_request(&service_account, &PostParams::default(), &request)
            .await
            .expect("a token for the chart's ServiceAccount")
            .status
            .and_then(|s| s.token)
            .expect("a token in the status");

        let dir = std::env::temp_dir().join("leasehold-e2e").join(format!("chart-{}", ns.name));
        std::fs::create_dir_all(&dir).expect("create the log directory");
        let kubeconfig = dir.join("kubeconfig-controller");
        ns.kubeconfig_for_token(&token, &kubeconfig).expect("write the controller's kubeconfig");
        let (cert_pem, key_pem) = cluster.cp.issue_serving_cert(&["127.0.0.1"]);
        let (cert, key): (PathBuf, PathBuf) = (dir.join("webhook.crt"), dir.join("webhook.key"));
        std::fs::write(&cert, cert_pem).expect("write the certificate");
        std::fs::write(&key, key_pem).expect("write the key");

        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let webhook = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let args = local_args(
            &container.args.expect("args"),
            admin,
            webhook,
            cert.to_str().expect("utf-8"),
            key.to_str().expect("utf-8"),
        );
        let mut command = Command::new(leasehold_bin());
        command
            .args(&args)
            .args(extra)
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", pod.metadata.name.as_deref().expect("name"))
            .env("POD_NAMESPACE", NAMESPACE)
            .env("RUST_LOG", "info,kube=warn");
        let process = LeaseholdProcess::spawn(&format!("chart-controller-{}", admin.port()), command, admin);
        process.wait_ready().await;
        ChartController { process, webhook }
    }

    /// Points the chart's webhook configurations at this process (the apiserver cannot
    /// reach the in-cluster Service: there is no kubelet, so no endpoint), keeping their
    /// rules, selectors and failure policies, and waits until injection answers in `ns`.
    pub(super) async fn serve_chart_webhooks(&self, cluster: &ChartCluster, ns: &TestNamespace) {
        point_chart_webhooks(cluster, self.webhook).await;
        let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), &ns.name);
        poll(WAIT, "the chart's injection webhook answered by the local controller", || async {
            Ok(crate::support::admission::injects(&pods, "probe").await?.then_some(()))
        })
        .await
        .expect("injection works");
    }

    pub(super) fn log(&self) -> String {
        self.process.log_tail(100_000)
    }
}

/// Points the chart's webhook configurations at `address` (the path of each kept), keeping
/// their rules, selectors and failure policies.
pub(super) async fn point_chart_webhooks(cluster: &ChartCluster, address: SocketAddr) {
    let local = |config: &WebhookClientConfig| {
        // The webhook's path: from its Service reference, or from the URL set here before.
        let path = match (&config.service, &config.url) {
            (Some(service), _) => service.path.clone().unwrap_or_default(),
            (None, Some(url)) => url.splitn(4, '/').nth(3).map(|p| format!("/{p}")).unwrap_or_default(),
            (None, None) => String::new(),
        };
        WebhookClientConfig {
            url: Some(format!("https://{address}{path}")),
            ca_bundle: Some(ByteString(cluster.cp.ca_pem().as_bytes().to_vec())),
            service: None,
        }
    };
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(cluster.admin.clone());
    let mut config = mutating.get("leasehold").await.expect("mutating");
    for hook in config.webhooks.iter_mut().flatten() {
        hook.client_config = local(&hook.client_config);
    }
    mutating.replace("leasehold", &PostParams::default(), &config).await.expect("repoint the mutating webhooks");
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(cluster.admin.clone());
    let mut config = validating.get("leasehold").await.expect("validating");
    for hook in config.webhooks.iter_mut().flatten() {
        hook.client_config = local(&hook.client_config);
    }
    validating.replace("leasehold", &PostParams::default(), &config).await.expect("repoint the validating webhook");
}

#[tokio::test]
async fn the_charts_rbac_suffices_for_the_controller_its_webhooks_and_app_sidecars() {
    let cluster = ChartCluster::start().await;
    cluster.install(&[]).await;

    // An app namespace with a lock, before any controller ran: its pods may not claim.
    let app = cluster.cp.namespace("app").await;
    let stage = Stage { cp: &cluster.cp, ns: &app };
    stage
        .locks()
        .create(&PostParams::default(), &DistributedLock::new("jobs", DistributedLockSpec::default()))
        .await
        .expect("a lock");
    let worker = stage.pod("worker").await;
    let sidecar = stage.sidecar(&worker, &[]).await;
    let (status, body) = sidecar.acquire("jobs", 1.0).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")), "before the controller: {body}");
    assert_eq!(stage.may_claim(&worker).await, Ok(false));

    // The controller with the chart's identity prepares the namespace: now they may.
    let controller = ChartController::start(&cluster, &app).await;
    controller.serve_chart_webhooks(&cluster, &app).await;
    poll(WAIT, "the worker allowed to claim", || async { stage.may_claim(&worker).await.map(|ok| ok.then_some(())) })
        .await
        .expect("the controller prepares the namespace");
    Api::<Role>::namespaced(cluster.admin.clone(), &app.name)
        .get("leasehold-client")
        .await
        .expect("the Role it applied");
    let (status, body) = sidecar.acquire("jobs", 20.0).await;
    assert_eq!(status, 200, "after the controller prepared the namespace: {body}");
    assert!(body["fencingToken"].as_i64().is_some_and(|t| t > 0), "{body}");
    assert_eq!(sidecar.release("jobs").await.0, 200);

    // The lifecycle, with nothing but the chart's RBAC (and under the chart's Lease guard).
    let ns = cluster.cp.namespace("lifecycle").await;
    let stage = Stage { cp: &cluster.cp, ns: &ns };
    let report = lifecycle(&stage, WAIT).await.unwrap_or_else(|e| panic!("{e}\ncontroller log:\n{}", controller.log()));
    assert_eq!(report.tokens.len(), 5);
    let events: Api<Event> = Api::namespaced(cluster.admin.clone(), &ns.name);
    let reasons: Vec<String> =
        events.list(&ListParams::default()).await.expect("events").items.into_iter().filter_map(|e| e.reason).collect();
    assert!(reasons.iter().any(|r| r == "Granted") && reasons.iter().any(|r| r == "Expired"), "{reasons:?}");

    // The webhooks, served by that controller: an audited force release of a hold
    // (stamped by the webhook with who asked and the hold's token, carried out and cleared
    // by the controller) and fencing of an object.
    let holder = stage.pod("holder").await;
    let hold = holder.claimant(&ns.name).acquire(LOCK, WAIT).await.expect("a hold to force-release");
    let locks = stage.locks();
    let patch = json!({"metadata": {"annotations": {"leasehold.dev/force-release": "chart test"}}});
    // The chart's default policy needs one approval: the one-step annotation is refused
    // until the lock itself opts in to break glass.
    match locks.patch(LOCK, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Err(kube::Error::Api(s)) if s.message.contains("needs 1 approval") => {}
        other => panic!("the chart's default policy refuses the annotation: {other:?}"),
    }
    let one_step = json!({"spec": {"forceRelease": {"approvals": 0}}});
    locks.patch(LOCK, &PatchParams::default(), &Patch::Merge(&one_step)).await.expect("opt in to one step");
    locks.patch(LOCK, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("request a force release");
    let lock = wait_for(&locks, LOCK, WAIT, "the force release recorded and cleared", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.last_force_release.as_ref()).is_some_and(|r| r.reason == "chart test")
            && !l.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("leasehold.dev/force-release"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\ncontroller log:\n{}", controller.log()));
    let status = lock.status.expect("status");
    let record = status.last_force_release.expect("recorded");
    assert_eq!(record.by, "leasehold-admin", "stamped with who asked");
    assert_eq!(record.revoked_token, Some(hold.token()), "the hold's token revoked");
    let current = status.fencing_token.expect("a token");
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.admin.clone(), &ns.name);
    let fenced = |token: i64| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": "fenced", "labels": {"leasehold.dev/fenced-by": LOCK},
            "annotations": {"leasehold.dev/fencing-token": token.to_string()}}}))
        .expect("a ConfigMap")
    };
    match config_maps.create(&PostParams::default(), &fenced(current - 1)).await {
        Err(kube::Error::Api(s)) => assert!(s.message.contains("fenced.leasehold.dev"), "{}", s.message),
        other => panic!("a stale token was admitted: {other:?}"),
    }
    config_maps.create(&PostParams::default(), &fenced(current)).await.expect("the current token is admitted");

    let log = controller.log();
    assert!(!log.to_lowercase().contains("forbidden"), "the controller was refused something:\n{log}");
}

#[tokio::test]
async fn the_charts_rbac_suffices_to_spread_lock_leases_over_lease_roles_and_to_remove_them() {
    let cluster = ChartCluster::start().await;
    cluster.install(&[]).await;
    // The chart names exactly the Lease Roles the controller writes and deletes.
    let cluster_role = Api::<ClusterRole>::all(cluster.admin.clone()).get(CONTROLLER).await.expect("ClusterRole");
    let deletable = cluster_role
        .rules
        .iter()
        .flatten()
        .find(|r| {
            r.resources.as_ref().is_some_and(|r| r.iter().any(|r| r == "roles"))
                && r.verbs.iter().any(|v| v == "delete")
        })
        .and_then(|r| r.resource_names.clone())
        .expect("a rule deleting Roles by name");
    assert_eq!(deletable, shards::names().collect::<Vec<_>>());

    // A budget of one byte: every lock Lease goes to its Lease Role.
    let app = cluster.cp.namespace("spread").await;
    let stage = Stage { cp: &cluster.cp, ns: &app };
    let controller = ChartController::start_with(&cluster, &app, &["--client-role-lease-bytes=1"]).await;
    let lock = DistributedLock::new("jobs", DistributedLockSpec::default());
    stage.locks().create(&PostParams::default(), &lock).await.expect("a lock");
    let roles = Api::<Role>::namespaced(cluster.admin.clone(), &app.name);
    let home = shards::name(shards::of("jobs"));
    wait_for(&roles, CLIENT_ROLE, WAIT, "the client Role, with no Lease rule", |r: &Role| {
        !r.rules.iter().flatten().any(|r| r.resources.as_ref().is_some_and(|r| r.iter().any(|r| r == "leases")))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\ncontroller log:\n{}", controller.log()));
    let in_home = roles.get(&home).await.expect("the lock Lease's Role");
    let named: Vec<_> = in_home.rules.iter().flatten().filter_map(|r| r.resource_names.clone()).flatten().collect();
    assert_eq!(named, ["jobs"], "{home}");

    // An app sidecar holds the lock through it.
    let worker = stage.pod("worker").await;
    poll(WAIT, "the worker allowed to claim", || async { stage.may_claim(&worker).await.map(|ok| ok.then_some(())) })
        .await
        .expect("the controller prepares the namespace");
    let sidecar = stage.sidecar(&worker, &[]).await;
    let (status, body) = sidecar.acquire("jobs", 20.0).await;
    assert_eq!(status, 200, "acquired through a Lease Role: {body}");
    assert_eq!(sidecar.release("jobs").await.0, 200);

    // The last lock gone, the Lease Roles and their bindings go too.
    stage.locks().delete("jobs", &DeleteParams::default()).await.expect("delete the lock");
    let bindings = Api::<RoleBinding>::namespaced(cluster.admin.clone(), &app.name);
    for name in shards::names() {
        until_gone(&roles, &name, WAIT, "a Lease Role").await;
        until_gone(&bindings, &name, WAIT, "a Lease Role's binding").await;
    }
    let log = controller.log();
    assert!(!log.to_lowercase().contains("forbidden"), "the controller was refused something:\n{log}");
}

#[tokio::test]
async fn without_one_rule_of_the_charts_cluster_role_the_lifecycle_is_forbidden() {
    let cluster = ChartCluster::start().await;
    cluster.install(&[]).await;
    let roles: Api<ClusterRole> = Api::all(cluster.admin.clone());
    let complete = roles.get(CONTROLLER).await.expect("the chart's ClusterRole");
    let status_rule = |rule: &k8s_openapi::api::rbac::v1::PolicyRule| {
        rule.resources.as_ref().is_some_and(|r| r.iter().any(|r| r == "distributedlocks/status"))
    };
    let mut reduced = complete.clone();
    let rules = reduced.rules.as_mut().expect("rules");
    let before = rules.len();
    rules.retain(|rule| !status_rule(rule));
    assert_eq!(rules.len(), before - 1, "the chart grants status writes in one rule");
    roles.replace(CONTROLLER, &PostParams::default(), &reduced).await.expect("remove the status rule");

    let ns = cluster.cp.namespace("lifecycle").await;
    let controller = ChartController::start(&cluster, &ns).await;
    let stage = Stage { cp: &cluster.cp, ns: &ns };
    let error = lifecycle(&stage, Duration::from_secs(15)).await.expect_err("the lifecycle needs status writes");
    assert!(error.contains("status"), "the scenario failed, but not on status: {error}");
    let log = controller.log();
    assert!(
        log.contains("forbidden") && log.contains("cannot patch resource \"distributedlocks/status\""),
        "the controller log shows no Forbidden status write:\n{log}"
    );

    // Put the rule back: the same controller writes status at once (it retries), so the
    // missing rule was the cause.
    let mut restored = roles.get(CONTROLLER).await.expect("ClusterRole");
    restored.rules = complete.rules;
    roles.replace(CONTROLLER, &PostParams::default(), &restored).await.expect("restore the rule");
    wait_for(&stage.locks(), LOCK, WAIT, "status written once allowed", |l: &DistributedLock| l.status.is_some())
        .await
        .unwrap_or_else(|e| panic!("{e}\ncontroller log:\n{}", controller.log()));
}
