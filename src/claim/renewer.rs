//! The task behind a [`super::Hold`]: renews the hold, watches the lock Lease for its
//! revocation, self-fences, and gives the hold back — released, or, after a revocation,
//! acknowledged once the owner has let go.

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tracing::{info, warn};

use super::hold::{HoldEvent, HoldStatus, ReleaseOutcome, fence, fence_reason};
use super::react::{self, Ours, Reaction};
use super::{Claimant, LostReason, edit};
use crate::lease::{CasError, Timing};

/// Test only (`broken-ignore-renew-deadline`): a hold that ignores its renew deadline, to
/// show that the fault suite's checker catches a sidecar that does.
const IGNORE_RENEW_DEADLINE: bool = cfg!(feature = "broken-ignore-renew-deadline");

/// Test only (`broken-401-transient`): a renewal refused with 401 (a Pod-bound token whose
/// Pod is gone) taken for a passing error, retried until the renew deadline — to show the
/// fault suite catches a holder that keeps saying "held" after its Pod was deleted.
const UNAUTHORIZED_TRANSIENT: bool = cfg!(feature = "broken-401-transient");

/// The renew deadline of a renewal sent at `sent`.
pub(super) fn deadline(sent: Instant, timing: &Timing) -> Instant {
    if IGNORE_RENEW_DEADLINE { sent + Duration::from_secs(365 * 24 * 3600) } else { sent + timing.renew_deadline }
}

/// The background task behind a hold.
pub(super) struct Renewer {
    pub(super) claimant: Claimant,
    pub(super) lock: String,
    /// The acquisition that produced this hold (see [`super::book`]).
    pub(super) ticket: super::book::Ticket,
    pub(super) token: i64,
    /// The timing the hold was granted under.
    pub(super) timing: Timing,
    /// The lock Lease as last seen or written.
    pub(super) lease: Lease,
    /// The renew deadline of the last successful renewal.
    pub(super) valid_until: Instant,
    /// The max-hold deadline, if any.
    pub(super) max_until: Option<Instant>,
    pub(super) status: watch::Sender<HoldStatus>,
    pub(super) events: broadcast::Sender<HoldEvent>,
}

/// A failed renewal attempt.
enum RenewFailure {
    /// The hold is gone.
    Lost(LostReason),
    /// Worth retrying before the deadline.
    Transient(String),
}

/// What giving the hold back did.
#[derive(Debug, PartialEq, Eq)]
enum GaveBack {
    /// Cleared the holder of a hold still granted.
    Released,
    /// Cleared the holder of a revoked hold: the controller may grant the next claimant.
    Acknowledged,
    /// Nothing of ours left on the Lease.
    Nothing,
    /// The apiserver could not be asked (unreachable, failing): try again.
    Unanswered,
}

type Commands = mpsc::Receiver<oneshot::Sender<ReleaseOutcome>>;

impl Renewer {
    /// Where we stand: holding with our token.
    fn ours(&self) -> Ours<'_> {
        Ours::Holding { identity: &self.claimant.identity, token: self.token }
    }

    fn fence(&self) -> Instant {
        fence(self.valid_until, self.max_until)
    }

    pub(super) async fn run(
        mut self,
        sent: Instant,
        mut states: BoxStream<'static, Option<Lease>>,
        mut commands: Commands,
    ) {
        let mut next = sent + self.timing.retry_period;
        loop {
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(self.fence().into()) => {
                    // Self-fenced: the owner's time is up (it was never told more), so
                    // free the lock early if we still can.
                    self.lose(fence_reason(self.fence(), self.max_until));
                    self.give_back().await;
                    return self.drain(commands, false).await;
                }
                command = commands.recv() => {
                    // Valid as the release was asked: what the caller needs to know about
                    // the work it just did, whether or not the apiserver answers now.
                    let valid = Instant::now() < self.fence();
                    let gave = self.release().await;
                    if let Some(reply) = command {
                        let _ = reply.send(ReleaseOutcome { was_held: valid && gave != GaveBack::Acknowledged });
                    }
                    if gave == GaveBack::Unanswered {
                        self.give_back_later().await;
                    }
                    return;
                }
                Some(state) = states.next() => {
                    let reaction = react::next(state.as_ref(), &self.ours());
                    if let Some(lease) = state {
                        self.lease = lease;
                    }
                    if let Reaction::LetGo(reason) = reaction {
                        self.lose(reason);
                        return self.drain(commands, true).await;
                    }
                }
                _ = tokio::time::sleep_until(next.into()) => {
                    let attempt = Instant::now();
                    match tokio::time::timeout_at(self.fence().into(), self.renew_once()).await {
                        Ok(Ok(sent)) => {
                            self.valid_until = deadline(sent, &self.timing);
                            next = sent + self.timing.retry_period;
                            self.claimant.metrics.renew_seconds.observe(attempt.elapsed().as_secs_f64());
                            self.status.send_replace(HoldStatus::Held { valid_until: self.fence(), late: false });
                        }
                        Ok(Err(RenewFailure::Lost(reason))) => {
                            self.lose(reason);
                            return self.drain(commands, true).await;
                        }
                        Ok(Err(RenewFailure::Transient(error))) => {
                            self.claimant.metrics.renew_failures.inc();
                            let remaining = self.fence().saturating_duration_since(Instant::now());
                            warn!(lock = %self.lock, token = self.token, %error, ?remaining, "renewal failed");
                            self.status.send_replace(HoldStatus::Held { valid_until: self.fence(), late: true });
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
    /// Returns the send time of the successful write. A renewal refused (403, or 401: our
    /// credentials are no longer valid) is a loss.
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
                        .get(&self.lease.name_any())
                        .await
                        .map_err(|e| RenewFailure::Transient(e.to_string()))?;
                    let reaction = react::next(current.as_ref(), &self.ours());
                    if let Some(lease) = current {
                        self.lease = lease;
                    }
                    if let Reaction::LetGo(reason) = reaction {
                        return Err(RenewFailure::Lost(reason));
                    }
                }
                Err(CasError::NotFound { .. }) => return Err(RenewFailure::Lost(LostReason::LeaseDeleted)),
                Err(CasError::Unauthorized { message, .. }) if UNAUTHORIZED_TRANSIENT => {
                    return Err(RenewFailure::Transient(message));
                }
                Err(CasError::Forbidden { message, .. } | CasError::Unauthorized { message, .. }) => {
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

    /// After a loss, waits for the owner to release (or drop) the Hold — it may still be
    /// acting within the time it was told it had — then, if `acknowledge`, clears our
    /// holder on a Lease that still drains our hold, and withdraws the claim.
    async fn drain(self, mut commands: Commands, acknowledge: bool) {
        let reply = commands.recv().await;
        if acknowledge && self.give_back().await == GaveBack::Acknowledged {
            info!(namespace = %self.claimant.namespace(), lock = %self.lock, token = self.token, "acknowledged the revocation");
        }
        self.claimant.withdraw_claim(&self.lock, self.ticket).await;
        self.status.send_replace(HoldStatus::Released);
        let _ = self.events.send(HoldEvent::Released { was_held: false });
        if let Some(reply) = reply {
            let _ = reply.send(ReleaseOutcome { was_held: false });
        }
    }

    /// Releases a valid hold: withdraws the claim and clears the holder at once, so the
    /// next waiter's grant waits for one round trip, not two. The controller never grants
    /// a claim it has served, so it cannot grant this one again however the two writes
    /// land. Returns whether the Lease still showed our hold granted (a hold revoked
    /// meanwhile is acknowledged instead, and was not held).
    async fn release(&mut self) -> GaveBack {
        let ((), gave) = tokio::join!(self.claimant.withdraw_claim(&self.lock, self.ticket), self.give_back());
        let was_ours = gave == GaveBack::Released;
        if matches!(*self.status.borrow(), HoldStatus::Held { .. }) {
            self.claimant.metrics.held.dec();
        }
        info!(namespace = %self.claimant.namespace(), lock = %self.lock, token = self.token, was_ours, "released");
        self.status.send_replace(HoldStatus::Released);
        let _ = self.events.send(HoldEvent::Released { was_held: was_ours });
        gave
    }

    /// A release the apiserver did not answer: clearing the holder is tried again, with a
    /// growing pause, until it lands or the hold can no longer be ours (a lease duration
    /// after our last successful renewal was sent: the controller expires it by then) — so
    /// a blip does not keep the lock from the next waiter for a whole lease.
    async fn give_back_later(&mut self) {
        let last_sent = self.valid_until.checked_sub(self.timing.renew_deadline).unwrap_or(self.valid_until);
        let until = last_sent + self.timing.lease_duration;
        let mut pause = Duration::from_millis(100);
        while Instant::now() + pause < until {
            tokio::time::sleep(pause).await;
            self.claimant.metrics.apiserver_retries.inc();
            // The claim too, in case its delete failed with the release's.
            self.claimant.withdraw_claim(&self.lock, self.ticket).await;
            match self.give_back().await {
                GaveBack::Unanswered => pause = (pause * 2).min(Duration::from_secs(1)),
                gave => {
                    info!(namespace = %self.claimant.namespace(), lock = %self.lock, token = self.token, ?gave, "released once the apiserver answered");
                    return;
                }
            }
        }
        warn!(lock = %self.lock, token = self.token, "the apiserver did not answer the release; the controller will expire the hold");
    }

    /// Clears the holder if the Lease still names our hold — granted (a release) or being
    /// drained with our token (an acknowledgement) — by compare-and-swap, re-reading on
    /// conflict.
    ///
    /// A release hands the lock on to the waiter the controller recorded as next, when it
    /// recorded one; a guard that refuses the handoff (one older than this claimant) gets
    /// the plain release instead, and the controller grants.
    async fn give_back(&self) -> GaveBack {
        let mut lease = self.lease.clone();
        let mut hand_on = true;
        for _ in 0..5 {
            let draining = edit::draining(&lease).is_some();
            let identity = &self.claimant.identity;
            let cleared = if hand_on {
                edit::given_back_or_handed_on(&lease, identity, self.token, Timestamp::now())
            } else {
                edit::given_back(&lease, identity, self.token)
            };
            let Some(cleared) = cleared else {
                return GaveBack::Nothing;
            };
            let handing_on = edit::holder(&cleared).is_some();
            match self.claimant.store.replace(&cleared).await {
                Ok(_) => {
                    self.claimant.returned(&self.lock, self.token);
                    return if draining { GaveBack::Acknowledged } else { GaveBack::Released };
                }
                Err(CasError::Conflict { .. }) => match self.claimant.store.get(&self.lease.name_any()).await {
                    Ok(Some(current)) => lease = current,
                    Ok(None) => return GaveBack::Nothing,
                    Err(_) => return GaveBack::Unanswered,
                },
                Err(CasError::Forbidden { message, .. }) if handing_on => {
                    warn!(lock = %self.lock, error = %message, "the lock Lease's guard refused the handoff; releasing instead");
                    hand_on = false;
                }
                Err(e @ (CasError::Timeout { .. } | CasError::Api { .. })) => {
                    warn!(lock = %self.lock, error = %e, "failed to clear the holder; trying again");
                    return GaveBack::Unanswered;
                }
                Err(e) => {
                    warn!(lock = %self.lock, error = %e, "failed to clear the holder; the controller will expire it");
                    return GaveBack::Nothing;
                }
            }
        }
        GaveBack::Nothing
    }
}

impl Claimant {
    /// Records that our hold with `token` on `lock` was given back, the write seen landing.
    fn returned(&self, lock: &str, token: i64) {
        let mut retired = self.retired.lock().expect("retired map is never poisoned");
        let entry = retired.entry(lock.to_owned()).or_default();
        entry.returned = entry.returned.max(token);
    }

    /// Deletes our claim on `lock` for acquisition `ticket`, unless a newer acquisition
    /// owns it (best effort: the controller drops stale claims anyway).
    pub(crate) async fn withdraw_claim(&self, lock: &str, ticket: super::book::Ticket) {
        let Some(_writing) = self.claims.withdrawal(lock, ticket).await else { return };
        if let Err(e) = self.delete_claim(lock).await {
            warn!(lock, error = %e, "failed to delete claim");
        }
    }
}
