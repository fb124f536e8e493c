//! The app in a worker "pod": acquire through the sidecar, write to the fenced resources
//! with the token, check the hold, release — and log every step. It trusts what the
//! sidecar tells it and nothing else, like a real app.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::history::Op;
use super::world::{RENEW_DEADLINE, Worker, World};
use crate::support::http_request;

/// Reads the worker's event stream and logs every `lost`, until the sidecar goes away.
async fn watch_losses(world: Arc<World>, worker: Arc<Worker>) {
    let Some(response) =
        crate::support::http_send(worker.api, "GET", &format!("/v1/locks/{}/events", worker.lock), None).await
    else {
        return;
    };
    let mut reader = crate::support::SseReader::from_response(response);
    while let Some((name, data)) = reader.next(Duration::from_secs(3600)).await {
        if name == "lost"
            && let Some(token) = data["fencingToken"].as_i64()
        {
            world.history.log(&worker.name, &worker.lock, Op::Lost { token });
        }
    }
}

/// One request to the sidecar, bounded so a frozen sidecar does not stall the app for ever.
async fn call(worker: &Worker, method: &str, path: &str, body: Option<&str>, limit: Duration) -> Option<(u16, Value)> {
    let (status, text) = tokio::time::timeout(limit, http_request(worker.api, method, path, body)).await.ok()??;
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// The app loop of `worker`, until it is stopped.
pub async fn run(world: Arc<World>, worker: Arc<Worker>) {
    let lock = worker.lock.clone();
    let mut sse: Option<tokio::task::JoinHandle<()>> = None;
    while !worker.stop.is_cancelled() {
        if sse.as_ref().is_none_or(|h| h.is_finished()) {
            sse = Some(tokio::spawn(watch_losses(world.clone(), worker.clone())));
        }
        let body = r#"{"waitSeconds": 10}"#;
        let path = format!("/v1/locks/{lock}/acquire");
        let acquired = tokio::select! {
            _ = worker.stop.cancelled() => break,
            r = call(&worker, "POST", &path, Some(body), Duration::from_secs(30)) => r,
        };
        let token = match acquired {
            Some((200, reply)) => {
                let Some(token) = reply["fencingToken"].as_i64() else { continue };
                // The sidecar's deadline is at most a renew deadline from now.
                world.history.log(
                    &worker.name,
                    &lock,
                    Op::Acquired { token, deadline: Instant::now() + RENEW_DEADLINE },
                );
                *worker.last_token.lock().expect("lock") = Some(token);
                token
            }
            // Timeout, unknown lock (being re-created), a sidecar being restarted...
            _ => {
                pace(&worker, 200).await;
                continue;
            }
        };
        let (steps, pause) = world.hold_steps;
        for step in 0..steps {
            if step > 0 && !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            world.write_all(&worker, token, false).await;
            let asked = Instant::now();
            match call(&worker, "GET", &format!("/v1/locks/{lock}"), None, Duration::from_secs(5)).await {
                Some((200, view)) => {
                    let held = view["held"].as_bool() == Some(true) && view["fencingToken"].as_i64() == Some(token);
                    let deadline =
                        view["remainingMs"].as_u64().map(|ms| asked.max(Instant::now()) + Duration::from_millis(ms));
                    world.history.log(&worker.name, &lock, Op::View { token, held, deadline });
                    if !held {
                        break;
                    }
                }
                _ => break,
            }
        }
        world.history.log(&worker.name, &lock, Op::Release { token });
        let _ = call(&worker, "POST", &format!("/v1/locks/{lock}/release"), None, Duration::from_secs(10)).await;
        pace(&worker, 150).await;
    }
    if let Some(h) = sse {
        h.abort();
    }
}

/// A short, random pause between critical sections (workload pacing, not synchronisation).
async fn pace(worker: &Worker, max_ms: u64) {
    let ms = rand_ms(max_ms);
    tokio::select! {
        _ = worker.stop.cancelled() => {}
        _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
    }
}

fn rand_ms(max: u64) -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now()) % max.max(1)
}

/// After its sidecar was frozen and thawed, the app resumes as a zombie would: it asks
/// the sidecar once, then writes with the token it had, without re-checking.
pub async fn zombie(world: &World, worker: &Worker) {
    let lock = &worker.lock;
    let Some(token) = *worker.last_token.lock().expect("lock") else { return };
    let asked = Instant::now();
    if let Some((200, view)) = call(worker, "GET", &format!("/v1/locks/{lock}"), None, Duration::from_secs(5)).await {
        let held = view["held"].as_bool() == Some(true) && view["fencingToken"].as_i64() == Some(token);
        let deadline = view["remainingMs"].as_u64().map(|ms| asked.max(Instant::now()) + Duration::from_millis(ms));
        world.history.log(&worker.name, lock, Op::View { token, held, deadline });
    }
    world.write_all(worker, token, true).await;
}
