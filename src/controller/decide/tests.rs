//! Table tests of [`super::decide`].

use super::*;
use crate::lease::Timing;

const S: Duration = Duration::from_secs(1);

fn inputs(current: Current, waiting: usize) -> Inputs {
    Inputs {
        terms: GrantedTiming {
            timing: Timing { lease_duration: 15 * S, renew_deadline: 10 * S, retry_period: 2 * S },
            max_hold: Some(60 * S),
        },
        confirm_timeout: S,
        current,
        waiting,
        deleting: false,
        tokens: Tokens::Known(100),
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
        // A claim that waited longer than a lease duration: its grant was confirmed before
        // it was answered.
        claim_seen_for: 60 * S,
        forced: false,
    }
}

/// An unconfirmed grant whose claim we first saw `claim_s` ago, granted `unchanged_s` ago.
fn fresh(claim_s: u32, unchanged_s: u32) -> HolderState {
    HolderState { confirmed: false, claim_seen_for: claim_s * S, ..held(unchanged_s) }
}

fn holding(h: HolderState, waiting: usize) -> Inputs {
    inputs(Current::Held(h), waiting)
}

fn draining(acknowledged: bool, since_renewal_s: u32, waiting: usize) -> Inputs {
    inputs(Current::Draining(DrainState { acknowledged, since_renewal: since_renewal_s * S }), waiting)
}

fn deleting(mut i: Inputs) -> Inputs {
    i.deleting = true;
    i
}

fn revocation(reason: RevokeReason) -> Revocation {
    Revocation { reason, token: Some(100) }
}

fn revoke(reason: RevokeReason) -> Decision {
    Decision::Revoke { revocation: revocation(reason), raise_to: 101 }
}

fn grant_next(reason: RevokeReason) -> Decision {
    Decision::Grant { token: 101, revoked: Some(revocation(reason)) }
}

fn drain(reason: RevokeReason, recheck_s: u32) -> Decision {
    Decision::Drain { revocation: revocation(reason), raise_to: 101, recheck: recheck_s * S }
}

#[test]
fn decision_table() {
    let cases: Vec<(&str, Inputs, Decision)> = vec![
        ("free, nobody waits", inputs(Current::Free, 0), Decision::Keep { recheck: None }),
        ("free, someone waits", inputs(Current::Free, 2), Decision::Grant { token: 101, revoked: None }),
        ("held, renewing", holding(held(3), 1), Decision::Keep { recheck: Some(12 * S) }),
        ("held, one tick before expiry", holding(held(14), 1), Decision::Keep { recheck: Some(S) }),
        // One write: the holder cannot believe it holds.
        ("expired, waiter", holding(held(15), 1), grant_next(RevokeReason::Expired)),
        ("expired, no waiter", holding(held(15), 0), revoke(RevokeReason::Expired)),
        // A grant on a claim sent less than a lease duration ago may have been answered
        // before it was confirmed: a hold renewed when we first saw the claim.
        (
            "unconfirmed past the confirm timeout, its claim seen 5 s ago: kept until a lease duration after it",
            holding(fresh(5, 2), 1),
            Decision::Keep { recheck: Some(10 * S) },
        ),
        (
            "unconfirmed, its claim withdrawn, seen 5 s ago: kept (its claimant clears the grant itself)",
            holding(HolderState { claim_present: false, ..fresh(5, 2) }, 1),
            Decision::Keep { recheck: Some(10 * S) },
        ),
        (
            "unconfirmed, its claim seen a lease duration ago: cannot have been answered, one write",
            holding(fresh(15, 2), 1),
            grant_next(RevokeReason::Unconfirmed),
        ),
        (
            "unconfirmed, young claim, forced: drained like a confirmed hold",
            holding(HolderState { forced: true, ..fresh(5, 2) }, 1),
            drain(RevokeReason::Forced, 13),
        ),
        (
            "unconfirmed, young claim, Pod gone: drained",
            holding(HolderState { pod_gone: true, ..fresh(5, 2) }, 1),
            drain(RevokeReason::PodGone, 13),
        ),
        (
            "unconfirmed, a later claim in its name seen 5 s ago, nothing seen for a lease duration: expired, one write",
            holding(fresh(5, 15), 1),
            grant_next(RevokeReason::Expired),
        ),
        (
            "unconfirmed in time",
            holding(HolderState { confirmed: false, unchanged_for: S / 4, ..held(0) }, 0),
            Decision::Keep { recheck: Some(S * 3 / 4) },
        ),
        (
            "unconfirmed too long",
            holding(HolderState { confirmed: false, ..held(1) }, 1),
            grant_next(RevokeReason::Unconfirmed),
        ),
        (
            "unconfirmed, claim withdrawn",
            holding(HolderState { confirmed: false, claim_present: false, ..held(0) }, 0),
            revoke(RevokeReason::Unconfirmed),
        ),
        (
            "confirmed holder without claim keeps holding",
            holding(HolderState { claim_present: false, ..held(0) }, 0),
            Decision::Keep { recheck: Some(15 * S) },
        ),
        // Drained: the holder may be alive and believing; the drain lasts until its
        // lease duration since the last renewal seen.
        ("pod gone", holding(HolderState { pod_gone: true, ..held(4) }, 1), drain(RevokeReason::PodGone, 11)),
        ("max hold", holding(HolderState { held_for: 60 * S, ..held(0) }, 1), drain(RevokeReason::MaxHold, 15)),
        ("forced", holding(HolderState { forced: true, ..held(2) }, 0), drain(RevokeReason::Forced, 13)),
        ("lock deleted", deleting(holding(held(5), 3)), drain(RevokeReason::LockDeleted, 10)),
        // ... unless it cannot believe: then one write, like an expiry.
        ("forced, but expired", holding(HolderState { forced: true, ..held(15) }, 1), grant_next(RevokeReason::Forced)),
        (
            "forced, never confirmed",
            holding(HolderState { forced: true, confirmed: false, ..held(0) }, 0),
            revoke(RevokeReason::Forced),
        ),
        ("pod gone, expired", holding(HolderState { pod_gone: true, ..held(20) }, 0), revoke(RevokeReason::PodGone)),
        ("lock deleted, expired", deleting(holding(held(15), 1)), Decision::DeleteLease),
        // The drain ends at the acknowledgement or the timeout; then the next grant.
        ("draining, in time", draining(false, 5, 1), Decision::Keep { recheck: Some(10 * S) }),
        ("draining, timed out, waiter", draining(false, 15, 1), Decision::Grant { token: 101, revoked: None }),
        ("draining, acknowledged, waiter", draining(true, 0, 2), Decision::Grant { token: 101, revoked: None }),
        ("draining, acknowledged, nobody waits", draining(true, 0, 0), Decision::Free),
        ("draining, timed out, nobody waits", draining(false, 16, 0), Decision::Free),
        ("lock deleted while draining", deleting(draining(false, 3, 1)), Decision::Keep { recheck: Some(12 * S) }),
        ("lock deleted, drained", deleting(draining(true, 3, 1)), Decision::DeleteLease),
        ("lock deleted, free: waiters are not served", deleting(inputs(Current::Free, 2)), Decision::DeleteLease),
    ];
    for (name, input, expected) in cases {
        let expected = if REGRANT_AT_ONCE { at_once(expected, &input) } else { expected };
        assert_eq!(decide(&input), expected, "{name}");
    }
}

/// What the broken build decides instead: never a drain.
fn at_once(expected: Decision, input: &Inputs) -> Decision {
    match expected {
        Decision::Drain { .. } if input.deleting => Decision::DeleteLease,
        Decision::Drain { revocation, raise_to, .. } if input.waiting > 0 => {
            Decision::Grant { token: raise_to, revoked: Some(revocation) }
        }
        Decision::Drain { revocation, raise_to, .. } => Decision::Revoke { revocation, raise_to },
        other => other,
    }
}

#[test]
fn max_hold_and_expiry_use_the_granted_terms() {
    // Granted under lease 15 s and max hold 60 s: an edit of the lock to shorter values
    // does not reach this hold (the caller passes the granted terms).
    let i = holding(HolderState { held_for: 59 * S, ..held(14) }, 1);
    assert_eq!(decide(&i), Decision::Keep { recheck: Some(S) });
    let mut unbounded = holding(HolderState { held_for: 3600 * S, ..held(0) }, 1);
    unbounded.terms.max_hold = None;
    assert_eq!(decide(&unbounded), Decision::Keep { recheck: Some(15 * S) });
}

#[test]
fn tokens_rise_with_a_backwards_clock() {
    let mut i = inputs(Current::Free, 1);
    i.tokens = Tokens::Known(1_700_000_000_000);
    i.wall_clock_ms = 1_000;
    assert_eq!(decide(&i), Decision::Grant { token: 1_700_000_000_001, revoked: None });
}

#[test]
fn no_token_left_blocks_every_write_that_needs_one() {
    let exhausted = |mut i: Inputs| {
        i.tokens = Tokens::Known(i64::MAX);
        decide(&i)
    };
    let blocked = Decision::Blocked(Blocked::TokenExhausted);
    assert_eq!(exhausted(inputs(Current::Free, 1)), blocked, "no grant");
    assert_eq!(exhausted(holding(held(15), 0)), blocked, "no revocation without a higher token");
    assert_eq!(exhausted(draining(true, 0, 1)), blocked, "no grant after a drain");
    // What needs no token still happens.
    assert_eq!(exhausted(draining(true, 0, 0)), Decision::Free);
    assert_eq!(exhausted(holding(held(1), 1)), Decision::Keep { recheck: Some(14 * S) });
}

#[test]
fn a_tampered_token_blocks_everything() {
    for current in
        [Current::Free, Current::Held(held(20)), Current::Draining(DrainState { acknowledged: true, since_renewal: S })]
    {
        let mut i = inputs(current, 1);
        i.tokens = Tokens::Tampered { found: i64::MAX, ceiling: 1_000 };
        assert_eq!(decide(&i), Decision::Blocked(Blocked::TokenTampered { found: i64::MAX, ceiling: 1_000 }));
    }
}

#[test]
fn a_hold_without_token_is_revoked_in_one_write() {
    let i = holding(HolderState { token: None, ..held(0) }, 0);
    assert_eq!(
        decide(&i),
        Decision::Revoke { revocation: Revocation { reason: RevokeReason::Unconfirmed, token: None }, raise_to: 101 }
    );
}
