//! Helpers for holds owned by a caller: session-bound acquires (a streaming answer read
//! line by line), keep-alives, releases and views by owner handle, and the Pod status a
//! kubelet would report (written here with the admin client: there is no kubelet).

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::{Env, Sidecar, TestPod};

impl Sidecar {
    /// `POST /v1/locks/{lock}/acquire` with `body`: status and JSON answer.
    pub async fn acquire_with(&self, lock: &str, body: Value) -> (u16, Value) {
        self.call("POST", &format!("/v1/locks/{lock}/acquire"), Some(&body.to_string())).await
    }

    /// A session-bound acquire (`"session": true` added to `body`): the status and, on
    /// 200, the open session whose first line is the grant.
    pub async fn session(&self, lock: &str, body: Value) -> (u16, Session) {
        open_session(self.api, lock, body).await.expect("the sidecar answers a session-bound acquire")
    }

    /// `POST /v1/locks/{lock}/holds/{handle}/keepalive`.
    pub async fn keepalive(&self, lock: &str, handle: &str) -> (u16, Value) {
        self.call("POST", &format!("/v1/locks/{lock}/holds/{handle}/keepalive"), None).await
    }

    /// `POST /v1/locks/{lock}/holds/{handle}/release`.
    pub async fn release_handle(&self, lock: &str, handle: &str) -> (u16, Value) {
        self.call("POST", &format!("/v1/locks/{lock}/holds/{handle}/release"), None).await
    }

    /// `GET /v1/locks/{lock}/holds/{handle}`.
    pub async fn hold_view(&self, lock: &str, handle: &str) -> (u16, Value) {
        self.call("GET", &format!("/v1/locks/{lock}/holds/{handle}"), None).await
    }
}

/// A session-bound acquire (`"session": true` added to `body`) on the sidecar API at
/// `api`: the status and the open session whose first line is the grant on 200; `None`
/// if the sidecar cannot be reached or does not answer.
pub async fn open_session(api: SocketAddr, lock: &str, mut body: Value) -> Option<(u16, Session)> {
    body["session"] = json!(true);
    let stream = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(api)).await.ok()?.ok()?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.ok()?;
    let connection = tokio::spawn(connection);
    let request = hyper::Request::builder()
        .method("POST")
        .uri(format!("/v1/locks/{lock}/acquire"))
        .header("host", api.to_string())
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))
        .expect("a request");
    let response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(_) => {
            connection.abort();
            return None;
        }
    };
    let status = response.status().as_u16();
    let content_type =
        response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    Some((status, Session { body: response.into_body(), buffer: Vec::new(), content_type, connection }))
}

/// An open session: the streaming answer to a session-bound acquire. Dropping it closes
/// the connection.
pub struct Session {
    body: hyper::body::Incoming,
    buffer: Vec<u8>,
    /// The answer's content type.
    pub content_type: String,
    connection: tokio::task::JoinHandle<hyper::Result<()>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        // The connection task owns the socket: ending it closes the connection.
        self.connection.abort();
    }
}

impl Session {
    /// The next non-empty line as JSON, or `None` if the stream ends or `timeout` passes.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        use http_body_util::BodyExt;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            while let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(serde_json::from_slice(&line).unwrap_or_else(|e| {
                    panic!("a session line is not JSON ({e}): {}", String::from_utf8_lossy(&line))
                }));
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame()).await.ok()??.ok()?;
            if let Ok(bytes) = frame.into_data() {
                self.buffer.extend_from_slice(&bytes);
            }
        }
    }

    /// Waits for the line whose `event` is `name`, skipping others; panics after `timeout`.
    pub async fn expect(&mut self, name: &str, timeout: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some(line) if line["event"] == name => return line,
                Some(_) => continue,
                None => panic!("no {name:?} line in the session within {timeout:?}"),
            }
        }
    }
}

/// Lets `pod`'s ServiceAccount read that Pod, and only it: get, and list and watch with a
/// `metadata.name` field selector (`resourceNames`), which is all the sidecar asks.
pub async fn allow_reading_own_pod(env: &Env, pod: &TestPod) {
    let name = format!("read-pod-{}", pod.name);
    let namespace = Some(env.name().to_owned());
    let meta = ObjectMeta { name: Some(name.clone()), namespace: namespace.clone(), ..ObjectMeta::default() };
    let role = Role {
        metadata: meta.clone(),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["pods".into()]),
            resource_names: Some(vec![pod.name.clone()]),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta,
        role_ref: RoleRef { api_group: Some("rbac.authorization.k8s.io".into()), kind: "Role".into(), name },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: pod.service_account.clone(),
            namespace,
            ..Subject::default()
        }]),
    };
    Api::<Role>::namespaced(env.ns.client.clone(), env.name())
        .create(&PostParams::default(), &role)
        .await
        .expect("create the Role");
    Api::<RoleBinding>::namespaced(env.ns.client.clone(), env.name())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create the RoleBinding");
}

/// A container status as the kubelet reports it for container `app`.
pub fn app_status(ready: bool, restarts: i32, state: Value, last_state: Value) -> Value {
    json!({"name": "app", "image": "registry.invalid/app", "imageID": "", "ready": ready,
           "restartCount": restarts, "started": ready, "state": state, "lastState": last_state})
}

/// A kubelet timestamp (whole seconds).
pub fn kubelet_time(at: jiff::Timestamp) -> String {
    jiff::Timestamp::from_second(at.as_second()).expect("in range").to_string()
}

/// Writes `pod`'s container statuses, as its kubelet would (the admin client writes the
/// status subresource).
pub async fn report_containers(env: &Env, pod: &TestPod, statuses: Value) {
    let pods: Api<Pod> = Api::namespaced(env.ns.client.clone(), env.name());
    let patch = json!({"status": {"phase": "Running", "containerStatuses": statuses}});
    pods.patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("failed to write the status of Pod {}: {e}", pod.name));
}

/// Reports `pod`'s app container running (since a minute ago) and ready.
pub async fn report_app_up(env: &Env, pod: &TestPod) {
    let since = kubelet_time(jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60));
    report_containers(env, pod, json!([app_status(true, 0, json!({"running": {"startedAt": since}}), json!({}))]))
        .await;
}

/// A "pod" that runs the sidecar (labelled `leasehold.dev/inject: "true"`, as an injected
/// Pod is), so that the controller lets its ServiceAccount read it.
pub async fn sidecar_pod(env: &Env, name: &str) -> TestPod {
    let sa = format!("sa-{name}");
    env.ns.service_account(&sa).await;
    let pod = env.ns.pod(name, &sa, &[(leasehold::crd::LABEL_INJECT, "true")]).await;
    let token = env.ns.pod_token(&sa, &pod).await;
    let client = env.cp.client_with_token(&token).await;
    TestPod {
        name: name.to_owned(),
        uid: kube::ResourceExt::uid(&pod).expect("a stored Pod has a uid"),
        service_account: sa,
        token,
        client,
        pod,
    }
}

/// Whether `pod`'s own client may read Pod `name` (a get).
pub async fn may_read_pod(env: &Env, pod: &TestPod, name: &str) -> Result<bool, String> {
    let pods: Api<Pod> = Api::namespaced(pod.client.clone(), env.name());
    match pods.get(name).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 403 => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}
