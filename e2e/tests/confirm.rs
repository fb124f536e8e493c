//! How long the controller waits for a grant's confirmation, against the real control
//! plane: longer after each grant of the lock that went unconfirmed, and back to
//! `--confirm-timeout` once a later grant is confirmed.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
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

#[tokio::test]
async fn each_grant_left_unconfirmed_makes_the_next_wait_longer_until_one_is_confirmed() {
    let env = Env::new("confirm-window").await;
    let _controller = env.controller(&["--leader-elect=false", "--confirm-timeout=1s"]).await;
    env.lock(LOCK, timing()).await;
    let names = ["a", "b", "c", "d", "e", "f", "g"];
    let mut pods = Vec::new();
    for name in names {
        pods.push(env.pod(name).await);
    }
    env.wait_claim_rbac(&pods[0]).await;
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
