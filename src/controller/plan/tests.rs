//! Table tests of [`super::plan`]: one observation in, every write and fact out.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;

use super::*;
use crate::claim::edit;
use crate::controller::build;
use crate::controller::decide::Tokens;
use crate::crd::ClaimMode;
use crate::crd::{
    ANNOTATION_FORCE_RELEASE, ANNOTATION_FORCE_RELEASE_BY, ANNOTATION_FORCE_RELEASE_TARGET, DistributedLockSpec,
};
use crate::lease::Timing;

const S: Duration = Duration::from_secs(1);
const TOKEN: i64 = 1_000;

fn now() -> Timestamp {
    Timestamp::from_second(1_000).expect("valid")
}

fn lock() -> DistributedLock {
    let mut lock = DistributedLock::new("orders", DistributedLockSpec::default());
    lock.metadata.namespace = Some("shop".into());
    lock.metadata.uid = Some("uid-1".into());
    lock
}

fn lease_duration() -> Duration {
    Timing::of(&lock().spec).lease_duration
}

fn claim(who: &str, created_s: i64) -> Claim {
    crate::controller::view::test_claim(who, created_s)
}

fn waiting(who: &str, created_s: i64, serveable: Option<bool>) -> Waiting {
    Waiting { claim: claim(who, created_s), unchanged_for: S, seen_for: 60 * S, serveable }
}

fn free() -> Lease {
    build::new_lock_lease(&lock(), 0, TOKEN)
}

/// Held by `who` with `TOKEN`, confirmed.
fn held(who: &str) -> Lease {
    let terms = GrantedTiming::of_spec(&lock().spec);
    let granted =
        build::granted(&free(), &claim(who, 1), TOKEN, &terms, Timestamp::from_second(900).expect("valid"), None);
    edit::renewed(&granted, Timestamp::from_second(990).expect("valid"))
}

fn draining(who: &str, acknowledged: bool) -> Lease {
    let mut lease = build::draining(&held(who), TOKEN + 1, "PodGone", Some(TOKEN));
    if acknowledged {
        lease.spec.as_mut().expect("a spec").holder_identity = None;
    }
    lease
}

fn clock(unchanged_s: u64) -> HoldClock {
    HoldClock { unchanged_for: Duration::from_secs(unchanged_s), held_for: 10 * S, pod_gone: false }
}

fn observation<'a>(lock: &'a DistributedLock, lease: &'a Lease, claims: Vec<Waiting>) -> Observation<'a> {
    let state = view::lease_state(lease);
    Observation {
        lock,
        slots: vec![SlotView {
            slot: 0,
            lease,
            hold: matches!(state, LeaseState::Held(_)).then(|| clock(1)),
            drain_since_renewal: matches!(state, LeaseState::Draining(_)).then_some(S),
        }],
        claims,
        spent: Vec::new(),
        given_back: Vec::new(),
        refused: Vec::new(),
        requests: Vec::new(),
        executed: None,
        required: 0,
        known: TOKEN,
        tokens: Tokens::Known(TOKEN + usize::from(matches!(state, LeaseState::Draining(_))) as i64),
        confirm_timeout: 2 * S,
        wall: now(),
    }
}

/// The write of slot 0's Lease (`Keep` when none).
fn write_of(plan: &Plan) -> LeaseWrite {
    plan.leases.iter().find(|w| w.slot == 0).map_or(LeaseWrite::Keep, |w| w.write.clone())
}

fn holder_of(plan: &Plan) -> Option<String> {
    match &write_of(plan) {
        LeaseWrite::Replace(lease) => edit::holder(lease).map(str::to_owned),
        _ => None,
    }
}

/// What slot 0's write leaves of a kept hold: its holder and token, and the waiter it
/// names as next.
fn kept_naming_next(plan: &Plan) -> (String, i64, Option<String>) {
    let LeaseWrite::Replace(written) = write_of(plan) else { panic!("a write recording the next waiter") };
    let holder = edit::holder(&written).expect("still held").to_owned();
    let token = crate::lease::token::of_lease(&written).expect("a token");
    (holder, token, crate::lease::next::of_lease(&written).map(|n| n.holder))
}

fn names(claims: &[Claim]) -> Vec<&str> {
    claims.iter().map(|c| c.name.as_str()).collect()
}

fn status(plan: &Plan) -> &StatusPlan {
    plan.status.as_ref().expect("a status")
}

#[test]
fn a_free_lock_is_granted_to_the_head_of_the_queue_with_a_new_token() {
    let lock = lock();
    let lease = free();
    let o = observation(&lock, &lease, vec![waiting("a", 1, Some(true)), waiting("b", 2, None), waiting("c", 3, None)]);
    let plan = super::plan(&o);
    assert_eq!(holder_of(&plan).as_deref(), Some("u-a"));
    assert_eq!(plan.grants.len(), 1);
    let grant = &plan.grants[0];
    assert_eq!(grant.claim.name, "orders.u-a");
    assert!(grant.token > TOKEN, "a new token: {}", grant.token);
    assert_eq!(plan.minted(), Some(grant.token));
    assert!(plan.revocations.is_empty() && plan.drained.is_empty() && plan.stale.is_empty());
    let status = status(&plan);
    assert_eq!(status.holds.first().and_then(|h| h.hold.token), Some(grant.token));
    assert_eq!(status.token, grant.token);
    assert_eq!(names(&status.waiters), ["orders.u-b", "orders.u-c"], "the rest wait, in order");
    assert_eq!(status.outcome.granted.first().map(|g| g.waited_seconds), Some(999.0));
    // The grant recorded is the hold the Lease now carries: status counts its end by it.
    let hold = &status.holds[0].hold;
    let recorded = status.outcome.granted.first().map(|g| (g.identity.as_str(), g.token, Some(g.acquired)));
    assert_eq!(recorded, Some((hold.identity.id.as_str(), grant.token, hold.acquire_time)));
    assert!(plan.track_holder);
    assert_eq!(plan.recheck, Some(o.confirm_timeout), "the grant must be confirmed in time");
}

#[test]
fn waiters_that_may_not_be_served_are_dropped_and_the_next_one_is_granted() {
    let lock = lock();
    let lease = free();
    let o = observation(&lock, &lease, vec![waiting("gone", 1, Some(false)), waiting("b", 2, Some(true))]);
    let plan = super::plan(&o);
    assert_eq!(holder_of(&plan).as_deref(), Some("u-b"));
    assert_eq!(names(&plan.stale), ["orders.u-gone"]);
}

#[test]
fn a_claim_already_served_is_never_granted_again() {
    // A hold was granted on claim a (seen held, or written by us), and the claim is still
    // there (or still cached) with no sign of being given back. It is dropped.
    let lock = lock();
    let lease = free();
    let mut o = observation(&lock, &lease, vec![waiting("a", 1, None), waiting("b", 2, Some(true))]);
    o.spent = vec!["uid-a".into()];
    let plan = super::plan(&o);
    assert_eq!(holder_of(&plan).as_deref(), Some("u-b"), "the next claimant, not the one that just released");
    assert_eq!(names(&plan.stale), ["orders.u-a"]);

    // Alone in the queue, it is not granted either.
    let mut o = observation(&lock, &lease, vec![waiting("a", 1, None)]);
    o.spent = vec!["uid-a".into()];
    let plan = super::plan(&o);
    assert_eq!(write_of(&plan), LeaseWrite::Keep);
    assert!(plan.grants.is_empty());
    assert!(status(&plan).waiters.is_empty());
    assert_eq!(names(&plan.stale), ["orders.u-a"]);
}

#[test]
fn a_claim_given_back_moments_ago_is_left_to_its_claimant_then_dropped() {
    // The holder released: the Lease is free and still names its claim, which its claimant
    // deletes at the same time. Not granted, not shown waiting, and not deleted by us for
    // the grace; rechecked when the grace ends.
    let lock = lock();
    let lease = free();
    let mut o = observation(&lock, &lease, vec![waiting("a", 1, None), waiting("b", 2, Some(true))]);
    o.spent = vec!["uid-a".into()];
    o.given_back = vec![("uid-a".into(), Duration::from_millis(300))];
    let plan = super::plan(&o);
    assert_eq!(holder_of(&plan).as_deref(), Some("u-b"), "the next claimant, not the one that just released");
    assert!(plan.stale.is_empty(), "left to its claimant: {:?}", plan.stale);
    assert!(status(&plan).waiters.is_empty(), "{:?}", status(&plan).waiters);
    assert!(plan.recheck.is_some_and(|r| r <= GIVEN_BACK_GRACE - Duration::from_millis(300)), "{:?}", plan.recheck);

    // Still there once the grace is over (its claimant died between its two writes): dropped.
    let mut o = observation(&lock, &lease, vec![waiting("a", 1, None)]);
    o.spent = vec!["uid-a".into()];
    o.given_back = vec![("uid-a".into(), GIVEN_BACK_GRACE)];
    let plan = super::plan(&o);
    assert!(plan.grants.is_empty());
    assert_eq!(names(&plan.stale), ["orders.u-a"]);

    // The grace is for a given-back claim only: one merely waiting is neither held off
    // nor dropped by it.
    let mut o = observation(&lock, &lease, vec![waiting("a", 1, Some(true))]);
    o.given_back = vec![("uid-other".into(), Duration::ZERO)];
    let plan = super::plan(&o);
    assert_eq!(holder_of(&plan).as_deref(), Some("u-a"));
}

#[test]
fn aged_out_claims_are_stale_and_the_earliest_deadline_is_rechecked() {
    let lock = lock();
    let lease = held("h");
    let mut old = waiting("old", 1, None);
    old.unchanged_for = 30 * S;
    let mut young = waiting("young", 2, None);
    young.unchanged_for = 25 * S;
    let o = observation(&lock, &lease, vec![old, young]);
    let plan = super::plan(&o);
    assert_eq!(write_of(&plan), LeaseWrite::Keep);
    assert_eq!(names(&plan.stale), ["orders.u-old"]);
    assert_eq!(names(&status(&plan).waiters), ["orders.u-young"]);
    assert_eq!(plan.recheck, Some(5 * S), "the young claim goes stale first");
}

#[test]
fn a_stale_claim_whose_delete_was_refused_is_not_deleted_again_while_the_cache_shows_it_unchanged() {
    // (case, claim a served, aged out, not serveable, its delete refused at the version
    // cached, dropped, granted)
    let table = [
        ("served: dropped", true, false, false, false, true, "u-b"),
        ("served, refused: left for the cache", true, false, false, true, false, "u-b"),
        ("aged out, refused: left for the cache", false, true, false, true, false, "u-b"),
        ("not serveable, refused: left for the cache", false, false, true, true, false, "u-b"),
        ("waiting, its delete once refused: served as ever", false, false, false, true, false, "u-a"),
    ];
    let lock = lock();
    let lease = free();
    for (case, served, aged, unserveable, refused, dropped, granted) in table {
        let mut a = waiting("a", 1, Some(!unserveable));
        if aged {
            a.unchanged_for = 30 * S;
        }
        let mut o = observation(&lock, &lease, vec![a, waiting("b", 2, Some(true))]);
        if served {
            o.spent = vec!["uid-a".into()];
        }
        if refused {
            o.refused = vec!["uid-a".into()];
        }
        let plan = super::plan(&o);
        let expected: &[&str] = if dropped { &["orders.u-a"] } else { &[] };
        assert_eq!(names(&plan.stale), expected, "{case}");
        assert_eq!(holder_of(&plan).as_deref(), Some(granted), "{case}");
    }
}

#[test]
fn a_renewing_holder_keeps_the_lock_and_its_own_claim_is_not_a_waiter() {
    let lock = lock();
    let lease = held("h");
    let o = observation(&lock, &lease, vec![waiting("h", 1, None), waiting("b", 2, Some(true))]);
    let plan = super::plan(&o);
    assert_eq!(kept_naming_next(&plan), ("u-h".to_owned(), TOKEN, Some("u-b".to_owned())));
    assert!(plan.grants.is_empty() && plan.revocations.is_empty() && plan.stale.is_empty());
    assert_eq!(names(&status(&plan).waiters), ["orders.u-b"]);
    assert_eq!(status(&plan).holds.first().map(|h| h.hold.identity.id.as_str()), Some("u-h"));
    assert_eq!(plan.recheck, Some(lease_duration() - S), "looked at again when it would expire");
}

#[test]
fn an_expired_hold_is_revoked_and_the_next_waiter_granted_in_one_write() {
    let lock = lock();
    let lease = held("h");
    let mut o = observation(&lock, &lease, vec![waiting("h", 1, None), waiting("b", 2, Some(true))]);
    o.slots[0].hold = Some(clock(lease_duration().as_secs()));
    let plan = super::plan(&o);
    assert_eq!(holder_of(&plan).as_deref(), Some("u-b"));
    let [revoked] = plan.revocations.as_slice() else { panic!("one revocation: {:?}", plan.revocations) };
    assert_eq!((revoked.reason, revoked.token, revoked.drain_from), (RevokeReason::Expired, Some(TOKEN), None));
    assert_eq!(revoked.claim.as_ref().map(|c| c.name.as_str()), Some("orders.u-h"), "its claim goes with it");
    assert_eq!(revoked.raised_to, plan.grants[0].token);
    assert_eq!(status(&plan).outcome.revoked, [(0, RevokeReason::Expired)]);
    assert_eq!(plan.grants[0].handoff_ms, Some(0));
}

#[test]
fn an_expired_holders_new_acquisition_keeps_its_claim_and_its_place() {
    // The holder lost its hold (it stopped renewing) and acquires again: its new claim
    // has its name, but is another object, made after b's.
    let lock = lock();
    let lease = held("h");
    let mut again = waiting("h", 3, Some(true));
    again.claim.uid = "uid-h-again".into();
    let mut o = observation(&lock, &lease, vec![waiting("b", 2, Some(true)), again]);
    o.slots[0].hold = Some(clock(lease_duration().as_secs()));
    let plan = super::plan(&o);
    assert_eq!(holder_of(&plan).as_deref(), Some("u-b"));
    let [revoked] = plan.revocations.as_slice() else { panic!("one revocation: {:?}", plan.revocations) };
    assert_eq!(revoked.reason, RevokeReason::Expired);
    assert_eq!(revoked.claim, None, "the new acquisition's claim is not the revoked hold's");
    assert!(plan.stale.is_empty(), "{:?}", plan.stale);

    // Once b holds, h's new claim waits: it is granted when b lets go.
    let lease = held("b");
    let mut again = waiting("h", 3, Some(true));
    again.claim.uid = "uid-h-again".into();
    let o = observation(&lock, &lease, vec![waiting("b", 2, None), again.clone()]);
    let plan = super::plan(&o);
    assert_eq!(names(&status(&plan).waiters), ["orders.u-h"]);
    let lease = free();
    let o = observation(&lock, &lease, vec![again]);
    assert_eq!(holder_of(&super::plan(&o)).as_deref(), Some("u-h"));
}

#[test]
fn a_believing_holder_whose_pod_is_gone_is_drained_and_nobody_is_granted() {
    let lock = lock();
    let lease = held("h");
    let mut o = observation(&lock, &lease, vec![waiting("h", 1, None), waiting("b", 2, Some(true))]);
    o.slots[0].hold = Some(HoldClock { pod_gone: true, ..clock(3) });
    let plan = super::plan(&o);
    assert!(plan.grants.is_empty());
    let [revoked] = plan.revocations.as_slice() else { panic!("one revocation") };
    assert_eq!((revoked.reason, revoked.drain_from), (RevokeReason::PodGone, Some(3 * S)));
    let LeaseWrite::Replace(written) = &write_of(&plan) else { panic!("a Lease write") };
    let LeaseState::Draining(drain) = view::lease_state(written) else { panic!("draining") };
    assert_eq!((drain.revoked, drain.holder.map(|h| h.id)), (Some(TOKEN), Some("u-h".to_owned())));
    assert_eq!(status(&plan).draining.first().and_then(|(_, d)| d.revoked), Some(TOKEN));
    assert!(status(&plan).holds.is_empty());
    assert_eq!(status(&plan).token, revoked.raised_to, "the old token is stale at once");
    assert_eq!(plan.recheck, Some(lease_duration() - 3 * S), "the drain's end");
}

#[test]
fn a_drain_holds_the_queue_until_acknowledged_or_timed_out() {
    let lock = lock();
    let waiters = || vec![waiting("b", 2, Some(true))];
    // Not acknowledged, within the lease duration: nothing moves.
    let unacknowledged = draining("h", false);
    let o = observation(&lock, &unacknowledged, waiters());
    let plan = super::plan(&o);
    assert_eq!(write_of(&plan), LeaseWrite::Keep);
    assert!(plan.grants.is_empty() && plan.drained.is_empty());
    assert_eq!(plan.recheck, Some(lease_duration() - S));

    // Acknowledged: granted, the drain over.
    let acknowledged = draining("h", true);
    let plan = super::plan(&observation(&lock, &acknowledged, waiters()));
    assert_eq!(holder_of(&plan).as_deref(), Some("u-b"));
    assert_eq!(plan.drained, [Drained { slot: 0, token: Some(TOKEN), acknowledged: true }]);
    assert_eq!(plan.grants[0].handoff_ms, None, "no handoff time after a drain");

    // Timed out with nobody waiting: freed.
    let mut o = observation(&lock, &unacknowledged, Vec::new());
    o.slots[0].drain_since_renewal = Some(lease_duration());
    let plan = super::plan(&o);
    let LeaseWrite::Replace(written) = &write_of(&plan) else { panic!("a Lease write") };
    assert_eq!(view::lease_state(written), LeaseState::Free);
    assert_eq!(plan.drained, [Drained { slot: 0, token: Some(TOKEN), acknowledged: false }]);
}

#[test]
fn a_lock_being_deleted_deletes_its_free_lease() {
    let mut lock = lock();
    lock.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let lease = free();
    let plan = super::plan(&observation(&lock, &lease, vec![waiting("b", 2, None)]));
    assert_eq!(write_of(&plan), LeaseWrite::Delete);
    assert!(plan.finish, "the lock goes once its only Lease is deleted");
    assert!(plan.grants.is_empty() && plan.status.is_none());
}

#[test]
fn a_tampered_token_grants_nothing_and_says_why_once() {
    let lock = lock();
    let lease = free();
    let mut o = observation(&lock, &lease, vec![waiting("b", 2, Some(true))]);
    o.tokens = Tokens::Tampered { found: i64::MAX, ceiling: 5 };
    let plan = super::plan(&o);
    assert_eq!(write_of(&plan), LeaseWrite::Keep);
    assert!(plan.grants.is_empty());
    assert!(matches!(status(&plan).ready, Ready::TokenTampered(_)));
    assert_eq!(plan.announce.as_ref().map(|a| a.0), Some("TokenTampered"));
    assert_eq!(plan.recheck, Some(NOT_READY_RECHECK));
    assert_eq!(status(&plan).token, TOKEN, "status keeps the trusted token");
}

fn with_annotations(mut lock: DistributedLock, pairs: &[(&str, &str)]) -> DistributedLock {
    let annotations: BTreeMap<String, String> = pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    lock.metadata.annotations = Some(annotations);
    lock
}

#[test]
fn a_force_release_annotation_is_stamped_refused_or_carried_out() {
    let asked = [(ANNOTATION_FORCE_RELEASE, "stuck"), (ANNOTATION_FORCE_RELEASE_BY, "alice")];
    let lease = held("h");
    // Unstamped: its target is the current hold, stamped first.
    let unstamped = with_annotations(lock(), &asked);
    let plan = super::plan(&observation(&unstamped, &lease, Vec::new()));
    assert_eq!(plan.first, Some(First::Stamp(TOKEN.to_string())));
    assert_eq!(write_of(&plan), LeaseWrite::Keep);

    // The policy needs approvals: refused, nothing revoked.
    let mut o = observation(&unstamped, &lease, Vec::new());
    o.required = 1;
    let plan = super::plan(&o);
    assert!(matches!(&plan.first, Some(First::Refuse(r)) if r.request.by == "alice" && r.entry.event == "Refused"));
    assert!(plan.revocations.is_empty());

    // Stamped with the holder's token: the believing holder is drained, the annotation
    // cleared, the release recorded.
    let target = TOKEN.to_string();
    let stamped = with_annotations(lock(), &[asked[0], asked[1], (ANNOTATION_FORCE_RELEASE_TARGET, &target)]);
    let plan = super::plan(&observation(&stamped, &lease, Vec::new()));
    let [revoked] = plan.revocations.as_slice() else { panic!("one revocation") };
    assert_eq!(revoked.reason, RevokeReason::Forced);
    assert_eq!(revoked.force.as_ref().map(|f| f.by.as_str()), Some("alice"));
    assert!(revoked.drain_from.is_some(), "a believing holder is drained");
    assert!(plan.clear_annotation);
    let forced = status(&plan).outcome.forced.as_ref().expect("recorded");
    assert_eq!((forced.by.as_str(), forced.revoked_token), ("alice", Some(TOKEN)));

    // Stamped with a token that no longer holds: cleared, revoking nothing.
    let stale = with_annotations(lock(), &[asked[0], asked[1], (ANNOTATION_FORCE_RELEASE_TARGET, "7")]);
    let plan = super::plan(&observation(&stale, &lease, Vec::new()));
    assert!(plan.revocations.is_empty());
    assert!(plan.clear_annotation);
    assert!(plan.skipped.as_deref().is_some_and(|s| s.contains("token 7 no longer holds")), "{:?}", plan.skipped);
}

#[test]
fn an_unconfirmed_grant_whose_claim_is_withdrawn_is_revoked_once_it_cannot_have_been_answered() {
    let lock = lock();
    let terms = GrantedTiming::of_spec(&lock.spec);
    let lease = build::granted(&free(), &claim("h", 1), TOKEN, &terms, now(), None);
    // Granted a second ago: its claimant may have answered it before confirming (and
    // clears it itself when it withdraws).
    let o = observation(&lock, &lease, vec![waiting("b", 2, Some(true))]);
    let plan = super::plan(&o);
    assert!(plan.revocations.is_empty(), "{:?}", plan.revocations);
    assert_eq!(kept_naming_next(&plan), ("u-h".to_owned(), TOKEN, Some("u-b".to_owned())));
    assert_eq!(plan.recheck, Some(14 * S), "looked at again once it cannot have been answered");
    // A lease duration after the grant: one write, to the next.
    let mut o = observation(&lock, &lease, vec![waiting("b", 2, Some(true))]);
    o.slots[0].hold = Some(clock(15));
    let plan = super::plan(&o);
    let [revoked] = plan.revocations.as_slice() else { panic!("one revocation") };
    assert_eq!((revoked.reason, revoked.drain_from), (RevokeReason::Unconfirmed, None));
    assert_eq!(holder_of(&plan).as_deref(), Some("u-b"));
}

#[test]
fn a_grant_on_a_fresh_claim_is_kept_unconfirmed_until_a_lease_duration_after_the_claim() {
    let lock = lock();
    let terms = GrantedTiming::of_spec(&lock.spec);
    let lease = build::granted(&free(), &claim("h", 1), TOKEN, &terms, now(), None);
    assert_eq!(
        lease.annotations().get(crate::crd::ANNOTATION_CLAIM_UID).map(String::as_str),
        Some("uid-h"),
        "the grant names the claim it serves"
    );
    let holder = |seen_s: u64| Waiting { seen_for: Duration::from_secs(seen_s), ..waiting("h", 1, None) };
    // Unconfirmed past the confirm timeout (2 s), its claim seen 5 s ago: kept.
    let mut o = observation(&lock, &lease, vec![holder(5), waiting("b", 2, Some(true))]);
    o.slots[0].hold = Some(clock(3));
    let plan = super::plan(&o);
    assert!(plan.revocations.is_empty(), "{:?}", plan.revocations);
    assert_eq!(plan.recheck, Some(10 * S));
    // Its claim seen a lease duration ago: it confirms before answering, so one write.
    let mut o = observation(&lock, &lease, vec![holder(15), waiting("b", 2, Some(true))]);
    o.slots[0].hold = Some(clock(3));
    let plan = super::plan(&o);
    let [revoked] = plan.revocations.as_slice() else { panic!("one revocation") };
    assert_eq!((revoked.reason, revoked.drain_from), (RevokeReason::Unconfirmed, None));
    assert_eq!(holder_of(&plan).as_deref(), Some("u-b"));
}

fn semaphore(permits: i32) -> DistributedLock {
    let mut lock = lock();
    lock.spec.permits = permits;
    lock
}

/// Slot `slot`'s Lease of `lock`, free or held by `who` with `token` (confirmed).
fn slot_lease(lock: &DistributedLock, slot: u32, held_by: Option<(&str, i64)>) -> Lease {
    let free = build::new_lock_lease(lock, slot, TOKEN);
    let Some((who, token)) = held_by else { return free };
    let terms = GrantedTiming::of_spec(&lock.spec);
    let granted =
        build::granted(&free, &claim(who, 1), token, &terms, Timestamp::from_second(900).expect("valid"), None);
    edit::renewed(&granted, Timestamp::from_second(990).expect("valid"))
}

fn slots_observation<'a>(lock: &'a DistributedLock, leases: &'a [Lease], claims: Vec<Waiting>) -> Observation<'a> {
    let mut o = observation(lock, &leases[0], claims);
    o.slots = leases
        .iter()
        .enumerate()
        .map(|(i, lease)| SlotView {
            slot: u32::try_from(i).expect("a slot"),
            lease,
            hold: matches!(view::lease_state(lease), LeaseState::Held(_)).then(|| clock(1)),
            drain_since_renewal: matches!(view::lease_state(lease), LeaseState::Draining(_)).then_some(S),
        })
        .collect();
    o
}

fn granted_slots(plan: &Plan) -> Vec<(u32, &str)> {
    plan.grants.iter().map(|g| (g.slot, g.claim.name.as_str())).collect()
}

#[test]
fn a_semaphore_grants_up_to_its_permits_in_claim_order_with_tokens_rising_across_slots() {
    let lock = semaphore(3);
    let leases: Vec<Lease> = (0..3).map(|slot| slot_lease(&lock, slot, None)).collect();
    let claims = ["a", "b", "c", "d"].iter().enumerate().map(|(i, w)| waiting(w, i as i64 + 1, Some(true))).collect();
    let plan = super::plan(&slots_observation(&lock, &leases, claims));
    assert_eq!(granted_slots(&plan), [(0, "orders.u-a"), (1, "orders.u-b"), (2, "orders.u-c")]);
    let tokens: Vec<i64> = plan.grants.iter().map(|g| g.token).collect();
    assert!(tokens[0] > TOKEN && tokens.windows(2).all(|w| w[1] > w[0]), "tokens rise across the lock: {tokens:?}");
    assert_eq!(plan.leases.iter().map(|w| w.slot).collect::<Vec<_>>(), [0, 1, 2], "one write per slot granted");
    let status = status(&plan);
    assert_eq!(status.holds.iter().map(|h| h.slot).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(names(&status.waiters), ["orders.u-d"], "the fourth waits");
    assert_eq!(status.token, tokens[2]);
    assert_eq!(status.permits, 3);
}

#[test]
fn a_semaphore_serves_the_head_on_a_free_slot_beside_its_holders() {
    let lock = semaphore(2);
    let leases = [slot_lease(&lock, 0, Some(("h", TOKEN))), slot_lease(&lock, 1, None)];
    let claims = vec![waiting("h", 1, None), waiting("b", 2, Some(true)), waiting("c", 3, None)];
    let plan = super::plan(&slots_observation(&lock, &leases, claims));
    assert_eq!(granted_slots(&plan), [(1, "orders.u-b")]);
    assert_eq!(names(&status(&plan).waiters), ["orders.u-c"], "the holder's own claim is not a waiter");
    assert!(plan.revocations.is_empty());
}

#[test]
fn an_expired_hold_on_one_slot_is_revoked_and_regranted_while_the_others_hold() {
    let lock = semaphore(2);
    let leases = [slot_lease(&lock, 0, Some(("h", TOKEN))), slot_lease(&lock, 1, Some(("k", TOKEN + 1)))];
    let mut o = slots_observation(&lock, &leases, vec![waiting("b", 2, Some(true))]);
    o.tokens = Tokens::Known(TOKEN + 1);
    o.slots[1].hold = Some(clock(lease_duration().as_secs()));
    let plan = super::plan(&o);
    assert_eq!(granted_slots(&plan), [(1, "orders.u-b")]);
    let [revoked] = plan.revocations.as_slice() else { panic!("one revocation: {:?}", plan.revocations) };
    assert_eq!((revoked.slot, revoked.reason, revoked.token), (1, RevokeReason::Expired, Some(TOKEN + 1)));
    assert!(plan.grants[0].token > TOKEN + 1, "above every token of the lock");
    assert_eq!(status(&plan).outcome.revoked, [(1, RevokeReason::Expired)]);
}

#[test]
fn shrinking_never_revokes_and_grants_nobody_until_fewer_hold_than_the_new_permits() {
    // Shrunk from 2 to 1 while both slots hold: both keep holding, nobody is granted.
    let lock = semaphore(1);
    let leases = [slot_lease(&lock, 0, Some(("h", TOKEN))), slot_lease(&lock, 1, Some(("k", TOKEN - 1)))];
    let plan = super::plan(&slots_observation(&lock, &leases, vec![waiting("b", 2, Some(true))]));
    assert!(plan.grants.is_empty() && plan.revocations.is_empty());
    assert_eq!(status(&plan).holds.len(), 2, "both holds stand");

    // Slot 0 released while slot 1 still holds: still one holder for one permit.
    let leases = [slot_lease(&lock, 0, None), slot_lease(&lock, 1, Some(("k", TOKEN - 1)))];
    let plan = super::plan(&slots_observation(&lock, &leases, vec![waiting("b", 2, Some(true))]));
    assert!(plan.grants.is_empty(), "a hold above the permits still counts: {:?}", plan.grants);

    // Slot 1 released: its Lease goes; slot 0 is granted.
    let leases = [slot_lease(&lock, 0, None), slot_lease(&lock, 1, None)];
    let plan = super::plan(&slots_observation(&lock, &leases, vec![waiting("b", 2, Some(true))]));
    assert_eq!(granted_slots(&plan), [(0, "orders.u-b")]);
    assert!(plan.leases.contains(&SlotWrite { slot: 1, write: LeaseWrite::Delete }), "{:?}", plan.leases);
}

#[test]
fn slot_zero_records_the_permits_for_claimants_to_watch() {
    let lock = semaphore(3);
    let mut bare = slot_lease(&lock, 0, None);
    bare.metadata.annotations.as_mut().expect("annotations").remove(crate::crd::ANNOTATION_PERMITS);
    let plan = super::plan(&slots_observation(&lock, std::slice::from_ref(&bare), Vec::new()));
    let LeaseWrite::Replace(written) = write_of(&plan) else { panic!("slot 0 written: {:?}", plan.leases) };
    assert_eq!(written.annotations().get(crate::crd::ANNOTATION_PERMITS).map(String::as_str), Some("3"));
    // Recorded already: nothing to write.
    let recorded = slot_lease(&lock, 0, None);
    let plan = super::plan(&slots_observation(&lock, std::slice::from_ref(&recorded), Vec::new()));
    assert_eq!(write_of(&plan), LeaseWrite::Keep);
    // A mutex records none.
    assert!(free().annotations().get(crate::crd::ANNOTATION_PERMITS).is_none());
}

fn writer(who: &str, created_s: i64) -> Waiting {
    let mut w = waiting(who, created_s, Some(true));
    w.claim.mode = ClaimMode::Write;
    w
}

#[test]
fn a_writer_holds_every_permit_alone_and_readers_behind_it_wait_for_it() {
    let lock = semaphore(3);
    // A reader holds: the writer at the head waits, and so does the reader behind it,
    // though two slots are free.
    let leases = [slot_lease(&lock, 0, Some(("r1", TOKEN))), slot_lease(&lock, 1, None), slot_lease(&lock, 2, None)];
    let plan = super::plan(&slots_observation(&lock, &leases, vec![writer("w", 2), waiting("r2", 3, Some(true))]));
    assert!(plan.grants.is_empty(), "{:?}", plan.grants);
    assert_eq!(names(&status(&plan).waiters), ["orders.u-w", "orders.u-r2"]);

    // All free: the writer is granted slot 0, marked as a writer, with a token above every
    // earlier one; the reader behind it waits.
    let leases = [slot_lease(&lock, 0, None), slot_lease(&lock, 1, None), slot_lease(&lock, 2, None)];
    let plan = super::plan(&slots_observation(&lock, &leases, vec![writer("w", 2), waiting("r2", 3, Some(true))]));
    assert_eq!(granted_slots(&plan), [(0, "orders.u-w")]);
    let writer_token = plan.grants[0].token;
    assert!(writer_token > TOKEN);
    let LeaseWrite::Replace(written) = write_of(&plan) else { panic!("slot 0 written") };
    assert_eq!(view::mode_of(&written), ClaimMode::Write);
    assert_eq!(names(&status(&plan).waiters), ["orders.u-r2"]);

    // While the writer holds, no reader is granted a free slot.
    let held_by_writer = view::lease_state(&written);
    assert!(matches!(held_by_writer, LeaseState::Held(ref h) if h.mode == ClaimMode::Write));
    let leases = [(*written).clone(), slot_lease(&lock, 1, None), slot_lease(&lock, 2, None)];
    let claims = vec![writer("w", 2), waiting("r2", 3, Some(true))];
    let plan = super::plan(&slots_observation(&lock, &leases, claims));
    assert!(plan.grants.is_empty(), "a reader beside a writer: {:?}", plan.grants);

    // Nor while the writer's revoked hold drains: it may still believe it holds.
    let draining = build::draining(&written, writer_token + 1, "Forced", Some(writer_token));
    assert!(matches!(view::lease_state(&draining), LeaseState::Draining(ref d) if d.mode == ClaimMode::Write));
    let leases = [draining, slot_lease(&lock, 1, None), slot_lease(&lock, 2, None)];
    let plan = super::plan(&slots_observation(&lock, &leases, vec![waiting("r2", 3, Some(true))]));
    assert!(plan.grants.is_empty(), "a reader beside a draining writer: {:?}", plan.grants);

    // Readers ahead of a writer are served; the writer waits behind them.
    let leases = [slot_lease(&lock, 0, None), slot_lease(&lock, 1, None), slot_lease(&lock, 2, None)];
    let claims = vec![waiting("r1", 1, Some(true)), writer("w", 2), waiting("r2", 3, Some(true))];
    let plan = super::plan(&slots_observation(&lock, &leases, claims));
    assert_eq!(granted_slots(&plan), [(0, "orders.u-r1")]);
}

mod next;
