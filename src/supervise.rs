//! Supervision of long-lived tasks: every task is joined; the first to end before
//! shutdown (cleanly, with an error, or by panic) is a failure that shuts the process
//! down with a non-zero exit, so nothing dies silently while the process looks healthy.

use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::error;

/// How long tasks get to finish after shutdown begins.
const GRACE: Duration = Duration::from_secs(10);

/// Tasks that are allowed to finish early (one-shot work) mark themselves with this.
pub type TaskResult = anyhow::Result<Completion>;

/// How a task ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Completion {
    /// A long-lived task stopped: a failure unless shutdown is under way.
    Stopped,
    /// A one-shot task did its work.
    Done,
}

/// Waits for every task in `tasks`. Returns an error if any long-lived task ended before
/// `shutdown` was cancelled (and cancels it then).
pub async fn supervise(mut tasks: JoinSet<TaskResult>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut failure = None;
    loop {
        let joined = if shutdown.is_cancelled() {
            match tokio::time::timeout(GRACE, tasks.join_next()).await {
                Ok(joined) => joined,
                Err(_) => {
                    error!("tasks did not stop within {GRACE:?}; aborting them");
                    tasks.abort_all();
                    break;
                }
            }
        } else {
            tasks.join_next().await
        };
        let Some(joined) = joined else { break };
        let result = joined.map_err(|e| anyhow::anyhow!("a task panicked: {e}")).and_then(|r| r);
        match result {
            Ok(Completion::Done) => {}
            Ok(Completion::Stopped) if shutdown.is_cancelled() => {}
            Ok(Completion::Stopped) | Err(_) if failure.is_none() && !shutdown.is_cancelled() => {
                let why = result.err().unwrap_or_else(|| anyhow::anyhow!("a long-lived task ended unexpectedly"));
                error!(error = %why, "shutting down");
                failure = Some(why);
                shutdown.cancel();
            }
            Ok(Completion::Stopped) => {}
            Err(e) => error!(error = %e, "task failed during shutdown"),
        }
    }
    failure.map_or(Ok(()), Err)
}

/// Cancels `token` on SIGTERM or SIGINT (a task of the current runtime).
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                error!(error = %e, "cannot listen for SIGTERM");
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("signal received, shutting down");
        token.cancel();
    });
}
