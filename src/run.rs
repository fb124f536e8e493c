//! `leasehold run`: run one command under a lock.
//!
//! Acquires with the caller's own credentials, then starts the command through a guard
//! ([`guard`]: a second `leasehold` process, in a process group of its own, subreaper of
//! the command's tree) with `LEASEHOLD_FENCING_TOKEN`, `LEASEHOLD_SLOT` and
//! `LEASEHOLD_LOCK` set, and renews in-process. After every renewal it passes the hold's validity deadline (on
//! `CLOCK_BOOTTIME`) to the guard, which stops the command by itself if that deadline
//! passes — so neither a `run` that is killed nor one that is frozen leaves the command
//! running unlocked. If the hold is lost, or `run` is told to stop, the guard sends the
//! whole tree SIGTERM and then SIGKILL after the grace; `run` kills the guard's process
//! group itself if the guard has not finished shortly after. The kill lands before the
//! lock can be granted again: the hold self-fences at the renew deadline and the
//! controller waits a full lease duration from the last renewal it saw; the grace
//! (`--grace`) is at most, and by default, half of that margin, and every timer here
//! counts time the host was suspended. The lock is
//! released when the command's tree is gone, and the command's exit status is passed
//! through; `run`'s own outcomes have the codes of [`EXIT_CODES`].

pub mod channel;
pub mod guard;
pub mod tree;

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::boottime::{self, BootTimer};
use crate::claim::{AcquireError, Claimant, Hold, HoldStatus};
use crate::crd::{ClaimMode, MANAGER_CLI};
use crate::duration::parse_duration;
use crate::lease::cas::REQUEST_TIMEOUT;
use crate::lease::{Identity, retry};
use channel::Message;

/// Exit status when Leasehold itself failed (the API server unreachable, an unexpected
/// answer).
pub const EXIT_FAILED: i32 = 1;
/// Exit status for arguments that cannot work (as clap's own usage errors).
pub const EXIT_USAGE: i32 = 2;
/// Exit status when the lock could not be had in time, or `wait`'s condition did not hold
/// in time (EX_TEMPFAIL).
pub const EXIT_NOT_ACQUIRED: i32 = 75;
/// Exit status when the lock cannot be claimed (or read) at all: unknown lock, forbidden
/// (EX_NOPERM).
pub const EXIT_REFUSED: i32 = 77;
/// Exit status when the child could not be started (as shells do).
pub const EXIT_CANNOT_RUN: i32 = 127;
/// Exit status when `run` was told to stop (SIGINT, SIGTERM) before it held the lock.
pub const EXIT_INTERRUPTED: i32 = 130;

/// The exit codes of `run` and `wait`, for their long help (and the docs, which repeat it).
pub const EXIT_CODES: &str = "\
Exit codes (run and wait):
  0       run: the command exited 0; wait: the condition holds
  1       Leasehold failed (API server unreachable, unexpected answer)
  2       bad arguments (usage), or no namespace for a bare lock name outside a Pod
  75      the lock was not acquired within --wait (run); the condition did not hold within --timeout (wait)
  77      the lock does not exist, or you may not claim (run) or read (wait) it
  127     run: the command could not be started
  130     run: interrupted (SIGINT/SIGTERM) before the lock was held
  128+N   run: the command was killed by signal N — 143 (SIGTERM) when the hold was lost or run was told to stop
  other   run: the command's own exit status, passed through";

/// How long a try-lock (`--try`, `--wait 0s`) gives the grant to arrive: the controller
/// must see the claim and grant, and we confirm — one round trip each, never instant. The
/// same as the sidecar API's `waitSeconds: 0`.
pub const TRY_WAIT: Duration = crate::claim::MIN_WAIT;

/// `leasehold run` arguments.
#[derive(Clone, Debug, clap::Args)]
#[command(after_long_help = EXIT_CODES)]
pub struct Config {
    /// The lock: `<namespace>/<name>`, or `<name>` inside a Pod (its own namespace, from
    /// `POD_NAMESPACE` or the service account's namespace file).
    #[arg(value_name = "LOCK", required_unless_present = "lock", conflicts_with = "lock")]
    pub target: Option<String>,
    /// The lock, as the positional argument (kept for existing scripts).
    #[arg(long = "lock", value_name = "LOCK")]
    pub lock: Option<String>,
    /// How long to wait for the lock. `0s` is a try-lock: it still gives the grant one
    /// second to arrive, and fails (exit 75) if the lock is held meanwhile.
    #[arg(long, default_value = "30s", value_parser = parse_duration, conflicts_with = "try_lock")]
    pub wait: Duration,
    /// Try-lock: the same as `--wait 0s`.
    #[arg(long = "try")]
    pub try_lock: bool,
    /// Between SIGTERM and SIGKILL when the command must stop (hold lost, or `run`
    /// signalled). At most, and by default, half the margin between the lock's
    /// renewDeadlineSeconds and leaseDurationSeconds, so the command is gone before the
    /// lock can be granted again.
    #[arg(long, value_parser = parse_duration)]
    pub grace: Option<Duration>,
    /// `read` (the default): hold one permit of the lock, beside other readers; `write`:
    /// hold every permit, alone (on a mutex they are the same).
    #[arg(long, default_value = "read", value_parser = parse_mode)]
    pub mode: ClaimMode,
    /// The command to run, after `--`.
    #[arg(required = true, last = true)]
    pub command: Vec<String>,
}

impl Config {
    /// How long to wait for the grant.
    pub fn acquire_wait(&self) -> Duration {
        if self.try_lock { TRY_WAIT } else { self.wait.max(TRY_WAIT) }
    }
}

/// `--mode`: `read` or `write`.
fn parse_mode(value: &str) -> Result<ClaimMode, String> {
    match value {
        "read" => Ok(ClaimMode::Read),
        "write" => Ok(ClaimMode::Write),
        other => Err(format!("--mode {other:?}: expected read or write")),
    }
}

/// A `--grace` longer than the lock's timing allows.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "--grace {requested:?} is longer than lock {lock} allows: at most {limit:?}, half the margin between its renewDeadlineSeconds and leaseDurationSeconds (the command must be gone before the lock can be granted again)"
)]
pub struct GraceError {
    /// The lock.
    pub lock: String,
    /// What was asked.
    pub requested: Duration,
    /// The longest grace the timing allows.
    pub limit: Duration,
}

/// Parses `<namespace>/<name>`.
pub fn parse_lock(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(format!("{s:?} is not <namespace>/<name>")),
    }
}

/// The exit code to pass through for a child's status (128 + signal when killed).
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// The grace between SIGTERM and SIGKILL, and when `run` kills the guard's group itself:
/// the grace asked for (by default and at most half of the margin between self-fencing
/// (renew deadline) and the earliest possible re-grant (lease duration)), and a quarter of
/// the margin after it — both before the margin runs out.
fn stop_timing(
    timing: crate::lease::Timing,
    requested: Option<Duration>,
    lock: &str,
) -> Result<(Duration, Duration), GraceError> {
    let margin = timing.lease_duration.saturating_sub(timing.renew_deadline);
    let limit = margin / 2;
    let grace = requested.unwrap_or(limit);
    if grace > limit {
        return Err(GraceError { lock: lock.to_owned(), requested: grace, limit });
    }
    Ok((grace, grace + margin / 4))
}

/// Runs the command under the lock; returns the exit code for the process.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<i32> {
    let arg = config.target.as_deref().or(config.lock.as_deref()).unwrap_or_default();
    let (namespace, lock) = match crate::cli::target::resolve(arg, &crate::cli::target::PodNamespace::read()) {
        Ok(resolved) => resolved,
        Err(e) => {
            eprintln!("leasehold run: {e}");
            return Ok(EXIT_USAGE);
        }
    };
    let (namespace, lock) = (&namespace, &lock);
    let named = format!("{namespace}/{lock}");
    let client = crate::kube_client::client().await.context("failed to build a Kubernetes client")?;
    // Who we are, as the apiserver sees it: the Pod when the token is bound to one.
    let deadline = tokio::time::Instant::now() + config.acquire_wait();
    let identity = discover(&client, deadline).await.context("failed to learn who we are (SelfSubjectReview)")?;
    let claimant = Claimant::new(client, namespace, identity, MANAGER_CLI);
    // A grace the lock's timing cannot allow is refused before anything is claimed.
    if config.grace.is_some() {
        match claimant.timing(lock).await {
            Ok(timing) => {
                if let Err(e) = stop_timing(timing, config.grace, &named) {
                    eprintln!("leasehold run: {e}");
                    return Ok(EXIT_USAGE);
                }
            }
            Err(e @ (AcquireError::UnknownLock { .. } | AcquireError::Forbidden { .. })) => {
                eprintln!("leasehold run: {e}");
                return Ok(EXIT_REFUSED);
            }
            Err(e) => return Err(e.into()),
        }
    }
    let acquired = tokio::select! {
        _ = shutdown.cancelled() => return Ok(EXIT_INTERRUPTED),
        acquired = claimant.acquire_in(lock, config.acquire_wait(), config.mode) => acquired,
    };
    let hold = match acquired {
        Ok(hold) => hold,
        Err(e @ AcquireError::Timeout { .. }) => {
            eprintln!("leasehold run: {e}");
            return Ok(EXIT_NOT_ACQUIRED);
        }
        Err(e @ (AcquireError::UnknownLock { .. } | AcquireError::Forbidden { .. })) => {
            eprintln!("leasehold run: {e}");
            return Ok(EXIT_REFUSED);
        }
        Err(e) => return Err(e.into()),
    };
    let token = hold.token();
    info!(%namespace, lock, token, "acquired; starting the command");
    // The hold's own timing (the lock may have been edited since the check above): a grace
    // it no longer allows is refused, and the lock released, before the command starts.
    let (grace, backstop) = match stop_timing(hold.timing(), config.grace, &named) {
        Ok(timing) => timing,
        Err(e) => {
            hold.release().await;
            eprintln!("leasehold run: {e}");
            return Ok(EXIT_USAGE);
        }
    };
    let started = start_guard(&config.command, namespace, lock, (token, hold.slot()), grace);
    let (listener, mut guard) = match started {
        Ok(started) => started,
        Err(e) => {
            hold.release().await;
            return Err(e);
        }
    };
    let supervised =
        Supervisor { hold: &hold, lock: named, backstop }.supervise(&mut guard, &listener, &shutdown).await;
    let outcome = hold.release().await;
    let status = supervised.context("failed to wait for the command")?;
    info!(lock, token, was_held = outcome.was_held, code = exit_code(status), "command finished; released");
    Ok(exit_code(status))
}

/// Who we are, as the apiserver sees it. A busy, failing or unreachable apiserver is asked
/// again until `deadline` (the wait for the lock): it costs time, not the run.
async fn discover(client: &kube::Client, deadline: tokio::time::Instant) -> anyhow::Result<Identity> {
    let attempt = || async {
        match tokio::time::timeout(REQUEST_TIMEOUT, Identity::discover(client)).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(anyhow::anyhow!("no answer within {REQUEST_TIMEOUT:?}")),
        }
    };
    // What is not an apiserver error got no answer.
    let transient = |e: &anyhow::Error| e.downcast_ref::<kube::Error>().is_none_or(retry::may_pass);
    let busy = |e: &anyhow::Error| e.downcast_ref::<kube::Error>().is_some_and(retry::is_busy);
    retry::within(deadline, attempt, transient, busy, |e, pause| {
        warn!(error = %e, ?pause, "failed to learn who we are; trying again");
    })
    .await
}

/// Starts the guard (which starts the command once it has a deadline) in a process group
/// of its own, and the channel it will connect to.
fn start_guard(
    command: &[String],
    namespace: &str,
    lock: &str,
    (token, slot): (i64, u32),
    grace: Duration,
) -> anyhow::Result<(UnixListener, Child)> {
    let (listener, name) = channel::listen().context("failed to open the channel to the command's guard")?;
    // This very binary, even if the file was replaced or deleted since it started. The
    // guard is spawned from the runtime's only thread (the main thread): a parent-death
    // signal follows the thread that forked, which lives as long as the process.
    let guard = Command::new("/proc/self/exe")
        .arg0("leasehold")
        .arg("run-guard")
        .args(["--parent", &std::process::id().to_string(), "--channel", &name])
        .args(["--grace-ms", &boottime::millis(grace).to_string(), "--"])
        .args(command)
        .env("LEASEHOLD_FENCING_TOKEN", token.to_string())
        .env("LEASEHOLD_SLOT", slot.to_string())
        .env("LEASEHOLD_LOCK", format!("{namespace}/{lock}"))
        .process_group(0)
        .spawn()
        .context("failed to start the command's guard (leasehold run-guard)")?;
    Ok((listener, guard))
}

/// `run`'s side while the command runs.
struct Supervisor<'a> {
    hold: &'a Hold,
    lock: String,
    /// After a stop request, how long before `run` kills the guard's group itself.
    backstop: Duration,
}

impl Supervisor<'_> {
    /// Feeds the guard the hold's deadline until the guard exits; asks it to stop when the
    /// hold is lost or on `shutdown`. Returns the guard's exit status (the command's).
    async fn supervise(
        &self,
        guard: &mut Child,
        listener: &UnixListener,
        shutdown: &CancellationToken,
    ) -> std::io::Result<ExitStatus> {
        let pid = guard.id().unwrap_or(0);
        let group = Pid::from_raw(i32::try_from(pid).unwrap_or(0));
        let mut channel: Option<UnixStream> = None;
        let mut sent: Option<Instant> = None;
        let mut look = Instant::now();
        let mut stopping = false;
        let mut backstop = BootTimer::new();
        loop {
            if let (Some(stream), false) = (channel.as_mut(), stopping)
                && let HoldStatus::Held { valid_until, .. } = self.hold.status()
            {
                if sent != Some(valid_until) {
                    let at = boottime::deadline_of(valid_until);
                    // A guard that is gone is seen by `wait` below.
                    let _ = stream.write_all(Message::Deadline(at).encode().as_bytes()).await;
                    sent = Some(valid_until);
                }
                let timing = self.hold.timing();
                look = boottime::next_look(valid_until, timing.renew_deadline, timing.retry_period, Instant::now());
            }
            let mut stop = false;
            tokio::select! {
                biased;
                status = guard.wait() => return status,
                accepted = channel::accept_from(listener, pid), if channel.is_none() && !stopping => {
                    channel = Some(accepted?);
                }
                reason = self.hold.lost(), if !stopping => {
                    let reason = reason.map_or_else(|| "released".to_owned(), |r| r.to_string());
                    let token = self.hold.token();
                    eprintln!("leasehold run: hold on {} (token {token}) lost: {reason}; stopping the command", self.lock);
                    warn!(lock = %self.lock, token, %reason, "hold lost; stopping the command");
                    stop = true;
                }
                _ = shutdown.cancelled(), if !stopping => {
                    info!("signal received; stopping the command");
                    stop = true;
                }
                _ = backstop.expired(), if stopping && backstop.deadline().is_some() => {
                    warn!(lock = %self.lock, "the command's guard did not finish in time; killing its process group");
                    let _ = killpg(group, Signal::SIGKILL);
                    backstop = BootTimer::new();
                }
                _ = tokio::time::sleep_until(look.into()), if channel.is_some() && !stopping => {}
            }
            if stop {
                stopping = true;
                match channel.as_mut() {
                    Some(stream) => {
                        let _ = stream.write_all(Message::Stop.encode().as_bytes()).await;
                    }
                    // Not connected yet: the command has not started; nothing to spare.
                    None => {
                        let _ = kill(group, Signal::SIGKILL);
                    }
                }
                backstop.arm(boottime::now() + self.backstop);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_timing_fits_in_the_margin() {
        let timing = |lease, renew| crate::lease::Timing {
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_secs(1),
        };
        let ms = Duration::from_millis;
        assert_eq!(stop_timing(timing(15, 10), None, "a/b"), Ok((ms(2_500), ms(3_750))));
        assert_eq!(stop_timing(timing(3, 2), None, "a/b"), Ok((ms(500), ms(750))));
        assert_eq!(stop_timing(timing(15, 10), Some(ms(1_000)), "a/b"), Ok((ms(1_000), ms(2_250))));
        assert_eq!(stop_timing(timing(15, 10), Some(ms(0)), "a/b"), Ok((ms(0), ms(1_250))));
        assert_eq!(stop_timing(timing(15, 10), Some(ms(2_500)), "a/b"), Ok((ms(2_500), ms(3_750))));
        let too_long = stop_timing(timing(15, 10), Some(ms(2_501)), "a/b").expect_err("past half the margin");
        assert_eq!(too_long.limit, ms(2_500));
        assert!(too_long.to_string().contains("lock a/b allows: at most 2.5s"), "{too_long}");
        // Whatever the timing and the grace allowed, both land before the margin runs out.
        for (lease, renew) in [(15, 10), (3, 2), (60, 59), (3600, 1)] {
            for requested in [None, Some(ms(0)), Some(ms(400))] {
                let Ok((grace, backstop)) = stop_timing(timing(lease, renew), requested, "a/b") else { continue };
                assert!(grace <= backstop && backstop < Duration::from_secs(lease - renew), "{lease} {renew}");
            }
        }
    }

    #[test]
    fn a_wait_of_zero_is_a_try_lock() {
        let config = |args: &[&str]| {
            #[derive(clap::Parser)]
            struct Cli {
                #[command(flatten)]
                config: Config,
            }
            let argv = ["run"].iter().chain(args).chain(&["--", "true"]);
            <Cli as clap::Parser>::try_parse_from(argv).map(|c| c.config)
        };
        let wait = |args: &[&str]| config(args).expect("valid").acquire_wait();
        assert_eq!(wait(&["a/b"]), Duration::from_secs(30));
        assert_eq!(wait(&["a/b", "--wait", "0s"]), TRY_WAIT);
        assert_eq!(wait(&["a/b", "--try"]), TRY_WAIT);
        assert_eq!(wait(&["--lock", "a/b", "--wait", "5s"]), Duration::from_secs(5));
        assert!(config(&["a/b", "--try", "--wait", "5s"]).is_err(), "--try and --wait conflict");
        assert!(config(&["a/b", "--lock", "a/b"]).is_err(), "the lock is given once");
        assert!(config(&[]).is_err(), "a lock is required");
    }

    #[test]
    fn lock_argument() {
        assert_eq!(parse_lock("shop/orders"), Ok(("shop".into(), "orders".into())));
        for bad in ["orders", "/orders", "shop/", "a/b/c", ""] {
            assert!(parse_lock(bad).is_err(), "{bad}");
        }
    }
}
