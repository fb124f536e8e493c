//! The operator CLI against a real control plane: `leasehold status` (text, JSON, tables),
//! `leasehold wait`, `leasehold run`'s try-lock and namespace defaulting, and the binary
//! run as a kubectl plugin.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use leasehold::claim::Hold;
use leasehold::crd::DistributedLockSpec;
use leasehold_harness::eventually;
use tokio::process::Command;

use crate::support::{Env, LeaseholdProcess, TestPod, leasehold_bin};

const LOCK: &str = "orders";

/// `leasehold <args>` as the cluster admin, without any Pod namespace in its environment.
fn admin(env: &Env, args: &[&str]) -> Command {
    let mut command = Command::new(leasehold_bin());
    command.args(args).env("KUBECONFIG", env.cp.kubeconfig_path()).env_remove("POD_NAMESPACE").env("RUST_LOG", "warn");
    command
}

/// `leasehold <args>` with `pod`'s Pod-bound credentials.
fn as_pod(env: &Env, pod: &TestPod, args: &[&str]) -> Command {
    let kubeconfig = env.log_dir().join(format!("kubeconfig-cli-{}", pod.name));
    env.ns.kubeconfig_for_token(&pod.token, &kubeconfig).expect("kubeconfig");
    let mut command = Command::new(leasehold_bin());
    command.args(args).env("KUBECONFIG", kubeconfig).env_remove("POD_NAMESPACE").env("RUST_LOG", "warn");
    command
}

async fn output(mut command: Command) -> Output {
    command.kill_on_drop(true).output().await.expect("run leasehold")
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

struct Setup {
    env: Env,
    _controller: LeaseholdProcess,
    pods: Vec<TestPod>,
}

/// A namespace with a controller, the lock, and pods `names` allowed to claim it.
async fn setup(prefix: &str, names: &[&str]) -> Setup {
    let env = Env::new(prefix).await;
    let controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let mut pods = Vec::new();
    for name in names {
        let pod = env.pod(name).await;
        env.wait_claim_rbac(&pod).await;
        pods.push(pod);
    }
    Setup { env, _controller: controller, pods }
}

/// Waits until the LockClaim of `pod` exists (it queues).
async fn queued(env: &Env, pod: &TestPod) {
    let claims = env.claims();
    let name = pod.identity().claim_name(LOCK);
    eventually(&format!("{} queued", pod.name), Duration::from_secs(30), || async {
        match claims.get_opt(&name).await {
            Ok(Some(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Pod 0 holds the lock, renewed at least once; pods 1 and 2 wait behind it, in that order.
async fn held_with_two_waiters(s: &Setup) -> (Hold, Vec<tokio::task::JoinHandle<()>>) {
    let ns = s.env.name();
    let hold = s.pods[0].claimant(ns).acquire(LOCK, Duration::from_secs(30)).await.expect("a acquires");
    // Answered at once on its fresh claim, the hold shows `Granted` until its first
    // renewal, a retry period after the claim: from then on, `Held`.
    crate::support::watch::until(&s.env.leases(), LOCK, Duration::from_secs(30), "a's first renewal", |l| {
        leasehold::claim::edit::is_confirmed(l)
    })
    .await;
    let mut waiters = Vec::new();
    for pod in &s.pods[1..] {
        let claimant = pod.claimant(ns);
        waiters.push(tokio::spawn(async move {
            let _ = claimant.acquire(LOCK, Duration::from_secs(300)).await;
        }));
        queued(&s.env, pod).await;
    }
    (hold, waiters)
}

#[tokio::test]
async fn status_shows_the_holder_the_token_and_the_queue_in_order() {
    let s = setup("cli-status-text", &["a", "b", "c"]).await;
    let (hold, _waiters) = held_with_two_waiters(&s).await;
    let lock = format!("{}/{LOCK}", s.env.name());
    let out = output(admin(&s.env, &["status", &lock])).await;
    println!("$ leasehold status {lock}\n{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    let [a, b, c] = [&s.pods[0], &s.pods[1], &s.pods[2]];
    assert!(shown.contains("State:     Held\n"), "{shown}");
    assert!(shown.contains("Holder:    pod a\n"), "{shown}");
    assert!(shown.contains(&format!("Identity:  {}\n", a.identity().id)), "{shown}");
    assert!(shown.contains(&format!("Token:     {}\n", hold.token())), "{shown}");
    assert!(shown.contains("Queue (2 waiting):"), "{shown}");
    let b_line = shown.find("1  pod b").unwrap_or_else(|| panic!("b first in\n{shown}"));
    let c_line = shown.find("2  pod c").unwrap_or_else(|| panic!("c second in\n{shown}"));
    assert!(b_line < c_line && shown.contains(&b.identity().id) && shown.contains(&c.identity().id), "{shown}");
    assert!(shown.contains("Ready") && shown.contains("LeaseOwned"), "{shown}");
}

#[tokio::test]
async fn status_json_has_the_documented_shape() {
    let s = setup("cli-status-json", &["a", "b", "c"]).await;
    let (hold, _waiters) = held_with_two_waiters(&s).await;
    let lock = format!("{}/{LOCK}", s.env.name());
    let out = output(admin(&s.env, &["status", &lock, "-o", "json"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(json["namespace"], s.env.name());
    assert_eq!(json["lock"], LOCK);
    assert_eq!(json["state"], "Held");
    assert_eq!(json["holder"]["pod"], "a");
    assert_eq!(json["holder"]["identity"], s.pods[0].identity().id);
    assert_eq!(json["holder"]["token"], hold.token());
    assert!(json["holder"]["heldSeconds"].as_f64().is_some_and(|s| s >= 0.0), "{json}");
    let queue: Vec<(u64, &str)> = json["queue"]
        .as_array()
        .expect("queue")
        .iter()
        .map(|w| (w["position"].as_u64().expect("position"), w["pod"].as_str().expect("pod")))
        .collect();
    assert_eq!(queue, [(1, "b"), (2, "c")]);
    assert!(json["queue"][0]["waitingSeconds"].as_f64().is_some(), "{json}");
    assert_eq!(json["pendingRequests"], serde_json::json!([]));
}

#[tokio::test]
async fn status_of_a_namespace_is_a_table_of_its_locks() {
    let s = setup("cli-status-table", &["a"]).await;
    s.env.lock("payments", DistributedLockSpec::default()).await;
    let hold = s.pods[0].claimant(s.env.name()).acquire(LOCK, Duration::from_secs(30)).await.expect("a acquires");
    // The table is read from the locks' status: wait until the controller has recorded the hold.
    crate::support::watch::until(&s.env.locks(), LOCK, Duration::from_secs(30), "holder recorded", |l| {
        l.status.as_ref().and_then(|s| s.holder.as_ref()).is_some_and(|h| h.fencing_token == hold.token())
    })
    .await;
    let out = output(admin(&s.env, &["status", s.env.name()])).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Vec<&str>> = shown.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["NAMESPACE", "LOCK", "HOLDER", "TOKEN", "HELD", "WAITERS", "READY"], "{shown}");
    assert_eq!(lines[1][..4], [s.env.name(), LOCK, "a", &hold.token().to_string()], "{shown}");
    assert_eq!(lines[2][..4], [s.env.name(), "payments", "-", "-"], "{shown}");
    assert_eq!(lines.len(), 3, "{shown}");
}

#[tokio::test]
async fn wait_times_out_with_75_while_the_lock_is_held() {
    let s = setup("cli-wait-timeout", &["a"]).await;
    let _hold = s.pods[0].claimant(s.env.name()).acquire(LOCK, Duration::from_secs(30)).await.expect("a acquires");
    let lock = format!("{}/{LOCK}", s.env.name());
    let out = output(admin(&s.env, &["wait", &lock, "--for", "free", "--timeout", "1s"])).await;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("was not free within 1s"), "{}", text(&out));
}

#[tokio::test]
async fn wait_exits_0_once_the_lock_is_granted_to_the_claimant_and_once_it_is_free() {
    let s = setup("cli-wait-free", &["a"]).await;
    let lock = format!("{}/{LOCK}", s.env.name());
    let granted =
        admin(&s.env, &["wait", &lock, "--for", "granted-to=a", "--timeout", "60s"]).kill_on_drop(true).spawn();
    let granted = granted.expect("start wait");
    let hold = s.pods[0].claimant(s.env.name()).acquire(LOCK, Duration::from_secs(30)).await.expect("a acquires");
    let out = granted.wait_with_output().await.expect("wait ends");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let free = admin(&s.env, &["wait", &lock, "--for", "free", "--timeout", "60s"]).kill_on_drop(true).spawn();
    let free = free.expect("start wait");
    hold.release().await;
    let out = free.wait_with_output().await.expect("wait ends");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[tokio::test]
async fn wait_on_a_lock_that_does_not_exist_exits_77() {
    let s = setup("cli-wait-unknown", &[]).await;
    let out = output(admin(&s.env, &["wait", &format!("{}/nope", s.env.name()), "--for", "free"])).await;
    assert_eq!(out.status.code(), Some(77), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"), "{}", text(&out));
}

/// A marker file the command writes: whether it ran.
fn touch(dir: &Path, name: &str) -> (String, std::path::PathBuf) {
    let path = dir.join(name);
    (format!("touch {}", path.display()), path)
}

#[tokio::test]
async fn run_with_wait_0s_or_try_on_a_free_lock_runs_the_command() {
    let s = setup("cli-run-try-free", &["a"]).await;
    let lock = format!("{}/{LOCK}", s.env.name());
    for (i, spelling) in [["--wait", "0s"].as_slice(), ["--try"].as_slice()].into_iter().enumerate() {
        let (script, ran) = touch(&s.env.log_dir(), &format!("ran-{i}"));
        let args: Vec<&str> = ["run", lock.as_str()]
            .into_iter()
            .chain(spelling.iter().copied())
            .chain(["--", "sh", "-c", &script])
            .collect();
        let out = output(as_pod(&s.env, &s.pods[0], &args)).await;
        assert_eq!(out.status.code(), Some(0), "{spelling:?}: {}", text(&out));
        assert!(ran.exists(), "{spelling:?}: the command did not run: {}", text(&out));
    }
}

#[tokio::test]
async fn run_try_on_a_held_lock_exits_75_without_running_the_command() {
    let s = setup("cli-run-try-held", &["a", "b"]).await;
    let _hold = s.pods[1].claimant(s.env.name()).acquire(LOCK, Duration::from_secs(30)).await.expect("b acquires");
    let (script, ran) = touch(&s.env.log_dir(), "ran");
    let lock = format!("{}/{LOCK}", s.env.name());
    let out = output(as_pod(&s.env, &s.pods[0], &["run", &lock, "--try", "--", "sh", "-c", &script])).await;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert!(!ran.exists(), "the command ran without the lock");
    // The try left nothing queued.
    let claim = s.env.claims().get_opt(&s.pods[0].identity().claim_name(LOCK)).await.expect("read the claim");
    assert!(claim.is_none(), "a's claim outlived the try: {claim:?}");
}

#[tokio::test]
async fn run_takes_the_lock_namespace_from_pod_namespace_and_names_what_is_missing() {
    let s = setup("cli-run-namespace", &["a"]).await;
    let (script, ran) = touch(&s.env.log_dir(), "ran");
    let mut in_pod = as_pod(&s.env, &s.pods[0], &["run", LOCK, "--wait", "10s", "--", "sh", "-c", &script]);
    in_pod.env("POD_NAMESPACE", s.env.name());
    let out = output(in_pod).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(ran.exists(), "the command did not run: {}", text(&out));
    // Outside a Pod (no POD_NAMESPACE; this machine has no service account file) a bare name is refused.
    assert!(!Path::new(leasehold::cli::target::NAMESPACE_FILE).exists(), "this test needs a machine outside a Pod");
    let out = output(as_pod(&s.env, &s.pods[0], &["run", LOCK, "--", "true"])).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("POD_NAMESPACE") && stderr.contains(leasehold::cli::target::NAMESPACE_FILE), "{stderr}");
}

/// A wait that runs out while the first claim is being written (here: no wait at all)
/// ends the acquisition: it once waited forever for the claim write it interrupted.
/// (Whether a claim is left depends on whether the interrupted create reached the
/// apiserver before the withdrawal's delete; the controller drops such a claim at its TTL.)
#[tokio::test]
async fn an_acquisition_whose_wait_ends_during_its_first_claim_returns() {
    let s = setup("cli-acquire-zero", &["a"]).await;
    let acquired =
        tokio::time::timeout(Duration::from_secs(30), s.pods[0].claimant(s.env.name()).acquire(LOCK, Duration::ZERO))
            .await
            .expect("the acquisition returns");
    assert!(
        matches!(acquired, Err(leasehold::claim::AcquireError::Timeout { .. })),
        "{:?}",
        acquired.map(|h| h.token())
    );
}

/// Linked as `kubectl-leasehold` on PATH, the binary answers `kubectl leasehold status`
/// (kubectl runs the plugin with the rest of the arguments), and its usage says
/// `kubectl leasehold`.
#[tokio::test]
async fn the_binary_works_as_a_kubectl_plugin() {
    let s = setup("cli-plugin", &["a"]).await;
    let hold = s.pods[0].claimant(s.env.name()).acquire(LOCK, Duration::from_secs(30)).await.expect("a acquires");
    let plugins = s.env.log_dir().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin directory");
    let link = plugins.join("kubectl-leasehold");
    if !link.exists() {
        std::os::unix::fs::symlink(leasehold_bin(), &link).expect("link kubectl-leasehold");
    }
    let lock = format!("{}/{LOCK}", s.env.name());
    let path = format!("{}:{}", plugins.display(), std::env::var("PATH").unwrap_or_default());
    let token = format!("Token:     {}\n", hold.token());

    let mut direct = Command::new(&link);
    direct.args(["status", &lock]).env("KUBECONFIG", s.env.cp.kubeconfig_path()).env_remove("POD_NAMESPACE");
    let out = output(direct).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&token), "{}", text(&out));

    let mut kubectl = Command::new(s.env.cp.bin_dir().join("kubectl"));
    kubectl
        .args(["leasehold", "status", &lock])
        .env("PATH", &path)
        .env("KUBECONFIG", s.env.cp.kubeconfig_path())
        .env_remove("POD_NAMESPACE");
    let out = output(kubectl).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&token), "{}", text(&out));

    let mut usage = Command::new(s.env.cp.bin_dir().join("kubectl"));
    usage.args(["leasehold", "status", "--help"]).env("PATH", &path);
    let out = output(usage).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: kubectl leasehold status"), "{}", text(&out));
}

/// `leasehold check` on a namespace's installation (the webhooks registered for it, the
/// guard bound to it): every line passes, and each named line is there.
#[tokio::test]
async fn check_passes_with_webhooks_certificates_and_guard_in_place() {
    let env = Env::new("cli-check-ok").await;
    let _controller = env.webhook_controller(None, &[]).await;
    env.apply_lease_guard(&format!("system:serviceaccount:{}:leasehold-controller", env.name())).await;
    let (lease_guard, claim_guard) =
        (format!("leasehold-lease-guard-{}", env.name()), format!("leasehold-claim-guard-{}", env.name()));
    let configuration = format!("leasehold-{}", env.name());
    let out = output(admin(
        &env,
        &[
            "check",
            "--webhook-configuration",
            &configuration,
            "--probe-namespace",
            env.name(),
            "--election-name=",
            "--guard-policy",
            &lease_guard,
            "--guard-policy",
            &claim_guard,
        ],
    ))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    for line in [
        "ok    webhook certificates: 4 CA bundles valid".to_owned(),
        "ok    controller leader: not checked".to_owned(),
        format!("ok    lease guard: policies and bindings present: {lease_guard}, {claim_guard}"),
        "ok    webhook inject.leasehold.dev: reached".to_owned(),
    ] {
        assert!(shown.contains(&line), "{line:?} in\n{shown}");
    }
}

/// A leading controller passes the leader check; with no controller (no election Lease)
/// and no guard, `check` fails, names both, says how to fix them, and exits 1.
#[tokio::test]
async fn check_names_a_missing_leader_and_guard_and_exits_1() {
    let led = Env::new("cli-check-leader").await;
    let _controller = led.controller(&[]).await;
    let args = |env: &Env| {
        let ns = env.name().to_owned();
        vec![
            "check".to_owned(),
            format!("--controller-namespace={ns}"),
            format!("--probe-namespace={ns}"),
            format!("--guard-policy=leasehold-lease-guard-{ns}"),
        ]
    };
    let led_args = args(&led);
    let out = output(admin(&led, &led_args.iter().map(String::as_str).collect::<Vec<_>>())).await;
    let shown = String::from_utf8_lossy(&out.stdout);
    let leader = shown.lines().find(|l| l.contains("controller leader:")).unwrap_or_else(|| panic!("{shown}"));
    assert!(leader.starts_with("ok") && leader.contains("leads"), "{shown}");

    let bare = Env::new("cli-check-bare").await;
    let bare_args = args(&bare);
    let out = output(admin(&bare, &bare_args.iter().map(String::as_str).collect::<Vec<_>>())).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    let after = |what: &str| {
        let mut lines = shown.lines().skip_while(|l| !l.contains(what));
        (lines.next().unwrap_or_default().to_owned(), lines.next().unwrap_or_default().to_owned())
    };
    let (leader, fix) = after("controller leader:");
    assert!(leader.starts_with("FAIL") && leader.contains("no replica has ever led"), "{shown}");
    assert!(fix.trim_start().starts_with("fix: is the controller Deployment running?"), "{shown}");
    let (guard, fix) = after("lease guard:");
    assert!(
        guard.starts_with("FAIL") && guard.contains("missing ValidatingAdmissionPolicy leasehold-lease-guard-"),
        "{shown}"
    );
    assert!(fix.trim_start().starts_with("fix: "), "{shown}");
}

/// A `--grace` longer than the lock's timing allows (half of 15 s − 10 s with the
/// defaults) is refused before anything is claimed: exit 2, the command not run.
#[tokio::test]
async fn run_refuses_a_grace_the_lock_does_not_allow_before_claiming() {
    let s = setup("cli-run-grace", &["a"]).await;
    let (script, ran) = touch(&s.env.log_dir(), "ran");
    let lock = format!("{}/{LOCK}", s.env.name());
    let out = output(as_pod(&s.env, &s.pods[0], &["run", &lock, "--grace", "3s", "--", "sh", "-c", &script])).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most 2.5s"), "{}", text(&out));
    assert!(!ran.exists(), "the command ran");
    let claim = s.env.claims().get_opt(&s.pods[0].identity().claim_name(LOCK)).await.expect("read the claim");
    assert!(claim.is_none(), "a claim was made: {claim:?}");
    // A grace within the margin runs the command.
    let out = output(as_pod(&s.env, &s.pods[0], &["run", &lock, "--grace", "1s", "--", "sh", "-c", &script])).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(ran.exists(), "the command did not run: {}", text(&out));
}
