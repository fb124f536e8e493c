//! What the chart renders, without a cluster: the generated parts equal their Rust
//! sources, every toggle does what the README says, every value is documented and typed,
//! and every documented value set validates strictly against the pinned release
//! (`make lint`'s own script).

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::helm::{Helm, NAMESPACE, count, find, objects, repo};
use crate::support::leasehold_bin;

/// `object` without the metadata the chart adds (labels, annotations) and with every
/// number as a float, so that a Helm round trip (`fromYaml | toYaml`) compares equal.
fn content(object: &Value) -> Value {
    let mut object = normalize(object);
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("labels");
        metadata.remove("annotations");
    }
    object
}

fn normalize(value: &Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64().expect("a JSON number is a float")),
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), normalize(v))).collect()),
        other => other.clone(),
    }
}

#[tokio::test]
async fn the_charts_lease_guard_is_what_leasehold_lease_guard_prints() {
    let helm = Helm::offline();
    let cases: [(&[&str], &str); 2] = [
        (&[], "leasehold-controller"),
        (&["serviceAccount.create=false", "serviceAccount.name=platform-locks"], "platform-locks"),
    ];
    for (sets, service_account) in cases {
        let rendered = helm.template(sets).await;
        let user = format!("system:serviceaccount:{NAMESPACE}:{service_account}");
        let output = std::process::Command::new(leasehold_bin())
            .args(["lease-guard", "--controller-user", &user])
            .output()
            .expect("run leasehold lease-guard");
        assert!(output.status.success());
        let expected = objects(&String::from_utf8_lossy(&output.stdout));
        assert_eq!(expected.len(), 4, "the Lease and the LockClaim policies and their bindings");
        for object in &expected {
            let kind = object["kind"].as_str().expect("a kind");
            let name = object["metadata"]["name"].as_str().expect("a name");
            let ours = find(&rendered, kind, name).unwrap_or_else(|| panic!("the chart renders no {kind} {name}"));
            assert_eq!(content(ours), content(object), "{kind} {name} differs from `leasehold lease-guard` ({sets:?})");
        }
        for name in ["leasehold-lease-guard", "leasehold-claim-guard"] {
            let policy = find(&rendered, "ValidatingAdmissionPolicy", name).expect("policy");
            assert!(
                policy["spec"]["matchConditions"][0]["expression"].as_str().is_some_and(|e| e.contains(&user)),
                "{name} exempts {user}"
            );
        }
    }
}

#[tokio::test]
async fn the_charts_crd_is_the_committed_one_and_obeys_crds_enabled_and_keep() {
    let helm = Helm::offline();
    let committed = std::fs::read_to_string(repo().join("crds/leasehold.dev_distributedlocks.yaml")).expect("crds/");
    let committed = objects(&committed).pop().expect("one CRD");
    let name = "distributedlocks.leasehold.dev";

    let rendered = helm.template(&[]).await;
    let crd = find(&rendered, "CustomResourceDefinition", name).expect("the CRD by default");
    assert_eq!(content(crd), content(&committed), "the chart's CRD differs from crds/ (run make generate)");
    assert_eq!(crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep", "kept by default");

    let committed_claims = std::fs::read_to_string(repo().join("crds/leasehold.dev_lockclaims.yaml"))
        .expect("crds/ has the LockClaim CRD");
    let committed_claims = objects(&committed_claims).pop().expect("one CRD");
    let claims = find(&rendered, "CustomResourceDefinition", "lockclaims.leasehold.dev").expect("the LockClaim CRD");
    assert_eq!(content(claims), content(&committed_claims), "the chart's LockClaim CRD differs from crds/");
    assert_eq!(claims["metadata"]["annotations"]["helm.sh/resource-policy"], "keep", "kept by default");

    let committed_requests = std::fs::read_to_string(repo().join("crds/leasehold.dev_forcereleaserequests.yaml"))
        .expect("crds/ has the ForceReleaseRequest CRD");
    let committed_requests = objects(&committed_requests).pop().expect("one CRD");
    let requests = find(&rendered, "CustomResourceDefinition", "forcereleaserequests.leasehold.dev")
        .expect("the ForceReleaseRequest CRD");
    assert_eq!(
        content(requests),
        content(&committed_requests),
        "the chart's ForceReleaseRequest CRD differs from crds/"
    );

    let rendered = helm.template(&["crds.keep=false"]).await;
    let crd = find(&rendered, "CustomResourceDefinition", name).expect("the CRD");
    assert!(crd["metadata"].get("annotations").is_none(), "crds.keep=false: no keep policy: {crd}");

    let rendered = helm.template(&["crds.enabled=false"]).await;
    assert_eq!(count(&rendered, "CustomResourceDefinition"), 0, "crds.enabled=false renders no CRD");
}

fn container(rendered: &[Value]) -> &Value {
    let deployment = find(rendered, "Deployment", "leasehold-controller").expect("the Deployment");
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn args(rendered: &[Value]) -> Vec<String> {
    container(rendered)["args"].as_array().expect("args").iter().map(|a| a.as_str().expect("string").into()).collect()
}

fn webhooks(rendered: &[Value]) -> Vec<&Value> {
    ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
        .iter()
        .flat_map(|kind| find(rendered, kind, "leasehold").expect("webhook configuration")["webhooks"].as_array())
        .flatten()
        .collect()
}

#[tokio::test]
async fn the_default_rendering_is_restricted_highly_available_and_fails_closed() {
    let rendered = Helm::offline().template(&[]).await;
    let deployment = find(&rendered, "Deployment", "leasehold-controller").expect("the Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(pod["serviceAccountName"], "leasehold-controller");
    let c = container(&rendered);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["volumeMounts"][0]["mountPath"], "/etc/leasehold/tls");
    assert_eq!(pod["volumes"][0]["secret"]["secretName"], "leasehold-webhook-tls");
    let env: Vec<(&str, &str)> = c["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["valueFrom"]["fieldRef"]["fieldPath"].as_str()?)))
        .collect();
    assert_eq!(env, [("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")], "downward API");
    let args = args(&rendered);
    for expected in [
        "--leader-elect=true",
        "--webhook-addr=0.0.0.0:9443",
        "--sidecar-image=ghcr.io/leasehold/leasehold:0.1.0",
        // The two-person rule by default (docs/guides/force-release.md).
        "--force-release-approvals=1",
        // The sidecar logs as it did before the values existed.
        "--sidecar-log-level=info",
        "--sidecar-log-format=plain",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
    }
    let resources = args.iter().find_map(|a| a.strip_prefix("--sidecar-resources=")).expect("sidecar resources");
    let resources: Value = serde_json::from_str(resources).expect("JSON");
    assert_eq!(resources, json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}}));
    let pdb = find(&rendered, "PodDisruptionBudget", "leasehold-controller").expect("a PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    let schema = find(&rendered, "FlowSchema", "leasehold-controller").expect("a FlowSchema");
    assert_eq!(schema["spec"]["priorityLevelConfiguration"]["name"], "workload-high");
    assert_eq!(schema["spec"]["matchingPrecedence"], 1000, "ahead of the built-in service-accounts schema (9000)");
    assert_eq!(
        schema["spec"]["rules"][0]["subjects"],
        json!([{"kind": "ServiceAccount", "serviceAccount": {"name": "leasehold-controller", "namespace": NAMESPACE}}])
    );

    // Generated certificate: one CA in the Secret and in every caBundle.
    let secret = find(&rendered, "Secret", "leasehold-webhook-tls").expect("the generated certificate");
    let ca = secret["data"]["ca.crt"].as_str().expect("ca.crt");
    assert!(secret["data"]["tls.crt"].is_string() && secret["data"]["tls.key"].is_string());
    let hooks = webhooks(&rendered);
    let names: Vec<&str> = hooks.iter().map(|h| h["name"].as_str().expect("name")).collect();
    assert_eq!(
        names,
        [
            "inject.leasehold.dev",
            "force-release.leasehold.dev",
            "force-release-requests.leasehold.dev",
            "fenced.leasehold.dev"
        ]
    );
    // Deletions of fenced objects are checked too (the lock from the old object).
    assert_eq!(hooks[3]["rules"][0]["operations"], json!(["CREATE", "UPDATE", "DELETE"]));
    // Every request and approval passes the webhook that stamps who asked and approved.
    assert_eq!(hooks[2]["rules"][0]["resources"], json!(["forcereleaserequests"]));
    assert_eq!(hooks[2]["rules"][0]["operations"], json!(["CREATE", "UPDATE"]));
    assert!(hooks[2].get("matchConditions").is_none(), "no request escapes it");
    for hook in &hooks {
        assert_eq!(hook["clientConfig"]["caBundle"], ca, "{}", hook["name"]);
        assert_eq!(hook["clientConfig"]["service"]["name"], "leasehold-webhook");
        assert_eq!(hook["failurePolicy"], "Fail", "{} fails closed", hook["name"]);
        let excluded = &hook["namespaceSelector"]["matchExpressions"][0];
        assert_eq!(excluded["operator"], "NotIn");
        assert_eq!(excluded["values"], json!(["kube-system", "kube-public", "kube-node-lease", NAMESPACE]));
    }
    for kind in ["Certificate", "Issuer", "ServiceMonitor", "NetworkPolicy"] {
        assert_eq!(count(&rendered, kind), 0, "no {kind} by default");
    }
}

#[tokio::test]
async fn optional_objects_appear_only_when_enabled() {
    let helm = Helm::offline();
    let rendered = helm.template(&["certManager.enabled=true"]).await;
    assert!(find(&rendered, "Certificate", "leasehold-webhook").is_some());
    assert!(find(&rendered, "Issuer", "leasehold-selfsigned").is_some());
    assert_eq!(count(&rendered, "Secret"), 0, "cert-manager writes the Secret");
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        let config = find(&rendered, kind, "leasehold").expect("configuration");
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "leasehold-system/leasehold-webhook"
        );
    }
    assert!(webhooks(&rendered).iter().all(|h| h["clientConfig"].get("caBundle").is_none()), "cert-manager injects it");

    let rendered = helm
        .template(&[
            "certManager.enabled=true",
            "certManager.issuerRef.name=corp",
            "certManager.issuerRef.kind=ClusterIssuer",
        ])
        .await;
    assert_eq!(count(&rendered, "Issuer"), 0, "an existing issuer is used");
    let certificate = find(&rendered, "Certificate", "leasehold-webhook").expect("Certificate");
    assert_eq!(certificate["spec"]["issuerRef"], json!({"name": "corp", "kind": "ClusterIssuer"}));

    let rendered = helm.template(&["metrics.serviceMonitor.enabled=true", "networkPolicy.enabled=true"]).await;
    let monitor = find(&rendered, "ServiceMonitor", "leasehold-controller").expect("ServiceMonitor");
    let metrics = find(&rendered, "Service", "leasehold-metrics").expect("the metrics Service");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"].as_object().expect("labels") {
        assert_eq!(&metrics["metadata"]["labels"][key], value, "the ServiceMonitor selects the metrics Service");
    }
    let policy = find(&rendered, "NetworkPolicy", "leasehold-controller").expect("NetworkPolicy");
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]), "egress stays open unless rules are given");

    let rendered = helm.template(&["flowSchema.enabled=false"]).await;
    assert_eq!(count(&rendered, "FlowSchema"), 0);
    let rendered = helm
        .template(&[
            "serviceAccount.name=locks",
            "flowSchema.priorityLevel=global-default",
            "flowSchema.matchingPrecedence=500",
        ])
        .await;
    let schema = find(&rendered, "FlowSchema", "leasehold-controller").expect("a FlowSchema");
    assert_eq!(schema["spec"]["rules"][0]["subjects"][0]["serviceAccount"]["name"], "locks", "the account it runs as");
    assert_eq!(schema["spec"]["priorityLevelConfiguration"]["name"], "global-default");
    assert_eq!(schema["spec"]["matchingPrecedence"], 500);

    let rendered = helm.template(&["sidecar.image.repository=example.com/sidecar", "sidecar.image.tag=1.2.3"]).await;
    assert!(args(&rendered).iter().any(|a| a == "--sidecar-image=example.com/sidecar:1.2.3"));

    let refused = helm
        .run(&[
            "template",
            "x",
            super::helm::chart_dir().to_str().expect("utf-8"),
            "--set",
            "controller.leaderElection.enabled=false",
        ])
        .await;
    assert!(refused.is_err_and(|e| e.contains("leaderElection")), "two replicas without an election are refused");
}

/// Dotted paths of the leaves of `values`, descending into maps whose schema lists
/// `properties` (the chart's own structure) and stopping at Kubernetes-typed values.
fn leaves(values: &Value, schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    let Some(map) = values.as_object() else { return };
    for (key, value) in map {
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        let node = &schema["properties"][key];
        assert!(node.is_object(), "values.schema.json does not describe {path}");
        if value.is_object() && node.get("properties").is_some() && !value.as_object().is_some_and(|m| m.is_empty()) {
            leaves(value, node, &path, out);
        } else {
            out.insert(path);
        }
    }
}

#[test]
fn every_value_is_documented_in_the_chart_readme_and_typed_in_its_schema() {
    let dir = super::helm::chart_dir();
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.join("values.yaml")).expect("values.yaml")).expect("YAML");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("values.schema.json")).expect("schema")).expect("JSON");
    let mut expected = BTreeSet::new();
    leaves(&values, &schema, "", &mut expected);
    let readme = std::fs::read_to_string(dir.join("README.md")).expect("README.md");
    let section = readme.split("\n## Values\n").nth(1).expect("a Values section");
    let section = section.split("\n## ").next().expect("text");
    let documented: BTreeSet<String> = section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(path, _)| path.to_owned()))
        .collect();
    let missing: Vec<&String> = expected.difference(&documented).collect();
    let stale: Vec<&String> = documented.difference(&expected).collect();
    assert!(missing.is_empty() && stale.is_empty(), "README.md values table: missing {missing:?}, stale {stale:?}");
}

#[tokio::test]
async fn every_documented_value_set_validates_strictly_against_the_pinned_release() {
    // The schemas come from the pinned release's /openapi/v2 (the shared control plane
    // only serves it here; nothing is installed), cached like `make lint` caches them.
    let schemas = leasehold_harness::schemas::ensure(leasehold_harness::shared()).await.expect("schemas");
    let script = repo().join("e2e/tools/lint-chart.sh");
    let output = tokio::process::Command::new(&script)
        .env("LEASEHOLD_SCHEMAS", &schemas)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run lint-chart.sh");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "make lint's script failed:\n{stderr}\n{stdout}");
    let cases = std::fs::read_dir(super::helm::chart_dir().join("ci")).expect("ci/").count() + 1;
    assert!(stdout.contains(&format!("{cases} value sets rendered and valid")), "{stdout}\n{stderr}");
}

#[tokio::test]
async fn host_network_moves_the_ports_onto_the_node_and_requires_replicas_on_different_nodes() {
    let helm = Helm::offline();
    let default = helm.template(&[]).await;
    let pod = |rendered: &[Value]| {
        find(rendered, "Deployment", "leasehold-controller").expect("the Deployment")["spec"]["template"]["spec"]
            .clone()
    };
    assert!(pod(&default).get("hostNetwork").is_none(), "pod network by default");

    let rendered =
        helm.template(&["hostNetwork=true", "podAntiAffinity=hard", "ports.webhook=10263", "ports.admin=10254"]).await;
    let spec = pod(&rendered);
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["dnsPolicy"], "ClusterFirstWithHostNet", "cluster DNS from the node's network");
    let args = args(&rendered);
    assert!(args.iter().any(|a| a == "--webhook-addr=0.0.0.0:10263"), "{args:?}");
    assert!(args.iter().any(|a| a == "--admin-addr=0.0.0.0:10254"), "{args:?}");
    let service = find(&rendered, "Service", "leasehold-webhook").expect("the webhook Service");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "webhook", "the Service follows the named port");
    assert_eq!(container(&rendered)["ports"][1]["containerPort"], 10263);

    let refused = helm
        .run(&["template", "x", super::helm::chart_dir().to_str().expect("utf-8"), "--set", "hostNetwork=true"])
        .await;
    assert!(
        refused.is_err_and(|e| e.contains("podAntiAffinity: hard")),
        "two host-network replicas that may share a node are refused"
    );
    // One replica needs no spreading.
    helm.template(&["hostNetwork=true", "replicaCount=1", "controller.leaderElection.enabled=false"]).await;
}

#[tokio::test]
async fn the_chart_installs_from_kubernetes_1_30_and_refuses_older_releases() {
    let helm = Helm::offline();
    let chart = super::helm::chart_dir();
    let chart = chart.to_str().expect("utf-8");
    helm.must(&["template", "x", chart, "--kube-version", "v1.30.0"]).await;
    let refused = helm.run(&["template", "x", chart, "--kube-version", "v1.29.15"]).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains(">=1.30.0-0") && e.contains("v1.29.15")),
        "Kubernetes 1.29 lacks ValidatingAdmissionPolicy v1: {refused:?}"
    );
}
