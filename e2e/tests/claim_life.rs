//! A waiting claim's lifetime against the real control plane: the controller lets a claim
//! live what it asks, but a new one no longer than three lease durations (30 s at least)
//! and one refreshed after a wait no longer than three times that wait; a waiting claimant
//! asks for longer as its wait grows, so a long wait costs a few refreshes.

use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use leasehold::claim::edit;
use leasehold::crd::{DistributedLock, LockClaim};

use crate::controller::fast;
use crate::support::Env;
use crate::support::watch::{until, until_gone};

const LOCK: &str = "orders";
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_claim_refreshed_after_a_wait_lives_three_times_that_wait_where_a_new_one_lives_30_s() {
    let env = Env::new("claim-life").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, fast()).await;
    let (a, b, c) = (env.pod("a").await, env.pod("b").await, env.pod("c").await);
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a holds");

    // b's claim shows a refresh 20 s after its request and asks to live an hour: it lives
    // three times its wait, 60 s. c's is new and asks the same: it lives 30 s (three lease
    // durations, at least 30 s). Neither is refreshed again.
    let now = Timestamp::now();
    let mut waited = edit::lock_claim(LOCK, &b.identity(), 3600, now);
    waited.spec.request_time = MicroTime(now - jiff::SignedDuration::from_secs(20));
    let new = edit::lock_claim(LOCK, &c.identity(), 3600, now);
    let created_at = Instant::now();
    let b_claims: Api<LockClaim> = Api::namespaced(b.client.clone(), env.name());
    let c_claims: Api<LockClaim> = Api::namespaced(c.client.clone(), env.name());
    let waited = b_claims.create(&PostParams::default(), &waited).await.expect("b's claim");
    let new = c_claims.create(&PostParams::default(), &new).await.expect("c's claim");
    until(&env.locks(), LOCK, WAIT, "b and c waiting", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.queue_length == 2)
    })
    .await;

    until_gone(&env.claims(), &new.name_any(), Duration::from_secs(60), "c's claim dropped").await;
    assert!(created_at.elapsed() >= Duration::from_secs(30), "c's dropped after {:?}", created_at.elapsed());
    let kept = env.claims().get_opt(&waited.name_any()).await.expect("read b's claim");
    assert!(kept.is_some(), "b's claim was dropped with c's, {:?} after both were made", created_at.elapsed());
    until(&env.locks(), LOCK, WAIT, "b alone waiting", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.queue_length == 1)
    })
    .await;

    until_gone(&env.claims(), &waited.name_any(), Duration::from_secs(60), "b's claim dropped").await;
    assert!(created_at.elapsed() >= Duration::from_secs(60), "b's dropped after {:?}", created_at.elapsed());
    assert!(hold.is_held());
    hold.release().await;
}

#[tokio::test]
async fn a_claim_never_refreshed_is_dropped_after_the_capped_ttl_whatever_it_asks() {
    let env = Env::new("claim-ttl").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, fast()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a holds");

    // b claims asking to live an hour, and is never heard of again. The controller caps a
    // new claim's life at max(3 x leaseDuration, 30 s): 30 s here.
    let claims: Api<LockClaim> = Api::namespaced(b.client.clone(), env.name());
    let claim = edit::lock_claim(LOCK, &b.identity(), 3600, Timestamp::now());
    let created_at = Instant::now();
    let created = claims.create(&PostParams::default(), &claim).await.expect("b's claim");
    until(&env.locks(), LOCK, WAIT, "b waiting", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.queue_length == 1)
    })
    .await;
    until_gone(&env.claims(), &created.name_any(), Duration::from_secs(60), "b's claim dropped").await;
    assert!(
        created_at.elapsed() >= Duration::from_secs(30),
        "dropped after {:?}, before its TTL",
        created_at.elapsed()
    );
    until(&env.locks(), LOCK, WAIT, "nobody waiting", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.queue_length == 0)
    })
    .await;
    assert!(hold.is_held());
    hold.release().await;
}

#[tokio::test]
async fn a_waiting_claimant_asks_its_claim_to_live_three_times_as_long_as_it_has_waited() {
    let env = Env::new("claim-grow").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, fast()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a holds");

    let name = b.identity().claim_name(LOCK);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut claims = watcher(env.claims(), config).applied_objects().boxed();
    let claimant = b.claimant(env.name());
    let waiting = tokio::spawn(async move { claimant.acquire(LOCK, Duration::from_secs(90)).await });

    // Lease 3 s: the first claim lives 45 s (made before the lock's timing is known) and is
    // refreshed 10 s on (a third of 30 s); then every refresh asks three times the wait the
    // claim shows (30 s after 10 s, 60 s after 20 s), and comes a third of that later.
    let timing = leasehold::lease::Timing::of(&fast());
    let mut lifetimes: Vec<i32> = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(claim) = claims.next().await {
            let claim = claim.expect("watch b's claim");
            if lifetimes.last() == Some(&claim.spec.ttl_seconds) {
                continue;
            }
            lifetimes.push(claim.spec.ttl_seconds);
            if lifetimes.len() > 1 {
                let shown = edit::wait_shown(&claim.spec);
                let rule = timing.claim_lifetime(shown).as_secs();
                assert_eq!(claim.spec.ttl_seconds as u64, rule, "asked after a wait of {shown:?}; {lifetimes:?}");
            }
            if claim.spec.ttl_seconds >= 60 {
                return;
            }
        }
        panic!("the watch of b's claim ended; lifetimes {lifetimes:?}")
    })
    .await
    .unwrap_or_else(|_| panic!("b's claim never asked 60 s or more; lifetimes {lifetimes:?}"));
    assert_eq!(lifetimes.len(), 3, "lifetimes asked: {lifetimes:?}");
    assert!(lifetimes[0] == 45 && (30..60).contains(&lifetimes[1]), "lifetimes asked: {lifetimes:?}");
    assert!(!waiting.is_finished(), "b's acquire ended while a held");
    hold.release().await;
    let next = waiting.await.expect("join").expect("b is granted once a releases");
    next.release().await;
}
