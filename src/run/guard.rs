//! The guard of `leasehold run`: a second, small `leasehold` process that starts the
//! command and answers for its whole process tree.
//!
//! `run` starts it in a process group of its own; the guard then
//! - becomes a child subreaper, so every process the command leaves behind (background
//!   jobs, daemons that `setsid`) is re-parented to it, not to init, and stays in reach;
//! - asks for a parent-death signal, and watches its channel to `run` (whose end means
//!   `run` is gone), so that a `run` killed with SIGKILL still has its command stopped;
//! - keeps the hold's validity deadline (on `CLOCK_BOOTTIME`, sent by `run` after every
//!   renewal) and stops the command itself when it passes — a `run` that is frozen or
//!   starved cannot leave its command running past its hold;
//! - stops the command on `run`'s request (hold lost, `run` told to stop);
//! - when the command's main process exits, stops whatever it left running: nothing of
//!   it outlives the release of the lock.
//!
//! Stopping is SIGTERM to every process of the tree, then SIGKILL after the grace `run`
//! chose (within the margin between the holder's self-fence and the earliest re-grant).
//! The guard exits with the command's status (128 + signal when killed by one) once the
//! whole tree is gone.
//!
//! Signals sent to the guard itself (a command's `kill 0` reaches its whole group) are
//! ignored unless they come with the death of `run`: only `run` decides.

use std::time::Duration;

use nix::errno::Errno;
use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getppid};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::signal::unix::{SignalKind, signal};

use super::channel::{self, Message};
use super::tree;
use crate::boottime::{self, BootTimer};

/// `leasehold run-guard` arguments (given by `leasehold run`, not by people).
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// The pid of the `leasehold run` that started this guard.
    #[arg(long)]
    pub parent: u32,
    /// The abstract socket name `run` listens on.
    #[arg(long)]
    pub channel: String,
    /// Milliseconds between SIGTERM and SIGKILL when stopping the command.
    #[arg(long)]
    pub grace_ms: u64,
    /// The command, after `--`.
    #[arg(required = true, last = true)]
    pub command: Vec<String>,
}

/// Exit status when the guard could not set itself up (as for a command that cannot run).
const EXIT_GUARD_FAILED: i32 = super::EXIT_CANNOT_RUN;

/// The exit code for a process's wait status: its code, or 128 + the signal that killed it.
fn code_of(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, signal, _) => Some(128 + signal as i32),
        _ => None,
    }
}

/// Reaps every exited child; records the command's status. Returns whether children remain.
fn reap(command: Pid, status: &mut Option<i32>) -> bool {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return true,
            Ok(exited) => {
                if exited.pid() == Some(command) {
                    *status = code_of(exited).or(*status);
                }
            }
            Err(Errno::EINTR) => {}
            // ECHILD: nothing left below us.
            Err(_) => return false,
        }
    }
}

/// Where the guard is with the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The command runs under the hold.
    Running,
    /// SIGTERM was sent to the tree; SIGKILL follows when the grace runs out.
    Terminating,
    /// The grace ran out: SIGKILL to whatever is left, until nothing is.
    Killing,
}

/// Runs the guard; returns the exit code for the process.
pub async fn run(config: Config) -> i32 {
    let me = Pid::this();
    let parent = config.parent;
    let run_is_gone = || u32::try_from(getppid().as_raw()).ok() != Some(parent);
    // Signal handlers first, then the parent-death signal, then the check that `run` is
    // still our parent: a `run` that died before the signal was asked for is seen here.
    let (Ok(mut term), Ok(mut int), Ok(mut hup), Ok(mut child)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
        signal(SignalKind::child()),
    ) else {
        eprintln!("leasehold run: cannot install the guard's signal handlers");
        return EXIT_GUARD_FAILED;
    };
    if let Err(e) = prctl::set_child_subreaper(true).and_then(|()| prctl::set_pdeathsig(Signal::SIGTERM)) {
        eprintln!("leasehold run: cannot set up the guard (prctl): {e}");
        return EXIT_GUARD_FAILED;
    }
    if run_is_gone() {
        return EXIT_GUARD_FAILED;
    }
    let stream = match channel::connect_to(&config.channel, parent) {
        Ok(stream) => stream,
        Err(e) => {
            eprintln!("leasehold run: the guard cannot reach leasehold run: {e}");
            return EXIT_GUARD_FAILED;
        }
    };
    let mut lines = BufReader::new(stream).lines();
    // The command starts only under a deadline that has not passed.
    let mut deadline = BootTimer::new();
    match lines.next_line().await.ok().flatten().as_deref().and_then(Message::parse) {
        Some(Message::Deadline(at)) if at > boottime::now() => deadline.arm(at),
        _ => {
            eprintln!("leasehold run: the hold ended before the command could start");
            return super::EXIT_NOT_ACQUIRED;
        }
    }
    let command = match std::process::Command::new(&config.command[0]).args(&config.command[1..]).spawn() {
        // Reaped below with waitpid, like every other process of the tree.
        Ok(spawned) => Pid::from_raw(i32::try_from(spawned.id()).unwrap_or(i32::MAX)),
        Err(e) => {
            eprintln!("leasehold run: cannot run {:?}: {e}", config.command[0]);
            return super::EXIT_CANNOT_RUN;
        }
    };

    let grace_period = Duration::from_millis(config.grace_ms);
    let mut grace = BootTimer::new();
    let mut phase = Phase::Running;
    let mut status = None;
    let mut channel_open = true;
    let mut sweep = tokio::time::interval(Duration::from_millis(50));
    loop {
        let remaining = reap(command, &mut status);
        if status.is_some() && !remaining {
            return status.unwrap_or(EXIT_GUARD_FAILED);
        }
        // The command's main process is done: what it left running goes too.
        let mut stop_reason = (status.is_some() && phase == Phase::Running).then_some("");
        if phase == Phase::Killing {
            tree::signal_descendants(me, Signal::SIGKILL);
        }
        if stop_reason.is_none() {
            tokio::select! {
                _ = child.recv() => {}
                _ = term.recv() => if run_is_gone() { stop_reason = Some("leasehold run is gone") },
                _ = int.recv() => if run_is_gone() { stop_reason = Some("leasehold run is gone") },
                _ = hup.recv() => if run_is_gone() { stop_reason = Some("leasehold run is gone") },
                line = lines.next_line(), if channel_open => match line.ok().flatten() {
                    Some(line) => match Message::parse(&line) {
                        Some(Message::Deadline(at)) => deadline.arm(at),
                        Some(Message::Stop) => stop_reason = Some(""),
                        None => stop_reason = Some("unreadable message from leasehold run"),
                    },
                    None => {
                        channel_open = false;
                        stop_reason = Some("leasehold run is gone");
                    }
                },
                _ = deadline.expired(), if phase == Phase::Running => {
                    stop_reason = Some("the hold was not renewed by its deadline");
                }
                _ = grace.expired(), if phase == Phase::Terminating => phase = Phase::Killing,
                // While killing, look again even without SIGCHLD: a process forked just
                // before its parent was killed is re-parented to us without one.
                _ = sweep.tick(), if phase == Phase::Killing => {}
            }
        }
        if let Some(reason) = stop_reason
            && phase == Phase::Running
        {
            if !reason.is_empty() {
                eprintln!("leasehold run: {reason}; stopping the command");
            }
            tree::signal_descendants(me, Signal::SIGTERM);
            grace.arm(boottime::now() + grace_period);
            phase = Phase::Terminating;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        let pid = Pid::from_raw(7);
        assert_eq!(code_of(WaitStatus::Exited(pid, 3)), Some(3));
        assert_eq!(code_of(WaitStatus::Signaled(pid, Signal::SIGKILL, false)), Some(137));
        assert_eq!(code_of(WaitStatus::Signaled(pid, Signal::SIGTERM, true)), Some(143));
        assert_eq!(code_of(WaitStatus::StillAlive), None);
    }
}
