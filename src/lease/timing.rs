//! The three durations of a lock, in the shape the renewal and expiry code needs.

use std::time::Duration;

use crate::crd::DistributedLockSpec;

/// The longest lifetime a waiting claim grows to (unless three lease durations are longer).
pub const LONGEST_CLAIM_LIFETIME: Duration = Duration::from_secs(600);

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

    /// How long a new claim lives without refresh: `max(3 × lease duration, 30 s)`. The
    /// controller caps every claim's `ttlSeconds` at [`Timing::claim_lifetime`] of the wait
    /// the claim shows, so a claim that asks for more lives this long until refreshed.
    pub fn claim_ttl(&self) -> Duration {
        (self.lease_duration * 3).max(Duration::from_secs(30))
    }

    /// The lifetime a claim asks for once its acquisition has waited `waited`: three times
    /// that wait, at least [`Timing::claim_ttl`] and at most [`Timing::claim_ttl_cap`]. It
    /// is refreshed every third of it, so the pause between refreshes doubles with the wait
    /// and a long wait costs a few refreshes instead of one every third of `claim_ttl`; a
    /// claimant that dies while waiting leaves the queue within three times the wait it
    /// had behind it (and is refused the lock sooner if its turn comes first: it cannot
    /// confirm the grant).
    pub fn claim_lifetime(&self, waited: Duration) -> Duration {
        waited.saturating_mul(3).clamp(self.claim_ttl(), self.claim_ttl_cap())
    }

    /// The longest a claim lives without refresh, however long it waited:
    /// `max(claim_ttl, 10 min)`.
    fn claim_ttl_cap(&self) -> Duration {
        self.claim_ttl().max(LONGEST_CLAIM_LIFETIME)
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
    fn a_claims_lifetime_is_three_times_its_wait_between_the_first_lifetime_and_the_cap() {
        let s = Duration::from_secs;
        // (lease, renew, retry ms), waited, lifetime
        let cases = [
            ((15_000, 10_000, 2_000), s(0), s(45)),
            ((15_000, 10_000, 2_000), s(15), s(45)),
            ((15_000, 10_000, 2_000), s(20), s(60)),
            ((15_000, 10_000, 2_000), s(120), s(360)),
            ((15_000, 10_000, 2_000), s(200), s(600)),
            ((15_000, 10_000, 2_000), s(100_000), s(600)),
            ((3_000, 2_000, 1_000), s(0), s(30)),
            ((3_000, 2_000, 1_000), s(11), s(33)),
            ((3_000, 2_000, 1_000), Duration::MAX, s(600)),
            // Three lease durations longer than the cap: they are the lifetime throughout.
            ((300_000, 200_000, 60_000), s(0), s(900)),
            ((300_000, 200_000, 60_000), s(1_000), s(900)),
        ];
        for ((lease, renew, retry), waited, lifetime) in cases {
            let timing = t(lease, renew, retry);
            assert_eq!(timing.claim_lifetime(waited), lifetime, "lease {lease} ms, waited {waited:?}");
            assert!(timing.claim_lifetime(waited) <= timing.claim_ttl_cap(), "lease {lease} ms, waited {waited:?}");
        }
    }

    #[test]
    fn a_claims_lifetime_grows_to_ten_minutes_or_three_lease_durations() {
        assert_eq!(t(15_000, 10_000, 2_000).claim_ttl_cap(), Duration::from_secs(600));
        assert_eq!(t(300_000, 200_000, 60_000).claim_ttl_cap(), Duration::from_secs(900));
    }

    #[test]
    fn of_spec_defaults() {
        let timing = Timing::of(&DistributedLockSpec::default());
        assert_eq!(timing, t(15_000, 10_000, 2_000));
    }
}
