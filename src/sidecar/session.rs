//! Session-bound holds: the acquire's response is a stream that lasts as long as the hold.
//!
//! The first line is the grant — the same JSON object a plain acquire answers — and every
//! later line is an event about this hold, one JSON object per line
//! (`application/x-ndjson`): every second while it is held, `held` with the time left
//! (`remainingMs`, so the stream alone tells the app how long it may act: a frozen sidecar
//! sends nothing, and the app's last word runs out), and when they happen `renew-late`,
//! `lost` and `released`. After a loss an empty line every second keeps the stream moving
//! (a shell pipeline's `curl` learns this way that its reader is gone). The hold lasts
//! while the connection stays open: when it closes — the caller closed it, or its process
//! died and the kernel closed it — the server drops the response body, and with it the
//! [`Session`], which lets the hold go at once. After `released` the stream ends.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use super::owner::{Ending, Handle};
use super::slots::{Granted, LockEvent, Slots, millis};

/// How often the time left is sent (or an empty line, once the hold is no longer held).
pub const KEEP_ALIVE: Duration = Duration::from_secs(1);

/// A session's end of the hold: dropping it (the connection closed) lets the hold go.
struct Session {
    slots: Slots,
    lock: String,
    handle: Handle,
    token: i64,
    events: broadcast::Receiver<LockEvent>,
    first: Option<String>,
    keep_alive: tokio::time::Interval,
    done: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        // After `released` the hold is gone already and this finds nothing to do.
        let (slots, lock, handle) = (self.slots.clone(), std::mem::take(&mut self.lock), self.handle.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                slots.let_go(&lock, &handle, Ending::SessionClosed).await;
            });
        }
    }
}

impl Session {
    /// The next line of the stream, `None` once it ends.
    async fn next_line(&mut self) -> Option<String> {
        if self.done {
            return None;
        }
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        loop {
            tokio::select! {
                event = self.events.recv() => match event {
                    Ok(event) if event.token() != self.token => continue,
                    Ok(event) => {
                        self.done = matches!(event, LockEvent::Released { .. });
                        return Some(line(&event));
                    }
                    Err(RecvError::Lagged(missed)) => return Some(format!("{}\n", json!({"event": "lagged", "missed": missed}))),
                    Err(RecvError::Closed) => return None,
                },
                _ = self.keep_alive.tick() => {
                    return Some(match self.slots.remaining_of(&self.lock, &self.handle) {
                        Some(left) => line(&json!({
                            "event": "held",
                            "fencingToken": self.token,
                            "remainingMs": millis(left.remaining),
                            "validUntilBoottimeMs": left.boottime_ms,
                        })),
                        None => "\n".to_owned(),
                    });
                }
            }
        }
    }
}

fn line(value: &impl serde::Serialize) -> String {
    let mut text = serde_json::to_string(value).unwrap_or_default();
    text.push('\n');
    text
}

/// The streaming answer to a session-bound acquire: `granted` first, then the hold's
/// events from `events` (subscribed before the grant was checked, so none is missed).
pub fn respond(slots: Slots, granted: Granted, handle: Handle, events: broadcast::Receiver<LockEvent>) -> Response {
    let start = tokio::time::Instant::now() + KEEP_ALIVE;
    let mut keep_alive = tokio::time::interval_at(start, KEEP_ALIVE);
    keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let session = Session {
        slots,
        lock: granted.lock.clone(),
        handle,
        token: granted.fencing_token,
        events,
        first: Some(line(&granted)),
        keep_alive,
        done: false,
    };
    let lines = futures::stream::unfold(session, |mut session| async move {
        let line = session.next_line().await?;
        Some((Ok::<_, Infallible>(Bytes::from(line)), session))
    });
    ([(header::CONTENT_TYPE, "application/x-ndjson"), (header::CACHE_CONTROL, "no-store")], Body::from_stream(lines))
        .into_response()
}
