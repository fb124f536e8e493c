//! How long the controller waits for a grant's confirmation, against the real control
//! plane: longer after each grant of the lock that went unconfirmed, and back to
//! `--confirm-timeout` once a later grant is confirmed; and on every lock, at least twice
//! the slowest confirmation seen lately on any.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use leasehold::claim::edit;
use leasehold::crd::DistributedLockSpec;

use crate::controller::ManualClaimant;
use crate::support::Env;
use crate::support::watch::{GrantLog, until};

const LOCK: &str = "orders";
const WAIT: Duration = Duration::from_secs(60);

/// Lease 5 s: confirmation windows of 1, 2 and 4 s fit under it.
fn timing() -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: 5,
        renew_deadline_seconds: 4,
        retry_period_seconds: 1,
        ..DistributedLockSpec::default()
    }
}

/// Pods `names`, once they may claim here.
async fn pods(env: &Env, names: &[&str]) -> Vec<crate::support::TestPod> {
    let mut pods = Vec::new();
    for name in names {
        pods.push(env.pod(name).await);
    }
    env.wait_claim_rbac(&pods[0]).await;
    pods
}

#[tokio::test]
async fn each_grant_left_unconfirmed_makes_the_next_wait_longer_until_one_is_confirmed() {
    let env = Env::new("confirm-window").await;
    let _controller = env.controller(&["--leader-elect=false", "--confirm-timeout=1s"]).await;
    env.lock(LOCK, timing()).await;
    let pods = pods(&env, &["a", "b", "c", "d", "e", "f", "g"]).await;
    let [a, b, c, d, e, f, g] = pods.as_slice() else { unreachable!("seven pods") };
    let mut grants = GrantLog::start(env.leases(), LOCK);

    // a holds while the others queue, in this order: b, c and d never confirm a grant, e
    // acquires like any sidecar, f and g never confirm either.
    let hold_a = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires the free lock");
    let queued_at = jiff::Timestamp::now();
    let mut manual = Vec::new();
    for pod in [b, c, d] {
        manual.push(ManualClaimant::claim(pod, env.name(), LOCK).await);
    }
    let claimant_e = e.claimant(env.name());
    let waiting_e = tokio::spawn(async move { claimant_e.acquire(LOCK, WAIT).await });
    until(&env.claims(), &e.identity().claim_name(LOCK), WAIT, "e's claim", |_| true).await;
    for pod in [f, g] {
        manual.push(ManualClaimant::claim(pod, env.name(), LOCK).await);
    }
    // Their claims must be older than a lease duration when granted: a grant on a younger
    // claim may have been answered before its confirmation, and is never revoked as
    // unconfirmed. a renews every second; its renewals tell the time on the apiserver.
    let aged = queued_at + jiff::SignedDuration::from_secs(7);
    until(&env.leases(), LOCK, WAIT, "a renewing past the claims' first lease duration", |l: &Lease| {
        l.spec.as_ref().and_then(|s| s.renew_time.as_ref()).is_some_and(|t| t.0 >= aged)
    })
    .await;
    assert!(hold_a.release().await.was_held);
    let hold_e = waiting_e.await.expect("join").expect("e is granted once b, c and d lost their turns");
    assert!(hold_e.release().await.was_held);

    let seen = grants.wait_for(7, WAIT).await;
    let holders: Vec<&str> = seen.iter().map(|s| s.holder.as_str()).collect();
    let expected: Vec<String> = [a, b, c, d, e, f, g].iter().map(|p| p.identity().id).collect();
    assert_eq!(holders, expected, "grant order");
    assert!(seen.windows(2).all(|w| w[0].token < w[1].token), "tokens strictly increase: {seen:?}");
    // How long each unconfirmed grant stood: until the next grant, which revoked it.
    let stood = |i: usize| seen[i + 1].seen - seen[i].seen;
    let (b_stood, c_stood, d_stood, f_stood) = (stood(1), stood(2), stood(3), stood(5));
    assert!(b_stood >= Duration::from_millis(700), "b's grant stood {b_stood:?}: revoked before the timeout");
    assert!(c_stood >= Duration::from_millis(1500), "c's grant stood {c_stood:?}: the window did not double");
    assert!(d_stood >= Duration::from_secs(3), "d's grant stood {d_stood:?}: the window did not double again");
    // e confirmed: f waits the timeout again, not the window d had.
    assert!(f_stood * 2 < d_stood, "f's grant stood {f_stood:?} after e confirmed, d's {d_stood:?}");
}

#[tokio::test]
async fn a_slow_confirmation_on_one_lock_makes_the_controller_wait_longer_on_another() {
    let env = Env::new("confirm-pace").await;
    let _controller = env.controller(&["--leader-elect=false", "--confirm-timeout=1s"]).await;
    let (slow, other) = ("slow", "other");
    env.lock(slow, timing()).await;
    env.lock(other, timing()).await;
    let pods = pods(&env, &["a", "m1", "m2", "b", "h", "c", "d"]).await;
    let [a, m1, m2, b, h, c, d] = pods.as_slice() else { unreachable!("seven pods") };
    let mut grants = GrantLog::start(env.leases(), other);

    // Lock "slow": a holds; m1 and m2 never confirm (their misses widen the lock's own
    // window to 4 s), then b confirms 3 s after it sees its grant, within that window.
    // Lock "other": h holds; c never confirms, d acquires like any sidecar.
    let hold_a = a.claimant(env.name()).acquire(slow, WAIT).await.expect("a acquires the free lock");
    let hold_h = h.claimant(env.name()).acquire(other, WAIT).await.expect("h acquires the free lock");
    let queued_at = jiff::Timestamp::now();
    let mut manual = Vec::new();
    for pod in [m1, m2] {
        manual.push(ManualClaimant::claim(pod, env.name(), slow).await);
    }
    let _b = ManualClaimant::claim(b, env.name(), slow).await;
    let _c = ManualClaimant::claim(c, env.name(), other).await;
    let claimant_d = d.claimant(env.name());
    let waiting_d = tokio::spawn(async move { claimant_d.acquire(other, WAIT).await });
    until(&env.claims(), &d.identity().claim_name(other), WAIT, "d's claim", |_| true).await;
    // Every claim older than a lease duration when granted, so each grant must be
    // confirmed before it is answered; a's renewals tell the time on the apiserver.
    let aged = queued_at + jiff::SignedDuration::from_secs(7);
    until(&env.leases(), slow, WAIT, "a renewing past the claims' first lease duration", |l: &Lease| {
        l.spec.as_ref().and_then(|s| s.renew_time.as_ref()).is_some_and(|t| t.0 >= aged)
    })
    .await;
    assert!(hold_a.release().await.was_held);

    // b pauses 3 s between seeing its grant and confirming it: a claimant on a slow
    // apiserver, as the controller sees it.
    let identity = b.identity();
    let leases: Api<Lease> = Api::namespaced(b.client.clone(), env.name());
    let granted =
        until(&leases, slow, WAIT, "the grant to b", |l: &Lease| edit::granted_token(l, &identity).is_some()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let confirmed = leases
        .replace(slow, &PostParams::default(), &edit::renewed(&granted, jiff::Timestamp::now()))
        .await
        .expect("b's confirmation lands within its lock's widened window");
    assert!(edit::granted_token(&confirmed, &identity).is_some(), "b holds");

    assert!(hold_h.release().await.was_held);
    let hold_d = waiting_d.await.expect("join").expect("d is granted once c lost its turn");
    assert!(hold_d.release().await.was_held);
    let seen = grants.wait_for(3, WAIT).await;
    let holders: Vec<String> = seen.iter().map(|s| s.holder.clone()).collect();
    assert_eq!(holders, [h.identity().id, c.identity().id, d.identity().id], "grant order on the other lock");
    // c's grant stood until d's grant revoked it: twice b's 3 s, capped at the 5 s lease
    // duration, where --confirm-timeout alone gives 1 s.
    let c_stood = seen[2].seen - seen[1].seen;
    assert!(c_stood >= Duration::from_secs(4), "c's grant stood {c_stood:?}: the slow confirmation did not count");
}
