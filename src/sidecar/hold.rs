//! Hold mode: hold one lock for the pod's whole life (leader election for singletons).
//!
//! The sidecar queues for the lock at start, and whenever a hold is lost it queues again.
//! While holding it writes `{lock, fencingToken, acquiredAt}` to a file in a shared volume
//! — atomically, by rename, so the app never reads half a file — and removes the file the
//! moment the hold is lost.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::slots::{LockEvent, Slots};

/// Writes `contents` to `path` atomically (temporary file in the same directory, rename).
pub fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

/// Holds `lock` until `shutdown`, re-queueing after every loss. `holding` is true while a
/// hold is in place and its file written (readiness follows it).
pub async fn run(
    slots: Slots,
    lock: String,
    file: Option<PathBuf>,
    holding: Arc<AtomicBool>,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::from_secs(1);
    while !shutdown.is_cancelled() {
        let mut events = slots.subscribe(&lock);
        let (_, reply) = slots.enqueue(&lock);
        let granted = tokio::select! {
            _ = shutdown.cancelled() => return,
            reply = reply => reply,
        };
        let granted = match granted {
            Ok(Ok(granted)) => granted,
            Ok(Err(error)) => {
                warn!(lock, %error, ?backoff, "hold mode cannot claim the lock; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(60));
                continue;
            }
            Err(_) => continue,
        };
        backoff = Duration::from_secs(1);
        let namespace = slots.claimant().namespace().to_owned();
        info!(lock, token = granted.fencing_token, "holding");
        if let Some(path) = &file {
            let record = json!({
                "lock": format!("{namespace}/{lock}"),
                "fencingToken": granted.fencing_token,
                "acquiredAt": jiff::Timestamp::now(),
            });
            if let Err(e) = write_atomically(path, record.to_string().as_bytes()) {
                warn!(path = %path.display(), error = %e, "failed to write the hold file");
            }
        }
        holding.store(true, Ordering::Release);
        // Wait for this hold to end.
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                event = events.recv() => event,
            };
            match event {
                Ok(LockEvent::Lost { fencing_token, .. } | LockEvent::Released { fencing_token, .. })
                    if fencing_token == granted.fencing_token =>
                {
                    break;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                _ => {}
            }
        }
        holding.store(false, Ordering::Release);
        if let Some(path) = &file {
            let _ = std::fs::remove_file(path);
        }
        info!(lock, token = granted.fencing_token, "hold ended; queueing again");
    }
}
