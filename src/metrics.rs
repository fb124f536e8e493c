//! Prometheus metrics (text format, `prometheus-client`). Never labelled by lock name:
//! a cluster with 10,000 locks must not make 10,000 series per metric.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram};
use prometheus_client::registry::Registry;

mod process;

/// Buckets of apiserver round trips, handoffs, renewals and reconciles, in seconds:
/// 0.5 ms to 30 s, with steps of 1 ms up to 3 ms and about 1.5× to 100 ms (a Lease
/// compare-and-swap takes ~1.6 ms, a handoff 3–15 ms), then coarse up to timeouts.
pub const MILLISECONDS: [f64; 20] = [
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0,
];

/// Buckets of a sidecar's acquire, in seconds: [`MILLISECONDS`] (an uncontended acquire
/// takes 8–20 ms), then up to an hour (the longest wait a sidecar accepts by default).
pub const ACQUIRE: [f64; 24] = [
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// Buckets of waits and holds, in seconds: 10 ms to a week, finer around a lease
/// duration (a failover waits ~15 s) and at every human scale (minutes, hours, days).
pub const SECONDS_TO_DAYS: [f64; 25] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
    3600.0, 7200.0, 21600.0, 43200.0, 86400.0, 259200.0, 604800.0,
];

fn latency_buckets() -> impl Iterator<Item = f64> {
    MILLISECONDS.into_iter()
}

fn long_buckets() -> impl Iterator<Item = f64> {
    SECONDS_TO_DAYS.into_iter()
}

/// Label set for revocations.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why ([`crate::lease::RevokeReason::as_str`]).
    pub reason: String,
}

/// Label set for errors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CategoryLabel {
    /// Error category, from each error type's `category()`.
    pub category: String,
}

/// Label set for force-release request outcomes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `executed`, `denied`, `expired`, `superseded`, or `refused` (the annotation while
    /// the lock's policy needs approvals).
    pub outcome: String,
}

/// The controller's metrics.
pub struct ControllerMetrics {
    /// Holds granted.
    pub grants: Counter,
    /// Holds released by their holder.
    pub releases: Counter,
    /// Holds a releasing holder handed on to the waiter recorded as next, as seen.
    pub handoffs: Counter,
    /// Holds revoked, by reason.
    pub revocations: Family<ReasonLabel, Counter>,
    /// Seconds from claim to grant.
    pub wait_seconds: Histogram,
    /// Seconds from grant to release or revocation.
    pub hold_seconds: Histogram,
    /// Seconds from a lock becoming free with waiters to the next grant.
    pub handoff_seconds: Histogram,
    /// Claimants waiting, over all locks.
    pub queue_depth: Gauge,
    /// Reconcile duration.
    pub reconcile_seconds: Histogram,
    /// Reconcile errors by category.
    pub reconcile_errors: Family<CategoryLabel, Counter>,
    /// 1 while this replica leads.
    pub leader: Gauge,
    /// Force-release requests ended, by outcome.
    pub force_release_requests: Family<OutcomeLabel, Counter>,
}

impl ControllerMetrics {
    /// Metrics registered under `leasehold_controller_`.
    pub fn register(registry: &mut Registry) -> Arc<ControllerMetrics> {
        let m = ControllerMetrics {
            grants: Counter::default(),
            releases: Counter::default(),
            handoffs: Counter::default(),
            revocations: Family::default(),
            wait_seconds: Histogram::new(long_buckets()),
            hold_seconds: Histogram::new(long_buckets()),
            handoff_seconds: Histogram::new(latency_buckets()),
            queue_depth: Gauge::default(),
            reconcile_seconds: Histogram::new(latency_buckets()),
            reconcile_errors: Family::default(),
            leader: Gauge::default(),
            force_release_requests: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("leasehold_controller");
        r.register("grants", "Holds granted", m.grants.clone());
        r.register("releases", "Holds released by their holder", m.releases.clone());
        r.register(
            "handoffs",
            "Holds a releasing holder handed on to the waiter recorded as next, as seen (also counted as grants)",
            m.handoffs.clone(),
        );
        r.register("revocations", "Holds revoked by the controller, by reason", m.revocations.clone());
        r.register("wait_seconds", "Seconds from claim to grant", m.wait_seconds.clone());
        r.register("hold_seconds", "Seconds from grant to release or revocation", m.hold_seconds.clone());
        r.register(
            "handoff_seconds",
            "Seconds from a lock freeing with waiters to the next grant",
            m.handoff_seconds.clone(),
        );
        r.register("queue_depth", "Claimants waiting, over all locks", m.queue_depth.clone());
        r.register("reconcile_seconds", "Reconcile duration", m.reconcile_seconds.clone());
        r.register("reconcile_errors", "Reconcile errors by category", m.reconcile_errors.clone());
        r.register("leader", "1 while this replica leads", m.leader.clone());
        r.register(
            "force_release_requests",
            "Force-release requests ended, by outcome",
            m.force_release_requests.clone(),
        );
        Arc::new(m)
    }
}

/// Metrics of a claimant (the sidecar and `leasehold run`).
pub struct ClientMetrics {
    /// Seconds from acquire request to confirmed hold.
    pub acquire_seconds: Histogram,
    /// Seconds per successful renewal round trip.
    pub renew_seconds: Histogram,
    /// Renewal attempts that failed without losing the hold.
    pub renew_failures: Counter,
    /// Holds lost (renew deadline passed, revoked, Lease deleted).
    pub lost: Counter,
    /// Holds currently held.
    pub held: Gauge,
    /// Apiserver requests tried again after a passing failure (busy, failing, unreachable):
    /// an acquisition's setup, or the clearing of a released hold.
    pub apiserver_retries: Counter,
}

impl ClientMetrics {
    /// Metrics registered under `leasehold_sidecar_`.
    pub fn register(registry: &mut Registry) -> Arc<ClientMetrics> {
        let m = ClientMetrics::new();
        let r = registry.sub_registry_with_prefix("leasehold_sidecar");
        r.register("acquire_seconds", "Seconds from acquire request to confirmed hold", m.acquire_seconds.clone());
        r.register("renew_seconds", "Seconds per successful renewal", m.renew_seconds.clone());
        r.register("renew_failures", "Renewal attempts that failed without losing the hold", m.renew_failures.clone());
        r.register("lost", "Holds lost", m.lost.clone());
        r.register("held", "Holds currently held", m.held.clone());
        r.register(
            "apiserver_retries",
            "Apiserver requests tried again after a passing failure (429, 5xx, unreachable)",
            m.apiserver_retries.clone(),
        );
        Arc::new(m)
    }

    fn new() -> ClientMetrics {
        ClientMetrics {
            acquire_seconds: Histogram::new(ACQUIRE),
            renew_seconds: Histogram::new(latency_buckets()),
            renew_failures: Counter::default(),
            lost: Counter::default(),
            held: Gauge::default(),
            apiserver_retries: Counter::default(),
        }
    }

    /// Unregistered metrics, for callers that do not export them.
    pub fn unregistered() -> Arc<ClientMetrics> {
        Arc::new(ClientMetrics::new())
    }
}

/// Label set for refused fenced writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    /// The written object's `group/resource` (`configmaps` for the core group).
    pub resource: String,
}

/// Label set for admission requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookOutcomeLabel {
    /// Which webhook: `fence`, `inject`, `force` or `request`.
    pub webhook: &'static str,
    /// `allowed`, `denied` or `error`.
    pub outcome: &'static str,
}

/// Label set for admission latency.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabel {
    /// Which webhook.
    pub webhook: &'static str,
}

/// A histogram family whose histograms share one set of buckets.
pub type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// The admission webhooks' metrics.
pub struct WebhookMetrics {
    /// Writes refused by the fence webhook, by the written object's resource.
    pub stale_writes_refused: Family<ResourceLabel, Counter>,
    /// `StaleWriteRefused` Events not recorded (the recorder was behind or failing).
    pub refusal_events_dropped: Counter,
    /// Admission requests answered, by webhook and outcome.
    pub requests: Family<WebhookOutcomeLabel, Counter>,
    /// Seconds to answer an admission request, by webhook.
    pub request_seconds: Histograms<WebhookLabel>,
}

impl WebhookMetrics {
    /// Metrics registered under `leasehold_webhook_`.
    pub fn register(registry: &mut Registry) -> Arc<WebhookMetrics> {
        let m = WebhookMetrics::unregistered();
        let r = registry.sub_registry_with_prefix("leasehold_webhook");
        r.register(
            "stale_writes_refused",
            "Writes refused by the fence webhook, by the written object's group/resource",
            m.stale_writes_refused.clone(),
        );
        r.register(
            "refusal_events_dropped",
            "StaleWriteRefused Events not recorded because the recorder was behind or failing",
            m.refusal_events_dropped.clone(),
        );
        r.register("requests", "Admission requests answered, by webhook and outcome", m.requests.clone());
        r.register("request_seconds", "Seconds to answer an admission request, by webhook", m.request_seconds.clone());
        Arc::new(m)
    }

    /// Metrics not exported (tests, and servers built without a registry).
    pub fn unregistered() -> WebhookMetrics {
        WebhookMetrics {
            stale_writes_refused: Family::default(),
            refusal_events_dropped: Counter::default(),
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency_histogram),
        }
    }
}

/// Label set for apiserver requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbCodeLabel {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` (or `other`).
    pub verb: &'static str,
    /// The HTTP status code, or `error` when no answer came.
    pub code: String,
}

/// Label set for apiserver latency.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabel {
    /// As in [`VerbCodeLabel`].
    pub verb: &'static str,
}

/// Metrics of a process's Kubernetes client.
pub struct ApiserverMetrics {
    /// Requests sent to the apiserver, by verb and answer.
    pub requests: Family<VerbCodeLabel, Counter>,
    /// Seconds from sending a request to its response headers, by verb (watches excluded).
    pub request_seconds: Histograms<VerbLabel>,
}

impl ApiserverMetrics {
    /// Metrics not exported (clients of the CLI and tests).
    pub fn unregistered() -> ApiserverMetrics {
        ApiserverMetrics {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency_histogram),
        }
    }
}

/// Label set for the build.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabel {
    /// The crate version of this binary.
    pub version: &'static str,
}

/// Registers what every long-running component exports: `leasehold_build_info`, the
/// `process_*` metrics, and its Kubernetes client's `leasehold_apiserver_*` metrics
/// (returned, for [`crate::kube_client::observed`]).
pub fn register_common(registry: &mut Registry) -> Arc<ApiserverMetrics> {
    let build: Family<VersionLabel, Gauge> = Family::default();
    build.get_or_create(&VersionLabel { version: env!("CARGO_PKG_VERSION") }).set(1);
    registry.sub_registry_with_prefix("leasehold").register("build_info", "1, labelled with the version", build);
    registry.register_collector(Box::new(process::ProcessCollector));
    let m = ApiserverMetrics::unregistered();
    let r = registry.sub_registry_with_prefix("leasehold_apiserver");
    r.register("requests", "Requests sent to the apiserver, by verb and HTTP status code", m.requests.clone());
    r.register(
        "request_seconds",
        "Seconds from sending a request to the apiserver to its response, by verb (watches excluded)",
        m.request_seconds.clone(),
    );
    Arc::new(m)
}

/// Renders a registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each histogram has resolution where docs/benchmarks.md measured it.
    #[test]
    fn buckets_resolve_the_measured_ranges() {
        // (buckets, a measured range (low, high), buckets at least within it)
        let cases: [(&[f64], (f64, f64), usize); 6] = [
            // Lease-level handoff p50..max.
            (&MILLISECONDS, (0.0027, 0.014), 4),
            // One Lease compare-and-swap (a renewal, an apiserver write) p50..p99.
            (&MILLISECONDS, (0.0015, 0.0025), 1),
            // Uncontended acquire via a sidecar p50..max.
            (&ACQUIRE, (0.008, 0.021), 3),
            // A contended acquire: up to the default longest wait.
            (&ACQUIRE, (1.0, 3600.0), 6),
            // Waits after a crash: around a 15 s lease duration.
            (&SECONDS_TO_DAYS, (14.0, 16.0), 1),
            // Holds: seconds to days.
            (&SECONDS_TO_DAYS, (1.0, 86400.0), 15),
        ];
        for (buckets, (low, high), at_least) in cases {
            assert!(buckets.windows(2).all(|w| w[0] < w[1]), "{buckets:?} increase");
            let within = buckets.iter().filter(|b| (low..=high).contains(*b)).count();
            assert!(within >= at_least, "{low}..{high}: {within} buckets in {buckets:?}");
        }
    }

    #[test]
    fn build_info_is_one_with_the_version() {
        let mut registry = Registry::default();
        register_common(&mut registry);
        let text = render(&registry);
        let line = format!("leasehold_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
        assert!(text.lines().any(|l| l == line), "{line} not in {text}");
    }
}
