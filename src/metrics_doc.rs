//! docs/metrics.md checked against what the controller and the sidecar export: every
//! metric family and Event reason documented, nothing documented that is not exported.
//! It builds both components' registries, so it sits above them, beside the front ends.

use prometheus_client::registry::Registry;

use crate::controller::events::EVENT_REASONS;
use crate::controller::oldest_hold::OldestHold;
use crate::metrics::{
    CategoryLabel, ClientMetrics, ControllerMetrics, OutcomeLabel, ReasonLabel, ResourceLabel, VerbCodeLabel,
    VerbLabel, WebhookLabel, WebhookMetrics, WebhookOutcomeLabel, register_common, render,
};
use crate::sidecar::owner::{Ending, OwnerMetrics};

/// The registries of the controller and the sidecar as they build them, with one
/// sample in every labelled family (a family without samples is not rendered).
fn exported() -> String {
    let mut controller = Registry::default();
    let apiserver = register_common(&mut controller);
    apiserver.requests.get_or_create(&VerbCodeLabel { verb: "get", code: "200".into() }).inc();
    apiserver.request_seconds.get_or_create(&VerbLabel { verb: "get" }).observe(0.01);
    let m = ControllerMetrics::register(&mut controller);
    m.revocations.get_or_create(&ReasonLabel { reason: crate::lease::RevokeReason::Expired.as_str().into() }).inc();
    m.reconcile_errors.get_or_create(&CategoryLabel { category: "status".into() }).inc();
    m.force_release_requests.get_or_create(&OutcomeLabel { outcome: "executed".into() }).inc();
    let w = WebhookMetrics::register(&mut controller);
    w.stale_writes_refused.get_or_create(&ResourceLabel { resource: "configmaps".into() }).inc();
    w.requests.get_or_create(&WebhookOutcomeLabel { webhook: "fence", outcome: "denied" }).inc();
    w.request_seconds.get_or_create(&WebhookLabel { webhook: "fence" }).observe(0.01);
    let (locks, _writer) = kube::runtime::reflector::store();
    controller.register_collector(Box::new(OldestHold { locks }));

    let mut sidecar = Registry::default();
    let apiserver = register_common(&mut sidecar);
    apiserver.requests.get_or_create(&VerbCodeLabel { verb: "get", code: "200".into() }).inc();
    apiserver.request_seconds.get_or_create(&VerbLabel { verb: "get" }).observe(0.01);
    ClientMetrics::register(&mut sidecar);
    OwnerMetrics::register(&mut sidecar).count(&Ending::SessionClosed);
    render(&controller) + &render(&sidecar)
}

/// The metric names in docs/metrics.md's metric tables (labels stripped).
fn documented(doc: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut in_table = false;
    for line in doc.lines() {
        if line.starts_with("| metric |") {
            in_table = true;
        } else if !line.starts_with('|') {
            in_table = false;
        } else if in_table && let Some(cell) = line.strip_prefix("| `") {
            let name = cell.split('`').next().unwrap_or_default();
            names.push(name.split('{').next().unwrap_or_default());
        }
    }
    names
}

/// docs/metrics.md lists every metric family and every Event reason, and names no
/// metric that is not exported.
#[test]
fn every_metric_is_documented() {
    let doc = include_str!("../docs/metrics.md");
    let text = exported();
    let families: Vec<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_whitespace().next()).collect();
    let samples: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .filter(|n| !n.is_empty())
        .collect();
    assert!(families.len() >= 30, "{families:?}");
    for family in &families {
        assert!(doc.contains(&format!("`{family}")), "docs/metrics.md does not document {family}");
    }
    let named = documented(doc);
    assert!(named.len() >= 30, "{named:?}");
    for name in named {
        assert!(
            families.contains(&name) || samples.contains(&name),
            "docs/metrics.md names {name}, which is not exported"
        );
    }
    for reason in EVENT_REASONS {
        assert!(doc.contains(&format!("| `{reason}` |")), "docs/metrics.md does not document the Event {reason}");
    }
}

#[test]
fn the_doc_tables_are_read() {
    let doc = "| metric | type |\n|---|---|\n| `a_total{x}` | counter |\n| `b` | gauge |\n\n| reason |\n| `C` | x |\n";
    assert_eq!(documented(doc), ["a_total", "b"]);
}
