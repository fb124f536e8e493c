//! The chart's monitoring objects (`metrics.prometheusRule`, `metrics.dashboard`,
//! `metrics.podMonitor`): every metric the alerts and the dashboard query is documented
//! in docs/metrics.md (which a unit test keeps equal to the metrics that exist), every
//! alert can be acted on, every panel queries something, and the PodMonitor finds what
//! the injection webhook adds.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::helm::{Helm, NAMESPACE, RELEASE, chart_dir, count, find, objects, repo};
use super::metric_refs::{documented_metrics, grafana_query, heading_anchors, metric_refs};

const ALL_ON: [&str; 3] =
    ["metrics.prometheusRule.enabled=true", "metrics.dashboard.enabled=true", "metrics.podMonitor.enabled=true"];

/// The alerts of the rendered PrometheusRule: (name, rule).
fn rendered_alerts(rendered: &[Value]) -> Vec<(String, Value)> {
    let rule = find(rendered, "PrometheusRule", RELEASE).expect("the PrometheusRule");
    rule["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| (r["alert"].as_str().expect("every rule is an alert").to_owned(), r.clone()))
        .collect()
}

/// The dashboard JSON in the rendered ConfigMap.
fn dashboard(rendered: &[Value]) -> Value {
    let map = find(rendered, "ConfigMap", "leasehold-dashboard").expect("the dashboard ConfigMap");
    let text = map["data"]["leasehold.json"].as_str().expect("data leasehold.json");
    serde_json::from_str(text).unwrap_or_else(|e| panic!("the dashboard is not JSON: {e}"))
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    let mut pending: Vec<&Value> = dashboard["panels"].as_array().expect("panels").iter().collect();
    while let Some(panel) = pending.pop() {
        pending.extend(panel["panels"].as_array().into_iter().flatten());
        out.push(panel);
    }
    out
}

#[tokio::test]
async fn every_metric_the_alerts_and_the_dashboard_query_is_documented() {
    let rendered = Helm::offline().template(&ALL_ON).await;
    // Where each metric is queried: "alert X", "dashboard panel \"Y\"".
    let mut queried: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut histogram_series: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut note = |expr: &str, place: String| {
        let refs = metric_refs(expr).unwrap_or_else(|e| panic!("{place}: {e}"));
        assert!(!refs.is_empty(), "{place} queries no Leasehold or process metric: {expr}");
        for r in refs {
            if r.histogram_series {
                histogram_series.entry(r.name.clone()).or_default().insert(place.clone());
            }
            queried.entry(r.name).or_default().insert(place.clone());
        }
    };
    for (name, rule) in rendered_alerts(&rendered) {
        note(rule["expr"].as_str().expect("an expr"), format!("alert {name}"));
    }
    let dashboard = dashboard(&rendered);
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().expect("a title");
        for target in panel["targets"].as_array().into_iter().flatten() {
            note(&grafana_query(target["expr"].as_str().unwrap_or_default()), format!("dashboard panel {title:?}"));
        }
    }

    let doc = std::fs::read_to_string(repo().join("docs/metrics.md")).expect("docs/metrics.md");
    let documented = documented_metrics(&doc);
    let missing: Vec<String> = queried
        .iter()
        .filter(|(name, _)| !documented.contains_key(*name))
        .map(|(name, places)| format!("{name} (queried by {})", places.iter().cloned().collect::<Vec<_>>().join(", ")))
        .collect();
    assert!(missing.is_empty(), "docs/metrics.md documents no metric named:\n  {}", missing.join("\n  "));
    let not_histograms: Vec<String> = histogram_series
        .iter()
        .filter(|(name, _)| !documented[*name].contains("histogram"))
        .map(|(name, places)| format!("{name} (queried by {})", places.iter().cloned().collect::<Vec<_>>().join(", ")))
        .collect();
    assert!(
        not_histograms.is_empty(),
        "queried through _bucket, _sum or _count, but not documented as a histogram in docs/metrics.md:\n  {}",
        not_histograms.join("\n  ")
    );
}

#[tokio::test]
async fn every_alert_has_a_summary_a_description_and_a_runbook_section() {
    let rendered = Helm::offline().template(&ALL_ON).await;
    let troubleshooting =
        std::fs::read_to_string(repo().join("docs/troubleshooting.md")).expect("docs/troubleshooting.md");
    let anchors = heading_anchors(&troubleshooting);
    let alerts = rendered_alerts(&rendered);
    let names: Vec<&str> = alerts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "LeaseholdNoLeader",
            "LeaseholdGrantsStalled",
            "LeaseholdHoldTooLong",
            "LeaseholdSidecarsLosingHolds",
            "LeaseholdWebhookErrors",
            "LeaseholdStaleWritesRefused",
            "LeaseholdReconcileErrors",
            "LeaseholdControllerMemoryHigh",
        ]
    );
    for (name, rule) in &alerts {
        let annotations = &rule["annotations"];
        for key in ["summary", "description"] {
            assert!(annotations[key].as_str().is_some_and(|t| !t.trim().is_empty()), "alert {name} has no {key}");
        }
        assert!(rule["labels"]["severity"].is_string(), "alert {name} has no severity");
        let runbook = annotations["runbook_url"].as_str().unwrap_or_else(|| panic!("alert {name} has no runbook_url"));
        let anchor = runbook
            .strip_prefix("https://github.com/leasehold/leasehold/blob/main/docs/troubleshooting.md#")
            .unwrap_or_else(|| {
                panic!("alert {name}: runbook_url {runbook} does not point into docs/troubleshooting.md")
            });
        assert!(anchors.contains(anchor), "alert {name}: docs/troubleshooting.md has no section #{anchor}");
    }
}

#[tokio::test]
async fn the_dashboard_is_grafana_json_with_a_prometheus_data_source_and_a_query_in_every_panel() {
    let rendered = Helm::offline().template(&ALL_ON).await;
    let map = find(&rendered, "ConfigMap", "leasehold-dashboard").expect("the dashboard ConfigMap");
    assert_eq!(map["metadata"]["namespace"], NAMESPACE);
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1", "Grafana's sidecar selects it by default");
    let dashboard = dashboard(&rendered);
    assert!(
        dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "a schemaVersion: {}",
        dashboard["schemaVersion"]
    );
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    let variables = dashboard["templating"]["list"].as_array().expect("templating variables");
    let source = variables.iter().find(|v| v["type"] == "datasource").expect("a data source variable");
    assert_eq!(source["query"], "prometheus");
    let reference = json!({"type": "prometheus", "uid": format!("${{{}}}", source["name"].as_str().expect("a name"))});
    let panels = panels(&dashboard);
    assert!(!panels.is_empty());
    let mut ids = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().expect("every panel has a title");
        assert!(ids.insert(panel["id"].as_u64().expect("an id")), "panel {title:?}: id used twice");
        assert!(panel["gridPos"]["w"].is_u64() && panel["gridPos"]["h"].is_u64(), "panel {title:?}: a gridPos");
        assert_eq!(panel["datasource"], reference, "panel {title:?} queries the data source variable");
        let targets = panel["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
        assert!(!targets.is_empty(), "panel {title:?} has no target");
        for target in targets {
            assert!(
                target["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "panel {title:?}: a target without expr"
            );
        }
    }
}

#[tokio::test]
async fn the_sidecar_pod_monitor_scrapes_the_admin_port_the_injection_webhook_adds() {
    let rendered = Helm::offline().template(&["metrics.podMonitor.enabled=true"]).await;
    let monitor = find(&rendered, "PodMonitor", "leasehold-sidecars").expect("the PodMonitor");
    assert_eq!(monitor["spec"]["namespaceSelector"], json!({"any": true}), "every namespace by default");
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    let port = endpoint["port"].as_str().expect("a port name");

    // A pod the selector matches, with a custom admin port: injected, it has the named port.
    let labels = monitor["spec"]["selector"]["matchLabels"].clone();
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "app", "labels": labels, "annotations": {"leasehold.dev/admin-port": "17071"}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    });
    let typed: Pod = serde_json::from_value(pod.clone()).expect("a Pod");
    let patch = leasehold::webhook::inject::inject(&typed, &Default::default())
        .expect("valid annotations")
        .patch
        .expect("the PodMonitor's selector selects pods that get the sidecar");
    json_patch::patch(&mut pod, &patch).expect("the patch applies");
    let ports: Vec<&Value> = pod["spec"]["initContainers"]
        .as_array()
        .expect("the sidecar is a native sidecar")
        .iter()
        .filter(|c| c["name"] == leasehold::webhook::inject::SIDECAR_NAME)
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .collect();
    let named: Vec<&&Value> = ports.iter().filter(|p| p["name"] == port).collect();
    assert_eq!(named.len(), 1, "the sidecar has one port named {port}: {ports:?}");
    assert_eq!(named[0]["containerPort"], 17071, "the admin port, whatever number the pod chose");

    let rendered =
        Helm::offline().template(&["metrics.podMonitor.enabled=true", "metrics.podMonitor.namespaces={a,b}"]).await;
    let monitor = find(&rendered, "PodMonitor", "leasehold-sidecars").expect("the PodMonitor");
    assert_eq!(monitor["spec"]["namespaceSelector"], json!({"matchNames": ["a", "b"]}));
}

#[tokio::test]
async fn monitoring_objects_are_off_by_default_and_follow_their_values() {
    let helm = Helm::offline();
    let rendered = helm.template(&[]).await;
    for kind in ["PrometheusRule", "PodMonitor"] {
        assert_eq!(count(&rendered, kind), 0, "no {kind} by default");
    }
    assert!(find(&rendered, "ConfigMap", "leasehold-dashboard").is_none(), "no dashboard by default");

    let values = chart_dir().join("ci/monitoring-values.yaml");
    let chart = chart_dir();
    let rendered = objects(
        &helm
            .must(&[
                "template",
                RELEASE,
                chart.to_str().expect("utf-8"),
                "--namespace",
                NAMESPACE,
                "--values",
                values.to_str().expect("utf-8"),
            ])
            .await,
    );
    let alerts: BTreeMap<String, Value> = rendered_alerts(&rendered).into_iter().collect();
    assert!(!alerts.contains_key("LeaseholdHoldTooLong"), "disabledAlerts leaves it out");
    assert_eq!(alerts.len(), 7);
    let expr = |name: &str| alerts[name]["expr"].as_str().expect("expr").to_owned();
    assert!(
        expr("LeaseholdNoLeader").contains(r#"leasehold_controller_leader{job="leasehold-metrics"}"#),
        "{}",
        expr("LeaseholdNoLeader")
    );
    assert_eq!(alerts["LeaseholdNoLeader"]["for"], "5m");
    assert!(expr("LeaseholdGrantsStalled").contains("[1h]"), "{}", expr("LeaseholdGrantsStalled"));
    assert!(
        expr("LeaseholdSidecarsLosingHolds")
            .contains(r#"leasehold_sidecar_lost_total{namespace=~"payments|batch"}[30m]"#)
    );
    assert!(
        expr("LeaseholdControllerMemoryHigh").ends_with("> 1073741824 * 0.8"),
        "1Gi: {}",
        expr("LeaseholdControllerMemoryHigh")
    );
    assert_eq!(alerts["LeaseholdStaleWritesRefused"]["labels"]["severity"], "warning");
    assert!(
        alerts.values().all(|a| a["annotations"]["runbook_url"]
            .as_str()
            .is_some_and(|u| u.starts_with("https://docs.example.com/leasehold/troubleshooting.md#"))),
        "runbookUrl"
    );
    let map = find(&rendered, "ConfigMap", "leasehold-dashboard").expect("the dashboard");
    assert_eq!(map["metadata"]["namespace"], "monitoring");
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "leasehold");
    assert_eq!(map["metadata"]["annotations"]["grafana_folder"], "Leasehold");

    // The default memory bound follows the controller's own limit.
    let rendered = helm.template(&["metrics.prometheusRule.enabled=true", "resources.limits.memory=512Mi"]).await;
    let alerts: BTreeMap<String, Value> = rendered_alerts(&rendered).into_iter().collect();
    let memory = alerts["LeaseholdControllerMemoryHigh"]["expr"].as_str().expect("expr");
    assert!(memory.ends_with("> 536870912 * 0.9"), "{memory}");
    let refused = helm
        .run(&[
            "template",
            RELEASE,
            chart.to_str().expect("utf-8"),
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "resources.limits=null",
        ])
        .await;
    assert!(
        refused.is_err_and(|e| e.contains("metrics.prometheusRule.controllerMemory.limit")),
        "no memory limit anywhere: the error names the value to set"
    );
}
