//! `leasehold run`: run one command under a lock.
//!
//! Acquires with the caller's own credentials, then starts the command through a guard
//! ([`guard`]: a second `leasehold` process, in a process group of its own, subreaper of
//! the command's tree) with `LEASEHOLD_FENCING_TOKEN` and `LEASEHOLD_LOCK` set, and renews
//! in-process. After every renewal it passes the hold's validity deadline (on
//! `CLOCK_BOOTTIME`) to the guard, which stops the command by itself if that deadline
//! passes — so neither a `run` that is killed nor one that is frozen leaves the command
//! running unlocked. If the hold is lost, or `run` is told to stop, the guard sends the
//! whole tree SIGTERM and then SIGKILL after the grace; `run` kills the guard's process
//! group itself if the guard has not finished shortly after. The kill lands before the
//! lock can be granted again: the hold self-fences at the renew deadline and the
//! controller waits a full lease duration from the last renewal it saw; the grace is half
//! of that margin, and every timer here counts time the host was suspended. The lock is
//! released when the command's tree is gone, and the command's exit status is passed
//! through.

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
use crate::controller::parse_duration;
use crate::crd::MANAGER_CLI;
use crate::lease::Identity;
use channel::Message;

/// Exit status when the lock could not be had in time (EX_TEMPFAIL).
pub const EXIT_NOT_ACQUIRED: i32 = 75;
/// Exit status when the lock cannot be claimed at all: unknown lock, forbidden (EX_NOPERM).
pub const EXIT_REFUSED: i32 = 77;
/// Exit status when the child could not be started (as shells do).
pub const EXIT_CANNOT_RUN: i32 = 127;

/// `leasehold run` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// The lock, as `<namespace>/<name>`.
    #[arg(long, value_parser = parse_lock)]
    pub lock: (String, String),
    /// How long to wait for the lock.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub wait: Duration,
    /// The command to run, after `--`.
    #[arg(required = true, last = true)]
    pub command: Vec<String>,
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
/// half, and three quarters, of the margin between self-fencing (renew deadline) and the
/// earliest possible re-grant (lease duration).
fn stop_timing(timing: crate::lease::Timing) -> (Duration, Duration) {
    let margin = timing.lease_duration.saturating_sub(timing.renew_deadline);
    (margin / 2, margin / 2 + margin / 4)
}

/// Runs the command under the lock; returns the exit code for the process.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<i32> {
    let (namespace, lock) = &config.lock;
    let client = crate::kube_client::client().await.context("failed to build a Kubernetes client")?;
    // Who we are, as the apiserver sees it: the Pod when the token is bound to one.
    let identity = Identity::discover(&client).await.context("failed to learn who we are (SelfSubjectReview)")?;
    let claimant = Claimant::new(client, namespace, identity, MANAGER_CLI);
    let acquired = tokio::select! {
        _ = shutdown.cancelled() => return Ok(130),
        acquired = claimant.acquire(lock, config.wait) => acquired,
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
    let (grace, backstop) = stop_timing(hold.timing());
    let started = start_guard(&config, token, grace);
    let (listener, mut guard) = match started {
        Ok(started) => started,
        Err(e) => {
            hold.release().await;
            return Err(e);
        }
    };
    let supervised = Supervisor { hold: &hold, lock: format!("{namespace}/{lock}"), backstop }
        .supervise(&mut guard, &listener, &shutdown)
        .await;
    let outcome = hold.release().await;
    let status = supervised.context("failed to wait for the command")?;
    info!(lock, token, was_held = outcome.was_held, code = exit_code(status), "command finished; released");
    Ok(exit_code(status))
}

/// Starts the guard (which starts the command once it has a deadline) in a process group
/// of its own, and the channel it will connect to.
fn start_guard(config: &Config, token: i64, grace: Duration) -> anyhow::Result<(UnixListener, Child)> {
    let (namespace, lock) = &config.lock;
    let (listener, name) = channel::listen().context("failed to open the channel to the command's guard")?;
    // This very binary, even if the file was replaced or deleted since it started. The
    // guard is spawned from the runtime's only thread (the main thread): a parent-death
    // signal follows the thread that forked, which lives as long as the process.
    let guard = Command::new("/proc/self/exe")
        .arg0("leasehold")
        .arg("run-guard")
        .args(["--parent", &std::process::id().to_string(), "--channel", &name])
        .args(["--grace-ms", &boottime::millis(grace).to_string(), "--"])
        .args(&config.command)
        .env("LEASEHOLD_FENCING_TOKEN", token.to_string())
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
        assert_eq!(stop_timing(timing(15, 10)), (ms(2_500), ms(3_750)));
        assert_eq!(stop_timing(timing(3, 2)), (ms(500), ms(750)));
        // Whatever the timing, both land before the margin runs out.
        for (lease, renew) in [(15, 10), (3, 2), (60, 59), (3600, 1)] {
            let (grace, backstop) = stop_timing(timing(lease, renew));
            assert!(grace <= backstop && backstop < Duration::from_secs(lease - renew), "{lease} {renew}");
        }
    }

    #[test]
    fn lock_argument() {
        assert_eq!(parse_lock("shop/orders"), Ok(("shop".into(), "orders".into())));
        for bad in ["orders", "/orders", "shop/", "a/b/c", ""] {
            assert!(parse_lock(bad).is_err(), "{bad}");
        }
    }
}
