//! A confirmed hold, as its owner sees it.
//!
//! The hold self-fences: it is valid until the renew deadline after the *send* time of the
//! last successful renewal, and never past its max-hold deadline (the lock's
//! `maxHoldSeconds` from the send time of the confirmation, or of the claim when the grant
//! was answered before confirming), both under the timing the
//! hold was granted with (recorded on the lock Lease). [`Hold::is_held`] compares those
//! deadlines with the clock on every call, so even a process that was frozen (SIGSTOP) and
//! thawed never answers "held" late, whatever the renewal task has had a chance to run.
//!
//! A hold the controller revoked is lost at once, but it is acknowledged (the holder
//! cleared on the lock Lease, which lets the controller grant the next claimant) only once
//! the owner lets go: releases or drops the [`Hold`]. Until then the owner may still be
//! acting within the time it was told it had.

use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use super::renewer::{Renewer, deadline};
use super::{Claimant, LostReason};
use crate::lease::{GrantedTiming, Timing, granted};

/// What a hold is doing.
#[derive(Clone, Debug, PartialEq)]
pub enum HoldStatus {
    /// Held until `valid_until` unless renewed; `late` after a failed renewal attempt.
    Held {
        /// Self-fence deadline: the renew deadline, never past the max-hold deadline.
        valid_until: Instant,
        /// The last renewal attempt failed.
        late: bool,
    },
    /// Lost; never held again.
    Lost(LostReason),
    /// Given up by us.
    Released,
}

/// Something that happened to a hold, for event streams.
#[derive(Clone, Debug, PartialEq)]
pub enum HoldEvent {
    /// A renewal attempt failed; the hold is still valid until its deadline.
    RenewLate {
        /// The failure.
        error: String,
        /// Time left before self-fencing.
        remaining: Duration,
    },
    /// The hold is lost.
    Lost(LostReason),
    /// The hold was released.
    Released {
        /// Whether it was still held when released.
        was_held: bool,
    },
}

/// The result of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReleaseOutcome {
    /// The hold was still valid when we gave it up (false: it had already been lost).
    pub was_held: bool,
}

/// A confirmed hold on a lock, renewed in the background until released, dropped or lost.
pub struct Hold {
    lock: String,
    slot: u32,
    token: i64,
    acquired_at: Timestamp,
    terms: GrantedTiming,
    /// The max-hold deadline, when the hold has one.
    max_until: Option<Instant>,
    status: watch::Receiver<HoldStatus>,
    events: broadcast::Sender<HoldEvent>,
    release: mpsc::Sender<oneshot::Sender<ReleaseOutcome>>,
}

/// A grant taken: confirmed by our compare-and-swap, or answered at once because it was
/// made on the claim we had just sent.
pub(super) struct Granted {
    /// The slot granted.
    pub slot: u32,
    /// The grant's token.
    pub token: i64,
    /// The lock Lease as our confirmation wrote it, or as the grant left it.
    pub lease: Lease,
    /// When the confirmation, or the claim, was sent: the renew deadline and the max-hold
    /// deadline count from here, and the first renewal is due a retry period after it.
    pub sent: Instant,
}

impl Hold {
    /// Starts renewing the grant taken. `fallback` is the lock's terms now, for a
    /// Lease granted without recorded terms.
    pub(super) fn start(
        claimant: Claimant,
        lock: &str,
        ticket: super::book::Ticket,
        fallback: GrantedTiming,
        Granted { slot, token, lease, sent }: Granted,
        states: BoxStream<'static, Option<Lease>>,
    ) -> Hold {
        {
            let mut retired = claimant.retired.lock().expect("retired map is never poisoned");
            let entry = retired.entry(lock.to_owned()).or_default();
            entry.handed = entry.handed.max(token);
        }
        claimant.metrics.held.inc();
        let terms = granted::of_lease(&lease, &fallback);
        let max_until = terms.max_hold.map(|max| sent + max);
        let valid_until = deadline(sent, &terms.timing);
        let (status_tx, status) =
            watch::channel(HoldStatus::Held { valid_until: fence(valid_until, max_until), late: false });
        let (events, _) = broadcast::channel(16);
        let (release, commands) = mpsc::channel(1);
        let renewer = Renewer {
            claimant,
            lock: lock.to_owned(),
            ticket,
            token,
            timing: terms.timing,
            lease,
            valid_until,
            max_until,
            status: status_tx,
            events: events.clone(),
        };
        tokio::spawn(renewer.run(sent, states, commands));
        Hold {
            lock: lock.to_owned(),
            slot,
            token,
            acquired_at: Timestamp::now(),
            terms,
            max_until,
            status,
            events,
            release,
        }
    }

    /// The lock's name.
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// The permit slot held (0 for a mutex): its Lease is `<lock>`, or `<lock>.<slot>`.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The fencing token granted with this hold.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// When the hold was confirmed (wall clock).
    pub fn acquired_at(&self) -> Timestamp {
        self.acquired_at
    }

    /// The timing the hold was granted under.
    pub fn timing(&self) -> Timing {
        self.terms.timing
    }

    /// The longest the hold may last (`maxHoldSeconds` at the grant), if bounded.
    pub fn max_hold(&self) -> Option<Duration> {
        self.terms.max_hold
    }

    /// The hold's status, with its deadlines applied against the clock now.
    pub fn status(&self) -> HoldStatus {
        match self.status.borrow().clone() {
            HoldStatus::Held { valid_until, .. } if Instant::now() >= valid_until => {
                HoldStatus::Lost(fence_reason(valid_until, self.max_until))
            }
            other => other,
        }
    }

    /// True while held and within its deadlines.
    pub fn is_held(&self) -> bool {
        matches!(self.status(), HoldStatus::Held { .. })
    }

    /// Time left before self-fencing, if held: never past the renew deadline, nor past the
    /// max-hold deadline.
    pub fn remaining(&self) -> Option<Duration> {
        match self.status() {
            HoldStatus::Held { valid_until, .. } => Some(valid_until.saturating_duration_since(Instant::now())),
            _ => None,
        }
    }

    /// Subscribes to renew-late, lost and released events.
    pub fn events(&self) -> broadcast::Receiver<HoldEvent> {
        self.events.subscribe()
    }

    /// Resolves when the hold is lost (or released), with the reason.
    pub async fn lost(&self) -> Option<LostReason> {
        let mut status = self.status.clone();
        loop {
            let current = status.borrow_and_update().clone();
            match current {
                HoldStatus::Lost(reason) => return Some(reason),
                HoldStatus::Released => return None,
                HoldStatus::Held { valid_until, .. } => tokio::select! {
                    _ = tokio::time::sleep_until(valid_until.into()) => return Some(fence_reason(valid_until, self.max_until)),
                    changed = status.changed() => if changed.is_err() { return Some(LostReason::RenewDeadline) },
                },
            }
        }
    }

    /// Gives the hold up: deletes the claim, then clears the holder by compare-and-swap
    /// (or, if the hold was revoked, acknowledges the revocation the same way). Releasing
    /// a hold already lost succeeds and says so.
    pub async fn release(self) -> ReleaseOutcome {
        let (reply, outcome) = oneshot::channel();
        if self.release.send(reply).await.is_err() {
            return ReleaseOutcome { was_held: false };
        }
        outcome.await.unwrap_or(ReleaseOutcome { was_held: false })
    }
}

/// The self-fence deadline: `valid_until` (the renew deadline), never past `max_until`.
pub(super) fn fence(valid_until: Instant, max_until: Option<Instant>) -> Instant {
    max_until.map_or(valid_until, |max| valid_until.min(max))
}

/// Why a hold whose self-fence deadline `at` passed is lost.
pub(super) fn fence_reason(at: Instant, max_until: Option<Instant>) -> LostReason {
    if max_until.is_some_and(|max| at >= max) { LostReason::MaxHold } else { LostReason::RenewDeadline }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_is_the_earlier_deadline_and_names_it() {
        let t0 = Instant::now();
        let (renew, max) = (t0 + Duration::from_secs(10), t0 + Duration::from_secs(4));
        assert_eq!(fence(renew, None), renew);
        assert_eq!(fence(renew, Some(max)), max);
        assert_eq!(fence(max, Some(renew)), max);
        assert_eq!(fence_reason(fence(renew, Some(max)), Some(max)), LostReason::MaxHold);
        assert_eq!(fence_reason(fence(max, Some(renew)), Some(renew)), LostReason::RenewDeadline);
        assert_eq!(fence_reason(renew, None), LostReason::RenewDeadline);
    }
}
