//! The arbiter's decision for one lock, as a pure function of what was observed.
//!
//! The rule: nobody is granted while a revoked holder may still believe it holds.
//! - A holder that stopped renewing (expired: no renewal seen for its lease duration) or
//!   never confirmed its grant cannot believe it holds: its revocation and the next grant
//!   are one write, the new, higher token making the old one stale at once.
//! - A claimant answers a grant on the claim it sent less than a retry period before at
//!   once, before confirming it, and counts its renew deadline from sending that claim. So
//!   until a lease duration has passed since we first saw the holder's claim, an
//!   unconfirmed grant is judged as a hold renewed then: never revoked for being
//!   unconfirmed, drained where a confirmed hold would be.
//! - A holder that may be alive and believing — revoked by an operator, for its maximum
//!   age, because its Pod is gone, or because the lock is deleted — is *drained*: one write
//!   raises the token (fenced resources refuse the old one at once) and marks the Lease
//!   draining while still naming the holder; the next grant waits until the holder
//!   acknowledges (clears itself, once its app has let go) or until its lease duration
//!   has passed since the last renewal seen before the revocation, by which time it has
//!   self-fenced.
//!
//! Every duration is judged on the controller's monotonic clock and under the timing the
//! hold was granted with.

use std::time::Duration;

use crate::lease::RevokeReason;
use crate::lease::{GrantedTiming, token};

/// Test only (`broken-regrant-at-once`): revoke and grant in one write for every reason,
/// never draining, to show that the fault suite catches a controller that does.
const REGRANT_AT_ONCE: bool = cfg!(feature = "broken-regrant-at-once");

/// Test only (`broken-unconfirmed-at-once`): revoke a grant not confirmed within the
/// confirm timeout whatever the age of its claim, as if no claimant answered before
/// confirming, to show that the fault suite catches a controller that does.
const UNCONFIRMED_AT_ONCE: bool = cfg!(feature = "broken-unconfirmed-at-once");

/// What the controller knows about a hold that is granted (not draining).
#[derive(Clone, Debug, PartialEq)]
pub struct HolderState {
    /// The token on the Lease (`None`: not a grant of ours, revoke it).
    pub token: Option<i64>,
    /// The holder renewed at least once since the grant.
    pub confirmed: bool,
    /// How long the holder's renewal record has been unchanged on our clock.
    pub unchanged_for: Duration,
    /// Age of the hold on our clock: since our grant, or since we first saw it in this
    /// leadership term (never more than its true age).
    pub held_for: Duration,
    /// The holder's Pod is gone (deleted, or re-created with a new UID).
    pub pod_gone: bool,
    /// The holder's claim still exists (an unconfirmed grant whose claim is gone was
    /// withdrawn).
    pub claim_present: bool,
    /// How long since we first saw the holder's claim (or, with none left, its grant) on
    /// our clock: it was sent before then.
    pub claim_seen_for: Duration,
    /// A force release targets this hold.
    pub forced: bool,
}

/// What the controller knows about a revoked hold being drained.
#[derive(Clone, Debug, PartialEq)]
pub struct DrainState {
    /// The holder acknowledged (cleared itself from the Lease).
    pub acknowledged: bool,
    /// How long since the last renewal seen before the revocation, on our clock (since
    /// our first sighting of the drain in this term, when that is later).
    pub since_renewal: Duration,
}

/// The lock Lease's state.
#[derive(Clone, Debug, PartialEq)]
pub enum Current {
    /// Nobody holds it.
    Free,
    /// Granted.
    Held(HolderState),
    /// A revoked hold is being drained.
    Draining(DrainState),
}

/// The lock Lease's token, as judged against what a controller could have minted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tokens {
    /// Trusted: the highest token known from every source.
    Known(i64),
    /// The Lease records a token no controller could have minted (above the ceiling).
    Tampered {
        /// The token found.
        found: i64,
        /// The highest a controller could have minted.
        ceiling: i64,
    },
}

/// Everything the decision depends on.
#[derive(Clone, Debug)]
pub struct Inputs {
    /// The terms the current hold was granted under (for a free lock: the lock's now).
    pub terms: GrantedTiming,
    /// Revoke grants not confirmed within this.
    pub confirm_timeout: Duration,
    /// The Lease's state.
    pub current: Current,
    /// How many live claimants wait (the head is served).
    pub waiting: usize,
    /// The DistributedLock is being deleted.
    pub deleting: bool,
    /// The tokens known.
    pub tokens: Tokens,
    /// Wall clock, ms (a minting source).
    pub wall_clock_ms: i64,
}

/// A hold taken away.
#[derive(Clone, Debug, PartialEq)]
pub struct Revocation {
    /// Why.
    pub reason: RevokeReason,
    /// The revoked hold's token, if it had one.
    pub token: Option<i64>,
}

/// Why nothing can be granted.
#[derive(Clone, Debug, PartialEq)]
pub enum Blocked {
    /// Every token has been issued.
    TokenExhausted,
    /// The Lease records a token above what a controller could have minted.
    TokenTampered {
        /// The token found.
        found: i64,
        /// The highest a controller could have minted.
        ceiling: i64,
    },
}

/// The decision.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Nothing to write; look again after `recheck` if set.
    Keep {
        /// When a deadline (expiry, confirmation, max hold, drain) falls due.
        recheck: Option<Duration>,
    },
    /// Grant the head of the queue with `token`, revoking the current hold in the same
    /// write if there is one (only a hold that cannot believe it holds).
    Grant {
        /// The new token.
        token: i64,
        /// The hold revoked by this grant.
        revoked: Option<Revocation>,
    },
    /// Revoke the current hold in one write, nobody waits: clear the holder and record
    /// `raise_to` so that the revoked token is stale at once.
    Revoke {
        /// The revocation.
        revocation: Revocation,
        /// The token recorded on the Lease.
        raise_to: i64,
    },
    /// Revoke the current hold, keeping its holder named until it acknowledges or the
    /// drain times out: record `raise_to` (the old token is stale at once) and mark the
    /// Lease draining the old token.
    Drain {
        /// The revocation.
        revocation: Revocation,
        /// The token recorded on the Lease.
        raise_to: i64,
        /// When the drain times out if the holder does not acknowledge.
        recheck: Duration,
    },
    /// The drain is over and nobody waits: write the Lease free.
    Free,
    /// The lock is being deleted and nobody can believe they hold it: delete the Lease.
    DeleteLease,
    /// Nothing can be granted or revoked; report why.
    Blocked(Blocked),
}

/// Why the granted hold `h` must end now, if it must; else when to look again.
fn judge(h: &HolderState, i: &Inputs) -> Result<Option<Duration>, RevokeReason> {
    // A holder without a token was not granted by a controller.
    if h.token.is_none() {
        return Err(RevokeReason::Unconfirmed);
    }
    if h.forced {
        return Err(RevokeReason::Forced);
    }
    if i.deleting {
        return Err(RevokeReason::LockDeleted);
    }
    let mut recheck = Vec::new();
    if !h.confirmed {
        let answerable = answerable_for(h, i);
        if !answerable.is_zero() {
            recheck.push(answerable);
        } else if !h.claim_present || h.unchanged_for >= i.confirm_timeout {
            return Err(RevokeReason::Unconfirmed);
        } else {
            recheck.push(i.confirm_timeout - h.unchanged_for);
        }
    }
    if h.pod_gone {
        return Err(RevokeReason::PodGone);
    }
    let lease = i.terms.timing.lease_duration;
    if h.unchanged_for >= lease {
        return Err(RevokeReason::Expired);
    }
    recheck.push(lease - h.unchanged_for);
    if let Some(max) = i.terms.max_hold {
        if h.held_for >= max {
            return Err(RevokeReason::MaxHold);
        }
        recheck.push(max - h.held_for);
    }
    Ok(recheck.into_iter().min())
}

/// How much longer the holder of the unconfirmed grant `h` may have answered it before
/// confirming: until a lease duration after we first saw its claim (its renew deadline
/// counts from sending the claim, before that; the margin is the one expiry allows a
/// holder's clock). Zero once it cannot have.
fn answerable_for(h: &HolderState, i: &Inputs) -> Duration {
    if UNCONFIRMED_AT_ONCE {
        return Duration::ZERO;
    }
    i.terms.timing.lease_duration.saturating_sub(h.claim_seen_for)
}

/// Whether revoking `h` for `reason` must drain: the holder may be alive and believing
/// (it confirmed, or may have answered its grant before confirming, and renewed within its
/// lease duration).
fn must_drain(reason: &RevokeReason, h: &HolderState, i: &Inputs) -> bool {
    let told = h.confirmed || !answerable_for(h, i).is_zero();
    let believing = told && h.unchanged_for < i.terms.timing.lease_duration;
    let drains = matches!(
        reason,
        RevokeReason::Forced | RevokeReason::MaxHold | RevokeReason::PodGone | RevokeReason::LockDeleted
    );
    drains && believing && !REGRANT_AT_ONCE
}

/// Time left in a drain, zero when it is over.
fn drain_left(d: &DrainState, i: &Inputs) -> Duration {
    if d.acknowledged { Duration::ZERO } else { i.terms.timing.lease_duration.saturating_sub(d.since_renewal) }
}

/// Decides what to write for one lock.
pub fn decide(i: &Inputs) -> Decision {
    let previous = match i.tokens {
        Tokens::Known(previous) => previous,
        Tokens::Tampered { found, ceiling } => return Decision::Blocked(Blocked::TokenTampered { found, ceiling }),
    };
    let next = token::mint(previous, i.wall_clock_ms);
    let minted = |decision: fn(i64) -> Decision| next.map_or(Decision::Blocked(Blocked::TokenExhausted), decision);
    match &i.current {
        Current::Free if i.deleting => Decision::DeleteLease,
        Current::Free if i.waiting > 0 => minted(|token| Decision::Grant { token, revoked: None }),
        Current::Free => Decision::Keep { recheck: None },
        Current::Draining(d) => match drain_left(d, i) {
            left if !left.is_zero() => Decision::Keep { recheck: Some(left) },
            _ if i.deleting => Decision::DeleteLease,
            _ if i.waiting > 0 => minted(|token| Decision::Grant { token, revoked: None }),
            _ => Decision::Free,
        },
        Current::Held(h) => match judge(h, i) {
            Ok(recheck) => Decision::Keep { recheck },
            Err(reason) => {
                let revocation = Revocation { reason, token: h.token };
                let Some(raise_to) = next else { return Decision::Blocked(Blocked::TokenExhausted) };
                if must_drain(&revocation.reason, h, i) {
                    let recheck = i.terms.timing.lease_duration.saturating_sub(h.unchanged_for);
                    Decision::Drain { revocation, raise_to, recheck }
                } else if i.deleting {
                    // Nobody can believe they hold it: nothing to keep the Lease for.
                    Decision::DeleteLease
                } else if i.waiting > 0 {
                    Decision::Grant { token: raise_to, revoked: Some(revocation) }
                } else {
                    Decision::Revoke { revocation, raise_to }
                }
            }
        },
    }
}

#[cfg(test)]
mod tests;
