//! The sidecar and `leasehold run` against the real control plane: sidecars run as local
//! processes with Pod-bound tokens; the controller runs as a local process.

use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, ListParams};
use leasehold::crd::DistributedLockSpec;
use serde_json::Value;

use crate::controller::fast;
use crate::support::watch::until;
use crate::support::{Env, Sidecar, leasehold_bin};
use leasehold_harness::Fault;

const LOCK: &str = "orders";

/// A resource that keeps the highest token it has seen and rejects lower ones.
#[derive(Default)]
struct FencedRegister {
    highest: i64,
    applied: Vec<(String, i64)>,
}

impl FencedRegister {
    fn write(&mut self, writer: &str, token: i64) -> bool {
        if token < self.highest {
            return false;
        }
        self.highest = token;
        self.applied.push((writer.to_owned(), token));
        true
    }
}

fn token_of(body: &Value) -> i64 {
    body["fencingToken"].as_i64().unwrap_or_else(|| panic!("no fencingToken in {body}"))
}

async fn setup(prefix: &str, spec: DistributedLockSpec) -> (Env, crate::support::LeaseholdProcess) {
    let env = Env::new(prefix).await;
    let controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, spec).await;
    (env, controller)
}

/// Starts an acquire in the background.
fn acquire_later(sidecar: &Sidecar, wait: f64) -> tokio::task::JoinHandle<(u16, Value)> {
    let api = sidecar.api;
    tokio::spawn(async move {
        let body = serde_json::json!({ "waitSeconds": wait }).to_string();
        let (status, text) =
            crate::support::http_request(api, "POST", &format!("/v1/locks/{LOCK}/acquire"), Some(&body))
                .await
                .expect("the sidecar answers");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    })
}

async fn wait_local_waiting(sidecar: &Sidecar) {
    leasehold_harness::eventually("the caller queued in the sidecar", Duration::from_secs(10), || async {
        let view = sidecar.view(LOCK).await;
        if view["state"] == "waiting" { Ok(()) } else { Err(view.to_string()) }
    })
    .await;
}

#[tokio::test]
async fn two_sidecars_contend_one_holder_at_a_time_and_release_hands_over() {
    let (env, _controller) = setup("sc-contend", DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);

    let (status, first) = sa.acquire(LOCK, 30.0).await;
    let boot_at_receipt = leasehold::boottime::millis(leasehold::boottime::now());
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["holder"], a.identity().id);
    // The boot-clock deadline is still ahead and never later than remainingMs counted from
    // receipt: it cannot be stretched by the answer's time in transit. (Both readings and
    // remainingMs are whole milliseconds rounded down: their sum may lose 1 ms.)
    let boot_until = first["validUntilBoottimeMs"].as_u64().expect("validUntilBoottimeMs");
    let remaining = first["remainingMs"].as_u64().expect("remainingMs");
    assert!(
        boot_until > boot_at_receipt && boot_until <= boot_at_receipt + remaining + 1,
        "{first} at {boot_at_receipt}"
    );
    let waiting = acquire_later(&sb, 30.0);
    wait_local_waiting(&sb).await;
    let (va, vb) = (sa.view(LOCK).await, sb.view(LOCK).await);
    assert_eq!((va["held"].as_bool(), vb["held"].as_bool()), (Some(true), Some(false)), "{va} {vb}");
    assert_eq!(va["fencingToken"], first["fencingToken"]);
    assert!(va["validUntilBoottimeMs"].as_u64().is_some() && vb.get("validUntilBoottimeMs").is_none(), "{va} {vb}");

    let (status, released) = sa.release(LOCK).await;
    assert_eq!((status, released["released"].as_bool(), released["wasHeld"].as_bool()), (200, Some(true), Some(true)));
    let (status, second) = waiting.await.expect("join");
    assert_eq!(status, 200, "{second}");
    assert!(token_of(&second) > token_of(&first), "{second} after {first}");
    let (va, vb) = (sa.view(LOCK).await, sb.view(LOCK).await);
    assert_eq!((va["held"].as_bool(), vb["held"].as_bool()), (Some(false), Some(true)), "{va} {vb}");
    let (status, released) = sb.release(LOCK).await;
    assert_eq!((status, released["wasHeld"].as_bool()), (200, Some(true)));
    // Releasing again is an idempotent success that says nothing was held.
    let (status, again) = sb.release(LOCK).await;
    assert_eq!((status, again["released"].as_bool(), again["wasHeld"].as_bool()), (200, Some(false), Some(false)));
}

#[tokio::test]
async fn a_frozen_holder_loses_its_hold_and_its_stale_write_is_rejected() {
    let (env, _controller) = setup("sc-zombie", fast()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);
    let mut register = FencedRegister::default();

    let (status, held_a) = sa.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200, "{held_a}");
    let token_a = token_of(&held_a);
    assert!(register.write("a", token_a));
    let mut events_a = sa.events(LOCK).await;
    let waiting = acquire_later(&sb, 30.0);
    wait_local_waiting(&sb).await;

    sa.process.signal(libc::SIGSTOP);
    let (status, held_b) = waiting.await.expect("join");
    assert_eq!(status, 200, "b is granted while a is frozen: {held_b}");
    let token_b = token_of(&held_b);
    assert!(token_b > token_a);
    assert!(register.write("b", token_b));

    sa.process.signal(libc::SIGCONT);
    // The very first answer after thawing must already say "not held".
    let view = sa.view(LOCK).await;
    assert_eq!(view["held"].as_bool(), Some(false), "a reports held after its deadline: {view}");
    let lost = events_a.expect("lost", Duration::from_secs(10)).await;
    assert_eq!(lost["fencingToken"].as_i64(), Some(token_a));
    for _ in 0..5 {
        let view = sa.view(LOCK).await;
        assert_eq!(view["held"].as_bool(), Some(false), "{view}");
        assert_ne!(view["state"], "held");
    }
    // The zombie's write with its old token is rejected by the resource.
    assert!(!register.write("a", token_a), "the stale write must be rejected");
    assert_eq!(register.applied, [("a".to_owned(), token_a), ("b".to_owned(), token_b)]);
    sb.release(LOCK).await;
}

#[tokio::test]
async fn holds_survive_a_controller_outage_and_nothing_is_granted_meanwhile() {
    let (env, mut controller) = setup("sc-outage", fast()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);
    let (status, held) = sa.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200, "{held}");

    controller.kill();
    // Watch the holder renew three times with no controller (3 s lease, 1 s retry).
    let leases = env.leases();
    let mut last = leases.get(LOCK).await.expect("lease").spec.and_then(|s| s.renew_time);
    for _ in 0..3 {
        let previous = last.clone();
        let lease = until(&leases, LOCK, Duration::from_secs(10), "a renewal", |l: &Lease| {
            l.spec.as_ref().and_then(|s| s.renew_time.clone()) != previous
        })
        .await;
        last = lease.spec.and_then(|s| s.renew_time);
    }
    let (status, refused) = sb.acquire(LOCK, 4.0).await;
    assert_eq!(status, 409, "no grant without a controller: {refused}");
    assert_eq!(refused["error"]["code"], "timeout");
    let view = sa.view(LOCK).await;
    assert_eq!(view["held"].as_bool(), Some(true), "the hold survived the outage: {view}");
    assert_eq!(view["fencingToken"], held["fencingToken"]);

    let _controller = env.controller(&["--leader-elect=false"]).await;
    let waiting = acquire_later(&sb, 30.0);
    wait_local_waiting(&sb).await;
    sa.release(LOCK).await;
    let (status, next) = waiting.await.expect("join");
    assert_eq!(status, 200, "{next}");
    assert!(token_of(&next) > token_of(&held));
    sb.release(LOCK).await;
}

#[tokio::test]
async fn sigterm_reports_the_hold_lost_at_once_and_hands_it_over_only_once_the_app_can_no_longer_believe() {
    let (env, _controller) = setup("sc-sigterm", fast()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let (mut sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);

    // An app that lets go when told: the lock moves on as soon as it released.
    let (status, held) = sa.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200, "{held}");
    let mut events = sa.events(LOCK).await;
    let waiting = acquire_later(&sb, 30.0);
    wait_local_waiting(&sb).await;
    sa.process.signal(libc::SIGTERM);
    let lost = events.expect("lost", Duration::from_secs(10)).await;
    assert_eq!(lost["fencingToken"], held["fencingToken"], "{lost}");
    let (status, refused) = sa.acquire(LOCK, 1.0).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (503, Some("shutting_down")), "{refused}");
    assert!(!waiting.is_finished(), "b was granted while a's app was still inside the time it was told");
    let (status, released) = sa.release(LOCK).await;
    assert_eq!(status, 200, "{released}");
    let (status, next) = waiting.await.expect("join");
    assert_eq!(status, 200, "{next}");
    assert!(token_of(&next) > token_of(&held));
    assert_eq!(sa.process.terminate(Duration::from_secs(10)).await, Some(0), "exits cleanly once given back");

    // An app that never answers: the lock moves on only after the time it was told.
    let mut sa = env.sidecar(&a, &[]).await;
    let waiting = acquire_later(&sa, 30.0);
    wait_local_waiting(&sa).await;
    sb.release(LOCK).await;
    let (status, held) = waiting.await.expect("join");
    assert_eq!(status, 200, "{held}");
    // The deadline the sidecar told, on the wall clock: `remainingMs` counted from when
    // the answer is read is later by the answer's transit, which the sidecar cannot see
    // (apps that must not be stretched compare against the answer's deadline, not this).
    let told_until: jiff::Timestamp = held["expiresAt"].as_str().expect("expiresAt").parse().expect("a timestamp");
    let waiting = acquire_later(&sb, 30.0);
    wait_local_waiting(&sb).await;
    assert_eq!(sa.process.terminate(Duration::from_secs(10)).await, Some(0));
    let (status, next) = waiting.await.expect("join");
    assert_eq!(status, 200, "{next}");
    let lease = env.leases().get(LOCK).await.expect("the lock Lease");
    let granted_at = lease.spec.and_then(|s| s.acquire_time).expect("b's grant").0;
    assert!(granted_at >= told_until, "b was granted at {granted_at}, before a's app stopped believing ({told_until})");
    sb.release(LOCK).await;
}

#[tokio::test]
async fn an_apiserver_blip_costs_an_acquire_time_not_failure_and_a_release_is_cleared_once_it_answers() {
    let spec = DistributedLockSpec {
        lease_duration_seconds: 30,
        renew_deadline_seconds: 20,
        retry_period_seconds: 2,
        ..DistributedLockSpec::default()
    };
    let (env, _controller) = setup("sc-blip", spec).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let (proxy, server) = env.apiserver_proxy();
    let (sa, sb) = (env.sidecar_via(&a, Some(&server), &[]).await, env.sidecar(&b, &[]).await);

    // An acquire sent while a's apiserver connection is down is tried again within its
    // wait, not answered 502.
    proxy.set(Fault::Drop);
    let acquiring = acquire_later(&sa, 30.0);
    leasehold_harness::eventually("a retry of the acquisition", Duration::from_secs(20), || async {
        match sa.process.metric("leasehold_sidecar_apiserver_retries_total").await {
            Some(n) if n >= 1.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    proxy.set(Fault::Pass);
    let (status, held) = acquiring.await.expect("join");
    assert_eq!(status, 200, "{held}");

    // A release while the connection is down: the hold was valid when asked, and the
    // holder is cleared once the apiserver answers again — b does not wait out a lease.
    let waiting = acquire_later(&sb, 60.0);
    wait_local_waiting(&sb).await;
    proxy.set(Fault::Drop);
    let (status, released) = sa.release(LOCK).await;
    assert_eq!(status, 200, "{released}");
    assert_eq!(released["wasHeld"], true, "{released}");
    assert!(!waiting.is_finished(), "b granted while a's release could not reach the apiserver");
    proxy.set(Fault::Pass);
    let (status, next) = waiting.await.expect("join");
    assert_eq!(status, 200, "{next}");
    let lease = env.leases().get(LOCK).await.expect("the lock Lease");
    let revoked = lease.metadata.annotations.as_ref().and_then(|a| a.get(leasehold::crd::ANNOTATION_REVOKED));
    assert_eq!(revoked, None, "b was granted after a revocation, not after a's release: {lease:?}");
    sb.release(LOCK).await;
}

#[tokio::test]
async fn a_claim_refresh_while_the_apiserver_is_unreachable_costs_a_retry_not_the_wait() {
    let (env, _controller) = setup("sc-refresh", DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let (proxy, server) = env.apiserver_proxy();
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar_via(&b, Some(&server), &[]).await);
    let (status, held) = sa.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200, "{held}");
    let waiting = acquire_later(&sb, 90.0);
    wait_local_waiting(&sb).await;
    until(&env.locks(), LOCK, Duration::from_secs(30), "b's claim queued", |l: &leasehold::crd::DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.queue_length == 1)
    })
    .await;

    // While b waits, its connection to the apiserver goes down; its next claim refresh
    // (a third of the claim's lifetime after the last) fails.
    proxy.set(Fault::Drop);
    let log = sb.process.process.as_ref().expect("b's sidecar runs").log().to_owned();
    leasehold_harness::logged(&log, "failed to refresh our claim; trying again", Duration::from_secs(30)).await;

    assert!(!waiting.is_finished(), "b's acquire ended while its apiserver was unreachable");
    proxy.set(Fault::Pass);
    let (status, released) = sa.release(LOCK).await;
    assert_eq!(status, 200, "{released}");
    let (status, next) = waiting.await.expect("join");
    assert_eq!(status, 200, "b still waited, and was granted: {next}");
    assert!(token_of(&next) > token_of(&held), "{next}");
    sb.release(LOCK).await;
}

#[tokio::test]
async fn a_claim_whose_create_got_no_answer_but_landed_is_kept_not_replaced() {
    let (env, _controller) = setup("sc-landed", DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let (proxy, server) = env.apiserver_proxy();
    let sa = env.sidecar_via(&a, Some(&server), &[]).await;
    let name = a.identity().claim_name(LOCK);

    // Every request a sends reaches the apiserver 6 s late, on whichever connection it
    // goes (new connections' handshakes pass at once): its claim lands a second after a
    // stopped waiting for the answer (5 s), and a tries again.
    proxy.set(Fault::DelayAfterHandshake(Duration::from_secs(6)));
    let acquiring = acquire_later(&sa, 60.0);
    let claim = until(&env.claims(), &name, Duration::from_secs(30), "a's first claim landed", |_| true).await;
    proxy.set(Fault::Pass);
    let (status, held) = acquiring.await.expect("join");
    assert_eq!(status, 200, "{held}");
    let log = sa.process.process.as_ref().expect("a's sidecar runs").log().to_owned();
    leasehold_harness::logged(&log, "a claim that got no answer had landed", Duration::from_secs(10)).await;
    // a holds: its claim stays until it releases. It is the one that landed first.
    let now = env.claims().get(&name).await.expect("a's claim");
    assert_eq!(now.metadata.uid, claim.metadata.uid, "a's claim was replaced, not kept: {now:?}");
    sa.release(LOCK).await;
}

#[tokio::test]
async fn malformed_requests_get_json_errors_and_change_nothing() {
    let (env, _controller) = setup("sc-malformed", DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let sa = env.sidecar(&a, &[]).await;
    let huge = format!("{{\"waitSeconds\": 1, \"pad\": \"{}\"}}", "x".repeat(64 * 1024));
    let cases: Vec<(&str, String, Option<String>, u16, &str)> = vec![
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("{not json".into()), 400, "invalid_body"),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("{\"waitSeconds\": \"ten\"}".into()), 400, "invalid_body"),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("{\"wait\": 3}".into()), 400, "invalid_body"),
        // The body must be a JSON object: an array would otherwise be read as the fields in order.
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("[5]".into()), 400, "invalid_body"),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("[]".into()), 400, "invalid_body"),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("5".into()), 400, "invalid_body"),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("null".into()), 400, "invalid_body"),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("\"5\"".into()), 400, "invalid_body"),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("{\"waitSeconds\": 1} []".into()), 400, "invalid_body"),
        (
            "POST",
            format!("/v1/locks/{LOCK}/acquire"),
            Some("{\"waitSeconds\": 1, \"waitSeconds\": 2}".into()),
            400,
            "invalid_body",
        ),
        ("POST", format!("/v1/locks/{LOCK}/acquire?waitSeconds=5"), None, 400, "invalid_query"),
        ("GET", format!("/v1/locks/{LOCK}?verbose=1"), None, 400, "invalid_query"),
        ("POST", format!("/v1/locks/{LOCK}/release"), Some("{\"force\": true}".into()), 400, "invalid_body"),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("{\"session\": \"yes\"}".into()), 400, "invalid_body"),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("{\"ttlSeconds\": 0}".into()), 400, "invalid_ttl"),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("{\"ttlSeconds\": 16}".into()), 400, "invalid_ttl"),
        (
            "POST",
            format!("/v1/locks/{LOCK}/acquire"),
            Some("{\"container\": \"Bad_Name\"}".into()),
            400,
            "invalid_container",
        ),
        ("POST", "/v1/locks/no-such-lock/acquire".into(), Some("{\"ttlSeconds\": 1}".into()), 404, "unknown_lock"),
        ("POST", format!("/v1/locks/{LOCK}/holds/h123/keepalive"), None, 400, "invalid_handle"),
        ("GET", format!("/v1/locks/{LOCK}/holds/H0123456789ABCDEF0123456789ABCDEF"), None, 400, "invalid_handle"),
        (
            "POST",
            format!("/v1/locks/{LOCK}/holds/h0123456789abcdef0123456789abcdef/release"),
            Some("{\"force\": true}".into()),
            400,
            "invalid_body",
        ),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("{\"waitSeconds\": -1}".into()), 400, "invalid_wait"),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some("{\"waitSeconds\": 1e12}".into()), 400, "invalid_wait"),
        ("POST", format!("/v1/locks/{LOCK}/acquire"), Some(huge), 413, "body_too_large"),
        ("POST", "/v1/locks/Bad.Name/acquire".into(), None, 400, "invalid_lock_name"),
        ("POST", "/v1/locks/no-such-lock/acquire".into(), Some("{\"waitSeconds\": 5}".into()), 404, "unknown_lock"),
        ("GET", format!("/v1/locks/{LOCK}/acquire"), None, 405, "method_not_allowed"),
        ("DELETE", format!("/v1/locks/{LOCK}"), None, 405, "method_not_allowed"),
        ("GET", format!("/v1/locks/{LOCK}/release"), None, 405, "method_not_allowed"),
        ("GET", "/v2/whatever".into(), None, 404, "not_found"),
    ];
    for (method, path, body, expected, code) in cases {
        let (status, reply) = sa.call(method, &path, body.as_deref()).await;
        assert_eq!(status, expected, "{method} {path}: {reply}");
        assert_eq!(reply["error"]["code"], code, "{method} {path}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "{method} {path}: no message in {reply}");
        if body.as_deref().is_some_and(|b| b.starts_with('[')) {
            assert!(message.contains("JSON object") && message.contains("array"), "{path}: {message}");
        }
    }
    // Nothing changed: no claim was left behind, the pod holds nothing.
    let claims = env.claims().list(&ListParams::default()).await.expect("list");
    assert!(claims.items.is_empty(), "claims left behind: {:?}", claims.items);
    let view = sa.view(LOCK).await;
    assert_eq!((view["state"].as_str(), view["held"].as_bool()), (Some("free"), Some(false)), "{view}");
}

#[tokio::test]
async fn a_caller_that_disconnects_while_waiting_leaves_the_queue() {
    let (env, _controller) = setup("sc-leave", DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);
    let (status, _) = sa.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200);
    let waiting = acquire_later(&sb, 60.0);
    wait_local_waiting(&sb).await;
    let claim = b.identity().claim_name(LOCK);
    until(&env.claims(), &claim, Duration::from_secs(10), "b's claim", |_| true).await;
    waiting.abort(); // the caller hangs up
    crate::support::watch::until_gone(&env.claims(), &claim, Duration::from_secs(10), "b's claim withdrawn").await;
    let view = sb.view(LOCK).await;
    assert_eq!((view["state"].as_str(), view["localWaiters"].as_u64()), (Some("free"), Some(0)), "{view}");
    // The controller names nobody next once it sees b's claim go (a release sent before
    // then hands b the lock, which b gives back: the admission suite's handoff test).
    let b_id = b.identity().id;
    until(&env.leases(), LOCK, Duration::from_secs(10), "b no longer named next", |l: &Lease| {
        leasehold::lease::next::of_lease(l).is_none_or(|n| n.holder != b_id)
    })
    .await;
    // a releases: nobody is granted (the lock stays free).
    sa.release(LOCK).await;
    let lease = env.leases().get(LOCK).await.expect("lease");
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None);
}

#[tokio::test]
async fn callers_in_one_pod_queue_locally_behind_one_claim() {
    let (env, _controller) = setup("sc-local", DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let sa = env.sidecar(&a, &[]).await;
    let (status, first) = sa.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200);
    let second = acquire_later(&sa, 30.0);
    leasehold_harness::eventually("a second local caller queued", Duration::from_secs(10), || async {
        let view = sa.view(LOCK).await;
        if view["localWaiters"] == 1 { Ok(()) } else { Err(view.to_string()) }
    })
    .await;
    let claims = env.claims().list(&ListParams::default()).await.expect("list");
    assert!(claims.items.len() <= 1, "one claim per pod and lock: {}", claims.items.len());
    sa.release(LOCK).await;
    let (status, next) = second.await.expect("join");
    assert_eq!(status, 200, "{next}");
    assert!(token_of(&next) > token_of(&first));
    sa.release(LOCK).await;
}

#[tokio::test]
async fn hold_mode_holds_for_life_writes_the_token_file_and_readiness_follows() {
    let (env, _controller) = setup("sc-hold", DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let dir = env.log_dir();
    let (file_a, file_b) = (dir.join("hold-a.json"), dir.join("hold-b.json"));
    let args = |file: &std::path::Path| {
        vec![
            "--hold".to_owned(),
            LOCK.to_owned(),
            "--hold-file".to_owned(),
            file.display().to_string(),
            "--ready-when-holding=true".to_owned(),
        ]
    };
    let args_a = args(&file_a);
    let mut sa = env.sidecar(&a, &args_a.iter().map(String::as_str).collect::<Vec<_>>()).await;
    sa.process.wait_ready().await;
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&file_a).expect("hold file")).expect("json");
    assert_eq!(record["lock"], format!("{}/{LOCK}", env.name()));
    let token_a = record["fencingToken"].as_i64().expect("token");
    let args_b = args(&file_b);
    let sb = env.sidecar(&b, &args_b.iter().map(String::as_str).collect::<Vec<_>>()).await;
    wait_local_waiting(&sb).await;
    assert_eq!(sb.process.admin_get("/readyz").await.map(|r| r.0), Some(503), "the non-holder is not ready");
    assert!(!file_b.exists());

    sa.process.terminate(Duration::from_secs(30)).await;
    // The file went before the release could hand the lock on.
    assert!(!file_a.exists(), "the terminated holder left its hold file");
    sb.process.wait_ready().await;
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&file_b).expect("hold file")).expect("json");
    assert!(record["fencingToken"].as_i64().expect("token") > token_a);
}

fn run_command(env: &Env, pod: &crate::support::TestPod, wait: &str, script: &str) -> Command {
    let kubeconfig = env.log_dir().join(format!("kubeconfig-run-{}", pod.name));
    env.ns.kubeconfig_for_token(&pod.token, &kubeconfig).expect("kubeconfig");
    let mut command = Command::new(leasehold_bin());
    command
        .args(["run", "--lock", &format!("{}/{LOCK}", env.name()), "--wait", wait, "--", "sh", "-c", script])
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", &pod.name)
        .env("POD_UID", &pod.uid)
        .env("RUST_LOG", "warn");
    command
}

async fn run_to_end(command: Command) -> std::process::Output {
    let mut command = tokio::process::Command::from(command);
    command.kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(90), command.output()).await.expect("leasehold run finishes").expect("run")
}

#[tokio::test]
async fn concurrent_leasehold_runs_never_overlap_and_pass_exit_codes_through() {
    let (env, _controller) = setup("run-overlap", DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let stamps = env.log_dir().join("stamps.txt");
    // The critical section: stamp start, work for 300 ms, stamp end; exit 3.
    let script = format!(
        "echo start $(date +%s%N) $LEASEHOLD_FENCING_TOKEN $LEASEHOLD_LOCK >> {s}; sleep 0.3; echo end $(date +%s%N) $LEASEHOLD_FENCING_TOKEN >> {s}; exit 3",
        s = stamps.display()
    );
    let (ra, rb) = tokio::join!(
        run_to_end(run_command(&env, &a, "60s", &script)),
        run_to_end(run_command(&env, &b, "60s", &script))
    );
    assert_eq!(ra.status.code(), Some(3), "{}", String::from_utf8_lossy(&ra.stderr));
    assert_eq!(rb.status.code(), Some(3), "{}", String::from_utf8_lossy(&rb.stderr));

    let text = std::fs::read_to_string(&stamps).expect("stamps");
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines.len(), 4, "{text}");
    let (start1, end1, start2, end2) = (&lines[0], &lines[1], &lines[2], &lines[3]);
    assert_eq!((start1[0], end1[0], start2[0], end2[0]), ("start", "end", "start", "end"), "no overlap: {text}");
    assert_eq!(start1[2], end1[2], "one child per run: {text}");
    let t = |l: &Vec<&str>| l[1].parse::<u128>().expect("nanoseconds");
    assert!(t(start2) >= t(end1), "the second child started before the first ended: {text}");
    let (token1, token2): (i64, i64) = (start1[2].parse().expect("token"), start2[2].parse().expect("token"));
    assert!(token2 > token1, "tokens distinct and increasing: {text}");
    assert_eq!(start1[3], format!("{}/{LOCK}", env.name()));
}

#[tokio::test]
async fn leasehold_run_kills_a_child_that_outlives_its_hold_and_fails_clearly_on_timeout() {
    let (env, _controller) = setup("run-lost", fast()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let started = env.log_dir().join("started");
    // A child that ignores SIGTERM and would run for ever.
    let script = format!("trap '' TERM; touch {}; while true; do sleep 1; done", started.display());
    let mut child = tokio::process::Command::from(run_command(&env, &a, "30s", &script));
    child.kill_on_drop(true).stderr(std::process::Stdio::piped());
    let running = child.spawn().expect("spawn leasehold run");
    leasehold_harness::eventually("the child started", Duration::from_secs(30), || async {
        if started.exists() { Ok(()) } else { Err("not yet") }
    })
    .await;

    // Meanwhile another run cannot get the lock: a distinct exit status and a clear message.
    let refused = run_to_end(run_command(&env, &b, "1s", "exit 0")).await;
    assert_eq!(refused.status.code(), Some(leasehold::run::EXIT_NOT_ACQUIRED));
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("was not granted within"), "{message}");

    // The hold is lost (the lock Lease deleted by hand): the child is killed.
    let lost = Instant::now();
    env.leases().delete(LOCK, &DeleteParams::default()).await.expect("delete the lock lease");
    let output = tokio::time::timeout(Duration::from_secs(30), running.wait_with_output())
        .await
        .expect("leasehold run ends after the loss")
        .expect("wait");
    let elapsed = lost.elapsed();
    assert_eq!(output.status.code(), Some(128 + libc::SIGKILL), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).contains("lost"), "{}", String::from_utf8_lossy(&output.stderr));
    // Killed within the renew deadline plus the grace (half the lease/deadline margin).
    assert!(elapsed < Duration::from_secs(5), "the child outlived the hold by {elapsed:?}");
}
