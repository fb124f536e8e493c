//! Pure readers for the monitoring tests: the metrics a PromQL expression selects,
//! the metrics docs/metrics.md documents, and the anchors of a Markdown file's headings.

use std::collections::{BTreeMap, BTreeSet};

use promql_parser::parser::Expr;
use promql_parser::util::{ExprVisitor, walk_expr};

/// Suffixes Prometheus adds to a histogram's series.
const HISTOGRAM_SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

/// A metric an expression queries: its family name, and whether it was queried through a
/// histogram series (`_bucket`, `_sum`, `_count`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MetricRef {
    pub name: String,
    pub histogram_series: bool,
}

/// The Leasehold and process metrics a PromQL expression selects (parsed with
/// `promql-parser`: a syntax error is an error), histogram suffixes stripped.
pub fn metric_refs(expr: &str) -> Result<BTreeSet<MetricRef>, String> {
    struct Selected(BTreeSet<MetricRef>);
    impl ExprVisitor for Selected {
        type Error = std::convert::Infallible;
        fn pre_visit(&mut self, expr: &Expr) -> Result<bool, Self::Error> {
            let selector = match expr {
                Expr::VectorSelector(vs) => vs,
                Expr::MatrixSelector(ms) => &ms.vs,
                _ => return Ok(true),
            };
            let name = selector.name.as_deref().unwrap_or_default();
            if name.starts_with("leasehold_") || name.starts_with("process_") {
                let stripped = HISTOGRAM_SUFFIXES.iter().find_map(|s| name.strip_suffix(s));
                self.0.insert(MetricRef {
                    name: stripped.unwrap_or(name).to_owned(),
                    histogram_series: stripped.is_some(),
                });
            }
            Ok(true)
        }
    }
    let parsed = promql_parser::parser::parse(expr).map_err(|e| format!("not PromQL ({e}): {expr}"))?;
    let mut selected = Selected(BTreeSet::new());
    let Ok(_) = walk_expr(&mut selected, &parsed);
    Ok(selected.0)
}

/// A Grafana panel query as Prometheus would receive it: Grafana's interval variables
/// replaced by a duration. Other variables (`$namespace`) stay: they are only valid inside
/// label values, where they are part of a string.
pub fn grafana_query(expr: &str) -> String {
    ["$__rate_interval", "$__interval", "$__range"].iter().fold(expr.to_owned(), |e, v| e.replace(v, "5m"))
}

/// The metrics docs/metrics.md documents, with their type: every table row whose first
/// cell is a code span naming a metric (labels in braces dropped).
pub fn documented_metrics(markdown: &str) -> BTreeMap<String, String> {
    markdown
        .lines()
        .filter_map(|line| {
            let mut cells = line.strip_prefix('|')?.split('|').map(str::trim);
            let name = cells.next()?.strip_prefix('`')?.split(['`', '{']).next()?.to_owned();
            let kind = cells.next().unwrap_or_default().to_owned();
            Some((name, kind))
        })
        .filter(|(name, _)| !name.is_empty())
        .collect()
}

/// The anchors GitHub gives a Markdown file's headings: lower case, punctuation other
/// than `-` and `_` dropped, spaces as `-`.
pub fn heading_anchors(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|line| {
            let text = line.trim_start_matches('#');
            (text.len() < line.len() && text.starts_with(' ')).then(|| anchor(text.trim()))
        })
        .collect()
}

fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn metric_refs_are_the_leasehold_and_process_metrics_an_expression_selects() {
    let r = |name: &str, histogram_series: bool| MetricRef { name: name.into(), histogram_series };
    let cases: [(&str, Vec<MetricRef>); 7] = [
        ("leasehold_controller_leader", vec![r("leasehold_controller_leader", false)]),
        (
            r#"max(leasehold_controller_leader{namespace="leasehold_system"}) < 1 or absent(leasehold_controller_leader)"#,
            vec![r("leasehold_controller_leader", false)],
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(leasehold_controller_wait_seconds_bucket[5m])))",
            vec![r("leasehold_controller_wait_seconds", true)],
        ),
        ("rate(leasehold_x_sum[5m]) / rate(leasehold_x_count[5m])", vec![r("leasehold_x", true)]),
        (
            "process_resident_memory_bytes and on (job, instance) leasehold_sidecar_held",
            vec![r("leasehold_sidecar_held", false), r("process_resident_memory_bytes", false)],
        ),
        // Other exporters' metrics, label names and label values are not ours.
        (r#"up{job='leasehold_a', leasehold_l="x"} * on (leasehold_label) group_left (leasehold_b) kube_up"#, vec![]),
        (
            r#"sum by (reason) (rate(leasehold_a_total{reason="a\"leasehold_b}"}[5m])) > 1e3"#,
            vec![r("leasehold_a_total", false)],
        ),
    ];
    for (expr, expected) in cases {
        assert_eq!(metric_refs(expr).map(|m| m.into_iter().collect::<Vec<_>>()), Ok(expected), "{expr}");
    }
    let broken = metric_refs("sum(rate(leasehold_a_total[5m])").expect_err("unbalanced parentheses");
    assert!(broken.contains("not PromQL"), "{broken}");
}

#[test]
fn grafana_queries_get_a_duration_for_the_interval_variables() {
    let cases = [
        ("rate(x[$__rate_interval])", "rate(x[5m])"),
        ("increase(x[$__range]) + rate(x[$__interval])", "increase(x[5m]) + rate(x[5m])"),
        (r#"x{namespace=~"$namespace"}"#, r#"x{namespace=~"$namespace"}"#),
    ];
    for (query, expected) in cases {
        assert_eq!(grafana_query(query), expected);
    }
}

#[test]
fn documented_metrics_are_the_first_cells_of_table_rows() {
    let doc = "# Metrics\n\n| metric | type | meaning |\n|---|---|---|\n\
        | `leasehold_a_total{reason}` | counter | A. |\n| `leasehold_b_seconds` | histogram | B. |\n\
        Text naming `leasehold_c` outside a table.\n| `Granted` | Normal | An Event. |\n";
    let documented = documented_metrics(doc);
    assert_eq!(documented.get("leasehold_a_total").map(String::as_str), Some("counter"));
    assert_eq!(documented.get("leasehold_b_seconds").map(String::as_str), Some("histogram"));
    assert!(!documented.contains_key("leasehold_c"), "only table rows document a metric");
    assert!(!documented.contains_key("metric"), "a header cell without a code span is no metric");
}

#[test]
fn heading_anchors_follow_githubs_rules() {
    let anchors = heading_anchors(
        "# Troubleshooting\n\n## A claim is forbidden (403)\n### LeaseholdNoLeader\n\
        ## Sidecar says `lost`\nnot #a heading\n#hashtag\n",
    );
    let expected = ["troubleshooting", "a-claim-is-forbidden-403", "leaseholdnoleader", "sidecar-says-lost"];
    assert_eq!(anchors, expected.into_iter().map(String::from).collect());
}
