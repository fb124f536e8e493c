//! `leasehold_controller_oldest_hold_seconds`: the age of the oldest current hold over all
//! locks, computed at scrape time from the DistributedLock cache (each lock's
//! holders' `acquiredAt`, written by the controller at the grant) — no apiserver
//! reads, and no series per lock.

use jiff::Timestamp;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use crate::crd::DistributedLock;

/// Seconds since the earliest of `acquired` at `now`; 0 with no hold (or one acquired
/// "later" than `now`, by a clock step).
pub fn oldest_hold_seconds(acquired: impl IntoIterator<Item = Timestamp>, now: Timestamp) -> f64 {
    acquired.into_iter().min().map_or(0.0, |first| now.duration_since(first).as_secs_f64().max(0.0))
}

/// Exports the age of the oldest hold among `locks`.
#[derive(Debug)]
pub struct OldestHold {
    /// The controller's DistributedLock cache.
    pub locks: Store<DistributedLock>,
}

impl Collector for OldestHold {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let acquired = self
            .locks
            .state()
            .into_iter()
            .filter_map(|lock| lock.status.clone())
            .flat_map(|status| super::status::listed(&status).into_iter().map(|h| h.acquired_at.0).collect::<Vec<_>>())
            .collect::<Vec<_>>();
        let gauge = ConstGauge::new(oldest_hold_seconds(acquired, Timestamp::now()));
        gauge.encode(encoder.encode_descriptor(
            "leasehold_controller_oldest_hold_seconds",
            "Age of the oldest current hold over all locks, 0 when none",
            None,
            gauge.metric_type(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("valid")
    }

    #[test]
    fn oldest_hold_table() {
        let now = at(1_000);
        let cases: [(&[i64], f64); 5] =
            [(&[], 0.0), (&[990], 10.0), (&[990, 400, 700], 600.0), (&[1_000], 0.0), (&[1_005], 0.0)];
        for (acquired, expected) in cases {
            assert_eq!(oldest_hold_seconds(acquired.iter().map(|s| at(*s)), now), expected, "{acquired:?}");
        }
    }
}
