//! Which status writes may wait. On a contended lock most reconciles change nothing in
//! status but its holder, token, counters and waiting queue — a claimant that let go
//! queues again at once, and the next is granted — and each such write is a server-side
//! apply, the dearest write the apiserver takes (about three times a Lease compare-and-swap).
//! Such a routine change, made while claimants waited before and still wait, is held back
//! for a moment after the lock's last status write: a later write carries it, or it is
//! written once the moment has passed.
//!
//! Status is never where a decision is read from, but recovery reads it: a lock Lease
//! deleted before this leader saw it is re-created draining the holder status names, and a
//! token is minted above status's. So a change is held back only while the status last
//! written still covers every hold granted since: each was granted on a slot that status
//! shows held, under a lease duration no longer than that holder's, with a token less than
//! [`TRAILING_TOKENS`] above status's, and under the generation status reflects. Recovery
//! mints above status's token plus that margin ([`recovery_floor`]) and drains the holder
//! status names to the end of its lease duration, unacknowledged. Everything else — a
//! condition, a revocation, a forced release, a new generation, the queue becoming empty
//! or non-empty — is written at once.
//!
//! Past the settle, a routine change is written as the controller's budget of routine
//! status writes allows ([`ROUTINE_STATUS_WRITES_PER_SECOND`]), and at the latest
//! [`STATUS_SETTLE_MAX`] after the lock's last status write: with many contended locks,
//! status then trails by a few seconds instead of every lock's status taking one apply a
//! second.
//!
//! Nor is a status applied again that was written moments ago but that no copy of the lock
//! shows yet: the write's own event is on its way and reconciles the lock.

use std::time::Duration;

use super::recreate;
use super::status::Outcome;
use crate::crd::DistributedLockStatus;

/// How long after the lock's last status write a routine change waits before it may be
/// written. A second: on a lock granted many times a second it turns most status applies
/// (the dearest write) into one per second; within the budget of routine writes status
/// shows a new holder at most this late (beyond it, [`STATUS_SETTLE_MAX`]), and the lock
/// Lease is the live record.
pub const STATUS_SETTLE: Duration = Duration::from_secs(1);

/// How long after the lock's last status write a routine change waits at most for the
/// budget of routine writes: status shows a new holder at most this late. Half the
/// margin of tokens status may trail by, so that the tokens of a lock granted all along
/// stay covered.
pub const STATUS_SETTLE_MAX: Duration = Duration::from_secs(5);

/// How many routine status writes a second the controller makes across every lock it
/// leads, past their settle; beyond it, they wait up to [`STATUS_SETTLE_MAX`]. A status
/// apply costs the apiserver about three Lease compare-and-swaps: twenty a second are a
/// small part of what it takes, where a hundred contended locks each written once a
/// second took about a third of its time on a two-core machine.
pub const ROUTINE_STATUS_WRITES_PER_SECOND: u32 = 20;

/// The budget of routine status writes: [`ROUTINE_STATUS_WRITES_PER_SECOND`], as many at once.
pub fn routine_status_budget() -> governor::DefaultDirectRateLimiter {
    let rate = std::num::NonZeroU32::new(ROUTINE_STATUS_WRITES_PER_SECOND).expect("a budget above zero");
    governor::RateLimiter::direct(governor::Quota::per_second(rate))
}

/// How far above the token status records the tokens granted while status waits may run
/// (tokens follow the wall clock in ms: ten seconds of it, ten times the settle).
pub const TRAILING_TOKENS: i64 = 10_000;

/// The token recovery assumes may have been issued, given the status last written (which
/// may trail the grants by up to [`TRAILING_TOKENS`]): 0 with no status token.
pub fn recovery_floor(status: Option<&DistributedLockStatus>) -> i64 {
    status.and_then(|s| s.fencing_token).map_or(0, |t| t.saturating_add(TRAILING_TOKENS))
}

/// How writing `desired` over `previous`, the status last written `since_written` ago
/// (unknown: never waits), may wait, given what was done since (`done`) and the lease
/// duration grants are made under now: held back for the rest of the settle
/// ([`StatusWrite::Wait`]), then written as the budget of routine status writes allows,
/// at the latest [`STATUS_SETTLE_MAX`] after the last write ([`StatusWrite::Budgeted`]).
/// `None`: write now.
fn routine_wait(
    previous: &DistributedLockStatus,
    desired: &DistributedLockStatus,
    done: &Outcome,
    lease_duration: Duration,
    since_written: Option<Duration>,
) -> Option<StatusWrite> {
    let since = since_written?;
    let wait = match remaining(STATUS_SETTLE, Some(since)) {
        Some(left) => StatusWrite::Wait(left),
        None => StatusWrite::Budgeted(remaining(STATUS_SETTLE_MAX, Some(since))?),
    };
    holdable(previous, desired, done, lease_duration).then_some(wait)
}

/// Whether writing `desired` over `previous` may wait: a routine change of a lock whose
/// claimants waited before and still wait, which recovery from `previous` still covers.
fn holdable(
    previous: &DistributedLockStatus,
    desired: &DistributedLockStatus,
    done: &Outcome,
    lease_duration: Duration,
) -> bool {
    let waiting = previous.queue_length > 0 && desired.queue_length > 0;
    waiting && routine(previous, desired, done) && covered(previous, desired, done, lease_duration)
}

/// Whether `desired` changes nothing over `previous` but what grants and releases change
/// on a contended lock: the same conditions (their messages name the holder), generation
/// and force-release record, and no revocation.
fn routine(previous: &DistributedLockStatus, desired: &DistributedLockStatus, done: &Outcome) -> bool {
    done.revoked.is_empty()
        && done.forced.is_none()
        && done.history.is_empty()
        && desired.observed_generation == previous.observed_generation
        && desired.last_force_release == previous.last_force_release
        && desired.force_release_approvals == previous.force_release_approvals
        && desired.force_release_history == previous.force_release_history
        && same_conditions(desired, previous)
}

/// Whether `a` and `b` have the same conditions, in order, by type, status and reason.
fn same_conditions(a: &DistributedLockStatus, b: &DistributedLockStatus) -> bool {
    a.conditions.len() == b.conditions.len()
        && a.conditions
            .iter()
            .zip(&b.conditions)
            .all(|(x, y)| x.type_ == y.type_ && x.status == y.status && x.reason == y.reason)
}

/// Whether recovery from `previous` is still safe for every hold granted since (`done`,
/// under `lease_duration`), and for a handoff with a token reserved since: its token within
/// the margin, its slot held in `previous` by a holder granted for at least as long.
fn covered(
    previous: &DistributedLockStatus,
    desired: &DistributedLockStatus,
    done: &Outcome,
    lease_duration: Duration,
) -> bool {
    // A token reserved for the next waiter is granted by a release, unseen: covered too.
    let tokens = match (previous.fencing_token, desired.fencing_token) {
        (Some(written), Some(now)) => now.max(done.reserved.unwrap_or(0)) <= written.saturating_add(TRAILING_TOKENS),
        (written, now) => written == now && done.reserved.is_none(),
    };
    let held_as_long = |slot: u32| {
        previous
            .holders
            .iter()
            .find(|h| u32::try_from(h.slot).ok() == Some(slot))
            .and_then(recreate::granted_for)
            .is_some_and(|d| d >= lease_duration)
    };
    tokens && done.granted.iter().all(|g| held_as_long(g.slot))
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
    /// Apply it if the budget of routine status writes allows; if not, look again within
    /// this long (when it may wait no longer).
    Budgeted(Duration),
}

/// The status write for `desired`, given `previous` (the status last written in this
/// term, else the lock's own), when that write was made, whether any copy of the lock
/// (the reconcile's or the cache's) shows a status at all, what was done since the write
/// and the lease duration grants are made under now.
pub fn status_write(
    previous: &DistributedLockStatus,
    desired: &DistributedLockStatus,
    since_written: Option<Duration>,
    shown: bool,
    done: &Outcome,
    lease_duration: Duration,
) -> StatusWrite {
    if desired == previous {
        if shown {
            return StatusWrite::Skip;
        }
        // Not shown past the grace: removed since the write, and put back at once.
        return match await_written(since_written) {
            Some(wait) => StatusWrite::Wait(wait),
            None => StatusWrite::Apply,
        };
    }
    routine_wait(previous, desired, done, lease_duration, since_written).unwrap_or(StatusWrite::Apply)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::status::Granted;
    use crate::crd::{ForceRelease, HolderStatus, WaiterStatus};
    use crate::lease::RevokeReason;
    use jiff::Timestamp;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    const MS: Duration = Duration::from_millis(1);
    const LEASE: Duration = Duration::from_secs(15);

    fn waiter(id: &str) -> WaiterStatus {
        WaiterStatus { identity: id.into(), pod: None, mode: None, since: Time(Timestamp::UNIX_EPOCH) }
    }

    fn condition(type_: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: "True".into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    /// Held by `holder` on slot 0 for 15 s with `token`, `waiters` queued, at generation 1.
    fn status(holder: &str, token: i64, waiters: &[&str]) -> DistributedLockStatus {
        let renewed = Timestamp::from_second(1_000).unwrap();
        let holder = HolderStatus {
            identity: holder.into(),
            slot: 0,
            mode: None,
            pod: None,
            fencing_token: token,
            acquired_at: Time(renewed),
            renewed_at: Some(Time(renewed)),
            expires_at: Some(Time(Timestamp::from_second(1_015).unwrap())),
            waited_seconds: 0.0,
        };
        DistributedLockStatus {
            holder: Some(Box::new(holder.clone())),
            holders: vec![holder],
            fencing_token: Some(token),
            waiters: waiters.iter().map(|w| waiter(w)).collect(),
            queue_length: i32::try_from(waiters.len()).unwrap_or(i32::MAX),
            conditions: vec![condition("Held", "Held", &format!("held with token {token}"))],
            observed_generation: Some(1),
            ..DistributedLockStatus::default()
        }
    }

    fn granted(slot: u32, token: i64) -> Outcome {
        let grant = Granted {
            slot,
            identity: "b".into(),
            token,
            acquired: Timestamp::UNIX_EPOCH,
            waited_seconds: 0.0,
            handoff_ms: None,
        };
        Outcome { granted: vec![grant], ..Outcome::default() }
    }

    #[test]
    fn only_routine_changes_recovery_still_covers_wait_and_only_for_the_rest_of_the_settle() {
        let before = status("a", 5, &["b", "c"]);
        let none = Outcome::default();
        let handed = granted(0, 6);
        let counted = DistributedLockStatus {
            stats: crate::crd::LockStats { grants: 1, ..Default::default() },
            ..status("b", 6, &["c", "a"])
        };
        let untimed = DistributedLockStatus {
            holders: vec![HolderStatus { expires_at: None, ..before.holders[0].clone() }],
            ..before.clone()
        };
        let past_margin = TRAILING_TOKENS + 6;
        let revoked = Outcome { revoked: vec![(0, RevokeReason::Expired)], ..granted(0, 6) };
        let forced = Outcome {
            forced: Some(ForceRelease {
                by: "op".into(),
                reason: "stuck".into(),
                at: Time(Timestamp::UNIX_EPOCH),
                revoked_token: Some(5),
                request: None,
                approved_by: vec![],
            }),
            ..Outcome::default()
        };
        let regenerated = DistributedLockStatus { observed_generation: Some(2), ..status("b", 6, &["c"]) };
        let turned = DistributedLockStatus {
            conditions: vec![condition("Held", "Draining", "draining token 5")],
            ..status("a", 5, &["b", "c"])
        };
        let other_slot = granted(1, 6);
        let (at_margin, beyond) = (granted(0, past_margin - 1), granted(0, past_margin));
        let reserved_within = Outcome { reserved: Some(past_margin - 1), ..Outcome::default() };
        let reserved_beyond = Outcome { reserved: Some(past_margin), ..Outcome::default() };
        // (case, previous, desired, done, lease duration now, since written, expected)
        type Row<'a> = (
            &'a str,
            &'a DistributedLockStatus,
            DistributedLockStatus,
            &'a Outcome,
            Duration,
            Option<Duration>,
            Option<Duration>,
        );
        let table: Vec<Row> = vec![
            (
                "a token reserved for the next waiter, within the margin",
                &before,
                status("a", 5, &["b", "c", "d"]),
                &reserved_within,
                LEASE,
                Some(100 * MS),
                Some(STATUS_SETTLE - 100 * MS),
            ),
            (
                "a token reserved for the next waiter, past the margin",
                &before,
                status("a", 5, &["b", "c", "d"]),
                &reserved_beyond,
                LEASE,
                Some(100 * MS),
                None,
            ),
            (
                "a waiter joins a waiting queue",
                &before,
                status("a", 5, &["b", "c", "d"]),
                &none,
                LEASE,
                Some(100 * MS),
                Some(STATUS_SETTLE - 100 * MS),
            ),
            (
                "a waiter leaves a waiting queue",
                &before,
                status("a", 5, &["c"]),
                &none,
                LEASE,
                Some(Duration::ZERO),
                Some(STATUS_SETTLE),
            ),
            (
                "the queue reorders",
                &before,
                status("a", 5, &["c", "b"]),
                &none,
                LEASE,
                Some(STATUS_SETTLE - MS),
                Some(MS),
            ),
            (
                "a new holder on the slot status shows held",
                &before,
                status("b", 6, &["c"]),
                &handed,
                LEASE,
                Some(10 * MS),
                Some(STATUS_SETTLE - 10 * MS),
            ),
            (
                "the same holder, a new token",
                &before,
                status("a", 6, &["b", "c"]),
                &handed,
                LEASE,
                Some(10 * MS),
                Some(STATUS_SETTLE - 10 * MS),
            ),
            (
                "a grant counted, its condition's message changed",
                &before,
                counted,
                &handed,
                LEASE,
                Some(10 * MS),
                Some(STATUS_SETTLE - 10 * MS),
            ),
            (
                "a token at the margin",
                &before,
                status("b", past_margin - 1, &["c"]),
                &at_margin,
                LEASE,
                Some(10 * MS),
                Some(STATUS_SETTLE - 10 * MS),
            ),
            (
                "a shorter lease duration than the holder status names",
                &before,
                status("b", 6, &["c"]),
                &handed,
                LEASE / 3,
                Some(10 * MS),
                Some(STATUS_SETTLE - 10 * MS),
            ),
            ("the settle has passed", &before, status("b", 6, &["c"]), &handed, LEASE, Some(STATUS_SETTLE), None),
            ("the last write is unknown", &before, status("a", 5, &["b", "c", "d"]), &none, LEASE, None, None),
            ("the queue empties", &before, status("b", 6, &[]), &handed, LEASE, Some(10 * MS), None),
            ("a token past the margin", &before, status("b", past_margin, &["c"]), &beyond, LEASE, Some(10 * MS), None),
            (
                "a grant on a slot status shows free",
                &before,
                status("a", 6, &["c"]),
                &other_slot,
                LEASE,
                Some(10 * MS),
                None,
            ),
            (
                "a longer lease duration than the holder status names",
                &before,
                status("b", 6, &["c"]),
                &handed,
                2 * LEASE,
                Some(10 * MS),
                None,
            ),
            (
                "status names a holder without its timing",
                &untimed,
                status("b", 6, &["c"]),
                &handed,
                LEASE,
                Some(10 * MS),
                None,
            ),
            ("a revocation", &before, status("b", 6, &["c"]), &revoked, LEASE, Some(10 * MS), None),
            ("a forced release", &before, status("a", 5, &["b", "c"]), &forced, LEASE, Some(10 * MS), None),
            ("a new generation", &before, regenerated, &handed, LEASE, Some(10 * MS), None),
            ("a condition turns", &before, turned, &none, LEASE, Some(10 * MS), None),
        ];
        for (case, previous, desired, done, lease, since, want) in table {
            assert_eq!(held_back(routine_wait(previous, &desired, done, lease, since)), want, "{case}");
        }
    }

    #[test]
    fn past_the_settle_a_change_that_could_wait_waits_for_the_budget_until_the_longest_settle() {
        let before = status("a", 5, &["b", "c"]);
        let handed = granted(0, 6);
        let revoked = Outcome { revoked: vec![(0, RevokeReason::Expired)], ..granted(0, 6) };
        let beyond = granted(0, TRAILING_TOKENS + 6);
        let (b, emptied, past_margin) =
            (status("b", 6, &["c"]), status("b", 6, &[]), status("b", TRAILING_TOKENS + 6, &["c"]));
        // (case, desired, done, since written, expected)
        type Row<'a> = (&'a str, &'a DistributedLockStatus, &'a Outcome, Option<Duration>, Option<Duration>);
        let table: Vec<Row> = vec![
            ("within the settle: held back, not budgeted", &b, &handed, Some(STATUS_SETTLE - MS), None),
            ("the settle just over", &b, &handed, Some(STATUS_SETTLE), Some(STATUS_SETTLE_MAX - STATUS_SETTLE)),
            ("a moment before the longest settle", &b, &handed, Some(STATUS_SETTLE_MAX - MS), Some(MS)),
            ("the longest settle over", &b, &handed, Some(STATUS_SETTLE_MAX), None),
            ("the last write unknown", &b, &handed, None, None),
            ("a revocation", &b, &revoked, Some(2 * STATUS_SETTLE), None),
            ("the queue empties", &emptied, &handed, Some(2 * STATUS_SETTLE), None),
            ("a token past the margin", &past_margin, &beyond, Some(2 * STATUS_SETTLE), None),
        ];
        for (case, desired, done, since, want) in table {
            let budgeted = match routine_wait(&before, desired, done, LEASE, since) {
                Some(StatusWrite::Budgeted(up_to)) => Some(up_to),
                _ => None,
            };
            assert_eq!(budgeted, want, "{case}");
        }
    }

    #[test]
    fn the_first_waiter_is_written_at_once() {
        let free_queue = status("a", 5, &[]);
        let wait = routine_wait(&free_queue, &status("a", 5, &["b"]), &Outcome::default(), LEASE, Some(MS));
        assert_eq!(wait, None);
    }

    /// How long a change is held back within the settle, if it is.
    fn held_back(wait: Option<StatusWrite>) -> Option<Duration> {
        match wait {
            Some(StatusWrite::Wait(left)) => Some(left),
            _ => None,
        }
    }

    #[test]
    fn recovery_assumes_tokens_up_to_the_margin_above_status() {
        assert_eq!(recovery_floor(None), 0);
        assert_eq!(recovery_floor(Some(&DistributedLockStatus::default())), 0);
        assert_eq!(recovery_floor(Some(&status("a", 5, &[]))), 5 + TRAILING_TOKENS);
        assert_eq!(recovery_floor(Some(&status("a", i64::MAX - 1, &[]))), i64::MAX);
    }

    #[test]
    fn each_status_is_applied_skipped_or_waited_for() {
        use StatusWrite::{Apply, Budgeted, Skip, Wait};
        let written = status("a", 5, &["b", "c"]);
        let joined = status("a", 5, &["b", "c", "d"]);
        let granted_b = status("b", 6, &["c"]);
        let none = Outcome::default();
        let handed = granted(0, 6);
        let revoked = Outcome { revoked: vec![(0, RevokeReason::Expired)], ..Outcome::default() };
        // (case, desired, since written, shown, done, expected)
        type Row<'a> = (&'a str, &'a DistributedLockStatus, Option<Duration>, bool, &'a Outcome, StatusWrite);
        let table: Vec<Row> = vec![
            ("unchanged and shown", &written, Some(10 * MS), true, &none, Skip),
            ("unchanged and shown, written long ago", &written, Some(60 * UNSEEN_GRACE), true, &none, Skip),
            ("unchanged and shown, write unknown", &written, None, true, &none, Skip),
            (
                "unchanged, not shown yet: its event is on its way",
                &written,
                Some(10 * MS),
                false,
                &none,
                Wait(UNSEEN_GRACE - 10 * MS),
            ),
            (
                "unchanged, not shown past the grace: removed, applied again",
                &written,
                Some(UNSEEN_GRACE),
                false,
                &none,
                Apply,
            ),
            ("unchanged, not shown, never written in this term", &written, None, false, &none, Apply),
            (
                "the queue alone changed within the settle",
                &joined,
                Some(10 * MS),
                true,
                &none,
                Wait(STATUS_SETTLE - 10 * MS),
            ),
            ("the queue changed, and a revocation to record", &joined, Some(10 * MS), true, &revoked, Apply),
            (
                "the queue alone changed after the settle",
                &joined,
                Some(STATUS_SETTLE),
                true,
                &none,
                Budgeted(STATUS_SETTLE_MAX - STATUS_SETTLE),
            ),
            ("the queue alone changed after the longest settle", &joined, Some(STATUS_SETTLE_MAX), true, &none, Apply),
            ("a new holder within the settle", &granted_b, Some(10 * MS), true, &handed, Wait(STATUS_SETTLE - 10 * MS)),
            (
                "a new holder after the settle",
                &granted_b,
                Some(STATUS_SETTLE + 10 * MS),
                false,
                &handed,
                Budgeted(STATUS_SETTLE_MAX - STATUS_SETTLE - 10 * MS),
            ),
            ("a new holder after the longest settle", &granted_b, Some(STATUS_SETTLE_MAX), false, &handed, Apply),
            ("a revocation after the settle", &granted_b, Some(STATUS_SETTLE), true, &revoked, Apply),
        ];
        for (case, desired, since, shown, done, want) in table {
            assert_eq!(status_write(&written, desired, since, shown, done, LEASE), want, "{case}");
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
