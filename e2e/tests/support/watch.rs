//! Waiting on watch events (never on sleeps): conditions on one object, and a recorder of
//! every grant a lock Lease goes through.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::wait::await_condition;
use leasehold::claim::lease_states;
use leasehold::controller::view;

/// Waits until object `name` satisfies `condition`, or panics after `timeout` naming `what`.
pub async fn until<K, F>(api: &Api<K>, name: &str, timeout: Duration, what: &str, condition: F) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(&K) -> bool,
{
    let found = tokio::time::timeout(
        timeout,
        await_condition(api.clone(), name, move |obj: Option<&K>| obj.is_some_and(&condition)),
    )
    .await
    .unwrap_or_else(|_| panic!("timed out after {timeout:?} waiting for {what}"))
    .unwrap_or_else(|e| panic!("watch failed while waiting for {what}: {e}"));
    found.unwrap_or_else(|| panic!("{name} vanished while waiting for {what}"))
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

/// Records every distinct grant of a lock Lease, from a watch, in the order seen.
pub struct GrantLog {
    grants: Arc<Mutex<Vec<SeenGrant>>>,
    changed: tokio::sync::watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl GrantLog {
    /// Starts recording grants of Lease `name`.
    pub fn start(api: Api<Lease>, name: &str) -> GrantLog {
        let grants: Arc<Mutex<Vec<SeenGrant>>> = Arc::default();
        let (tx, changed) = tokio::sync::watch::channel(0);
        let recorded = grants.clone();
        let mut states = lease_states(api, name).boxed();
        let task = tokio::spawn(async move {
            while let Some(state) = states.next().await {
                let Some(hold) = state.as_ref().and_then(view::lease_hold) else { continue };
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
        GrantLog { grants, changed, task }
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
