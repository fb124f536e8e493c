//! Prometheus metrics (text format, `prometheus-client`). Never labelled by lock name:
//! a cluster with 10,000 locks must not make 10,000 series per metric.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram};
use prometheus_client::registry::Registry;

/// Latency buckets in seconds: 1 ms to ~65 s.
fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 17)
}

/// Hold and wait buckets in seconds: 10 ms to ~3 days.
fn long_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.01, 4.0, 13)
}

/// Why the controller took a hold away.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum RevokeReason {
    /// No renewal seen for a lease duration.
    Expired,
    /// The holder's Pod is gone.
    PodGone,
    /// The grant was never confirmed.
    Unconfirmed,
    /// Held longer than `maxHoldSeconds`.
    MaxHold,
    /// An operator forced it.
    Forced,
    /// The DistributedLock is being deleted.
    LockDeleted,
}

/// Label set for revocations.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: RevokeReason,
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
            acquire_seconds: Histogram::new(long_buckets()),
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

    /// docs/metrics.md lists every metric family and every Event reason.
    #[test]
    fn every_metric_is_documented() {
        let doc = include_str!("../docs/metrics.md");
        let mut registry = Registry::default();
        ControllerMetrics::register(&mut registry);
        ClientMetrics::register(&mut registry);
        let text = render(&registry);
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        // Labelled families without samples are not rendered; they are checked by name below.
        assert!(families.len() >= 13, "{families:?}");
        for labelled in ["leasehold_controller_revocations", "leasehold_controller_reconcile_errors"] {
            assert!(doc.contains(&format!("`{labelled}")), "docs/metrics.md does not document {labelled}");
        }
        for family in families {
            assert!(doc.contains(&format!("`{family}")), "docs/metrics.md does not document {family}");
        }
        for reason in crate::controller::events::EVENT_REASONS {
            assert!(doc.contains(&format!("| `{reason}` |")), "docs/metrics.md does not document the Event {reason}");
        }
    }
}
