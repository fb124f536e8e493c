//! Table tests of the waiter a held mutex's Lease names as next.

use super::*;
use crate::lease::next::{self, Next};

/// The next waiter slot 0's write records (`None`: no write, or a write naming nobody).
fn next_of(plan: &Plan) -> Option<Next> {
    match write_of(plan) {
        LeaseWrite::Replace(lease) => next::of_lease(&lease),
        _ => None,
    }
}

/// `lease` recording `who` as next with `token`.
fn naming(mut lease: Lease, who: &str, token: i64) -> Lease {
    let c = claim(who, 2);
    let recorded =
        Next { holder: c.identity.id.clone(), claim: c.name.clone(), claim_uid: c.uid.clone(), token, mode: None };
    next::record(&mut lease, Some(&recorded));
    lease
}

#[test]
fn a_grant_names_the_waiter_behind_its_head_with_a_token_above_its_own() {
    let lock = lock();
    let lease = free();
    let o = observation(&lock, &lease, vec![waiting("a", 1, Some(true)), waiting("b", 2, Some(true))]);
    let plan = super::plan(&o);
    assert_eq!(holder_of(&plan).as_deref(), Some("u-a"));
    let granted = plan.grants[0].token;
    let recorded = next_of(&plan).expect("b named as next");
    assert_eq!((recorded.holder.as_str(), recorded.claim.as_str()), ("u-b", "orders.u-b"));
    assert_eq!(recorded.token, granted + 1, "reserved one above the grant's");
    assert_eq!(plan.reserved, [(0, recorded.token)]);
    assert_eq!(plan.minted(), Some(granted), "the grant's, not the reserved one");
    let status = status(&plan);
    assert_eq!(status.token, granted, "status shows the grant's token: fenced writes are judged against it");
    assert_eq!(status.outcome.reserved, Some(recorded.token), "status must cover the reserved one");
}

#[test]
fn a_held_lease_names_the_head_of_the_queue_once_and_follows_it() {
    let lock = lock();
    // Nobody named yet: the head, with a new token.
    let lease = held("h");
    let plan = super::plan(&observation(&lock, &lease, vec![waiting("b", 2, Some(true))]));
    let recorded = next_of(&plan).expect("b named");
    assert_eq!(recorded.holder, "u-b");
    assert!(recorded.token > TOKEN);
    // Already named, with a token above the hold's: nothing to write.
    let named = naming(held("h"), "b", TOKEN + 5);
    let mut o = observation(&lock, &named, vec![waiting("b", 2, Some(true))]);
    o.tokens = Tokens::Known(TOKEN + 5);
    let plan = super::plan(&o);
    assert_eq!(write_of(&plan), LeaseWrite::Keep);
    assert!(plan.reserved.is_empty());
    // The one named withdrew, another waits: named instead, with a token above the last.
    let mut o = observation(&lock, &named, vec![waiting("c", 3, Some(true))]);
    o.tokens = Tokens::Known(TOKEN + 5);
    let recorded = next_of(&super::plan(&o)).expect("c named");
    assert_eq!(recorded.holder, "u-c");
    assert!(recorded.token > TOKEN + 5, "never the withdrawn waiter's token again");
    // Nobody waits: the record goes, the hold stays.
    let mut o = observation(&lock, &named, Vec::new());
    o.tokens = Tokens::Known(TOKEN + 5);
    let plan = super::plan(&o);
    let LeaseWrite::Replace(written) = write_of(&plan) else { panic!("the record is removed") };
    assert!(!next::any_recorded(&written));
    assert_eq!(edit::holder(&written), Some("u-h"));
    assert_eq!(crate::lease::token::of_lease(&written), Some(TOKEN));
}

#[test]
fn a_record_whose_token_is_not_above_the_holds_is_replaced() {
    let lock = lock();
    let stale = naming(held("h"), "b", TOKEN);
    let recorded = next_of(&super::plan(&observation(&lock, &stale, vec![waiting("b", 2, Some(true))])));
    assert!(recorded.is_some_and(|r| r.holder == "u-b" && r.token > TOKEN));
}

#[test]
fn nobody_is_named_next_where_a_release_must_not_hand_on() {
    let mut edited = lock();
    edited.spec.max_hold_seconds = Some(7);
    let deleting = {
        let mut lock = lock();
        lock.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
        lock
    };
    let named = naming(held("h"), "b", TOKEN + 5);
    let drain = naming(draining("h", false), "b", TOKEN + 5);
    let claims = || vec![waiting("b", 2, Some(true))];
    // (case, lock, lease)
    let cases: [(&str, &DistributedLock, &Lease); 3] = [
        ("the lock's terms changed since the grant", &edited, &named),
        ("the hold is draining", &lock(), &drain),
        ("the lock is being deleted", &deleting, &named),
    ];
    for (case, lock, lease) in cases {
        let mut o = observation(lock, lease, claims());
        o.tokens = Tokens::Known(TOKEN + 5);
        let plan = super::plan(&o);
        let leases: Vec<&Lease> = plan
            .leases
            .iter()
            .filter_map(|w| match &w.write {
                LeaseWrite::Replace(l) => Some(&**l),
                _ => None,
            })
            .collect();
        assert!(leases.iter().all(|l| !next::any_recorded(l)), "{case}: {leases:?}");
        assert!(plan.reserved.is_empty(), "{case}");
    }
    // A semaphore's slots name nobody.
    let sem = semaphore(2);
    let leases = [slot_lease(&sem, 0, Some(("r1", TOKEN))), slot_lease(&sem, 1, Some(("r2", TOKEN + 1)))];
    let plan = super::plan(&slots_observation(&sem, &leases, vec![waiting("r3", 3, Some(true))]));
    assert!(plan.reserved.is_empty() && plan.leases.is_empty(), "{:?}", plan.leases);
}

#[test]
fn a_writer_named_next_is_recorded_with_its_mode() {
    let lock = lock();
    let lease = held("h");
    let plan = super::plan(&observation(&lock, &lease, vec![writer("w", 2)]));
    assert_eq!(next_of(&plan).and_then(|n| n.mode).as_deref(), Some(ClaimMode::Write.as_str()));
}
