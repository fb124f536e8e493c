//! Hold mode: hold one lock for the pod's whole life (leader election for singletons).
//!
//! The sidecar queues for the lock at start, and whenever a hold is lost it queues again.
//! While holding it keeps a hold file in a volume every container of the pod mounts:
//! `{lock, fencingToken, acquiredAt, validUntilBoottimeMs}`, written atomically (by
//! rename, so the app never reads half a file). `validUntilBoottimeMs` is the hold's own
//! self-fence deadline on `CLOCK_BOOTTIME` — the clock `/proc/uptime` shows in every
//! container of the pod — and is moved forward after every successful renewal. So the
//! file stops vouching for the hold by itself when the sidecar dies, is killed or is
//! frozen: the app checks the deadline against its own reading of that clock, and a file
//! nobody refreshes goes stale at the renew deadline, before the controller can grant the
//! lock to anyone else (a full lease duration after the last renewal it saw). The file is
//! also removed the moment a hold ends, before a shutdown releases the lock, and by a
//! restarted sidecar before it does anything else.
//!
//! With a bound on the app (`--hold-app-down-after`), hold mode claims only while every app
//! container of the pod is running and ready, and gives leadership up when one has not
//! been for longer than the bound: it removes the file, waits until the deadline written
//! in it has passed (the app may have read it just before), then releases — so a
//! crash-looping or hung leader does not keep the lock. It queues again once the app is up.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::owner::{Ending, Terms};
use super::pod::PodView;
use super::slots::{LockEvent, Slots};
use crate::claim::HoldStatus;
use crate::lease::Timing;

/// When to look again for a renewal of a hold valid until `valid_until`.
fn next_look(valid_until: Instant, timing: Timing, now: Instant) -> Instant {
    crate::boottime::next_look(valid_until, timing.renew_deadline, timing.retry_period, now)
}

/// The contents of the hold file.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HoldRecord {
    /// `<namespace>/<lock>`.
    pub lock: String,
    /// The hold's fencing token.
    pub fencing_token: i64,
    /// When the hold was confirmed (wall clock, informative).
    pub acquired_at: Timestamp,
    /// Until when the hold is valid unless renewed: milliseconds on `CLOCK_BOOTTIME`
    /// (`/proc/uptime` × 1000), never later than the sidecar's own self-fence deadline.
    pub valid_until_boottime_ms: u64,
}

/// Where hold mode keeps its hold file.
#[derive(Clone, Debug)]
pub struct HoldFile {
    path: PathBuf,
}

impl HoldFile {
    /// The hold file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> HoldFile {
        HoldFile { path: path.into() }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn temporary(&self) -> PathBuf {
        self.path.with_extension("tmp")
    }

    /// Removes the file (and a half-written temporary) if present. A sidecar calls this
    /// before anything else at start: a file left by a previous run of the container
    /// (killed, crashed) may still be within its deadline while another pod is granted.
    pub fn clear(&self) -> std::io::Result<()> {
        for path in [self.path.clone(), self.temporary()] {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Writes `record` atomically (temporary file in the same directory, rename).
    pub fn write(&self, record: &HoldRecord) -> std::io::Result<()> {
        let mut contents = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        contents.push(b'\n');
        std::fs::write(self.temporary(), contents)?;
        std::fs::rename(self.temporary(), &self.path)
    }

    /// Removes the file, logging a failure (the deadline inside still expires it).
    pub fn remove(&self) {
        if let Err(e) = self.clear() {
            warn!(path = %self.path.display(), error = %e, "failed to remove the hold file; it expires at its deadline");
        }
    }
}

/// Hold mode's watch on the app: leadership is given up when an app container has not been
/// running and ready for `down_after`, and claimed only while the app is up.
pub struct AppWatch {
    /// The sidecar's Pod.
    pub view: PodView,
    /// How long the app may be down before leadership is given up.
    pub down_after: Duration,
}

/// Whether the app is up, and since when it has not been (with why).
struct AppState {
    watch: AppWatch,
    down_since: Option<(Instant, String)>,
}

impl AppState {
    fn new(watch: AppWatch) -> AppState {
        let mut state = AppState { watch, down_since: None };
        state.observe();
        state
    }

    /// Reads the Pod's latest status.
    fn observe(&mut self) {
        let pod = self.watch.view.borrow_and_update().clone();
        let up = match pod.as_deref() {
            Some(pod) => super::pod::app_up(pod),
            None => Err("this Pod's status is not known (yet)".to_owned()),
        };
        self.down_since = match (up, self.down_since.take()) {
            (Ok(()), _) => None,
            (Err(why), Some((since, _))) => Some((since, why)),
            (Err(why), None) => Some((Instant::now(), why)),
        };
    }

    /// When leadership is to be given up, if the app is down.
    fn give_up_at(&self) -> Option<Instant> {
        self.down_since.as_ref().map(|(since, _)| *since + self.watch.down_after)
    }

    /// Why, after `down_after`.
    fn why(&self) -> String {
        let (why, secs) = (self.down_since.as_ref().map_or("", |(_, why)| why), self.watch.down_after.as_secs_f64());
        format!("{why} for {secs} s")
    }

    /// Waits for the Pod's next change and reads it; `false` if the watch is gone.
    async fn changed(&mut self) -> bool {
        let changed = self.watch.view.changed().await.is_ok();
        self.observe();
        changed
    }
}

/// Sleeps until `at` (or for ever when `None`).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// The first pause before claiming again after a failure that may pass (no answer, 429,
/// 5xx), and the longest (the pause doubles while such failures repeat).
const TRANSIENT_RETRY: Duration = Duration::from_millis(200);
const TRANSIENT_RETRY_MAX: Duration = Duration::from_secs(2);

/// Holds `lock` until `shutdown`, re-queueing after every loss. `holding` is true while a
/// hold is in place and its file written (readiness may follow it). With `app`, it claims
/// only while the app is up and gives leadership up when the app has been down too long.
pub async fn run(
    slots: Slots,
    lock: String,
    file: Option<HoldFile>,
    holding: Arc<AtomicBool>,
    app: Option<AppWatch>,
    shutdown: CancellationToken,
) {
    let mut app = app.map(AppState::new);
    let mut backoff = Duration::from_secs(1);
    let mut transient = TRANSIENT_RETRY;
    while !shutdown.is_cancelled() {
        // Claim only for an app that is up.
        if let Some(app) = app.as_mut() {
            while app.down_since.is_some() {
                if let Some((_, why)) = &app.down_since {
                    info!(lock, why, "hold mode waits for the app before claiming");
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    changed = app.changed() => if !changed { return },
                }
            }
        }
        let mut events = slots.subscribe(&lock);
        let (id, mut reply) = slots.enqueue(&lock, Terms::sidecar());
        let granted = loop {
            let give_up_at = app.as_ref().and_then(AppState::give_up_at);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                reply = &mut reply => break Some(reply),
                changed = async { app.as_mut().expect("only with an app").changed().await }, if app.is_some() => {
                    if !changed { return }
                }
                // The app went down while queued: leave the queue until it is up again.
                _ = sleep_until(give_up_at), if give_up_at.is_some() => break None,
            }
        };
        let Some(granted) = granted else {
            slots.leave(&lock, id);
            continue;
        };
        let granted = match granted {
            Ok(Ok(granted)) => granted,
            Ok(Err(error)) => {
                // A request that got no answer (the apiserver restarting, or this process
                // paused past the request's timeout) is tried again at once: a growing
                // backoff would leave the lock idle while this pod is the one waiting for
                // it. Refusals back off, up to a minute.
                let pause = if error.is_transient() { transient } else { backoff };
                warn!(lock, %error, ?pause, "hold mode cannot claim the lock; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                if error.is_transient() {
                    transient = (transient * 2).min(TRANSIENT_RETRY_MAX);
                } else {
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                }
                continue;
            }
            Err(_) => continue,
        };
        (backoff, transient) = (Duration::from_secs(1), TRANSIENT_RETRY);
        let (token, handle) = (granted.fencing_token, granted.handle);
        info!(lock, token, "holding");
        let record = HoldRecord {
            lock: format!("{}/{lock}", slots.claimant().namespace()),
            fencing_token: token,
            acquired_at: Timestamp::now(),
            valid_until_boottime_ms: 0,
        };
        let mut written: Option<Instant> = None;
        let mut give_up: Option<String> = None;
        // Until this hold ends: keep the file's deadline at the hold's, and watch for the end.
        while let Some((HoldStatus::Held { valid_until, .. }, timing)) = slots.hold_status(&lock, token) {
            if written != Some(valid_until) && !shutdown.is_cancelled() {
                if let Some(file) = &file {
                    let record = HoldRecord {
                        valid_until_boottime_ms: crate::boottime::millis(crate::boottime::deadline_of(valid_until)),
                        ..record.clone()
                    };
                    if let Err(e) = file.write(&record) {
                        warn!(path = %file.path().display(), error = %e, "failed to write the hold file");
                    }
                }
                written = Some(valid_until);
                holding.store(true, Ordering::Release);
            }
            let give_up_at = app.as_ref().and_then(AppState::give_up_at);
            let event = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = sleep_until(give_up_at), if give_up_at.is_some() => {
                    give_up = app.as_ref().map(AppState::why);
                    break;
                }
                changed = async { app.as_mut().expect("only with an app").changed().await }, if app.is_some() => {
                    if !changed { return }
                    continue;
                }
                event = events.recv() => event,
                _ = tokio::time::sleep_until(next_look(valid_until, timing, Instant::now()).into()) => continue,
            };
            match event {
                Ok(LockEvent::Lost { fencing_token, .. } | LockEvent::Released { fencing_token, .. })
                    if fencing_token == token =>
                {
                    break;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                _ => {}
            }
        }
        holding.store(false, Ordering::Release);
        if let Some(file) = &file {
            file.remove();
        }
        if let Some(why) = give_up {
            // The app may have read the file just before it went: let go only once the
            // deadline written in it has passed (the hold renews meanwhile, so nobody else
            // is granted while the file could still vouch for it).
            warn!(lock, token, why, "hold mode gives leadership up: the app is down");
            if let Some(deadline) = written {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(deadline.into()) => {}
                }
            }
            slots.let_go(&lock, &handle, Ending::AppDown { why }).await;
        }
        info!(lock, token, "hold ended; queueing again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ready: Option<bool>) -> Option<Arc<k8s_openapi::api::core::v1::Pod>> {
        let statuses = match ready {
            None => serde_json::json!([]),
            Some(ready) => serde_json::json!([{"name": "app", "image": "x", "imageID": "", "restartCount": 0,
                "ready": ready, "state": {"running": {"startedAt": "2026-11-30T10:00:00Z"}}}]),
        };
        let pod = serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app"}]},
                                     "status": {"containerStatuses": statuses}});
        Some(Arc::new(serde_json::from_value(pod).expect("a Pod")))
    }

    #[test]
    fn the_app_is_down_from_the_first_sight_of_it_until_it_is_up() {
        let (tx, view) = tokio::sync::watch::channel(None);
        let bound = Duration::from_secs(10);
        let mut app = AppState::new(AppWatch { view, down_after: bound });
        // Nothing known yet counts as down: hold mode does not claim for an unseen app.
        let (since, why) = app.down_since.clone().expect("down");
        assert!(why.contains("not known"), "{why}");
        assert_eq!(app.give_up_at(), Some(since + bound));
        tx.send_replace(pod(Some(true)));
        app.observe();
        assert_eq!(app.down_since, None);
        assert_eq!(app.give_up_at(), None);
        tx.send_replace(pod(Some(false)));
        app.observe();
        let (first, why) = app.down_since.clone().expect("down");
        assert_eq!(why, "container app is not ready");
        // Still down, for another reason: the bound counts from the first sight.
        tx.send_replace(pod(None));
        app.observe();
        let (again, why) = app.down_since.clone().expect("down");
        assert_eq!((again, why.as_str()), (first, "container app has no status yet"));
        assert_eq!(app.why(), "container app has no status yet for 10 s");
    }

    #[test]
    fn the_hold_file_is_written_whole_and_cleared_with_its_temporary() {
        let dir = std::env::temp_dir().join(format!("leasehold-hold-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = HoldFile::new(dir.join("hold.json"));
        let record = HoldRecord {
            lock: "ns/leader".into(),
            fencing_token: 7,
            acquired_at: Timestamp::UNIX_EPOCH,
            valid_until_boottime_ms: 123_456,
        };
        file.write(&record).expect("write");
        let text = std::fs::read_to_string(file.path()).expect("read");
        assert_eq!(
            text,
            "{\"lock\":\"ns/leader\",\"fencingToken\":7,\"acquiredAt\":\"1970-01-01T00:00:00Z\",\"validUntilBoottimeMs\":123456}\n"
        );
        std::fs::write(dir.join("hold.tmp"), "half").expect("a leftover temporary");
        file.clear().expect("clear");
        assert!(!file.path().exists() && !dir.join("hold.tmp").exists());
        file.clear().expect("clearing nothing is fine");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
