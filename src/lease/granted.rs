//! The timing a hold was granted under, recorded on the lock Lease at every grant.
//!
//! A hold lives by the timing it was granted with: the controller judges its expiry, its
//! drain and its maximum age by it, and the holder self-fences by it — whatever later
//! edits of the DistributedLock say. So an edit that shortens `leaseDurationSeconds` never
//! lets the controller grant the lock to someone else while the current holder may still
//! believe it holds under the longer timing. The lease duration is the Lease's own
//! `spec.leaseDurationSeconds`; the rest are annotations.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::ResourceExt;

use super::Timing;
use crate::crd::{ANNOTATION_MAX_HOLD, ANNOTATION_RENEW_DEADLINE, ANNOTATION_RETRY_PERIOD, DistributedLockSpec};

/// The terms of a hold: its timing and its maximum age.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantedTiming {
    /// Lease duration, renew deadline, retry period.
    pub timing: Timing,
    /// The longest the hold may last, if the lock bounds it.
    pub max_hold: Option<Duration>,
}

impl GrantedTiming {
    /// The terms a lock's spec gives a new hold now.
    pub fn of_spec(spec: &DistributedLockSpec) -> GrantedTiming {
        GrantedTiming {
            timing: Timing::of(spec),
            max_hold: spec.max_hold_seconds.and_then(|s| u64::try_from(s).ok()).map(Duration::from_secs),
        }
    }
}

fn seconds(value: &str) -> Option<Duration> {
    value.parse::<u32>().ok().filter(|s| *s > 0).map(|s| Duration::from_secs(u64::from(s)))
}

/// Writes `granted` onto a Lease being granted: `spec.leaseDurationSeconds` and the
/// renew-deadline, retry-period and max-hold annotations (the last removed when unbounded).
pub fn record(lease: &mut Lease, granted: &GrantedTiming) {
    let secs = |d: Duration| d.as_secs().to_string();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.lease_duration_seconds = i32::try_from(granted.timing.lease_duration.as_secs()).ok();
    let annotations = lease.annotations_mut();
    annotations.insert(ANNOTATION_RENEW_DEADLINE.into(), secs(granted.timing.renew_deadline));
    annotations.insert(ANNOTATION_RETRY_PERIOD.into(), secs(granted.timing.retry_period));
    match granted.max_hold {
        Some(max) => annotations.insert(ANNOTATION_MAX_HOLD.into(), secs(max)),
        None => annotations.remove(ANNOTATION_MAX_HOLD),
    };
}

/// The terms the hold on `lease` was granted under. A Lease granted without them (by an
/// older version) is read with `fallback` (the lock's spec now), except for its own
/// `spec.leaseDurationSeconds`, which every grant has written.
pub fn of_lease(lease: &Lease, fallback: &GrantedTiming) -> GrantedTiming {
    let annotations = lease.annotations();
    let get = |key: &str| annotations.get(key).and_then(|v| seconds(v));
    let lease_duration = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u32::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(fallback.timing.lease_duration, |s| Duration::from_secs(u64::from(s)));
    match get(ANNOTATION_RENEW_DEADLINE) {
        Some(renew_deadline) => GrantedTiming {
            timing: Timing {
                lease_duration,
                renew_deadline,
                retry_period: get(ANNOTATION_RETRY_PERIOD).unwrap_or(fallback.timing.retry_period),
            },
            // Absent: unbounded. Present but unreadable: the lock's current bound.
            max_hold: annotations.get(ANNOTATION_MAX_HOLD).and_then(|v| seconds(v).or(fallback.max_hold)),
        },
        None => GrantedTiming { timing: Timing { lease_duration, ..fallback.timing }, max_hold: fallback.max_hold },
    }
}

/// Whether `lease` records every term of its hold, so that [`of_lease`] reads nothing from
/// its fallback: the lease duration, renew deadline and retry period readable, and the max
/// hold readable or absent (unbounded).
pub fn recorded(lease: &Lease) -> bool {
    let annotations = lease.annotations();
    let readable = |key: &str| annotations.get(key).and_then(|v| seconds(v)).is_some();
    let duration = lease.spec.as_ref().and_then(|s| s.lease_duration_seconds).is_some_and(|s| s > 0);
    duration
        && readable(ANNOTATION_RENEW_DEADLINE)
        && readable(ANNOTATION_RETRY_PERIOD)
        && (!annotations.contains_key(ANNOTATION_MAX_HOLD) || readable(ANNOTATION_MAX_HOLD))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn terms(lease: u32, renew: u32, retry: u32, max: Option<u32>) -> GrantedTiming {
        let d = |s: u32| Duration::from_secs(u64::from(s));
        GrantedTiming {
            timing: Timing { lease_duration: d(lease), renew_deadline: d(renew), retry_period: d(retry) },
            max_hold: max.map(d),
        }
    }

    #[test]
    fn recorded_terms_are_read_back_whatever_the_lock_says_now() {
        let mut lease = Lease::default();
        record(&mut lease, &terms(15, 10, 2, Some(60)));
        let now = terms(3, 2, 1, None);
        assert_eq!(of_lease(&lease, &now), terms(15, 10, 2, Some(60)));
        record(&mut lease, &terms(6, 4, 1, None));
        assert_eq!(of_lease(&lease, &terms(15, 10, 2, Some(60))), terms(6, 4, 1, None), "no max hold: unbounded");
    }

    #[test]
    fn a_lease_granted_by_an_older_version_falls_back_to_the_spec() {
        let mut lease: Lease =
            serde_json::from_value(serde_json::json!({"spec": {"leaseDurationSeconds": 20}})).expect("a Lease");
        let spec = terms(15, 10, 2, Some(60));
        assert_eq!(of_lease(&lease, &spec), terms(20, 10, 2, Some(60)), "its own lease duration, the rest from spec");
        lease.spec = None;
        assert_eq!(of_lease(&lease, &spec), spec);
    }

    #[test]
    fn malformed_annotations_fall_back_field_by_field() {
        let mut lease = Lease::default();
        record(&mut lease, &terms(15, 10, 2, Some(60)));
        lease.annotations_mut().insert(ANNOTATION_RETRY_PERIOD.into(), "soon".into());
        lease.annotations_mut().insert(ANNOTATION_MAX_HOLD.into(), "0".into());
        let read = of_lease(&lease, &terms(9, 8, 3, Some(5)));
        assert_eq!((read.timing.renew_deadline, read.timing.retry_period, read.max_hold), (10 * S, 3 * S, Some(5 * S)));
    }

    #[test]
    fn a_lease_records_its_terms_only_when_none_falls_back_to_the_spec() {
        let full = {
            let mut lease = Lease::default();
            record(&mut lease, &terms(15, 10, 2, Some(60)));
            lease
        };
        let edited = |f: &dyn Fn(&mut Lease)| {
            let mut lease = full.clone();
            f(&mut lease);
            lease
        };
        let unbounded = {
            let mut lease = Lease::default();
            record(&mut lease, &terms(15, 10, 2, None));
            lease
        };
        let table = [
            ("every term recorded", full.clone(), true),
            ("no max hold: unbounded", unbounded, true),
            ("no lease duration", edited(&|l| l.spec = None), false),
            ("a zero lease duration", edited(&|l| l.spec.as_mut().unwrap().lease_duration_seconds = Some(0)), false),
            ("no renew deadline", edited(&|l| drop(l.annotations_mut().remove(ANNOTATION_RENEW_DEADLINE))), false),
            ("no retry period", edited(&|l| drop(l.annotations_mut().remove(ANNOTATION_RETRY_PERIOD))), false),
            (
                "an unreadable max hold",
                edited(&|l| drop(l.annotations_mut().insert(ANNOTATION_MAX_HOLD.into(), "soon".into()))),
                false,
            ),
            ("nothing recorded", Lease::default(), false),
        ];
        let (a, b) = (terms(9, 8, 3, Some(5)), terms(30, 20, 4, None));
        for (case, lease, expected) in table {
            assert_eq!(recorded(&lease), expected, "{case}");
            // Recorded: what is read back does not depend on the fallback; not: it does.
            assert_eq!(of_lease(&lease, &a) == of_lease(&lease, &b), expected, "{case}");
        }
    }
}
