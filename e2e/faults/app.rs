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

use serde_json::{Value, json};

use super::history::{Learned, Op};
use super::world::{AppBelief, AppKind, CALLER_TTL, Worker, World, random};
use crate::support::http_request;
use crate::support::owner::{Session, open_session};

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

/// How the app owns its hold, and so how it lets go.
enum Owner {
    /// A pod-scoped hold, released by lock name.
    Pod,
    /// A session-bound hold: the task following the session owns its connection, so
    /// ending the task closes the session.
    Session {
        /// Owned for its drop, which ends the session.
        _follower: Follower,
    },
    /// A heartbeat hold, by its owner handle.
    Heartbeat(String),
}

/// The task following a session; dropping it ends the task (and closes the connection).
struct Follower(tokio::task::JoinHandle<()>);

impl Drop for Follower {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One acquisition as the app's kind makes it: the token, when the answer arrived, until
/// when it may count on it, and how it owns the hold. `None`: not granted this time.
async fn acquire(world: &Arc<World>, worker: &Arc<Worker>) -> Option<(i64, Instant, Instant, Owner)> {
    let lock = &worker.lock;
    let path = format!("/v1/locks/{lock}/acquire");
    match worker.kind {
        AppKind::Session => {
            let mut body = json!({"waitSeconds": 10});
            if worker.writer {
                body["mode"] = json!("write");
            }
            let (status, mut session) =
                tokio::time::timeout(Duration::from_secs(30), open_session(worker.api, lock, body)).await.ok()??;
            let grant = session.next(Duration::from_secs(5)).await;
            let receipt = Instant::now();
            let grant = grant.filter(|_| status == 200)?;
            let (token, deadline) = (grant["fencingToken"].as_i64()?, until(&grant, receipt)?);
            let follower = tokio::spawn(follow_session(world.clone(), worker.clone(), session, token));
            Some((token, receipt, deadline, Owner::Session { _follower: Follower(follower) }))
        }
        kind => {
            let mut body = match kind {
                AppKind::Heartbeat => json!({"waitSeconds": 10, "ttlSeconds": CALLER_TTL.as_secs_f64()}),
                _ => json!({"waitSeconds": 10}),
            };
            if worker.writer {
                body["mode"] = json!("write");
            }
            let answer = call(worker, "POST", &path, Some(&body.to_string()), Duration::from_secs(30)).await;
            let receipt = Instant::now();
            let (200, reply) = answer? else { return None };
            let (token, deadline) = (reply["fencingToken"].as_i64()?, until(&reply, receipt)?);
            let owner = match kind {
                AppKind::Heartbeat => Owner::Heartbeat(reply["handle"].as_str()?.to_owned()),
                _ => Owner::Pod,
            };
            Some((token, receipt, deadline, owner))
        }
    }
}

/// Follows a session's lines: `held` lines extend the app's belief, `lost` and `released`
/// (or the session closing) end it.
async fn follow_session(world: Arc<World>, worker: Arc<Worker>, mut session: Session, token: i64) {
    loop {
        let line = session.next(Duration::from_secs(24 * 3600)).await;
        let receipt = Instant::now();
        let learned = match line.as_ref().map(|l| l["event"].as_str()) {
            None => Learned::StreamClosed,
            Some(Some("lost")) => Learned::LostEvent,
            Some(Some("released")) => Learned::ReleasedEvent,
            Some(Some("held")) => {
                let line = line.as_ref().expect("a line");
                let mut belief = worker.belief.lock().expect("lock");
                let deadline = until(line, receipt).filter(|_| line["fencingToken"].as_i64() == Some(token));
                if let Some(deadline) = deadline.filter(|_| belief.token == Some(token) && !belief.lost) {
                    belief.until = Some(belief.until.map_or(deadline, |u| u.max(deadline)));
                    world.history.log_at(
                        receipt,
                        &worker.name,
                        &worker.lock,
                        Op::Held { token, until: Some(deadline) },
                    );
                }
                continue;
            }
            Some(_) => continue,
        };
        learn(&world, &worker, Some(token), learned);
        if !matches!(learned, Learned::LostEvent) {
            return;
        }
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
        let acquired = tokio::select! {
            _ = worker.stop.cancelled() => break,
            a = acquire(&world, &worker) => a,
        };
        // Timeout, unknown lock (being re-created), a sidecar being restarted...
        let Some((token, receipt, deadline, owner)) = acquired else {
            pace(&worker, 300).await;
            continue;
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
        work(&world, &worker, token, &owner).await;
        {
            let mut belief = worker.belief.lock().expect("lock");
            world.history.log(&worker.name, &lock, Op::Release { token });
            *belief = AppBelief::default();
        }
        let release = match &owner {
            Owner::Pod => Some(format!("/v1/locks/{lock}/release")),
            Owner::Heartbeat(handle) => Some(format!("/v1/locks/{lock}/holds/{handle}/release")),
            // Closing the session lets go.
            Owner::Session { .. } => None,
        };
        drop(owner);
        if let Some(path) = release {
            let _ = call(&worker, "POST", &path, None, Duration::from_secs(10)).await;
        }
        pace(&worker, 150).await;
    }
    if let Some(h) = stream {
        h.abort();
    }
    *worker.belief.lock().expect("lock") = AppBelief::default();
    world.history.log(&worker.name, &lock, Op::Stopped);
}

/// The critical section: steps of writes and an answer about the hold (a view, or a
/// keep-alive for a heartbeat hold), until its length is done or the app stops believing.
async fn work(world: &World, worker: &Worker, token: i64, owner: &Owner) {
    let lock = &worker.lock;
    let end = Instant::now() + worker.sections.pick();
    let acting = || worker.belief.lock().expect("lock").acting(Instant::now()) == Some(token);
    while acting() && Instant::now() < end && !worker.stop.is_cancelled() {
        if hang(world, worker, token).await {
            break;
        }
        world.write_all(worker, &worker.name, token, acting, false).await;
        if !acting() {
            break;
        }
        let (method, path) = match owner {
            Owner::Heartbeat(handle) => ("POST", format!("/v1/locks/{lock}/holds/{handle}/keepalive")),
            _ => ("GET", format!("/v1/locks/{lock}")),
        };
        let answer = call(worker, method, &path, None, Duration::from_secs(2)).await;
        let receipt = Instant::now();
        if let Some((status, answer)) = answer {
            let mut belief = worker.belief.lock().expect("lock");
            if belief.token != Some(token) || belief.lost {
                break;
            }
            let held = status == 200
                && answer["held"].as_bool() == Some(true)
                && answer["fencingToken"].as_i64() == Some(token);
            match until(&answer, receipt).filter(|_| held) {
                Some(deadline) => {
                    belief.until = Some(belief.until.map_or(deadline, |u| u.max(deadline)));
                    world.history.log_at(receipt, &worker.name, lock, Op::Held { token, until: Some(deadline) });
                }
                // A keep-alive refused, or a view saying not held.
                None if status == 200 || matches!(owner, Owner::Heartbeat(_)) && status < 500 => {
                    belief.lost = true;
                    world.history.log_at(receipt, &worker.name, lock, Op::NotHeld);
                    break;
                }
                None => {}
            }
        }
        // An answer that did not come back tells the app nothing: it works on until its
        // last answer runs out.
        let until = worker.belief.lock().expect("lock").until.unwrap_or_else(Instant::now);
        let wake = (Instant::now() + worker.sections.pause()).min(end).min(until);
        tokio::select! {
            _ = worker.learned.notified() => {}
            _ = worker.stop.cancelled() => {}
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
    }
}

/// A hung app (the `app-hung` fault): it makes no call — no keep-alive — until the hang
/// ends, still believing what it was last told; then, as a zombie, writes once with
/// `token` without checking. Returns whether it hung.
async fn hang(world: &World, worker: &Worker, token: i64) -> bool {
    let Some(until) = worker.hung_until.lock().expect("lock").take() else { return false };
    tokio::select! {
        _ = worker.stop.cancelled() => {}
        _ = tokio::time::sleep_until(until.into()) => {}
    }
    zombie(world, worker, token).await;
    true
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
