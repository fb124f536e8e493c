//! Holds owned by a caller, against the real control plane: a session-bound hold whose app
//! is SIGKILLed is handed on before its lease could expire; a heartbeat that lapses loses
//! the hold within its TTL and its later writes are stale; a wrong owner handle changes
//! nothing; a hold taken by an app container that has since restarted is released; hold
//! mode gives leadership up when the app stops. The "apps" are local processes (or this
//! test); the kubelet's reports are written to the Pod status with the admin client.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use leasehold::crd::{DistributedLock, DistributedLockSpec};
use leasehold_harness::{Supervised, eventually};
use serde_json::{Value, json};

use crate::controller::fast;
use crate::support::owner::{
    allow_reading_own_pod, app_status, kubelet_time, may_read_pod, report_app_up, report_containers, sidecar_pod,
};
use crate::support::watch::until;
use crate::support::{Env, LeaseholdProcess, Sidecar, TestPod};

const LOCK: &str = "orders";

/// A namespace `prefix`-… with a controller (no election) and lock `orders` of `spec`, and
/// pods a and b allowed to claim it.
pub(crate) async fn setup(prefix: &str, spec: DistributedLockSpec) -> (Env, LeaseholdProcess, TestPod, TestPod) {
    let env = Env::new(prefix).await;
    let controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, spec).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    (env, controller, a, b)
}

fn token_of(body: &Value) -> i64 {
    body["fencingToken"].as_i64().unwrap_or_else(|| panic!("no fencingToken in {body}"))
}

fn handle_of(body: &Value) -> String {
    body["handle"].as_str().unwrap_or_else(|| panic!("no handle in {body}")).to_owned()
}

/// Starts a plain acquire in the background.
fn acquire_later(sidecar: &Sidecar, wait: f64) -> tokio::task::JoinHandle<(u16, Value)> {
    let api = sidecar.api;
    tokio::spawn(async move {
        let body = json!({ "waitSeconds": wait }).to_string();
        let (status, text) =
            crate::support::http_request(api, "POST", &format!("/v1/locks/{LOCK}/acquire"), Some(&body))
                .await
                .expect("the sidecar answers");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    })
}

async fn wait_local_waiting(sidecar: &Sidecar) {
    eventually("the caller queued in the sidecar", Duration::from_secs(10), || async {
        let view = sidecar.view(LOCK).await;
        if view["state"] == "waiting" { Ok(()) } else { Err(view.to_string()) }
    })
    .await;
}

/// The lock Lease's renewTime and duration now.
async fn renewed_at(env: &Env) -> (jiff::Timestamp, i32) {
    let spec = env.leases().get(LOCK).await.expect("the lock Lease").spec.expect("spec");
    (spec.renew_time.expect("renewed").0, spec.lease_duration_seconds.expect("a duration"))
}

/// Waits until the lock Lease names `pod`; returns the grant's acquireTime.
async fn granted_to(env: &Env, pod: &TestPod) -> jiff::Timestamp {
    let id = pod.identity().id;
    let lease = until(&env.leases(), LOCK, Duration::from_secs(30), "the grant", |l: &Lease| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(id.as_str())
    })
    .await;
    lease.spec.and_then(|s| s.acquire_time).expect("a grant has an acquireTime").0
}

/// A resource that keeps the highest token it has seen and refuses lower ones.
#[derive(Default)]
struct FencedRegister {
    highest: i64,
}

impl FencedRegister {
    fn write(&mut self, token: i64) -> bool {
        if token < self.highest {
            return false;
        }
        self.highest = token;
        true
    }
}

/// The example worker in Python (examples/session-worker/worker.py), as `pod`'s app.
fn python_worker(env: &Env, sidecar: &Sidecar, name: &str, seconds: f64, log: &Path) -> Supervised {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/session-worker/worker.py");
    let mut command = std::process::Command::new("python3");
    command
        .arg(script)
        .args([LOCK, &seconds.to_string()])
        .arg(log)
        .env("LEASEHOLD_URL", format!("http://{}", sidecar.api));
    Supervised::spawn(name, command, &env.log_dir().join(format!("{name}.log"))).expect("start the app")
}

/// The tokens of the `start` lines in a worker log.
fn started(log: &Path) -> Vec<i64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("start "))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

#[tokio::test]
async fn a_session_holders_app_killed_hands_the_lock_on_before_its_lease_could_expire() {
    let (env, _controller, a, b) = setup("own-kill", DistributedLockSpec::default()).await;
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);
    let mut events_a = sa.events(LOCK).await;
    let log = env.log_dir().join("work.log");
    // a's app holds through its session for far longer than this test runs.
    let app = python_worker(&env, &sa, "app-a", 600.0, &log);
    let token_a = eventually("a's app started its work", Duration::from_secs(60), || async {
        started(&log).first().copied().ok_or_else(|| app.log_tail(5))
    })
    .await;
    let waiting = acquire_later(&sb, 60.0);
    wait_local_waiting(&sb).await;
    let (renewed, lease_seconds) = renewed_at(&env).await;

    app.kill_and_reap();
    let (status, granted) = waiting.await.expect("join");
    assert_eq!(status, 200, "{granted}");
    assert!(token_of(&granted) > token_a);
    // Handed on by a release, long before a's hold could have expired: the grant is
    // stamped within the lease duration of a renewal a's sidecar made while its app lived.
    let acquired = granted_to(&env, &b).await;
    let expiry = renewed + jiff::SignedDuration::from_secs(lease_seconds.into());
    assert!(acquired < expiry, "b was granted at {acquired}, a's hold could expire at {expiry}");
    let released = events_a.expect("released", Duration::from_secs(10)).await;
    assert_eq!(token_of(&released), token_a);
    assert!(released["reason"].as_str().unwrap_or_default().contains("session closed"), "{released}");
    let closed = sa.process.metric("leasehold_sidecar_holds_ended_total{reason=\"session_closed\"}").await;
    assert_eq!(closed, Some(1.0), "the closed session is counted");
    let lock = until(&env.locks(), LOCK, Duration::from_secs(10), "b in status", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.holder.as_ref()).is_some_and(|h| h.identity == b.identity().id)
    })
    .await;
    assert_eq!(lock.status.expect("status").stats.expirations, 0, "a's hold expired instead of being released");
    sb.release(LOCK).await;
}

#[tokio::test]
async fn a_lapsed_heartbeat_loses_the_hold_within_its_ttl_and_its_later_writes_are_stale() {
    let (env, _controller, a, b) = setup("own-heartbeat", DistributedLockSpec::default()).await;
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);
    let mut register = FencedRegister::default();
    let ttl = Duration::from_millis(1500);

    // A TTL longer than the lock's lease duration is refused, naming it.
    let (status, refused) = sa.acquire_with(LOCK, json!({"ttlSeconds": 20})).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("invalid_ttl")), "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap_or_default().contains("(15 s)"), "{refused}");

    let (status, held) = sa.acquire_with(LOCK, json!({"ttlSeconds": ttl.as_secs_f64(), "waitSeconds": 10})).await;
    assert_eq!(status, 200, "{held}");
    let (token_a, handle) = (token_of(&held), handle_of(&held));
    assert_eq!(held["ttlSeconds"].as_f64(), Some(1.5));
    assert!(held["remainingMs"].as_u64().expect("remainingMs") <= 1500, "{held}");
    assert!(register.write(token_a));
    let waiting = acquire_later(&sb, 60.0);
    wait_local_waiting(&sb).await;

    // The app keeps its TTL alive for a while; no answer ever promises past it.
    let mut last = (jiff::Timestamp::now(), 0);
    for _ in 0..5 {
        let sent = jiff::Timestamp::now();
        let (status, view) = sa.keepalive(LOCK, &handle).await;
        assert_eq!(status, 200, "{view}");
        let remaining = view["remainingMs"].as_u64().expect("remainingMs");
        assert!(remaining <= 1500, "a keep-alive promised {remaining} ms with a 1.5 s TTL");
        let by_name = sa.view(LOCK).await;
        assert!(by_name["remainingMs"].as_u64().is_some_and(|r| r <= 1500), "{by_name}");
        last = (sent, remaining);
        tokio::time::sleep(Duration::from_millis(400)).await; // the app works between keep-alives
    }
    // Then it hangs: no more keep-alives. The hold is handed on within the TTL plus a
    // small bound, and never before what the app was last told had run out.
    let (status, next) = waiting.await.expect("join");
    assert_eq!(status, 200, "{next}");
    let acquired = granted_to(&env, &b).await;
    let (sent, remaining) = last;
    let told_until = sent + jiff::SignedDuration::from_millis(i64::try_from(remaining).expect("small"));
    assert!(acquired >= told_until, "b was granted at {acquired}, before a's word ran out at {told_until}");
    let lapsed_by = sent + jiff::SignedDuration::try_from(ttl + Duration::from_secs(2)).expect("small");
    assert!(acquired <= lapsed_by, "b was granted at {acquired}, later than TTL + 2 s after a's last keep-alive");

    // The sidecar says why, to the hung app when it comes back.
    let (status, refused) = sa.keepalive(LOCK, &handle).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (409, Some("hold_ended")), "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap_or_default().contains("heartbeat lapsed"), "{refused}");
    let (status, view) = sa.hold_view(LOCK, &handle).await;
    assert_eq!((status, view["state"].as_str(), view["held"].as_bool()), (200, Some("ended"), Some(false)));
    let lapsed = sa.process.metric("leasehold_sidecar_holds_ended_total{reason=\"heartbeat_lapsed\"}").await;
    assert_eq!(lapsed, Some(1.0), "the lapse is counted");
    // Its writes carry a stale token: refused once the next holder has written.
    assert!(register.write(token_of(&next)));
    assert!(!register.write(token_a), "the lapsed holder's write was applied");
    sb.release(LOCK).await;
}

#[tokio::test]
async fn a_wrong_handle_changes_nothing_and_the_true_holder_keeps_the_lock() {
    let (env, _controller, a, _b) = setup("own-handle", DistributedLockSpec::default()).await;
    env.lock("billing", DistributedLockSpec::default()).await;
    let sa = env.sidecar(&a, &[]).await;
    let (status, first) = sa.acquire_with(LOCK, json!({"waitSeconds": 10})).await;
    assert_eq!(status, 200, "{first}");
    let first_handle = handle_of(&first);
    let (status, released) = sa.release_handle(LOCK, &first_handle).await;
    assert_eq!((status, released["released"].as_bool()), (200, Some(true)), "{released}");

    // Another caller of the pod now holds, bound to its session.
    let (status, mut session) = sa.session(LOCK, json!({"waitSeconds": 10})).await;
    assert_eq!(status, 200);
    assert_eq!(session.content_type, "application/x-ndjson");
    let held = session.next(Duration::from_secs(10)).await.expect("the grant line");
    let (token, handle) = (token_of(&held), handle_of(&held));
    assert_eq!(held["session"].as_bool(), Some(true), "{held}");
    let (status, billing) = sa.acquire_with("billing", json!({"waitSeconds": 10})).await;
    assert_eq!(status, 200, "{billing}");
    let lease_before = env.leases().get(LOCK).await.expect("lease");

    let unknown = "h0123456789abcdef0123456789abcdef";
    let cases: Vec<(String, &str, u16, Option<&str>, &str)> = vec![
        // A made-up handle, another lock's handle, a malformed one: refused.
        (format!("/v1/locks/{LOCK}/holds/{unknown}/release"), "POST", 409, Some("wrong_handle"), "does not own"),
        (
            format!("/v1/locks/{LOCK}/holds/{}/release", handle_of(&billing)),
            "POST",
            409,
            Some("wrong_handle"),
            "billing",
        ),
        (format!("/v1/locks/{LOCK}/holds/{unknown}/keepalive"), "POST", 409, Some("wrong_handle"), "does not own"),
        (format!("/v1/locks/{LOCK}/holds/{unknown}"), "GET", 409, Some("wrong_handle"), "does not own"),
        (
            format!("/v1/locks/{LOCK}/holds/not-a-handle/release"),
            "POST",
            400,
            Some("invalid_handle"),
            "not an owner handle",
        ),
        // The lock name alone cannot release a caller's hold.
        (format!("/v1/locks/{LOCK}/release"), "POST", 409, Some("handle_required"), "owner handle"),
    ];
    for (path, method, expected, code, says) in cases {
        let (status, reply) = sa.call(method, &path, None).await;
        assert_eq!((status, reply["error"]["code"].as_str()), (expected, code), "{method} {path}: {reply}");
        assert!(reply["error"]["message"].as_str().unwrap_or_default().contains(says), "{path}: {reply}");
    }
    // A late, repeated release by the earlier caller, with its own (ended) handle: a
    // success that says nothing was released.
    let (status, late) = sa.release_handle(LOCK, &first_handle).await;
    assert_eq!((status, late["released"].as_bool()), (200, Some(false)), "{late}");
    assert!(late["reason"].as_str().unwrap_or_default().contains("released by its owner"), "{late}");

    // Nothing changed: the Lease is untouched, the true holder still holds.
    let lease_after = env.leases().get(LOCK).await.expect("lease");
    assert_eq!(lease_after.metadata.annotations, lease_before.metadata.annotations);
    assert_eq!(
        lease_after.spec.as_ref().and_then(|s| s.holder_identity.clone()),
        Some(a.identity().id),
        "the holder was cleared"
    );
    let (status, view) = sa.hold_view(LOCK, &handle).await;
    assert_eq!((status, view["held"].as_bool(), token_of(&view)), (200, Some(true), token), "{view}");
    let line = session.expect("held", Duration::from_secs(5)).await;
    assert_eq!(token_of(&line), token);

    // Its own handle releases it; the session then ends with `released`.
    let (status, released) = sa.release_handle(LOCK, &handle).await;
    assert_eq!((status, released["released"].as_bool(), released["wasHeld"].as_bool()), (200, Some(true), Some(true)));
    let ended = session.expect("released", Duration::from_secs(5)).await;
    assert_eq!(token_of(&ended), token);
    assert!(session.next(Duration::from_secs(5)).await.is_none(), "the session stream did not end");
    sa.release_handle("billing", &handle_of(&billing)).await;
}

#[tokio::test]
async fn a_hold_taken_by_an_app_container_that_restarted_is_released() {
    let (env, _controller, _, b) = setup("own-restart", DistributedLockSpec::default()).await;
    // A pod with the sidecar: the controller lets it read itself, and no other Pod.
    let a = sidecar_pod(&env, "with-sidecar").await;
    eventually("the Pod readable by its own sidecar", Duration::from_secs(30), || async {
        if may_read_pod(&env, &a, &a.name).await? { Ok(()) } else { Err("not yet".to_owned()) }
    })
    .await;
    assert_eq!(may_read_pod(&env, &a, &b.name).await, Ok(false), "another Pod is out of reach");
    report_app_up(&env, &a).await;
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);
    let mut events_a = sa.events(LOCK).await;

    // The app takes a pod-scoped hold (the default), then crashes: the hold outlives the
    // process, as pod-scoped holds do, until the kubelet reports the restart.
    let (status, held) = sa.acquire_with(LOCK, json!({"waitSeconds": 10})).await;
    assert_eq!(status, 200, "{held}");
    let token_a = token_of(&held);
    let granted_at = jiff::Timestamp::now();
    let waiting = acquire_later(&sb, 60.0);
    wait_local_waiting(&sb).await;
    // The kubelet restarts the container in the next second, as it reports.
    let since = kubelet_time(granted_at - jiff::SignedDuration::from_secs(60));
    let restarted = kubelet_time(granted_at + jiff::SignedDuration::from_secs(1));
    let crashed =
        json!({"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": since, "finishedAt": restarted}});
    report_containers(&env, &a, json!([app_status(false, 1, json!({"running": {"startedAt": restarted}}), crashed)]))
        .await;

    let (status, next) = waiting.await.expect("join");
    assert_eq!(status, 200, "{next}");
    assert!(token_of(&next) > token_a);
    let released = events_a.expect("released", Duration::from_secs(10)).await;
    assert_eq!(token_of(&released), token_a);
    assert!(released["reason"].as_str().unwrap_or_default().contains("container app"), "{released}");
    let view = sa.view(LOCK).await;
    assert_eq!((view["held"].as_bool(), view["state"].as_str()), (Some(false), Some("free")), "{view}");
    sb.release(LOCK).await;
}

/// The documented hold-file check, as an app runs it: the deadline it vouches for, if it
/// does.
fn vouches(file: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let record: Value = serde_json::from_str(&text).ok()?;
    let until = record["validUntilBoottimeMs"].as_u64()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let (whole, hundredths) = uptime.split_whitespace().next()?.split_once('.')?;
    let now = whole.parse::<u64>().ok()? * 1000 + hundredths.parse::<u64>().ok()? * 10;
    (now < until).then_some(until)
}

/// The boot-clock reading (ms) at a wall-clock time of this machine.
fn boot_ms_at(wall: jiff::Timestamp) -> u64 {
    let boot = u64::try_from(leasehold::boottime::now().as_millis()).expect("small");
    let ago = Duration::try_from(jiff::Timestamp::now().duration_since(wall)).unwrap_or_default();
    boot.saturating_sub(u64::try_from(ago.as_millis()).expect("small"))
}

#[tokio::test]
async fn hold_mode_gives_leadership_up_when_the_app_stops_and_claims_again_when_it_is_back() {
    let (env, _controller, a, b) = setup("own-hold", fast()).await;
    for pod in [&a, &b] {
        allow_reading_own_pod(&env, pod).await;
        report_app_up(&env, pod).await;
    }
    let dir = env.log_dir();
    let (file_a, file_b) = (dir.join("hold-a.json"), dir.join("hold-b.json"));
    let hold_mode = |file: &Path| {
        vec![
            "--hold".to_owned(),
            LOCK.to_owned(),
            "--hold-file".to_owned(),
            file.display().to_string(),
            "--ready-when-holding=true".to_owned(),
            "--hold-app-down-after=1s".to_owned(),
        ]
    };
    let args_a = hold_mode(&file_a);
    let sa = env.sidecar(&a, &args_a.iter().map(String::as_str).collect::<Vec<_>>()).await;
    sa.process.wait_ready().await;
    let args_b = hold_mode(&file_b);
    let sb = env.sidecar(&b, &args_b.iter().map(String::as_str).collect::<Vec<_>>()).await;
    wait_local_waiting(&sb).await;
    // An app of a's reads the hold file as documented, all along.
    let reader = {
        let file = file_a.clone();
        tokio::spawn(async move {
            let mut last = None;
            while file.exists() {
                last = vouches(&file).or(last);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            last
        })
    };

    // a's app container stops (it crashed and waits to be restarted).
    let stopped = kubelet_time(jiff::Timestamp::now());
    let crashed = json!({"terminated": {"exitCode": 1, "finishedAt": stopped}});
    let backoff = json!({"waiting": {"reason": "CrashLoopBackOff"}});
    report_containers(&env, &a, json!([app_status(false, 1, backoff, crashed)])).await;
    let granted = granted_to(&env, &b).await;
    let last_vouched = reader.await.expect("join").expect("a's file vouched while a led");
    let grant = boot_ms_at(granted);
    assert!(last_vouched <= grant, "a's file vouched until {last_vouched} ms, after b's grant at {grant} ms");
    assert!(!file_a.exists());
    sb.process.wait_ready().await;
    // While its app is down, a does not queue again.
    let view = sa.view(LOCK).await;
    assert_eq!((view["state"].as_str(), view["localWaiters"].as_u64()), (Some("free"), Some(0)), "{view}");
    assert_eq!(sa.process.admin_get("/readyz").await.map(|r| r.0), Some(503));

    // a's app is back: a queues behind b. Then b's app stops being ready: b gives up, a leads.
    report_app_up(&env, &a).await;
    wait_local_waiting(&sa).await;
    let since = kubelet_time(jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60));
    report_containers(&env, &b, json!([app_status(false, 0, json!({"running": {"startedAt": since}}), json!({}))]))
        .await;
    granted_to(&env, &a).await;
    sa.process.wait_ready().await;
    assert!(vouches(&file_a).is_some() && !file_b.exists());
}

#[tokio::test]
async fn a_session_hold_revoked_under_a_live_app_is_given_back_only_when_the_app_lets_go() {
    let (env, _controller, a, b) = setup("own-drain", DistributedLockSpec::default()).await;
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);
    let (status, mut session) = sa.session(LOCK, json!({"waitSeconds": 10})).await;
    assert_eq!(status, 200);
    let token = token_of(&session.next(Duration::from_secs(10)).await.expect("the grant line"));
    let waiting = acquire_later(&sb, 60.0);
    wait_local_waiting(&sb).await;
    let (renewed, lease_seconds) = renewed_at(&env).await;

    // An operator forces the lock away while a's app works: the app hears `lost` at once,
    // but the lock is not handed on while the app may still act on what it was told.
    env.force_release(LOCK, "maintenance", Some(&token.to_string())).await;
    let lost = session.expect("lost", Duration::from_secs(10)).await;
    assert_eq!(token_of(&lost), token);
    let draining = env.draining(LOCK, token, Duration::from_secs(10)).await;
    let holder = draining.spec.as_ref().and_then(|s| s.holder_identity.clone());
    assert_eq!(holder, Some(a.identity().id), "the revoked holder is still named while it drains");
    let view = sa.view(LOCK).await;
    assert_eq!((view["held"].as_bool(), view["state"].as_str()), (Some(false), Some("lost")), "{view}");

    // The app lets go (its session closes): only now is the next waiter granted — long
    // before the drain would have timed out.
    let closed = jiff::Timestamp::now();
    drop(session);
    let (status, next) = waiting.await.expect("join");
    assert_eq!(status, 200, "{next}");
    let acquired = granted_to(&env, &b).await;
    assert!(acquired >= closed, "b was granted at {acquired}, before a's app let go at {closed}");
    let timeout = renewed + jiff::SignedDuration::from_secs(lease_seconds.into());
    assert!(acquired < timeout, "b was granted at {acquired}: the drain timed out ({timeout}) instead");
    sb.release(LOCK).await;
}
