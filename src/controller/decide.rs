//! The arbiter's decision for one lock, as a pure function of what was observed.
//!
//! Revocation and the next grant happen in one compare-and-swap when someone waits: the
//! failed holder's token is made stale by the new grant's higher token, and the lock is
//! never free for longer than one write.

use std::time::Duration;

use crate::lease::{Timing, token};
use crate::metrics::RevokeReason;

/// What the controller knows about the current hold.
#[derive(Clone, Debug, PartialEq)]
pub struct HolderState {
    /// The token on the Lease (`None`: not a grant of ours, revoke it).
    pub token: Option<i64>,
    /// The holder renewed at least once since the grant.
    pub confirmed: bool,
    /// How long the holder's renewal record has been unchanged on our clock.
    pub unchanged_for: Duration,
    /// Wall-clock age of the hold, from the Lease's acquireTime.
    pub held_for: Duration,
    /// The holder's Pod is gone (deleted, or re-created with a new UID).
    pub pod_gone: bool,
    /// The holder's claim still exists (an unconfirmed grant whose claim is gone was
    /// withdrawn).
    pub claim_present: bool,
}

/// Everything the decision depends on.
#[derive(Clone, Debug)]
pub struct Inputs {
    /// The lock's timing.
    pub timing: Timing,
    /// Revoke holds older than this.
    pub max_hold: Option<Duration>,
    /// Revoke grants not confirmed within this.
    pub confirm_timeout: Duration,
    /// The current hold, if any.
    pub holder: Option<HolderState>,
    /// How many live claimants wait (the head is served).
    pub waiting: usize,
    /// An operator asked for a forced release.
    pub force: bool,
    /// The highest token known from every source.
    pub previous_token: i64,
    /// Wall clock, ms.
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

/// The decision.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Nothing to write; look again after `recheck` if set.
    Keep {
        /// When a deadline (expiry, confirmation, max hold) falls due.
        recheck: Option<Duration>,
    },
    /// Grant the head of the queue with `token`, revoking the current hold in the same
    /// write if there is one.
    Grant {
        /// The new token.
        token: i64,
        /// The hold revoked by this grant.
        revoked: Option<Revocation>,
    },
    /// Revoke the current hold, nobody waits: clear the holder and record `raise_to` as
    /// the lock's token so the revoked one is stale at once.
    Revoke {
        /// The revocation.
        revocation: Revocation,
        /// The token recorded on the Lease after revocation.
        raise_to: i64,
    },
}

/// Why the current hold must end now, if it must; else when to look again.
fn judge(h: &HolderState, i: &Inputs) -> Result<Option<Duration>, RevokeReason> {
    if i.force {
        return Err(RevokeReason::Forced);
    }
    // A holder without a token was not granted by a controller.
    if h.token.is_none() {
        return Err(RevokeReason::Unconfirmed);
    }
    if h.pod_gone {
        return Err(RevokeReason::PodGone);
    }
    let mut recheck = Vec::new();
    if !h.confirmed {
        if !h.claim_present || h.unchanged_for >= i.confirm_timeout {
            return Err(RevokeReason::Unconfirmed);
        }
        recheck.push(i.confirm_timeout - h.unchanged_for);
    }
    if h.unchanged_for >= i.timing.lease_duration {
        return Err(RevokeReason::Expired);
    }
    recheck.push(i.timing.lease_duration - h.unchanged_for);
    if let Some(max) = i.max_hold {
        if h.held_for >= max {
            return Err(RevokeReason::MaxHold);
        }
        recheck.push(max - h.held_for);
    }
    Ok(recheck.into_iter().min())
}

/// Decides what to write for one lock.
pub fn decide(i: &Inputs) -> Decision {
    let next_token = token::mint(i.previous_token, i.wall_clock_ms);
    match &i.holder {
        None if i.waiting > 0 => Decision::Grant { token: next_token, revoked: None },
        None => Decision::Keep { recheck: None },
        Some(h) => match judge(h, i) {
            Ok(recheck) => Decision::Keep { recheck },
            Err(reason) => {
                let revocation = Revocation { reason, token: h.token };
                if i.waiting > 0 {
                    Decision::Grant { token: next_token, revoked: Some(revocation) }
                } else {
                    Decision::Revoke { revocation, raise_to: next_token }
                }
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn inputs(holder: Option<HolderState>, waiting: usize) -> Inputs {
        Inputs {
            timing: Timing { lease_duration: 15 * S, renew_deadline: 10 * S, retry_period: 2 * S },
            max_hold: Some(60 * S),
            confirm_timeout: S,
            holder,
            waiting,
            force: false,
            previous_token: 100,
            wall_clock_ms: 50,
        }
    }

    fn held(unchanged_s: u32) -> HolderState {
        HolderState {
            token: Some(100),
            confirmed: true,
            unchanged_for: unchanged_s * S,
            held_for: 30 * S,
            pod_gone: false,
            claim_present: true,
        }
    }

    fn revoke(reason: RevokeReason) -> Decision {
        Decision::Revoke { revocation: Revocation { reason, token: Some(100) }, raise_to: 101 }
    }

    #[test]
    fn decision_table() {
        let grant_next =
            |reason| Decision::Grant { token: 101, revoked: Some(Revocation { reason, token: Some(100) }) };
        let cases: Vec<(&str, Inputs, Decision)> = vec![
            ("free, nobody waits", inputs(None, 0), Decision::Keep { recheck: None }),
            ("free, someone waits", inputs(None, 2), Decision::Grant { token: 101, revoked: None }),
            ("held, renewing", inputs(Some(held(3)), 1), Decision::Keep { recheck: Some(12 * S) }),
            ("held, one tick before expiry", inputs(Some(held(14)), 1), Decision::Keep { recheck: Some(S) }),
            ("expired, waiter", inputs(Some(held(15)), 1), grant_next(RevokeReason::Expired)),
            ("expired, no waiter", inputs(Some(held(15)), 0), revoke(RevokeReason::Expired)),
            ("pod gone", inputs(Some(HolderState { pod_gone: true, ..held(0) }), 0), revoke(RevokeReason::PodGone)),
            (
                "unconfirmed in time",
                inputs(Some(HolderState { confirmed: false, unchanged_for: S / 4, ..held(0) }), 0),
                Decision::Keep { recheck: Some(S * 3 / 4) },
            ),
            (
                "unconfirmed too long",
                inputs(Some(HolderState { confirmed: false, ..held(1) }), 1),
                grant_next(RevokeReason::Unconfirmed),
            ),
            (
                "unconfirmed, claim withdrawn",
                inputs(Some(HolderState { confirmed: false, claim_present: false, ..held(0) }), 0),
                revoke(RevokeReason::Unconfirmed),
            ),
            (
                "confirmed holder without claim keeps holding",
                inputs(Some(HolderState { claim_present: false, ..held(0) }), 0),
                Decision::Keep { recheck: Some(15 * S) },
            ),
            ("max hold", inputs(Some(HolderState { held_for: 60 * S, ..held(0) }), 0), revoke(RevokeReason::MaxHold)),
            ("forced", Inputs { force: true, ..inputs(Some(held(0)), 0) }, revoke(RevokeReason::Forced)),
        ];
        for (name, input, expected) in cases {
            assert_eq!(decide(&input), expected, "{name}");
        }
    }

    #[test]
    fn tokens_rise_with_a_backwards_clock() {
        let mut i = inputs(None, 1);
        i.previous_token = 1_700_000_000_000;
        i.wall_clock_ms = 1_000;
        assert_eq!(decide(&i), Decision::Grant { token: 1_700_000_000_001, revoked: None });
    }

    #[test]
    fn a_hold_without_token_is_revoked() {
        let i = inputs(Some(HolderState { token: None, ..held(0) }), 0);
        assert!(matches!(
            decide(&i),
            Decision::Revoke { revocation: Revocation { reason: RevokeReason::Unconfirmed, token: None }, .. }
        ));
    }
}
