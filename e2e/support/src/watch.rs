//! Waiting on watch events (never on sleeps): conditions on one object, and a recorder of
//! every grant a lock Lease goes through.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::wait::await_condition;
use leasehold::controller::view;

/// Waits until object `name` satisfies `condition`, or panics after `timeout` naming `what`.
pub async fn until<K, F>(api: &Api<K>, name: &str, timeout: Duration, what: &str, condition: F) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(&K) -> bool,
{
    crate::lifecycle::wait_for(api, name, timeout, what, condition).await.unwrap_or_else(|e| panic!("{e}"))
}

/// Waits until lock Lease `lock` names `holder` (a claimant identity) as the next waiter,
/// and returns that version.
pub async fn until_named_next(
    leases: &Api<k8s_openapi::api::coordination::v1::Lease>,
    lock: &str,
    holder: &str,
    timeout: Duration,
) -> k8s_openapi::api::coordination::v1::Lease {
    let what = format!("{holder} named next on {lock}");
    until(leases, lock, timeout, &what, |l| leasehold::lease::next::of_lease(l).is_some_and(|n| n.holder == holder))
        .await
}

/// Waits until object `name` does not exist.
pub async fn until_gone<K>(api: &Api<K>, name: &str, timeout: Duration, what: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::time::timeout(timeout, await_condition(api.clone(), name, |obj: Option<&K>| obj.is_none()))
        .await
        .unwrap_or_else(|_| panic!("timed out after {timeout:?} waiting for {what}"))
        .unwrap_or_else(|e| panic!("watch failed while waiting for {what}: {e}"));
}

/// One grant seen on a lock Lease.
#[derive(Clone, Debug)]
pub struct SeenGrant {
    /// Holder identity.
    pub holder: String,
    /// Token.
    pub token: i64,
    /// The Lease's acquireTime (the controller's wall clock at the grant).
    pub acquire_time: jiff::Timestamp,
    /// When the test saw it.
    pub seen: Instant,
}

/// Records every distinct grant of a lock Lease, from a watch, in the order seen, and when
/// the watch had to re-list (a re-list shows only the latest state: grants made while the
/// watch was down can be missing).
pub struct GrantLog {
    grants: Arc<Mutex<Vec<SeenGrant>>>,
    relists: Arc<Mutex<Vec<Instant>>>,
    changed: tokio::sync::watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl GrantLog {
    /// Starts recording grants of Lease `name`.
    pub fn start(api: Api<Lease>, name: &str) -> GrantLog {
        let grants: Arc<Mutex<Vec<SeenGrant>>> = Arc::default();
        let relists: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let (tx, changed) = tokio::sync::watch::channel(0);
        let (recorded, relisted) = (grants.clone(), relists.clone());
        let config = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = kube::runtime::watcher(api, config).backoff(leasehold::lease::watch_backoff()).boxed();
        let task = tokio::spawn(async move {
            let mut first_list = true;
            while let Some(event) = events.next().await {
                let lease = match event {
                    Ok(kube::runtime::watcher::Event::Apply(l) | kube::runtime::watcher::Event::InitApply(l)) => l,
                    Ok(kube::runtime::watcher::Event::Init) => {
                        if !std::mem::take(&mut first_list) {
                            relisted.lock().expect("not poisoned").push(Instant::now());
                        }
                        continue;
                    }
                    _ => continue,
                };
                let Some(hold) = view::lease_hold(&lease) else { continue };
                let (Some(token), Some(acquire_time)) = (hold.token, hold.acquire_time) else { continue };
                let mut grants = recorded.lock().expect("not poisoned");
                if grants.last().is_none_or(|g| g.token != token || g.holder != hold.identity.id) {
                    grants.push(SeenGrant {
                        holder: hold.identity.id.clone(),
                        token,
                        acquire_time,
                        seen: Instant::now(),
                    });
                    tx.send_replace(grants.len());
                }
            }
        });
        GrantLog { grants, relists, changed, task }
    }

    /// When the watch re-listed.
    pub fn relists(&self) -> Vec<Instant> {
        self.relists.lock().expect("not poisoned").clone()
    }

    /// The grants so far.
    pub fn grants(&self) -> Vec<SeenGrant> {
        self.grants.lock().expect("not poisoned").clone()
    }

    /// Waits until at least `n` grants were seen.
    pub async fn wait_for(&mut self, n: usize, timeout: Duration) -> Vec<SeenGrant> {
        let reached = tokio::time::timeout(timeout, self.changed.wait_for(|count| *count >= n)).await.is_ok();
        assert!(reached, "timed out after {timeout:?} waiting for {n} grants; saw {:?}", self.grants());
        self.grants()
    }
}

impl Drop for GrantLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}
