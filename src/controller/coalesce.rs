//! Which status writes may wait. On a contended lock most reconciles change nothing in
//! status but the waiting queue — a claimant that let go queues again at once — and each
//! such write is a server-side apply, the dearest write the apiserver takes. A change to the
//! queue alone, made while claimants waited before and still wait, is held back for a
//! moment after the lock's last status write: the next grant's write carries it, or it is
//! written once the moment has passed. Everything else — a holder, a token, a counter, a
//! condition, the queue becoming empty or non-empty — is written at once. Status is never
//! where a decision is read from, so holding the queue back changes no grant.
//!
//! Nor is a status applied again that was written moments ago but that no copy of the lock
//! shows yet: the write's own event is on its way and reconciles the lock.

use std::time::Duration;

use crate::crd::DistributedLockStatus;

/// How long after the lock's last status write a change to the queue alone may wait.
pub const QUEUE_SETTLE: Duration = Duration::from_millis(250);

/// How long to hold back writing `desired` over `previous`, the status last written
/// `since_written` ago (unknown: never held back). `None`: write now.
pub fn hold_back(
    previous: &DistributedLockStatus,
    desired: &DistributedLockStatus,
    since_written: Option<Duration>,
) -> Option<Duration> {
    let remaining = remaining(QUEUE_SETTLE, since_written)?;
    let waiting = previous.queue_length > 0 && desired.queue_length > 0;
    let queue_only = || {
        let queue = (previous.waiters.clone(), previous.queue_length);
        DistributedLockStatus { waiters: queue.0, queue_length: queue.1, ..desired.clone() } == *previous
    };
    (waiting && queue_only()).then_some(remaining)
}

/// How long after a status write a reconcile that does not see it yet waits for the cache,
/// instead of applying the same status again.
pub const UNSEEN_GRACE: Duration = Duration::from_secs(1);

/// How long a status equal to the one written `since_written` ago (unknown: not at all),
/// which no copy of the lock shows yet, waits for the cache rather than being applied
/// again. The write's own watch event arrives within milliseconds and reconciles the lock;
/// past the grace the status is applied again, since it may have been removed after the
/// write. `None`: apply now.
pub fn await_written(since_written: Option<Duration>) -> Option<Duration> {
    remaining(UNSEEN_GRACE, since_written)
}

/// What of `window` is left `since` the last status write (unknown: nothing).
fn remaining(window: Duration, since: Option<Duration>) -> Option<Duration> {
    window.checked_sub(since?).filter(|d| !d.is_zero())
}

/// What a reconcile does with the status it wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusWrite {
    /// Apply it now.
    Apply,
    /// Nothing to write: the lock shows it already.
    Skip,
    /// Not now: look again after this long (the write's own event, or the next grant's
    /// write, usually comes first).
    Wait(Duration),
}

/// The status write for `desired`, given `previous` (the status last written in this
/// term, else the lock's own), when that write was made, whether any copy of the lock
/// (the reconcile's or the cache's) shows a status at all, and whether this reconcile has
/// something to record (a grant, a revocation, a force-release, a counter).
pub fn status_write(
    previous: &DistributedLockStatus,
    desired: &DistributedLockStatus,
    since_written: Option<Duration>,
    shown: bool,
    to_record: bool,
) -> StatusWrite {
    if desired == previous {
        if shown {
            return StatusWrite::Skip;
        }
        if let Some(wait) = await_written(since_written) {
            return StatusWrite::Wait(wait);
        }
    }
    match hold_back(previous, desired, since_written).filter(|_| !to_record) {
        Some(wait) => StatusWrite::Wait(wait),
        None => StatusWrite::Apply,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{HolderStatus, WaiterStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const MS: Duration = Duration::from_millis(1);

    fn waiter(id: &str) -> WaiterStatus {
        WaiterStatus { identity: id.into(), pod: None, mode: None, since: Time(jiff::Timestamp::UNIX_EPOCH) }
    }

    fn status(holder: &str, token: i64, waiters: &[&str]) -> DistributedLockStatus {
        let holder = HolderStatus {
            identity: holder.into(),
            slot: 0,
            mode: None,
            pod: None,
            fencing_token: token,
            acquired_at: Time(jiff::Timestamp::UNIX_EPOCH),
            renewed_at: None,
            expires_at: None,
            waited_seconds: 0.0,
        };
        DistributedLockStatus {
            holder: Some(Box::new(holder.clone())),
            holders: vec![holder],
            fencing_token: Some(token),
            waiters: waiters.iter().map(|w| waiter(w)).collect(),
            queue_length: i32::try_from(waiters.len()).unwrap_or(i32::MAX),
            ..DistributedLockStatus::default()
        }
    }

    #[test]
    fn only_a_change_within_a_waiting_queue_waits_and_only_for_the_rest_of_the_settle() {
        let before = status("a", 5, &["b", "c"]);
        let counted = DistributedLockStatus {
            stats: crate::crd::LockStats { grants: 1, ..Default::default() },
            ..status("a", 5, &["b", "c", "d"])
        };
        let table: Vec<(&str, DistributedLockStatus, Option<Duration>, Option<Duration>)> = vec![
            ("a waiter joins a waiting queue", status("a", 5, &["b", "c", "d"]), Some(100 * MS), Some(150 * MS)),
            ("a waiter leaves a waiting queue", status("a", 5, &["c"]), Some(Duration::ZERO), Some(QUEUE_SETTLE)),
            ("the queue reorders", status("a", 5, &["c", "b"]), Some(249 * MS), Some(MS)),
            ("the settle has passed", status("a", 5, &["b", "c", "d"]), Some(QUEUE_SETTLE), None),
            ("the last write is unknown", status("a", 5, &["b", "c", "d"]), None, None),
            ("the queue empties", status("a", 5, &[]), Some(10 * MS), None),
            ("a new holder", status("b", 6, &["c"]), Some(10 * MS), None),
            ("the same holder, a new token", status("a", 6, &["b", "c"]), Some(10 * MS), None),
            ("a counter with the queue", counted, Some(10 * MS), None),
        ];
        for (case, desired, since, want) in table {
            assert_eq!(hold_back(&before, &desired, since), want, "{case}");
        }
    }

    #[test]
    fn the_first_waiter_is_written_at_once() {
        let free_queue = status("a", 5, &[]);
        assert_eq!(hold_back(&free_queue, &status("a", 5, &["b"]), Some(MS)), None);
    }

    #[test]
    fn each_status_is_applied_skipped_or_waited_for() {
        use StatusWrite::{Apply, Skip, Wait};
        let written = status("a", 5, &["b", "c"]);
        let joined = status("a", 5, &["b", "c", "d"]);
        let granted = status("b", 6, &["c"]);
        // (case, desired, since written, shown, something to record, expected)
        type Row<'a> = (&'a str, &'a DistributedLockStatus, Option<Duration>, bool, bool, StatusWrite);
        let table: Vec<Row> = vec![
            ("unchanged and shown", &written, Some(10 * MS), true, false, Skip),
            ("unchanged and shown, written long ago", &written, Some(60 * UNSEEN_GRACE), true, false, Skip),
            ("unchanged and shown, write unknown", &written, None, true, false, Skip),
            (
                "unchanged, not shown yet: its event is on its way",
                &written,
                Some(10 * MS),
                false,
                false,
                Wait(UNSEEN_GRACE - 10 * MS),
            ),
            (
                "unchanged, not shown past the grace: removed, applied again",
                &written,
                Some(UNSEEN_GRACE),
                false,
                false,
                Apply,
            ),
            ("unchanged, not shown, never written in this term", &written, None, false, false, Apply),
            (
                "the queue alone changed within the settle",
                &joined,
                Some(10 * MS),
                true,
                false,
                Wait(QUEUE_SETTLE - 10 * MS),
            ),
            ("the queue alone changed, but something to record", &joined, Some(10 * MS), true, true, Apply),
            ("the queue alone changed after the settle", &joined, Some(QUEUE_SETTLE), true, false, Apply),
            ("a new holder", &granted, Some(10 * MS), true, false, Apply),
            ("a new holder, not shown yet", &granted, Some(10 * MS), false, false, Apply),
        ];
        for (case, desired, since, shown, to_record, want) in table {
            assert_eq!(status_write(&written, desired, since, shown, to_record), want, "{case}");
        }
    }

    #[test]
    fn a_status_not_yet_seen_waits_for_the_cache_only_within_the_grace() {
        let table: Vec<(&str, Option<Duration>, Option<Duration>)> = vec![
            ("written just now", Some(Duration::ZERO), Some(UNSEEN_GRACE)),
            ("written 200 ms ago", Some(200 * MS), Some(UNSEEN_GRACE - 200 * MS)),
            ("the grace has passed: applied again", Some(UNSEEN_GRACE), None),
            ("long ago: applied again", Some(60 * UNSEEN_GRACE), None),
            ("never written in this term: applied", None, None),
        ];
        for (case, since_written, want) in table {
            assert_eq!(await_written(since_written), want, "{case}");
        }
    }
}
