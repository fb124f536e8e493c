//! The app in a worker pod: acquire through the sidecar, work in steps — write the fenced
//! resources with the token, ask the sidecar for its view — and release; log every step.
//!
//! It trusts what the sidecar tells it and nothing else, as a real app would: it counts on
//! the hold until receipt + `remainingMs` of the latest answer that said held, and stops
//! as soon as it learns otherwise — a view saying not held, or, for an app that follows
//! the event stream, a `lost` or unrequested `released` event or the stream closing. A
//! sidecar that does not answer (killed, frozen, cut off) tells it nothing: it works on
//! until its last answer runs out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::history::{Learned, Op};
use super::world::{AppBelief, AppKind, Worker, World, random};
use crate::support::http_request;

/// One request to the sidecar, bounded so a frozen sidecar does not stall the app for ever.
pub async fn call(
    worker: &Worker,
    method: &str,
    path: &str,
    body: Option<&str>,
    limit: Duration,
) -> Option<(u16, Value)> {
    let (status, text) = tokio::time::timeout(limit, http_request(worker.api, method, path, body)).await.ok()??;
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// The instant the hold `answer` reports runs out: `remainingMs` counted from `receipt`,
/// but never past `validUntilBoottimeMs` (the boot clock does not stretch while a paused
/// sidecar's answer waits to be sent).
pub fn until(answer: &Value, receipt: Instant) -> Option<Instant> {
    let relative = receipt + Duration::from_millis(answer["remainingMs"].as_u64()?);
    Some(match answer["validUntilBoottimeMs"].as_u64() {
        Some(ms) => relative.min(boot_instant(Duration::from_millis(ms))),
        None => relative,
    })
}

/// The instant on this process's clock at which `CLOCK_BOOTTIME` reads `deadline`.
fn boot_instant(deadline: Duration) -> Instant {
    let (now, boot) = (Instant::now(), leasehold::boottime::now());
    match deadline.checked_sub(boot) {
        Some(ahead) => now + ahead,
        None => now.checked_sub(boot - deadline).unwrap_or(now),
    }
}

/// Follows the event stream of `worker`'s lock until it closes; what it learns about the
/// hold the app believes in is logged and ends the belief. Returns once subscribed.
async fn follow(world: Arc<World>, worker: Arc<Worker>) -> Option<tokio::task::JoinHandle<()>> {
    let response =
        crate::support::http_send(worker.api, "GET", &format!("/v1/locks/{}/events", worker.lock), None).await?;
    if response.status().as_u16() != 200 {
        return None;
    }
    let mut reader = crate::support::SseReader::from_response(response);
    Some(tokio::spawn(async move {
        loop {
            let event = reader.next(Duration::from_secs(24 * 3600)).await;
            let learned = match &event {
                None => Some((None, Learned::StreamClosed)),
                Some((name, data)) if name == "lost" => Some((data["fencingToken"].as_i64(), Learned::LostEvent)),
                Some((name, data)) if name == "released" => {
                    Some((data["fencingToken"].as_i64(), Learned::ReleasedEvent))
                }
                Some(_) => None,
            };
            if let Some((token, how)) = learned {
                learn(&world, &worker, token, how);
            }
            if event.is_none() {
                return;
            }
        }
    }))
}

/// The app learns that its hold (`token`, or whatever it holds when `None`) is gone.
fn learn(world: &World, worker: &Worker, token: Option<i64>, how: Learned) {
    let mut belief = worker.belief.lock().expect("lock");
    match belief.token {
        Some(held) if !belief.lost && token.is_none_or(|t| t == held) => {
            belief.lost = true;
            world.history.log(&worker.name, &worker.lock, Op::Lost { token: held, how });
            worker.learned.notify_one();
        }
        // Not (yet) believed: remember it, in case the grant answer is still on its way.
        _ => worker.gone.lock().expect("lock").extend(token),
    }
}

/// The app loop of `worker`, until it is stopped.
pub async fn run(world: Arc<World>, worker: Arc<Worker>) {
    let lock = worker.lock.clone();
    let mut stream: Option<tokio::task::JoinHandle<()>> = None;
    while !worker.stop.is_cancelled() {
        if worker.kind == AppKind::Events && stream.as_ref().is_none_or(|h| h.is_finished()) {
            stream = follow(world.clone(), worker.clone()).await;
            if stream.is_none() {
                pace(&worker, 300).await;
                continue;
            }
        }
        let path = format!("/v1/locks/{lock}/acquire");
        let answer = tokio::select! {
            _ = worker.stop.cancelled() => break,
            a = call(&worker, "POST", &path, Some(r#"{"waitSeconds": 10}"#), Duration::from_secs(30)) => a,
        };
        let receipt = Instant::now();
        let (token, deadline) = match answer {
            Some((200, reply)) => match (reply["fencingToken"].as_i64(), until(&reply, receipt)) {
                (Some(token), Some(deadline)) => (token, deadline),
                _ => continue,
            },
            // Timeout, unknown lock (being re-created), a sidecar being restarted...
            _ => {
                pace(&worker, 300).await;
                continue;
            }
        };
        {
            let mut belief = worker.belief.lock().expect("lock");
            *belief = AppBelief { token: Some(token), until: Some(deadline), lost: false };
            world.history.log_at(receipt, &worker.name, &lock, Op::Granted { token, until: Some(deadline) });
        }
        if worker.gone.lock().expect("lock").contains(&token) {
            learn(&world, &worker, Some(token), Learned::LostEvent);
        }
        *worker.last_token.lock().expect("lock") = Some(token);
        work(&world, &worker, token).await;
        {
            let mut belief = worker.belief.lock().expect("lock");
            world.history.log(&worker.name, &lock, Op::Release { token });
            *belief = AppBelief::default();
        }
        let _ = call(&worker, "POST", &format!("/v1/locks/{lock}/release"), None, Duration::from_secs(10)).await;
        pace(&worker, 150).await;
    }
    if let Some(h) = stream {
        h.abort();
    }
    *worker.belief.lock().expect("lock") = AppBelief::default();
    world.history.log(&worker.name, &lock, Op::Stopped);
}

/// The critical section: steps of writes and a view, until its length is done or the app
/// stops believing.
async fn work(world: &World, worker: &Worker, token: i64) {
    let lock = &worker.lock;
    let end = Instant::now() + worker.sections.pick();
    let acting = || worker.belief.lock().expect("lock").acting(Instant::now()) == Some(token);
    while acting() && Instant::now() < end && !worker.stop.is_cancelled() {
        world.write_all(worker, &worker.name, token, acting, false).await;
        if !acting() {
            break;
        }
        let view = call(worker, "GET", &format!("/v1/locks/{lock}"), None, Duration::from_secs(2)).await;
        let receipt = Instant::now();
        if let Some((200, view)) = view {
            let mut belief = worker.belief.lock().expect("lock");
            if belief.token != Some(token) || belief.lost {
                break;
            }
            let held = view["held"].as_bool() == Some(true) && view["fencingToken"].as_i64() == Some(token);
            match until(&view, receipt).filter(|_| held) {
                Some(deadline) => {
                    belief.until = Some(belief.until.map_or(deadline, |u| u.max(deadline)));
                    world.history.log_at(receipt, &worker.name, lock, Op::Held { token, until: Some(deadline) });
                }
                None => {
                    belief.lost = true;
                    world.history.log_at(receipt, &worker.name, lock, Op::NotHeld);
                    break;
                }
            }
        }
        // A view that did not come back tells the app nothing: it works on until its last
        // answer runs out.
        let until = worker.belief.lock().expect("lock").until.unwrap_or_else(Instant::now);
        let wake = (Instant::now() + worker.sections.pause()).min(end).min(until);
        tokio::select! {
            _ = worker.learned.notified() => {}
            _ = worker.stop.cancelled() => {}
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
    }
}

/// A short, random pause between critical sections (workload pacing, not synchronisation).
pub async fn pace(worker: &Worker, max_ms: u64) {
    tokio::select! {
        _ = worker.stop.cancelled() => {}
        _ = tokio::time::sleep(Duration::from_millis(random(max_ms))) => {}
    }
}

/// After its sidecar was frozen and thawed, the app resumes as a zombie would: it writes
/// once more with `token`, the token it had, without checking it still holds it.
pub async fn zombie(world: &World, worker: &Worker, token: i64) {
    let acting = || worker.belief.lock().expect("lock").acting(Instant::now()) == Some(token);
    world.write_all(worker, &worker.name, token, acting, true).await;
}
