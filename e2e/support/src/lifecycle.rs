//! The controller's lifecycle as a reusable scenario: FIFO grants in claim order with
//! strictly increasing tokens, a release handing over to the next waiter, and a holder
//! that stops renewing expiring after the lease duration — the controller's
//! lifecycle test, runnable against any control plane and any controller already running
//! there (for instance one holding only the chart's RBAC).
//!
//! Unlike the other helpers it returns errors instead of panicking: a test may expect it
//! to fail (a controller missing a permission), and the error names the step that did.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;
use leasehold::claim::edit;
use leasehold::crd::{DistributedLock, DistributedLockSpec, LockClaim};
use leasehold_harness::{ControlPlane, TestNamespace, eventually};

use crate::watch::GrantLog;
use crate::{Env, LeaseholdProcess, Sidecar, TestPod, free_port, sidecar_bin};

/// The lock the scenario creates.
pub const LOCK: &str = "orders";

/// A namespace on some control plane: where a scenario runs.
pub struct Stage<'a> {
    /// The control plane.
    pub cp: &'a ControlPlane,
    /// The namespace.
    pub ns: &'a TestNamespace,
}

impl Env {
    /// This test's namespace as a [`Stage`].
    pub fn stage(&self) -> Stage<'_> {
        Stage { cp: self.cp, ns: &self.ns }
    }
}

impl Stage<'_> {
    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.ns.name
    }

    /// DistributedLocks of the namespace (admin).
    pub fn locks(&self) -> Api<DistributedLock> {
        Api::namespaced(self.ns.client.clone(), &self.ns.name)
    }

    /// Leases of the namespace (admin).
    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.ns.client.clone(), &self.ns.name)
    }

    /// LockClaims of the namespace (admin).
    pub fn claims(&self) -> Api<LockClaim> {
        Api::namespaced(self.ns.client.clone(), &self.ns.name)
    }

    /// A "pod": a ServiceAccount, a Pod object, and a client holding a token bound to it.
    pub async fn pod(&self, name: &str) -> TestPod {
        let sa = format!("sa-{name}");
        self.ns.service_account(&sa).await;
        let pod = self.ns.pod(name, &sa, &[]).await;
        let token = self.ns.pod_token(&sa, &pod).await;
        let client = self.cp.client_with_token(&token).await;
        TestPod {
            name: name.to_owned(),
            uid: pod.uid().expect("a stored Pod has a uid"),
            service_account: sa,
            token,
            client,
            pod,
        }
    }

    /// Where process logs go.
    pub fn log_dir(&self) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join("leasehold-e2e").join(self.name());
        std::fs::create_dir_all(&dir).expect("create the log directory");
        dir
    }

    /// Starts a sidecar process for `pod` (its Pod-bound token, downward-API identity),
    /// with `extra` arguments, and waits until it is healthy.
    pub async fn sidecar(&self, pod: &TestPod, extra: &[&str]) -> Sidecar {
        self.sidecar_via(pod, None, extra).await
    }

    /// [`Self::sidecar`], reaching the apiserver at `server` (a fault proxy's
    /// `https://addr`) when given.
    pub async fn sidecar_via(&self, pod: &TestPod, server: Option<&str>, extra: &[&str]) -> Sidecar {
        let kubeconfig = self.log_dir().join(format!("kubeconfig-{}", pod.name));
        match server {
            Some(server) => self.ns.kubeconfig_for_token_via(&pod.token, server, &kubeconfig),
            None => self.ns.kubeconfig_for_token(&pod.token, &kubeconfig),
        }
        .expect("write the pod's kubeconfig");
        let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut command = Command::new(sidecar_bin());
        command
            .args(["sidecar", "--listen", &api.to_string(), "--admin-addr", &admin.to_string()])
            .args(extra)
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAMESPACE", self.name())
            .env("POD_NAME", &pod.name)
            .env("POD_UID", &pod.uid)
            .env("RUST_LOG", "info,kube=warn");
        let process = LeaseholdProcess::spawn(&format!("sidecar-{}-{}", pod.name, api.port()), command, admin);
        let name = process.name.clone();
        eventually(&format!("{name} healthy"), Duration::from_secs(60), || async {
            match process.admin_get("/healthz").await {
                Some((200, _)) => Ok(()),
                other => Err(format!("{other:?}: {}", process.log_tail(10))),
            }
        })
        .await;
        Sidecar { process, api }
    }

    /// Whether `pod` may claim in this namespace: create LockClaims (a SelfSubjectAccessReview).
    pub async fn may_claim(&self, pod: &TestPod) -> Result<bool, String> {
        self.allowed(pod, "create", "leasehold.dev", "lockclaims", None).await
    }

    /// Whether `pod` may `verb` `resource` (of API group `group`, named `name` if given) in
    /// this namespace: a SelfSubjectAccessReview.
    pub async fn allowed(
        &self,
        pod: &TestPod,
        verb: &str,
        group: &str,
        resource: &str,
        name: Option<&str>,
    ) -> Result<bool, String> {
        let reviews: Api<SelfSubjectAccessReview> = Api::all(pod.client.clone());
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(self.name().to_owned()),
                    verb: Some(verb.into()),
                    group: Some(group.into()),
                    resource: Some(resource.into()),
                    name: name.map(str::to_owned),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let answer = reviews.create(&PostParams::default(), &review).await.map_err(|e| e.to_string())?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

/// What a successful run saw.
#[derive(Debug)]
pub struct Report {
    /// Tokens of the grants, in grant order (a, b, c, the expiring holder, its successor).
    pub tokens: Vec<i64>,
}

/// Runs the lifecycle in `stage` against the controller already running there; every
/// wait gives up after `patience`. The lock uses the fastest timing the CRD allows
/// (lease 3 s, renew deadline 2 s, retry 1 s).
pub async fn lifecycle(stage: &Stage<'_>, patience: Duration) -> Result<Report, String> {
    let spec = DistributedLockSpec {
        lease_duration_seconds: 3,
        renew_deadline_seconds: 2,
        retry_period_seconds: 1,
        ..DistributedLockSpec::default()
    };
    stage
        .locks()
        .create(&PostParams::default(), &DistributedLock::new(LOCK, spec))
        .await
        .map_err(|e| format!("create lock {LOCK}: {e}"))?;
    let (a, b, c) = (stage.pod("a").await, stage.pod("b").await, stage.pod("c").await);
    poll(patience, "claimant RBAC prepared by the controller", || async {
        stage.may_claim(&a).await.map(|allowed| allowed.then_some(()))
    })
    .await?;
    let grants = GrantLog::start(stage.leases(), LOCK);
    let ns = stage.name().to_owned();

    // Claim order a, b, c: each claim exists before the next one is made.
    let hold_a = a.claimant(&ns).acquire(LOCK, patience).await.map_err(|e| format!("a acquires the free lock: {e}"))?;
    let claimant_b = b.claimant(&ns);
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, Duration::from_secs(120)).await });
    wait_for(&stage.claims(), &b.identity().claim_name(LOCK), patience, "b's claim", |_| true).await?;
    let claimant_c = c.claimant(&ns);
    let waiting_c = tokio::spawn(async move { claimant_c.acquire(LOCK, Duration::from_secs(120)).await });

    let lock = wait_for(&stage.locks(), LOCK, patience, "two waiters in the lock's status", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.queue_length == 2)
    })
    .await?;
    let status = lock.status.unwrap_or_default();
    let holder = status.holder.clone().ok_or("status names no holder while a holds")?;
    check(holder.identity == a.identity().id, format!("status holder {} is not a", holder.identity))?;
    check(holder.fencing_token == hold_a.token(), "status token differs from a's".into())?;
    let waiters: Vec<&str> = status.waiters.iter().map(|w| w.pod.as_deref().unwrap_or("")).collect();
    check(waiters == ["b", "c"], format!("waiters {waiters:?}, expected b then c"))?;

    // A release hands over to the head of the queue.
    check(hold_a.release().await.was_held, "a's release says it did not hold".into())?;
    let hold_b = joined(waiting_b, "b is granted after a releases").await?;
    wait_for(&stage.locks(), LOCK, patience, "b in status after one release", |l: &DistributedLock| {
        l.status
            .as_ref()
            .is_some_and(|s| s.stats.releases == 1 && s.holder.as_ref().is_some_and(|h| h.identity == b.identity().id))
    })
    .await?;
    check(hold_b.release().await.was_held, "b's release says it did not hold".into())?;
    let hold_c = joined(waiting_c, "c is granted after b releases").await?;
    check(hold_c.release().await.was_held, "c's release says it did not hold".into())?;

    // A holder that confirms once and then stops renewing expires after the lease
    // duration, and not before; its successor gets a higher token.
    let leases_a: Api<Lease> = Api::namespaced(a.client.clone(), &ns);
    let claims_a: Api<LockClaim> = Api::namespaced(a.client.clone(), &ns);
    let claim = edit::lock_claim(LOCK, &a.identity(), 45, Timestamp::now());
    claims_a.create(&PostParams::default(), &claim).await.map_err(|e| format!("a's manual claim: {e}"))?;
    let identity = a.identity();
    let granted = wait_for(&leases_a, LOCK, patience, "the grant to a's manual claim", |l: &Lease| {
        edit::granted_token(l, &identity).is_some()
    })
    .await?;
    let last_renewal = Timestamp::now();
    leases_a
        .replace(LOCK, &PostParams::default(), &edit::renewed(&granted, last_renewal))
        .await
        .map_err(|e| format!("a confirms its grant: {e}"))?;
    let hold_b = b.claimant(&ns).acquire(LOCK, patience).await.map_err(|e| format!("b after a expires: {e}"))?;
    let lease = stage.leases().get(LOCK).await.map_err(|e| format!("read the lock Lease: {e}"))?;
    let granted_at = lease.spec.and_then(|s| s.acquire_time).ok_or("the lock Lease has no acquireTime")?.0;
    let gap = granted_at.duration_since(last_renewal);
    check(gap >= jiff::SignedDuration::from_secs(3), format!("b was granted {gap:?} after a's last renewal"))?;
    wait_for(&stage.locks(), LOCK, patience, "the expiration counted in status", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.stats.expirations == 1)
    })
    .await?;
    check(hold_b.release().await.was_held, "b's second release says it did not hold".into())?;

    let seen = poll(patience, "five grants on the lock Lease", || async {
        let seen = grants.grants();
        Ok((seen.len() >= 5).then_some(seen))
    })
    .await?;
    let holders: Vec<&str> = seen.iter().map(|g| g.holder.as_str()).collect();
    let expected = [a.identity().id, b.identity().id, c.identity().id, a.identity().id, b.identity().id];
    check(holders == expected, format!("grant order {holders:?}"))?;
    check(seen.windows(2).all(|w| w[0].token < w[1].token), format!("tokens do not strictly increase: {seen:?}"))?;
    Ok(Report { tokens: seen.iter().map(|g| g.token).collect() })
}

fn check(condition: bool, failure: String) -> Result<(), String> {
    if condition { Ok(()) } else { Err(failure) }
}

async fn joined(
    task: tokio::task::JoinHandle<Result<leasehold::claim::Hold, leasehold::claim::AcquireError>>,
    what: &str,
) -> Result<leasehold::claim::Hold, String> {
    task.await.map_err(|e| format!("{what}: the task failed: {e}"))?.map_err(|e| format!("{what}: {e}"))
}

/// Waits until object `name` satisfies `condition` (watch, not polling).
pub async fn wait_for<K, F>(api: &Api<K>, name: &str, timeout: Duration, what: &str, condition: F) -> Result<K, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(&K) -> bool,
{
    let found = tokio::time::timeout(
        timeout,
        await_condition(api.clone(), name, move |obj: Option<&K>| obj.is_some_and(&condition)),
    )
    .await
    .map_err(|_| format!("timed out after {timeout:?} waiting for {what}"))?
    .map_err(|e| format!("watch failed while waiting for {what}: {e}"))?;
    found.ok_or_else(|| format!("{name} vanished while waiting for {what}"))
}

/// Retries `attempt` (every 100 ms) until it yields a value, or fails after `timeout`.
pub async fn poll<T, F, Fut>(timeout: Duration, what: &str, mut attempt: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::from("no answer yet");
    loop {
        match attempt().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last = e,
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what} (last error: {last})"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
