//! `leasehold run` answers for the command's whole process tree: on loss of the hold, on
//! SIGTERM, when `run` itself is killed or frozen, and when the command exits leaving
//! processes behind, nothing of the command runs on unlocked.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::DeleteParams;
use leasehold::crd::DistributedLockSpec;
use leasehold_harness::{Fault, Supervised, eventually};

use crate::controller::fast;
use crate::sidecar_owner::setup;
use crate::support::watch::until;
use crate::support::{Env, TestPod, leasehold_bin};

const LOCK: &str = "orders";

/// A `sleep` argument no other test uses: the processes of this test's command are the
/// ones running `sleep <marker>`.
fn marker(test: u32) -> String {
    format!("{}{:02}", 100_000 + std::process::id(), test)
}

/// The live (not zombie) processes running `sleep <marker>`.
fn alive(marker: &str) -> Vec<u32> {
    let expected = format!("sleep\0{marker}\0");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        // The state letter follows the command name, which is in parentheses.
        let live = std::fs::read_to_string(entry.path().join("stat")).ok().is_some_and(|stat| {
            let state = stat.rfind(')').and_then(|end| stat[end + 1..].split_whitespace().next());
            state.is_some_and(|s| s != "Z" && s != "X")
        });
        if live && cmdline == expected.as_bytes() {
            found.push(pid);
        }
    }
    found
}

/// A shell command that writes, to `result`, the processes running `sleep <marker>` at the
/// moment it runs (what a next holder's command would overlap with).
fn record_overlap(marker: &str, result: &std::path::Path) -> String {
    format!(
        "for f in /proc/[0-9]*/cmdline; do c=$(tr '\\0' ' ' < \"$f\" 2>/dev/null); \
         case \"$c\" in \"sleep {marker} \") echo \"$f\";; esac; done > {}",
        result.display()
    )
}

fn run_command(env: &Env, pod: &TestPod, wait: &str, script: &str) -> Command {
    run_command_via(env, pod, None, wait, script)
}

/// [`run_command`] reaching the apiserver at `server` (a fault proxy) when given.
fn run_command_via(env: &Env, pod: &TestPod, server: Option<&str>, wait: &str, script: &str) -> Command {
    let kubeconfig = env.log_dir().join(format!("kubeconfig-run-{}", pod.name));
    match server {
        Some(server) => env.ns.kubeconfig_for_token_via(&pod.token, server, &kubeconfig),
        None => env.ns.kubeconfig_for_token(&pod.token, &kubeconfig),
    }
    .expect("kubeconfig");
    let mut command = Command::new(leasehold_bin());
    command
        .args(["run", "--lock", &format!("{}/{LOCK}", env.name()), "--wait", wait, "--", "sh", "-c", script])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn");
    command
}

/// Starts `leasehold run` as a supervised process (log in the test's directory).
fn start_run(env: &Env, pod: &TestPod, name: &str, script: &str) -> Supervised {
    let log = env.log_dir().join(format!("run-{name}.log"));
    Supervised::spawn(name, run_command(env, pod, "30s", script), &log).expect("start leasehold run")
}

async fn wait_alive(marker: &str, count: usize) {
    eventually(&format!("{count} processes running sleep {marker}"), Duration::from_secs(30), || async {
        let found = alive(marker);
        if found.len() == count { Ok(()) } else { Err(format!("{found:?}")) }
    })
    .await;
}

/// `run` for pod b, whose command records what of a's command is still running when it
/// starts; returns that record (empty: nothing overlapped).
async fn next_holder_sees(env: &Env, b: &TestPod, marker: &str) -> String {
    let result = env.log_dir().join(format!("overlap-{marker}"));
    let mut next = start_run(env, b, "run-b", &record_overlap(marker, &result));
    let status = next.wait_exit(Duration::from_secs(60)).await.expect("b's run finishes");
    assert_eq!(status.code(), Some(0), "{}", next.log_tail(20));
    std::fs::read_to_string(&result).expect("b's command ran")
}

#[tokio::test]
async fn losing_the_hold_stops_the_whole_tree_before_run_exits() {
    let (env, _controller, a, _b) = setup("run-tree-lost", fast()).await;
    let m = marker(1);
    // A background job, a job that ignores SIGTERM (only SIGKILL ends it), a process in a
    // session of its own (out of reach of a group signal), and a foreground child.
    let script = format!("sleep {m} & (trap '' TERM; exec sleep {m}) & setsid sleep {m} & sleep {m}");
    let mut run = start_run(&env, &a, "run-a", &script);
    wait_alive(&m, 4).await;
    env.leases().delete(LOCK, &DeleteParams::default()).await.expect("delete the lock lease");
    let status = run.wait_exit(Duration::from_secs(30)).await.expect("run ends after the loss");
    // Checked the moment run has exited: nothing of the command is left.
    assert_eq!(alive(&m), Vec::<u32>::new(), "processes outlived the hold; log:\n{}", run.log_tail(20));
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{}", run.log_tail(20));
    assert!(run.log_tail(20).contains("lost"), "{}", run.log_tail(20));
}

#[tokio::test]
async fn sigterm_of_run_stops_the_whole_tree_and_passes_the_status_through() {
    let (env, _controller, a, _b) = setup("run-tree-term", DistributedLockSpec::default()).await;
    let m = marker(2);
    let mut run = start_run(&env, &a, "run-a", &format!("sleep {m} & setsid sleep {m} & sleep {m} & wait"));
    wait_alive(&m, 3).await;
    run.signal(libc::SIGTERM);
    let status = run.wait_exit(Duration::from_secs(30)).await.expect("run ends after SIGTERM");
    assert_eq!(alive(&m), Vec::<u32>::new(), "processes outlived run; log:\n{}", run.log_tail(20));
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{}", run.log_tail(20));
    // The lock was released: the Lease names nobody.
    let lease = env.leases().get(LOCK).await.expect("lease");
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None);
}

#[tokio::test]
async fn sigkill_of_run_kills_its_command_and_grandchildren_before_the_next_holder_starts() {
    let (env, _controller, a, b) = setup("run-tree-kill", fast()).await;
    let m = marker(3);
    let run = start_run(&env, &a, "run-a", &format!("sleep {m} & sleep {m}"));
    wait_alive(&m, 2).await;
    run.kill_and_reap();
    let overlap = next_holder_sees(&env, &b, &m).await;
    assert_eq!(overlap, "", "the next holder's command ran beside the killed run's command");
    assert_eq!(alive(&m), Vec::<u32>::new());
}

#[tokio::test]
async fn a_frozen_run_cannot_leave_its_command_running_past_its_hold() {
    let (env, _controller, a, b) = setup("run-tree-freeze", fast()).await;
    let m = marker(4);
    let mut run = start_run(&env, &a, "run-a", &format!("sleep {m} & sleep {m}"));
    wait_alive(&m, 2).await;
    let leases = env.leases();
    let holder = a.identity().id;
    until(&leases, LOCK, Duration::from_secs(10), "a holds", |l: &Lease| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(holder.as_str())
    })
    .await;
    run.signal(libc::SIGSTOP);
    let overlap = next_holder_sees(&env, &b, &m).await;
    assert_eq!(overlap, "", "the next holder's command ran beside the frozen run's command");
    run.signal(libc::SIGCONT);
    let status = run.wait_exit(Duration::from_secs(30)).await.expect("the thawed run ends");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{}", run.log_tail(20));
    assert!(run.log_tail(20).contains("not renewed by its deadline"), "{}", run.log_tail(20));
    assert_eq!(alive(&m), Vec::<u32>::new());
}

#[tokio::test]
async fn what_the_command_leaves_running_is_stopped_before_the_release_and_its_status_passes_through() {
    let (env, _controller, a, _b) = setup("run-tree-leftover", DistributedLockSpec::default()).await;
    let m = marker(5);
    // The command starts two jobs, waits for the test's word (a FIFO), and exits 4.
    let go = env.log_dir().join("go");
    assert!(Command::new("mkfifo").arg(&go).status().expect("mkfifo").success());
    let script = format!("sleep {m} & setsid sleep {m} & read word < {}; exit 4", go.display());
    let mut run = start_run(&env, &a, "run-a", &script);
    wait_alive(&m, 2).await;
    tokio::task::spawn_blocking(move || std::fs::write(go, "go\n")).await.expect("join").expect("write the FIFO");
    let status = run.wait_exit(Duration::from_secs(30)).await.expect("run ends when the command exits");
    assert_eq!(
        alive(&m),
        Vec::<u32>::new(),
        "the command's leftovers outlived the release; log:\n{}",
        run.log_tail(20)
    );
    assert_eq!(status.code(), Some(4), "{}", run.log_tail(20));
    let lease = env.leases().get(LOCK).await.expect("lease");
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None, "released after the command's tree ended");
}

#[tokio::test]
async fn run_started_while_its_apiserver_is_unreachable_waits_for_it_and_runs_the_command() {
    let (env, _controller, a, _b) = setup("run-unreachable", DistributedLockSpec::default()).await;
    let (proxy, server) = env.apiserver_proxy();
    proxy.set(Fault::Drop);
    let ran = env.log_dir().join("run-unreachable-token");
    let script = format!("echo \"$LEASEHOLD_FENCING_TOKEN\" > {}", ran.display());
    let log = env.log_dir().join("run-unreachable.log");
    let mut run =
        Supervised::spawn("run-a", run_command_via(&env, &a, Some(&server), "60s", &script), &log).expect("start run");

    // Its first request (who are we?) finds no apiserver; it is tried again within --wait.
    leasehold_harness::logged(&log, "failed to learn who we are; trying again", Duration::from_secs(30)).await;

    proxy.set(Fault::Pass);
    let status = run.wait_exit(Duration::from_secs(60)).await.expect("run ends");
    assert_eq!(status.code(), Some(0), "{}", run.log_tail(20));
    let token: i64 = std::fs::read_to_string(&ran).expect("the command ran").trim().parse().expect("a fencing token");
    let lease = env.leases().get(LOCK).await.expect("the lock Lease");
    assert!(
        leasehold::lease::token::of_lease(&lease).is_some_and(|t| t >= token),
        "the command ran under a token the lock granted: {token}"
    );
}
