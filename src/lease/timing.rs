//! The three durations of a lock, in the shape the renewal and expiry code needs.

use std::time::Duration;

use crate::crd::DistributedLockSpec;

/// Lease duration, renew deadline and retry period of a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// A hold not renewed for this long may be expired by the controller.
    pub lease_duration: Duration,
    /// A holder that has not renewed successfully for this long declares the hold lost.
    pub renew_deadline: Duration,
    /// How often a holder renews.
    pub retry_period: Duration,
}

impl Timing {
    /// The timing of a lock, from its (apiserver-validated) spec.
    pub fn of(spec: &DistributedLockSpec) -> Timing {
        let secs = |s: i32| Duration::from_secs(u64::try_from(s.max(1)).unwrap_or(1));
        Timing {
            lease_duration: secs(spec.lease_duration_seconds),
            renew_deadline: secs(spec.renew_deadline_seconds),
            retry_period: secs(spec.retry_period_seconds),
        }
    }

    /// How long a waiting claim may live without refresh: `max(3 × lease duration, 30 s)`.
    /// The controller caps every claim's `ttlSeconds` at this.
    pub fn claim_ttl(&self) -> Duration {
        (self.lease_duration * 3).max(Duration::from_secs(30))
    }

    /// Checks lease > renew deadline > 1.2 × retry period, the rule the CRD enforces, for
    /// timings that do not come from a DistributedLock (the controller's own election).
    pub fn validate(&self) -> Result<(), String> {
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "lease duration {:?} must be greater than renew deadline {:?}",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline.as_secs_f64() <= 1.2 * self.retry_period.as_secs_f64() {
            return Err(format!(
                "renew deadline {:?} must be greater than 1.2 x retry period {:?}",
                self.renew_deadline, self.retry_period
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(lease: u64, renew: u64, retry: u64) -> Timing {
        Timing {
            lease_duration: Duration::from_millis(lease),
            renew_deadline: Duration::from_millis(renew),
            retry_period: Duration::from_millis(retry),
        }
    }

    #[test]
    fn validate_table() {
        assert!(t(15_000, 10_000, 2_000).validate().is_ok());
        assert!(t(3_000, 2_000, 1_000).validate().is_ok());
        assert!(t(10_000, 10_000, 2_000).validate().unwrap_err().contains("renew deadline"));
        assert!(t(15_000, 2_400, 2_000).validate().unwrap_err().contains("1.2 x retry"));
    }

    #[test]
    fn claim_ttl_is_three_lease_durations_but_at_least_30s() {
        assert_eq!(t(15_000, 10_000, 2_000).claim_ttl(), Duration::from_secs(45));
        assert_eq!(t(3_000, 2_000, 1_000).claim_ttl(), Duration::from_secs(30));
    }

    #[test]
    fn of_spec_defaults() {
        let timing = Timing::of(&DistributedLockSpec::default());
        assert_eq!(timing, t(15_000, 10_000, 2_000));
    }
}
