//! App pods for tests and benchmarks on the node: busybox containers that use the injected
//! sidecar as an app would — `wget` to `$LEASEHOLD_URL` — and report what they got on
//! stdout.

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::BUSYBOX_IMAGE;

/// The app's script: print whether the sidecar answered before anything else ran, acquire
/// `lock` (waiting up to a minute), print the answer, then idle until SIGTERM and exit.
pub fn acquirer_script(lock: &str) -> String {
    format!(
        r#"trap 'echo terminating; exit 0' TERM
if wget -q -O /dev/null http://127.0.0.1:7071/healthz; then echo sidecar-first; else echo sidecar-not-up; fi
until answer=$(wget -q -O- --post-data '{{"waitSeconds": 60}}' "$LEASEHOLD_URL/v1/locks/{lock}/acquire"); do sleep 1; done
echo "acquired $answer"
while true; do sleep 1; done"#
    )
}

/// The script of an app whose hold lasts as long as its session: it acquires `lock` with
/// `"session": true` and keeps the answer's stream open in the background (its first
/// line, the grant, in `/tmp/session`). On SIGTERM the shell exits at once, the
/// container's other processes die with it, the stream's connection closes, and the
/// sidecar lets the hold go without waiting for the kubelet to report the container ended.
pub fn session_acquirer_script(lock: &str) -> String {
    format!(
        r#"trap 'echo terminating; exit 0' TERM
while true; do
  wget -q -O /tmp/session --post-data '{{"waitSeconds": 60, "session": true}}' "$LEASEHOLD_URL/v1/locks/{lock}/acquire" &
  wait $!
  sleep 1
done"#
    )
}

/// A pod labelled for injection whose app container runs [`acquirer_script`].
pub fn acquirer(name: &str, lock: &str, restart_policy: &str) -> Pod {
    app_pod(name, restart_policy, &acquirer_script(lock))
}

/// A pod labelled for injection whose app container runs [`session_acquirer_script`].
pub fn session_acquirer(name: &str, lock: &str, restart_policy: &str) -> Pod {
    app_pod(name, restart_policy, &session_acquirer_script(lock))
}

fn app_pod(name: &str, restart_policy: &str, script: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"leasehold.dev/inject": "true", "app": "acquirer"}},
        "spec": {
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 10,
            "containers": [{
                "name": "app",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        },
    }))
    .expect("a valid Pod")
}

/// The fencing token in the app's log line `acquired {...}`, once there is one.
pub fn acquired_token(log: &str) -> Option<i64> {
    let line = log.lines().find_map(|l| l.strip_prefix("acquired "))?;
    let answer: serde_json::Value = serde_json::from_str(line).ok()?;
    answer["fencingToken"].as_i64()
}

/// The pod's claimant identity, `<name>_<uid>`.
pub fn identity(pod: &Pod) -> String {
    format!("{}_{}", pod.metadata.name.clone().unwrap_or_default(), pod.metadata.uid.clone().unwrap_or_default())
}

/// The container ID (`containerd://...`) of `container` in `pod`'s status.
pub fn container_id(pod: &Pod, container: &str) -> String {
    let status = pod.status.clone().unwrap_or_default();
    status
        .init_container_statuses
        .into_iter()
        .flatten()
        .chain(status.container_statuses.into_iter().flatten())
        .find(|s| s.name == container)
        .and_then(|s| s.container_id)
        .unwrap_or_else(|| panic!("no container {container} running in {:?}", pod.metadata.name))
}
