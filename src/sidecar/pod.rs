//! The sidecar's own Pod, as the kubelet reports it: which app container instance has
//! ended, and whether the app is up.
//!
//! The sidecar watches only its own Pod (a list and watch with a `metadata.name` field
//! selector, so a Role limited to that name by `resourceNames` is enough). The decisions
//! are pure functions of the Pod's status, and they only ever conclude "ended" from facts
//! that cannot be stale: the kubelet's status may lag behind the containers, but a
//! container instance reported as started or finished after some moment did start or
//! finish after it. The kubelet's timestamps have one-second resolution and are the
//! node's wall clock, the clock the sidecar reads too (same node).

use std::sync::Arc;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::watch;
use tracing::{debug, warn};

/// The latest state of the sidecar's Pod: `None` until first read (or while it cannot be).
pub type PodView = watch::Receiver<Option<Arc<Pod>>>;

/// Watches Pod `name` (with uid `uid`: a Pod re-created under the same name is not ours)
/// into the returned view, until the returned task is dropped. Failures (a missing
/// permission, say) are logged and retried with the watch's backoff.
pub fn watch_pod(
    client: kube::Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> (PodView, impl std::future::Future<Output = ()> + Send + 'static) {
    let (tx, rx) = watch::channel(None);
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let (namespace, name, uid) = (namespace.to_owned(), name.to_owned(), uid.to_owned());
    let task = async move {
        // The backoff is ours, not the stream's: kube's stream backoff starts afresh on any
        // item, and every relist begins with one (`Init`) before it fails, so a missing
        // permission would be asked about several times a second for ever.
        let mut events = watcher(api, config).boxed();
        let mut delays = backoff();
        let mut failing = false;
        while let Some(event) = events.next().await {
            match event {
                // A relist begins: nothing learned yet.
                Ok(watcher::Event::Init) => {}
                Ok(event) => {
                    failing = false;
                    delays = backoff();
                    if let watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) = event
                        && pod.metadata.uid.as_deref() == Some(uid.as_str())
                    {
                        tx.send_replace(Some(Arc::new(pod)));
                    }
                }
                Err(error) => {
                    if !failing {
                        warn!(pod = %format!("{namespace}/{name}"), %error, "cannot watch this Pod's status (needs get, list and watch on it); container restarts go unnoticed until it can");
                    } else {
                        debug!(%error, "pod watch still failing");
                    }
                    failing = true;
                    let delay = delays.next().unwrap_or(MAX_DELAY);
                    tokio::time::sleep(delay).await;
                }
            }
        }
    };
    (rx, task)
}

/// The longest pause between attempts.
const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(30);

/// Retries from 200 ms up to 30 s: a missing permission is not fixed in a hurry, and a
/// sidecar in every pod should not ask every two seconds meanwhile.
fn backoff() -> impl Iterator<Item = std::time::Duration> + Send {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(200))
        .with_max_delay(MAX_DELAY)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// The status of container `name`, if the kubelet reported one.
fn status<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|s| s.name == name)
}

/// The names of the Pod's app containers (its regular containers: not init containers,
/// not native sidecars such as this one).
pub fn app_containers(pod: &Pod) -> Vec<&str> {
    pod.spec.as_ref().map(|s| s.containers.iter().map(|c| c.name.as_str()).collect()).unwrap_or_default()
}

/// The container a hold bound to "the pod's only app container" belongs to: that
/// container if there is exactly one, else none.
pub fn only_app_container(pod: &Pod) -> Option<&str> {
    match app_containers(pod).as_slice() {
        [only] => Some(only),
        _ => None,
    }
}

/// Whether the instance of container `name` that was running at `taken_at` — the one whose
/// process took a hold then — has ended by now, as far as the Pod's status proves:
/// - the current (or last) instance started after `taken_at`: the one running then had
///   ended before it started (a container runs one instance at a time);
/// - an instance finished after `taken_at`: if it was the one running then, it ended; if
///   it started later, the one running then had ended before.
///
/// A status that shows neither proves nothing (it may lag behind a newer instance that
/// took the hold), so the answer is `false`. The timestamps are whole seconds, rounded
/// down: a reported time after `taken_at` is a real time after it; an instance that
/// started within the same second as the grant is not told apart (the hold is then kept
/// until the next proof).
pub fn instance_ended(pod: &Pod, name: &str, taken_at: Timestamp) -> bool {
    let Some(status) = status(pod, name) else { return false };
    let after = |time: Option<&Time>| time.is_some_and(|t| t.0 > taken_at);
    let state = status.state.as_ref();
    let running = state.and_then(|s| s.running.as_ref());
    let terminated = state.and_then(|s| s.terminated.as_ref());
    let last = status.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    after(running.and_then(|r| r.started_at.as_ref()))
        || after(terminated.and_then(|t| t.started_at.as_ref()))
        || after(terminated.and_then(|t| t.finished_at.as_ref()))
        || after(last.and_then(|t| t.finished_at.as_ref()))
}

/// Whether the app is up: every app container running and ready. `Err` says what is not.
pub fn app_up(pod: &Pod) -> Result<(), String> {
    for name in app_containers(pod) {
        let Some(status) = status(pod, name) else {
            return Err(format!("container {name} has no status yet"));
        };
        let running = status.state.as_ref().is_some_and(|s| s.running.is_some());
        if !running {
            let how = match status.state.as_ref() {
                Some(s) if s.terminated.is_some() => "has terminated",
                Some(s) if s.waiting.is_some() => "is waiting to (re)start",
                _ => "is not running",
            };
            return Err(format!("container {name} {how}"));
        }
        if !status.ready {
            return Err(format!("container {name} is not ready"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T: i64 = 1_800_000_000;

    fn at(offset: i64) -> String {
        Timestamp::from_second(T + offset).expect("valid").to_string()
    }

    fn pod(containers: &[&str], statuses: serde_json::Value) -> Pod {
        let containers: Vec<_> = containers.iter().map(|n| json!({"name": n, "image": "x"})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": containers},
            "status": {"containerStatuses": statuses},
        }))
        .expect("a Pod")
    }

    fn app(state: serde_json::Value, last: serde_json::Value, ready: bool) -> serde_json::Value {
        json!([{"name": "app", "image": "x", "imageID": "", "restartCount": 1, "ready": ready,
                "state": state, "lastState": last}])
    }

    #[test]
    fn an_instance_ends_only_on_proof() {
        // The hold was taken half a second into second T.
        let taken = Timestamp::from_second(T).expect("valid") + jiff::SignedDuration::from_millis(500);
        let running = |s| json!({"running": {"startedAt": at(s)}});
        let finished = |s, f| json!({"terminated": {"exitCode": 1, "startedAt": at(s), "finishedAt": at(f)}});
        let waiting = json!({"waiting": {"reason": "CrashLoopBackOff"}});
        let cases = [
            ("running since before the grant", running(-30), json!({}), false),
            ("started in the grant's second: not told apart", running(0), json!({}), false),
            ("restarted after the grant", running(1), finished(-30, 1), true),
            ("restarted later, last exit unknown", running(5), json!({}), true),
            ("terminated after the grant", finished(-30, 2), json!({}), true),
            ("terminated in the grant's second: not proven", finished(-30, 0), json!({}), false),
            ("waiting after an exit after the grant", waiting.clone(), finished(-30, 3), true),
            ("waiting after an exit before the grant (a stale status)", waiting.clone(), finished(-30, -2), false),
            ("waiting, nothing known", waiting, json!({}), false),
            ("running, but the last instance finished after the grant", running(0), finished(-30, 1), true),
        ];
        for (what, state, last, ended) in cases {
            let p = pod(&["app"], app(state, last, true));
            assert_eq!(instance_ended(&p, "app", taken), ended, "{what}");
        }
        let p = pod(&["app"], app(running(100), json!({}), true));
        assert!(!instance_ended(&p, "other", taken), "a container without a status proves nothing");
        let bare: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("a Pod");
        assert!(!instance_ended(&bare, "app", taken));
    }

    #[test]
    fn the_only_app_container() {
        assert_eq!(only_app_container(&pod(&["app"], json!([]))), Some("app"));
        assert_eq!(only_app_container(&pod(&["app", "helper"], json!([]))), None);
        assert_eq!(only_app_container(&pod(&[], json!([]))), None);
    }

    #[test]
    fn the_app_is_up_when_every_container_runs_ready() {
        let running = json!({"running": {"startedAt": at(0)}});
        assert_eq!(app_up(&pod(&["app"], app(running.clone(), json!({}), true))), Ok(()));
        let cases = [
            (app(running.clone(), json!({}), false), "container app is not ready"),
            (app(json!({"waiting": {"reason": "CrashLoopBackOff"}}), json!({}), false), "container app is waiting"),
            (
                app(json!({"terminated": {"exitCode": 0, "finishedAt": at(0)}}), json!({}), false),
                "container app has terminated",
            ),
            (json!([]), "container app has no status yet"),
        ];
        for (statuses, expected) in cases {
            let error = app_up(&pod(&["app"], statuses)).expect_err(expected);
            assert!(error.starts_with(expected), "{error}");
        }
        // Every app container counts.
        let both = json!([
            {"name": "app", "image": "x", "imageID": "", "restartCount": 0, "ready": true, "state": running},
            {"name": "helper", "image": "x", "imageID": "", "restartCount": 0, "ready": false, "state": {"running": {}}},
        ]);
        assert_eq!(app_up(&pod(&["app", "helper"], both)), Err("container helper is not ready".into()));
    }
}
