//! The apps of a hold-mode pod, whose sidecar holds the lock for the pod's life. Each
//! trusts only what the product documents as trustworthy: one reads the hold file the
//! sidecar writes into the pod's shared volume and applies its documented validity check,
//! the other asks the sidecar's API. While it believes, each writes the fenced resources
//! with the token, about three times a second.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::app::{call, until};
use super::history::Op;
use super::world::{AppBelief, Worker, World};

/// The name in the history of the app trusting `pod`'s hold file.
pub fn file_app(pod: &str) -> String {
    format!("{pod}/file")
}

/// The name in the history of the app trusting `pod`'s sidecar API.
pub fn api_app(pod: &str) -> String {
    format!("{pod}/api")
}

/// What a hold file lets the app believe: the token, and until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Valid {
    /// The token.
    pub token: i64,
    /// The time limit, if the file gives one.
    pub until: Option<Instant>,
}

/// The documented validity check of a hold file read when `CLOCK_BOOTTIME` showed
/// `boottime` (and the test's clock `now`): the file exists, names a token, and its
/// `validUntilBoottimeMs` is ahead of the clock — the app may act until then.
pub fn validity(contents: Option<&str>, boottime: Duration, now: Instant) -> Option<Valid> {
    let record: serde_json::Value = serde_json::from_str(contents?).ok()?;
    let token = record["fencingToken"].as_i64()?;
    let valid_until = Duration::from_millis(record["validUntilBoottimeMs"].as_u64()?);
    let left = valid_until.checked_sub(boottime).filter(|left| !left.is_zero())?;
    Some(Valid { token, until: Some(now + left) })
}

fn read(path: &Path) -> Option<Valid> {
    let (boottime, now) = (leasehold::boottime::now(), Instant::now());
    validity(std::fs::read_to_string(path).ok().as_deref(), boottime, now)
}

/// The app trusting the hold file: reads it every 100 ms.
pub async fn trust_file(world: Arc<World>, worker: Arc<Worker>) {
    let client = file_app(&worker.name);
    let path = worker.hold_file.clone().expect("a hold-mode pod has a hold file");
    let lock = worker.lock.clone();
    let mut believed: Option<i64> = None;
    let mut next_write = Instant::now();
    while !worker.stop.is_cancelled() {
        let valid = read(&path);
        match (believed, valid) {
            (None, Some(v)) => world.history.log(&client, &lock, Op::Granted { token: v.token, until: v.until }),
            (Some(t), Some(v)) if t == v.token => {
                world.history.log(&client, &lock, Op::Held { token: v.token, until: v.until });
            }
            (Some(_), Some(v)) => {
                world.history.log(&client, &lock, Op::NotHeld);
                world.history.log(&client, &lock, Op::Granted { token: v.token, until: v.until });
            }
            (Some(_), None) => world.history.log(&client, &lock, Op::NotHeld),
            (None, None) => {}
        }
        believed = valid.map(|v| v.token);
        if let Some(token) = believed
            && Instant::now() >= next_write
        {
            let acting = || read(&path).is_some_and(|v| v.token == token && v.until.is_none_or(|u| Instant::now() < u));
            world.write_all(&worker, &client, token, acting, false).await;
            next_write = Instant::now() + Duration::from_millis(300);
        }
        tokio::select! {
            _ = worker.stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    world.history.log(&client, &lock, Op::Stopped);
}

/// The app trusting the sidecar's API: asks for its view every 300 ms.
pub async fn trust_api(world: Arc<World>, worker: Arc<Worker>) {
    let client = api_app(&worker.name);
    let lock = worker.lock.clone();
    while !worker.stop.is_cancelled() {
        let view = call(&worker, "GET", &format!("/v1/locks/{lock}"), None, Duration::from_secs(1)).await;
        let receipt = Instant::now();
        if let Some((200, view)) = view {
            let mut belief = worker.belief.lock().expect("lock");
            let held = view["held"].as_bool() == Some(true);
            match (view["fencingToken"].as_i64(), until(&view, receipt)) {
                (Some(token), Some(deadline)) if held => {
                    let op = if belief.acting(receipt) == Some(token) {
                        Op::Held { token, until: Some(deadline) }
                    } else {
                        Op::Granted { token, until: Some(deadline) }
                    };
                    world.history.log_at(receipt, &client, &lock, op);
                    *belief = AppBelief { token: Some(token), until: Some(deadline), lost: false };
                }
                _ => {
                    if belief.token.is_some() {
                        world.history.log_at(receipt, &client, &lock, Op::NotHeld);
                    }
                    *belief = AppBelief::default();
                }
            }
        }
        // A view that did not come back tells the app nothing: it acts until its last
        // answer runs out.
        let acting = || worker.belief.lock().expect("lock").acting(Instant::now());
        if let Some(token) = acting() {
            world.write_all(&worker, &client, token, || acting() == Some(token), false).await;
        }
        tokio::select! {
            _ = worker.stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
    }
    *worker.belief.lock().expect("lock") = AppBelief::default();
    world.history.log(&client, &lock, Op::Stopped);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_files_validity_check() {
        let now = Instant::now();
        let boot = Duration::from_secs(1000);
        let file = |until_ms: u64| {
            format!(
                r#"{{"lock":"ns/leader","fencingToken":7,"acquiredAt":"2026-01-01T00:00:00Z","validUntilBoottimeMs":{until_ms}}}"#
            )
        };
        assert_eq!(
            validity(Some(&file(1_002_500)), boot, now),
            Some(Valid { token: 7, until: Some(now + Duration::from_millis(2500)) })
        );
        // A deadline behind the clock, a missing file, a file without a deadline: not held.
        assert_eq!(validity(Some(&file(1_000_000)), boot, now), None);
        assert_eq!(validity(Some(&file(999_000)), boot, now), None);
        assert_eq!(validity(None, boot, now), None);
        assert_eq!(validity(Some(r#"{"fencingToken":7}"#), boot, now), None);
    }
}
