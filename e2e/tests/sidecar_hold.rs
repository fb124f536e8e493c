//! Hold mode cannot outlive the hold: after the holding sidecar is killed, frozen or
//! restarted, neither its hold file (by the check `examples/leader-election/holding.sh`
//! documents), nor its readiness, nor its API says "leader" once another pod is granted.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use serde_json::Value;

use crate::controller::fast;
use crate::support::watch::until;
use crate::support::{Env, Sidecar, TestPod};

const LOCK: &str = "orders";

/// The documented shell check, run on `file`: does it say this pod holds the lock?
fn holding(file: &Path) -> bool {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/leader-election/holding.sh");
    let status = Command::new("sh")
        .arg("-c")
        .arg(". \"$1\" && leasehold_holding")
        .arg("sh")
        .arg(&script)
        .env("LEASEHOLD_HOLD_FILE", file)
        .status()
        .expect("run sh");
    status.success()
}

/// The hold file's record, if there is one.
fn record(file: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(file).ok()?;
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text}", file.display())))
}

fn valid_until_ms(file: &Path) -> u64 {
    let record = record(file).unwrap_or_else(|| panic!("no hold file at {}", file.display()));
    record["validUntilBoottimeMs"].as_u64().unwrap_or_else(|| panic!("no validUntilBoottimeMs in {record}"))
}

/// The boot clock now, in milliseconds, as the documented check reads it: `/proc/uptime`.
fn uptime_ms() -> u64 {
    let text = std::fs::read_to_string("/proc/uptime").expect("/proc/uptime");
    let seconds = text.split_whitespace().next().expect("a field");
    let (whole, hundredths) = seconds.split_once('.').expect("two decimals");
    whole.parse::<u64>().expect("seconds") * 1000 + hundredths.parse::<u64>().expect("hundredths") * 10
}

/// Where a wall-clock time of this machine (a Lease's acquireTime, written by the local
/// controller) falls on the boot clock, in milliseconds.
fn boot_ms_at(wall: jiff::Timestamp) -> u64 {
    let (boot, now) = (uptime_ms(), jiff::Timestamp::now());
    let ago = Duration::try_from(now.duration_since(wall)).unwrap_or_default();
    boot.saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX))
}

fn hold_args(file: &Path) -> Vec<String> {
    vec![
        "--hold".into(),
        LOCK.into(),
        "--hold-file".into(),
        file.display().to_string(),
        "--ready-when-holding=true".into(),
    ]
}

async fn hold_mode_sidecar(env: &Env, pod: &TestPod, file: &Path) -> Sidecar {
    let args = hold_args(file);
    env.sidecar(pod, &args.iter().map(String::as_str).collect::<Vec<_>>()).await
}

/// Two pods in hold mode on a fast lock: `a` holds (ready, its file valid through
/// several renewals), `b` waits.
async fn a_holds_b_waits(
    prefix: &str,
) -> (Env, crate::support::LeaseholdProcess, [TestPod; 2], [Sidecar; 2], [PathBuf; 2]) {
    let env = Env::new(prefix).await;
    let controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, fast()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let dir = env.log_dir();
    let (file_a, file_b) = (dir.join("hold-a.json"), dir.join("hold-b.json"));
    let sa = hold_mode_sidecar(&env, &a, &file_a).await;
    sa.process.wait_ready().await;
    assert!(holding(&file_a), "the holder's file is valid by the documented check: {:?}", record(&file_a));
    let first = valid_until_ms(&file_a);
    // The file's deadline follows the renewals (lease 3 s, deadline 2 s, retry 1 s): after
    // three renewals it is still valid, with a later deadline.
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
    leasehold_harness::eventually("the hold file follows the renewals", Duration::from_secs(5), || async {
        if holding(&file_a) && valid_until_ms(&file_a) > first + 1_000 {
            Ok(())
        } else {
            Err(format!("{:?}", record(&file_a)))
        }
    })
    .await;
    let sb = hold_mode_sidecar(&env, &b, &file_b).await;
    leasehold_harness::eventually("b queued", Duration::from_secs(10), || async {
        let view = sb.view(LOCK).await;
        if view["state"] == "waiting" { Ok(()) } else { Err(view.to_string()) }
    })
    .await;
    assert!(!holding(&file_b));
    (env, controller, [a, b], [sa, sb], [file_a, file_b])
}

/// Waits until `pod` is granted the lock; returns the grant's acquireTime.
async fn granted_to(env: &Env, pod: &TestPod) -> jiff::Timestamp {
    let id = pod.identity().id;
    let lease = until(&env.leases(), LOCK, Duration::from_secs(30), "the grant to b", |l: &Lease| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(id.as_str())
    })
    .await;
    lease.spec.and_then(|s| s.acquire_time).expect("a grant has an acquireTime").0
}

#[tokio::test]
async fn a_killed_hold_mode_sidecar_leaves_a_file_that_stops_vouching_before_the_next_grant() {
    let (env, _controller, [_a, b], [mut sa, sb], [file_a, file_b]) = a_holds_b_waits("hold-kill").await;
    sa.process.kill();
    let granted = granted_to(&env, &b).await;
    // Nobody removed a's file (its sidecar is dead), but it stopped vouching for the hold
    // before b was granted, and the documented check says so.
    let until_a = valid_until_ms(&file_a);
    let grant = boot_ms_at(granted);
    assert!(until_a <= grant, "a's file was valid until {until_a} ms, after b's grant at {grant} ms");
    assert!(!holding(&file_a), "a's file still says it holds: {:?}", record(&file_a));
    assert!(sa.process.admin_get("/readyz").await.is_none(), "a dead sidecar answers readiness");
    sb.process.wait_ready().await;
    assert!(holding(&file_b), "{:?}", record(&file_b));
}

#[tokio::test]
async fn a_frozen_hold_mode_sidecar_never_says_leader_after_the_next_grant() {
    let (env, _controller, [_a, b], [sa, sb], [file_a, file_b]) = a_holds_b_waits("hold-freeze").await;
    sa.process.signal(libc::SIGSTOP);
    let granted = granted_to(&env, &b).await;
    let until_a = valid_until_ms(&file_a);
    let grant = boot_ms_at(granted);
    assert!(until_a <= grant, "a's file was valid until {until_a} ms, after b's grant at {grant} ms");
    assert!(!holding(&file_a), "a's file still says it holds: {:?}", record(&file_a));
    sb.process.wait_ready().await;

    sa.process.signal(libc::SIGCONT);
    // The first answers after thawing already say "not the leader".
    let ready = sa.process.admin_get("/readyz").await;
    assert_eq!(ready.as_ref().map(|r| r.0), Some(503), "{ready:?}");
    let view = sa.view(LOCK).await;
    assert_eq!(view["held"].as_bool(), Some(false), "{view}");
    // The file goes, and until it does it never says "held".
    leasehold_harness::eventually("a's hold file removed", Duration::from_secs(10), || async {
        assert!(!holding(&file_a), "a's file says it holds after b's grant: {:?}", record(&file_a));
        if file_a.exists() { Err(format!("{:?}", record(&file_a))) } else { Ok(()) }
    })
    .await;
    // a queues again behind b, which holds for life: a stays unready and not holding.
    leasehold_harness::eventually("a queued again", Duration::from_secs(10), || async {
        let view = sa.view(LOCK).await;
        if view["state"] == "waiting" { Ok(()) } else { Err(view.to_string()) }
    })
    .await;
    assert_eq!(sa.process.admin_get("/readyz").await.map(|r| r.0), Some(503));
    assert_eq!(sa.view(LOCK).await["held"].as_bool(), Some(false));
    assert!(!file_a.exists() && holding(&file_b));
}

#[tokio::test]
async fn a_restarted_sidecar_gives_its_predecessors_hold_back_only_once_every_answer_it_gave_ran_out() {
    let (env, _controller, [a, b], [mut sa, _sb], [file_a, _file_b]) = a_holds_b_waits("hold-respawn").await;
    sa.process.kill();
    // What the killed sidecar last vouched for: its apps may count on the hold until then.
    let until_a = valid_until_ms(&file_a);
    // The container restarts at once and finds its own pod's confirmed hold: it must not
    // hand it on (nor let the controller) before that deadline.
    let _restarted = hold_mode_sidecar(&env, &a, &file_a).await;
    let grant = boot_ms_at(granted_to(&env, &b).await);
    assert!(until_a <= grant, "a's predecessor vouched until {until_a} ms, after b's grant at {grant} ms");
}

#[tokio::test]
async fn a_restarted_hold_mode_sidecar_removes_the_file_it_left_before_anything_else() {
    let (env, _controller, [a, b], [mut sa, _sb], [file_a, _file_b]) = a_holds_b_waits("hold-restart").await;
    sa.process.kill();
    assert!(file_a.exists(), "the killed sidecar's file is left behind");
    // The container restarts (same pod, same volume): healthy means the file is gone.
    let restarted = hold_mode_sidecar(&env, &a, &file_a).await;
    assert!(!file_a.exists(), "the restarted sidecar kept its predecessor's file: {:?}", record(&file_a));
    granted_to(&env, &b).await;
    let view = restarted.view(LOCK).await;
    assert_eq!(view["held"].as_bool(), Some(false), "{view}");
    assert!(!file_a.exists() && !holding(&file_a));
    assert_eq!(restarted.process.admin_get("/readyz").await.map(|r| r.0), Some(503));
}
