//! Support shared by every Leasehold test binary that works against a real control plane:
//! the end-to-end tests (`e2e/tests`), the fault-injection suite (`e2e/faults`), the node
//! tests (`e2e/node/tests`) and the benchmarks (`bench`), each taking it as a
//! dev-dependency. It holds the CRDs' installation, Leasehold processes (controllers,
//! sidecars) spawned from the binary under test, "pods" (a Pod object plus a Pod-bound
//! client), calls to a sidecar's local API, admission plumbing, and waits on watch events.
//! The control plane itself comes from `leasehold-harness`.

pub mod admission;
pub mod clock;
pub mod lifecycle;
pub mod locks;
pub mod owner;
pub mod watch;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResourceExt, ResourceExt};
use leasehold::claim::Claimant;
use leasehold::crd::{DistributedLock, DistributedLockSpec, ForceReleaseRequest, LockClaim};
use leasehold::lease::Identity;
use leasehold_harness::{ControlPlane, Supervised, TestNamespace, eventually, shared};

/// The binary under test: the `leasehold` binary cargo built beside the running test or
/// benchmark.
pub fn leasehold_bin() -> &'static str {
    // Cargo names the binary to the test binaries of its own package only; this crate asks
    // at run time, once.
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        assert_cmd::cargo::cargo_bin("leasehold")
            .into_os_string()
            .into_string()
            .expect("the path of the leasehold binary is UTF-8")
    })
}

/// The sidecar binary under test: `leasehold-sidecar`, the one the chart injects into app
/// pods, built beside the running test or benchmark.
pub fn sidecar_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        assert_cmd::cargo::cargo_bin("leasehold-sidecar")
            .into_os_string()
            .into_string()
            .expect("the path of the leasehold-sidecar binary is UTF-8")
    })
}

/// A free loopback port (bound and released; the caller binds it next), never one this
/// process handed out before.
///
/// It is taken below the kernel's ephemeral range: a server a test stops and starts again on
/// the same port (a restarted sidecar) would otherwise find it taken, now and then, as the
/// local port of some client connection made meanwhile. And it is never handed out twice:
/// while such a server is down its port looks free, and handed to another server (the
/// restarted sidecar's own admin port, say) it would be taken when the first comes back.
pub fn free_port() -> u16 {
    use rand::Rng as _;
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let below = 10_000.min(ephemeral / 2)..ephemeral;
    loop {
        let port = rand::rng().random_range(below.clone());
        let mut given = GIVEN.lock().expect("never poisoned");
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
}

/// Installs the DistributedLock, LockClaim and ForceReleaseRequest CRDs (idempotent) and
/// waits until they are established.
pub async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [DistributedLock::crd(), LockClaim::crd(), ForceReleaseRequest::crd()] {
        let name = crd.name_any();
        crds.patch(&name, &PatchParams::apply("leasehold-e2e").force(), &Patch::Apply(&crd))
            .await
            .expect("apply the CRD");
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .expect("CRD established within 30s")
        .expect("watch the CRD");
    }
}

/// A test's world: the shared control plane, a fresh namespace with the CRD installed.
pub struct Env {
    /// The control plane.
    pub cp: &'static ControlPlane,
    /// The test's namespace.
    pub ns: TestNamespace,
}

impl Env {
    /// A fresh namespace on the shared control plane, CRD installed.
    pub async fn new(prefix: &str) -> Env {
        let cp = shared();
        let ns = cp.namespace(prefix).await;
        install_crd(&ns.client).await;
        Env { cp, ns }
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.ns.name
    }

    /// DistributedLocks of the namespace.
    pub fn locks(&self) -> Api<DistributedLock> {
        Api::namespaced(self.ns.client.clone(), &self.ns.name)
    }

    /// Leases of the namespace.
    pub fn leases(&self) -> Api<k8s_openapi::api::coordination::v1::Lease> {
        Api::namespaced(self.ns.client.clone(), &self.ns.name)
    }

    /// LockClaims of the namespace.
    pub fn claims(&self) -> Api<LockClaim> {
        Api::namespaced(self.ns.client.clone(), &self.ns.name)
    }

    /// Creates a lock with the given spec.
    pub async fn lock(&self, name: &str, spec: DistributedLockSpec) -> DistributedLock {
        self.locks().create(&PostParams::default(), &DistributedLock::new(name, spec)).await.expect("create the lock")
    }

    /// Starts a controller scoped to this namespace (its own election Lease here too).
    pub async fn controller(&self, extra: &[&str]) -> LeaseholdProcess {
        self.controller_as(None, extra).await
    }

    /// Starts a controller with `kubeconfig` (default: the admin's).
    pub async fn controller_as(&self, kubeconfig: Option<&std::path::Path>, extra: &[&str]) -> LeaseholdProcess {
        self.controller_with(kubeconfig, extra, |_| {}).await
    }

    /// Starts a controller whose wall clock is the timestamp file `clock` ([`clock`]).
    pub async fn controller_under_clock(&self, clock: &std::path::Path, extra: &[&str]) -> LeaseholdProcess {
        self.controller_with(None, extra, |command| clock::under_clock(command, clock)).await
    }

    async fn controller_with(
        &self,
        kubeconfig: Option<&std::path::Path>,
        extra: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> LeaseholdProcess {
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let identity = format!("controller-{}", admin.port());
        let mut command = Command::new(leasehold_bin());
        command
            .args(["controller", "--namespace", self.name(), "--election-namespace", self.name()])
            .args(["--admin-addr", &admin.to_string(), "--identity", &identity])
            .args(extra)
            .env("KUBECONFIG", kubeconfig.unwrap_or(self.cp.kubeconfig_path()))
            .env("RUST_LOG", std::env::var("LEASEHOLD_E2E_CONTROLLER_LOG").unwrap_or_else(|_| "info,kube=warn".into()));
        configure(&mut command);
        let process = LeaseholdProcess::spawn(&identity, command, admin);
        process.wait_ready().await;
        process
    }

    /// A "pod": a ServiceAccount, a Pod object, and a client holding a token bound to it.
    pub async fn pod(&self, name: &str) -> TestPod {
        self.stage().pod(name).await
    }

    /// Waits until `pod` may create LockClaims here (the controller prepares claimant RBAC
    /// once the namespace has a lock).
    pub async fn wait_claim_rbac(&self, pod: &TestPod) {
        let stage = self.stage();
        eventually("claimant RBAC prepared by the controller", Duration::from_secs(30), || async {
            if stage.may_claim(pod).await? { Ok(()) } else { Err("not allowed yet".to_owned()) }
        })
        .await;
    }

    /// Waits until `pod` may `verb` `resource` (of `group`, named `name` if given) here.
    pub async fn wait_allowed(&self, pod: &TestPod, verb: &str, group: &str, resource: &str, name: Option<&str>) {
        let stage = self.stage();
        let what = format!("{} allowed to {verb} {resource} {}", pod.name, name.unwrap_or(""));
        eventually(&what, Duration::from_secs(30), || async {
            if stage.allowed(pod, verb, group, resource, name).await? {
                Ok(())
            } else {
                Err("not allowed yet".to_owned())
            }
        })
        .await;
    }

    /// Starts a sidecar process for `pod`, with its Pod-bound token and downward-API
    /// identity; waits until it is healthy.
    pub async fn sidecar(&self, pod: &TestPod, extra: &[&str]) -> Sidecar {
        self.stage().sidecar(pod, extra).await
    }

    /// [`Env::sidecar`], reaching the apiserver at `server` (a fault proxy) when given.
    pub async fn sidecar_via(&self, pod: &TestPod, server: Option<&str>, extra: &[&str]) -> Sidecar {
        self.stage().sidecar_via(pod, server, extra).await
    }

    /// A fault proxy in front of the apiserver (initially passing), and the URL that
    /// reaches the apiserver through it.
    pub fn apiserver_proxy(&self) -> (leasehold_harness::FaultProxy, String) {
        let upstream: std::net::SocketAddr =
            self.cp.server_url().trim_start_matches("https://").parse().expect("the apiserver's address");
        let proxy = leasehold_harness::FaultProxy::start(upstream).expect("a fault proxy");
        let url = format!("https://{}", proxy.addr());
        (proxy, url)
    }

    /// Where process logs go.
    pub fn log_dir(&self) -> PathBuf {
        self.stage().log_dir()
    }
}

/// A simulated pod: its Pod object and a client with a Pod-bound token.
pub struct TestPod {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// Its ServiceAccount.
    pub service_account: String,
    /// The Pod-bound token.
    pub token: String,
    /// A client using that token.
    pub client: Client,
    /// The stored Pod.
    pub pod: Pod,
}

impl TestPod {
    /// This pod's claimant identity.
    pub fn identity(&self) -> Identity {
        Identity::for_pod(&self.name, &self.uid)
    }

    /// A claimant acting as this pod.
    pub fn claimant(&self, namespace: &str) -> Claimant {
        Claimant::new(self.client.clone(), namespace, self.identity(), "leasehold-e2e")
    }
}

/// A sidecar process and its lock API address.
pub struct Sidecar {
    /// The process (admin address inside).
    pub process: LeaseholdProcess,
    /// The lock API.
    pub api: SocketAddr,
}

impl Sidecar {
    /// `POST /v1/locks/{lock}/acquire` with `{"waitSeconds": wait}`: status and JSON body.
    pub async fn acquire(&self, lock: &str, wait: f64) -> (u16, serde_json::Value) {
        let body = serde_json::json!({ "waitSeconds": wait }).to_string();
        self.call("POST", &format!("/v1/locks/{lock}/acquire"), Some(&body)).await
    }

    /// `POST /v1/locks/{lock}/release`.
    pub async fn release(&self, lock: &str) -> (u16, serde_json::Value) {
        self.call("POST", &format!("/v1/locks/{lock}/release"), None).await
    }

    /// `GET /v1/locks/{lock}`.
    pub async fn view(&self, lock: &str) -> serde_json::Value {
        let (status, body) = self.call("GET", &format!("/v1/locks/{lock}"), None).await;
        assert_eq!(status, 200, "view of {lock}: {body}");
        body
    }

    /// Any request; the body parsed as JSON (`Null` if it is not JSON).
    pub async fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
        let (status, text) = http_request(self.api, method, path, body)
            .await
            .unwrap_or_else(|| panic!("{} did not answer {method} {path}", self.process.name));
        (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
    }

    /// Opens the event stream of `lock`.
    pub async fn events(&self, lock: &str) -> SseReader {
        let response = http_send(self.api, "GET", &format!("/v1/locks/{lock}/events"), None)
            .await
            .expect("the sidecar answers the event stream");
        assert_eq!(response.status().as_u16(), 200);
        SseReader::from_response(response)
    }
}

/// Reads Server-Sent Events from a streaming response.
pub struct SseReader {
    body: hyper::body::Incoming,
    buffer: String,
}

impl SseReader {
    /// Reads events from an event-stream response.
    pub fn from_response(response: hyper::Response<hyper::body::Incoming>) -> SseReader {
        SseReader { body: response.into_body(), buffer: String::new() }
    }

    /// The next event (name, JSON data), or `None` if the stream ends or `timeout` passes.
    pub async fn next(&mut self, timeout: Duration) -> Option<(String, serde_json::Value)> {
        use http_body_util::BodyExt;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut name = None;
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim());
                    }
                }
                match name {
                    // Keep-alive comments carry no event.
                    None => continue,
                    Some(name) => return Some((name, serde_json::from_str(&data).unwrap_or(serde_json::Value::Null))),
                }
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame()).await.ok()??.ok()?;
            if let Ok(bytes) = frame.into_data() {
                self.buffer.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }

    /// Waits for the event named `name`, skipping others; panics after `timeout`.
    pub async fn expect(&mut self, name: &str, timeout: Duration) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some((n, data)) if n == name => return data,
                Some(_) => continue,
                None => panic!("no {name:?} event within {timeout:?}"),
            }
        }
    }
}

/// A Leasehold process under test, killed on drop.
pub struct LeaseholdProcess {
    /// The process.
    pub process: Option<Supervised>,
    /// Its admin address.
    pub admin: SocketAddr,
    /// Its name.
    pub name: String,
}

impl LeaseholdProcess {
    /// Spawns `command` with its output in a log file.
    pub fn spawn(name: &str, command: Command, admin: SocketAddr) -> LeaseholdProcess {
        let log = std::env::temp_dir().join(format!("leasehold-e2e-{name}-{}.log", std::process::id()));
        let process = Supervised::spawn(name, command, &log).expect("spawn a leasehold process");
        LeaseholdProcess { process: Some(process), admin, name: name.to_owned() }
    }

    fn process(&self) -> &Supervised {
        self.process.as_ref().expect("the process is running")
    }

    /// GETs `path` on the admin server; `None` if it does not answer.
    pub async fn admin_get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.admin, path).await
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&self) {
        let what = format!("{} ready at {}", self.name, self.admin);
        eventually(&what, Duration::from_secs(60), || async {
            match self.admin_get("/readyz").await {
                Some((200, _)) => Ok(()),
                other => Err(format!("{other:?}; log tail:\n{}", self.process().log_tail(20))),
            }
        })
        .await;
    }

    /// The value of an unlabelled metric, if exposed.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.admin_get("/metrics").await?;
        body.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    }

    /// Sends a signal.
    pub fn signal(&self, signal: i32) {
        self.process().signal(signal);
    }

    /// SIGKILLs and reaps the process.
    pub fn kill(&mut self) {
        if let Some(p) = self.process.take() {
            p.kill_and_reap();
        }
    }

    /// Sends SIGTERM and waits up to `timeout` for the exit; returns the exit code.
    pub async fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        let process = self.process.as_mut().expect("the process is running");
        process.signal(libc::SIGTERM);
        let status = process.wait_exit(timeout).await;
        status.and_then(|s| s.code())
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.as_ref().map(|p| p.log_tail(lines)).unwrap_or_default()
    }
}

/// GET over loopback; `None` if nothing answers.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    http_request(addr, "GET", path, None).await
}

/// One HTTP/1.1 request over loopback (hyper); `None` if nothing answers.
pub async fn http_request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Option<(u16, String)> {
    use http_body_util::BodyExt;
    let response = http_send(addr, method, path, body).await?;
    let status = response.status().as_u16();
    let bytes = tokio::time::timeout(Duration::from_secs(120), response.into_body().collect()).await.ok()?.ok()?;
    Some((status, String::from_utf8_lossy(&bytes.to_bytes()).into_owned()))
}

/// Sends one request and returns the response with its body still streaming (for SSE).
pub async fn http_send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Option<hyper::Response<hyper::body::Incoming>> {
    let stream = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr)).await.ok()?.ok()?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.ok()?;
    tokio::spawn(connection);
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body.unwrap_or("").to_owned())))
        .ok()?;
    sender.send_request(request).await.ok()
}
