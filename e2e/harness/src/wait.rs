//! Waiting on conditions with deadlines, and running async start-up code from the
//! synchronous API.

use std::{
    fmt::Display,
    future::Future,
    time::{Duration, Instant},
};

use anyhow::anyhow;

/// How often conditions are polled: often enough to add little latency to tests, rarely
/// enough not to load a 2-core machine.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The outcome of one poll of a condition.
pub(crate) enum Probe<T> {
    /// The condition holds.
    Ready(T),
    /// Not yet; the reason is reported if the deadline passes.
    NotYet(String),
    /// It never will (e.g. the process being waited for exited).
    Fatal(anyhow::Error),
}

/// Polls `probe` until it is ready, fails fatally, or `timeout` passes.
pub(crate) async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Probe<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let reason = match probe().await {
            Probe::Ready(value) => return Ok(value),
            Probe::Fatal(error) => return Err(error.context(format!("while waiting for {what}"))),
            Probe::NotYet(reason) => reason,
        };
        if Instant::now() >= deadline {
            return Err(anyhow!("timed out after {timeout:?} waiting for {what}: {reason}"));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Polls `attempt` until it returns `Ok`, and returns that value; panics with the last
/// error if `timeout` passes first.
///
/// For conditions a test waits on that the API offers no watch for, such as an RBAC
/// change taking effect: a condition with a deadline, never a bare sleep.
pub async fn eventually<T, E, F, Fut>(what: &str, timeout: Duration, mut attempt: F) -> T
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let result = poll(what, timeout, || {
        let next = attempt();
        async move {
            match next.await {
                Ok(value) => Probe::Ready(value),
                Err(error) => Probe::NotYet(error.to_string()),
            }
        }
    })
    .await;
    match result {
        Ok(value) => value,
        Err(error) => panic!("{error:#}"),
    }
}

/// Waits until the log file at `log` contains `line` (a message a process writes when it
/// reaches a state nothing else shows); panics if `timeout` passes first.
pub async fn logged(log: &std::path::Path, line: &str, timeout: Duration) {
    eventually(&format!("{line:?} in {}", log.display()), timeout, || async {
        let text = std::fs::read_to_string(log).map_err(|e| e.to_string())?;
        if text.contains(line) { Ok(()) } else { Err("not yet".to_owned()) }
    })
    .await;
}

/// Runs `future` to completion on a new current-thread runtime in a new thread.
///
/// The synchronous API (`ControlPlane::start`, `start_apiserver`, ...) is called from
/// inside `#[tokio::test]` runtimes, where starting another runtime on the same thread
/// panics; a scoped helper thread sidesteps that and blocks only the caller.
pub(crate) fn block_on<F>(future: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("failed to build a tokio runtime for the harness")
                    .block_on(future)
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}
