//! `leasehold run`: run one command under a lock.
//!
//! Acquires with the caller's own credentials, hands the child `LEASEHOLD_FENCING_TOKEN`
//! and `LEASEHOLD_LOCK`, renews in-process, and if the hold is lost sends the child SIGTERM
//! and then SIGKILL — the kill lands before the lock can be granted again, because the
//! hold self-fences at the renew deadline and the controller waits a full lease duration
//! from the last renewal it saw. The lock is released when the child exits, and the
//! child's exit status is passed through.

use std::process::ExitStatus;
use std::time::Duration;

use anyhow::Context as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::claim::{AcquireError, Claimant};
use crate::controller::parse_duration;
use crate::crd::MANAGER_CLI;
use crate::lease::Identity;

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

fn signal(child: &Child, signal: Signal) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// The exit code to pass through for a child's status (128 + signal when killed).
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
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
    let mut child = match Command::new(&config.command[0])
        .args(&config.command[1..])
        .env("LEASEHOLD_FENCING_TOKEN", token.to_string())
        .env("LEASEHOLD_LOCK", format!("{namespace}/{lock}"))
        .kill_on_drop(true)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("leasehold run: cannot run {:?}: {e}", config.command[0]);
            hold.release().await;
            return Ok(EXIT_CANNOT_RUN);
        }
    };
    // Half the margin between self-fencing and the earliest possible re-grant: the child
    // gets that long to exit on SIGTERM before SIGKILL.
    let timing = hold.timing();
    let grace = timing.lease_duration.saturating_sub(timing.renew_deadline) / 2;
    let status = tokio::select! {
        status = child.wait() => status?,
        reason = hold.lost() => {
            let reason = reason.map_or_else(|| "released".to_owned(), |r| r.to_string());
            eprintln!("leasehold run: hold on {namespace}/{lock} (token {token}) lost: {reason}; stopping the command");
            warn!(lock, token, %reason, "hold lost; stopping the command");
            stop(&mut child, grace).await?
        }
        _ = shutdown.cancelled() => {
            info!("signal received; stopping the command");
            stop(&mut child, grace).await?
        }
    };
    let outcome = hold.release().await;
    info!(lock, token, was_held = outcome.was_held, code = exit_code(status), "command finished; released");
    Ok(exit_code(status))
}

/// SIGTERM, then SIGKILL after `grace`.
async fn stop(child: &mut Child, grace: Duration) -> std::io::Result<ExitStatus> {
    signal(child, Signal::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            signal(child, Signal::SIGKILL);
            child.wait().await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_argument() {
        assert_eq!(parse_lock("shop/orders"), Ok(("shop".into(), "orders".into())));
        for bad in ["orders", "/orders", "shop/", "a/b/c", ""] {
            assert!(parse_lock(bad).is_err(), "{bad}");
        }
    }
}
