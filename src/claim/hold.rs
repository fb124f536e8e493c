//! A confirmed hold and the task that renews it.
//!
//! The renewal task self-fences: the hold is valid until the renew deadline after the
//! *send* time of the last successful renewal. [`Hold::is_held`] compares that deadline
//! with the clock on every call, so even a process that was frozen (SIGSTOP) and thawed
//! never answers "held" late, whatever the task has had a chance to run.

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tracing::{info, warn};

use super::{Claimant, LostReason, edit};
use crate::lease::{CasError, Timing};

/// Test only (`broken-ignore-renew-deadline`): a hold that ignores its renew deadline, to
/// show that the fault suite's checker catches a sidecar that does.
const IGNORE_RENEW_DEADLINE: bool = cfg!(feature = "broken-ignore-renew-deadline");

/// The self-fence deadline of a renewal sent at `sent`.
fn deadline(sent: Instant, timing: &Timing) -> Instant {
    if IGNORE_RENEW_DEADLINE { sent + Duration::from_secs(365 * 24 * 3600) } else { sent + timing.renew_deadline }
}

/// What a hold is doing.
#[derive(Clone, Debug, PartialEq)]
pub enum HoldStatus {
    /// Held until `valid_until` unless renewed; `late` after a failed renewal attempt.
    Held {
        /// Self-fence deadline.
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
    token: i64,
    acquired_at: Timestamp,
    timing: Timing,
    status: watch::Receiver<HoldStatus>,
    events: broadcast::Sender<HoldEvent>,
    release: mpsc::Sender<oneshot::Sender<ReleaseOutcome>>,
}

/// A grant just confirmed by our compare-and-swap.
pub(super) struct Confirmed {
    /// The grant's token.
    pub token: i64,
    /// The lock Lease as our confirmation wrote it.
    pub lease: Lease,
    /// When the confirmation was sent: the renew deadline counts from here.
    pub sent: Instant,
}

impl Hold {
    pub(super) fn start(
        claimant: Claimant,
        lock: &str,
        ticket: super::book::Ticket,
        timing: Timing,
        Confirmed { token, lease, sent }: Confirmed,
        states: BoxStream<'static, Option<Lease>>,
    ) -> Hold {
        {
            let mut retired = claimant.retired.lock().expect("retired map is never poisoned");
            let entry = retired.entry(lock.to_owned()).or_default();
            *entry = (*entry).max(token);
        }
        claimant.metrics.held.inc();
        let (status_tx, status) =
            watch::channel(HoldStatus::Held { valid_until: deadline(sent, &timing), late: false });
        let (events, _) = broadcast::channel(16);
        let (release, commands) = mpsc::channel(1);
        let renewer = Renewer {
            claimant,
            lock: lock.to_owned(),
            ticket,
            token,
            timing,
            lease,
            valid_until: deadline(sent, &timing),
            status: status_tx,
            events: events.clone(),
        };
        tokio::spawn(renewer.run(sent, states, commands));
        Hold { lock: lock.to_owned(), token, acquired_at: Timestamp::now(), timing, status, events, release }
    }

    /// The lock's name.
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// The fencing token granted with this hold.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// When the hold was confirmed (wall clock).
    pub fn acquired_at(&self) -> Timestamp {
        self.acquired_at
    }

    /// The lock's timing.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// The hold's status, with the renew deadline applied against the clock now.
    pub fn status(&self) -> HoldStatus {
        match self.status.borrow().clone() {
            HoldStatus::Held { valid_until, .. } if Instant::now() >= valid_until => {
                HoldStatus::Lost(LostReason::RenewDeadline)
            }
            other => other,
        }
    }

    /// True while held and within the renew deadline.
    pub fn is_held(&self) -> bool {
        matches!(self.status(), HoldStatus::Held { .. })
    }

    /// Time left before self-fencing, if held.
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
                    _ = tokio::time::sleep_until(valid_until.into()) => return Some(LostReason::RenewDeadline),
                    changed = status.changed() => if changed.is_err() { return Some(LostReason::RenewDeadline) },
                },
            }
        }
    }

    /// Gives the hold up: deletes the claim, then clears the holder by compare-and-swap.
    /// Releasing a hold already lost succeeds and says so.
    pub async fn release(self) -> ReleaseOutcome {
        let (reply, outcome) = oneshot::channel();
        if self.release.send(reply).await.is_err() {
            return ReleaseOutcome { was_held: false };
        }
        outcome.await.unwrap_or(ReleaseOutcome { was_held: false })
    }
}

/// The background task behind a [`Hold`].
struct Renewer {
    claimant: Claimant,
    lock: String,
    /// The acquisition that produced this hold (see [`super::book`]).
    ticket: super::book::Ticket,
    token: i64,
    timing: Timing,
    lease: Lease,
    valid_until: Instant,
    status: watch::Sender<HoldStatus>,
    events: broadcast::Sender<HoldEvent>,
}

/// A failed renewal attempt.
enum RenewFailure {
    /// The hold is gone.
    Lost(LostReason),
    /// Worth retrying before the deadline.
    Transient(String),
}

impl Renewer {
    async fn run(
        mut self,
        sent: Instant,
        mut states: BoxStream<'static, Option<Lease>>,
        mut commands: mpsc::Receiver<oneshot::Sender<ReleaseOutcome>>,
    ) {
        let mut next = sent + self.timing.retry_period;
        loop {
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(self.valid_until.into()) => {
                    // Self-fence, then free the lock early if we still can.
                    self.lose(LostReason::RenewDeadline);
                    self.give_back().await;
                    return self.drain(commands, false).await;
                }
                command = commands.recv() => {
                    let was_held = Instant::now() < self.valid_until;
                    let was_held = self.release().await && was_held;
                    if let Some(reply) = command {
                        let _ = reply.send(ReleaseOutcome { was_held });
                    }
                    return;
                }
                Some(state) = states.next() => {
                    if let Err(reason) = edit::still_ours(state.as_ref(), &self.claimant.identity, self.token) {
                        self.lose(reason);
                        return self.drain(commands, false).await;
                    }
                    if let Some(lease) = state {
                        self.lease = lease;
                    }
                }
                _ = tokio::time::sleep_until(next.into()) => {
                    let attempt = Instant::now();
                    match tokio::time::timeout_at(self.valid_until.into(), self.renew_once()).await {
                        Ok(Ok(sent)) => {
                            self.valid_until = deadline(sent, &self.timing);
                            next = sent + self.timing.retry_period;
                            self.claimant.metrics.renew_seconds.observe(attempt.elapsed().as_secs_f64());
                            self.status.send_replace(HoldStatus::Held { valid_until: self.valid_until, late: false });
                        }
                        Ok(Err(RenewFailure::Lost(reason))) => {
                            self.lose(reason);
                            return self.drain(commands, false).await;
                        }
                        Ok(Err(RenewFailure::Transient(error))) => {
                            self.claimant.metrics.renew_failures.inc();
                            let remaining = self.valid_until.saturating_duration_since(Instant::now());
                            warn!(lock = %self.lock, token = self.token, %error, ?remaining, "renewal failed");
                            self.status.send_replace(HoldStatus::Held { valid_until: self.valid_until, late: true });
                            let _ = self.events.send(HoldEvent::RenewLate { error, remaining });
                            next = Instant::now() + (self.timing.retry_period / 4).max(Duration::from_millis(200));
                        }
                        // The deadline branch fires next.
                        Err(_) => {}
                    }
                }
            }
        }
    }

    /// One renewal; on conflict re-reads and retries while the hold is still ours.
    /// Returns the send time of the successful write.
    async fn renew_once(&mut self) -> Result<Instant, RenewFailure> {
        loop {
            let sent = Instant::now();
            match self.claimant.store.replace(&edit::renewed(&self.lease, Timestamp::now())).await {
                Ok(lease) => {
                    self.lease = lease;
                    return Ok(sent);
                }
                Err(CasError::Conflict { .. }) => {
                    let current = self
                        .claimant
                        .store
                        .get(&self.lock)
                        .await
                        .map_err(|e| RenewFailure::Transient(e.to_string()))?;
                    edit::still_ours(current.as_ref(), &self.claimant.identity, self.token)
                        .map_err(RenewFailure::Lost)?;
                    self.lease = current.expect("still_ours implies the Lease exists");
                }
                Err(CasError::NotFound { .. }) => return Err(RenewFailure::Lost(LostReason::LeaseDeleted)),
                Err(CasError::Forbidden { message, .. }) => {
                    return Err(RenewFailure::Lost(LostReason::Refused(message)));
                }
                Err(e) => return Err(RenewFailure::Transient(e.to_string())),
            }
        }
    }

    fn lose(&self, reason: LostReason) {
        if matches!(*self.status.borrow(), HoldStatus::Held { .. }) {
            warn!(namespace = %self.claimant.namespace(), lock = %self.lock, token = self.token, %reason, "hold lost");
            self.claimant.metrics.lost.inc();
            self.claimant.metrics.held.dec();
        }
        self.status.send_replace(HoldStatus::Lost(reason.clone()));
        let _ = self.events.send(HoldEvent::Lost(reason));
    }

    /// After a loss, waits for the owner to release (or drop) the Hold, then withdraws.
    async fn drain(self, mut commands: mpsc::Receiver<oneshot::Sender<ReleaseOutcome>>, was_held: bool) {
        let reply = commands.recv().await;
        self.claimant.withdraw_claim(&self.lock, self.ticket).await;
        self.status.send_replace(HoldStatus::Released);
        let _ = self.events.send(HoldEvent::Released { was_held });
        if let Some(reply) = reply {
            let _ = reply.send(ReleaseOutcome { was_held });
        }
    }

    /// Releases a valid hold: claim first (so the controller cannot re-grant it to us),
    /// then the holder. Returns whether the Lease still showed our hold.
    async fn release(&mut self) -> bool {
        self.claimant.withdraw_claim(&self.lock, self.ticket).await;
        let was_ours = self.give_back().await;
        if matches!(*self.status.borrow(), HoldStatus::Held { .. }) {
            self.claimant.metrics.held.dec();
        }
        info!(namespace = %self.claimant.namespace(), lock = %self.lock, token = self.token, was_ours, "released");
        self.status.send_replace(HoldStatus::Released);
        let _ = self.events.send(HoldEvent::Released { was_held: was_ours });
        was_ours
    }

    /// Clears the holder if the Lease still shows our hold. Returns whether it did.
    async fn give_back(&mut self) -> bool {
        let mut lease = self.lease.clone();
        for _ in 0..5 {
            match self.claimant.store.replace(&edit::released(&lease)).await {
                Ok(_) => return true,
                Err(CasError::Conflict { .. }) => match self.claimant.store.get(&self.lock).await {
                    Ok(Some(current))
                        if edit::still_ours(Some(&current), &self.claimant.identity, self.token).is_ok() =>
                    {
                        lease = current;
                    }
                    _ => return false,
                },
                Err(e) => {
                    warn!(lock = %self.lock, error = %e, "failed to clear the holder; the controller will expire it");
                    return false;
                }
            }
        }
        false
    }
}

impl Claimant {
    /// Deletes our claim on `lock` for acquisition `ticket`, unless a newer acquisition
    /// owns it (best effort: the controller drops stale claims anyway).
    pub(crate) async fn withdraw_claim(&self, lock: &str, ticket: super::book::Ticket) {
        let Some(_writing) = self.claims.withdrawal(lock, ticket).await else { return };
        if let Err(e) = self.store.delete(&self.identity.claim_name(lock), None).await {
            warn!(lock, error = %e, "failed to delete claim");
        }
    }
}
