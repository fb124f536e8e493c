//! Acting on locks as an operator or as cluster machinery would: force-release requests,
//! writes under another identity (impersonation), and readings of the lock Lease.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use leasehold::crd::{ANNOTATION_DRAINING, ANNOTATION_FORCE_RELEASE, ANNOTATION_FORCE_RELEASE_TARGET, DistributedLock};
use serde_json::json;

use crate::Env;
use crate::watch::until;

/// The user kube-controller-manager's garbage collector deletes as.
pub const GARBAGE_COLLECTOR: &str = "system:serviceaccount:kube-system:generic-garbage-collector";

/// A client acting as `user`: the admin of the control plane whose kubeconfig is
/// `kubeconfig`, impersonating it (impersonation checks the impersonated user's own
/// permissions on every request).
pub async fn impersonating(kubeconfig: &std::path::Path, user: &str) -> kube::Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("read the admin kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("the admin kubeconfig is valid");
    config.auth_info.impersonate = Some(user.to_owned());
    kube::Client::try_from(config).expect("a client")
}

impl Env {
    /// A client acting as `user` (the admin impersonating it).
    pub async fn impersonating(&self, user: &str) -> kube::Client {
        impersonating(self.cp.kubeconfig_path(), user).await
    }

    /// Asks (as the admin, no webhook involved) for a forced release of `lock`, with the
    /// target as given (`None`: unstamped, as from an older webhook).
    pub async fn force_release(&self, lock: &str, reason: &str, target: Option<&str>) {
        let mut annotations = json!({ANNOTATION_FORCE_RELEASE: reason});
        if let Some(target) = target {
            annotations[ANNOTATION_FORCE_RELEASE_TARGET] = json!(target);
        }
        let patch = json!({"metadata": {"annotations": annotations}});
        self.locks()
            .patch(lock, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("request a force release");
    }

    /// Waits until the lock Lease drains token `token` (revoked, its holder still named or
    /// acknowledged), and returns it.
    pub async fn draining(&self, lock: &str, token: i64, timeout: Duration) -> Lease {
        let wanted = token.to_string();
        until(&self.leases(), lock, timeout, "the lock Lease draining", move |l: &Lease| {
            l.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_DRAINING)) == Some(&wanted)
        })
        .await
    }

    /// Waits until the lock's `Ready` condition has `reason`, and returns the lock.
    pub async fn ready_reason(&self, lock: &str, reason: &str, timeout: Duration) -> DistributedLock {
        let reason = reason.to_owned();
        until(&self.locks(), lock, timeout, &format!("Ready reason {reason}"), move |l: &DistributedLock| {
            l.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == reason))
        })
        .await
    }

    /// Reasons of the Events recorded in the namespace.
    async fn event_reasons(&self) -> Vec<String> {
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.ns.client.clone(), self.name());
        let list = events.list(&Default::default()).await.expect("list events");
        list.items.into_iter().filter_map(|e| e.reason).collect()
    }

    /// Waits until an Event with `reason` was recorded.
    pub async fn event(&self, reason: &str, timeout: Duration) {
        leasehold_harness::eventually(&format!("an Event {reason}"), timeout, || async {
            let reasons = self.event_reasons().await;
            if reasons.iter().any(|r| r == reason) { Ok(()) } else { Err(format!("{reasons:?}")) }
        })
        .await;
    }
}

/// A Lease's renewTime (the holder's clock; in these tests, the same machine's).
pub fn renew_time(lease: &Lease) -> Timestamp {
    lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()).expect("a renewTime").0
}

/// A Lease's acquireTime (the controller's clock at the grant).
pub fn acquire_time(lease: &Lease) -> Timestamp {
    lease.spec.as_ref().and_then(|s| s.acquire_time.as_ref()).expect("an acquireTime").0
}

/// Every version of one Lease, from a watch that was listening before the call returned:
/// a state that lasts only milliseconds (a drain acknowledged at once) is still seen.
pub struct LeaseWatch {
    events: futures::stream::BoxStream<
        'static,
        Result<kube::runtime::watcher::Event<Lease>, kube::runtime::watcher::Error>,
    >,
    timeout: Duration,
}

impl LeaseWatch {
    /// Starts watching Lease `name` and returns once the watch has listed it.
    pub async fn start(api: Api<Lease>, name: &str, timeout: Duration) -> LeaseWatch {
        use futures::StreamExt;
        let config = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = kube::runtime::watcher(api, config).boxed();
        loop {
            match tokio::time::timeout(timeout, events.next()).await {
                Ok(Some(Ok(kube::runtime::watcher::Event::InitDone))) => break,
                Ok(Some(_)) => continue,
                other => panic!("the watch of Lease {name} did not start: {other:?}"),
            }
        }
        LeaseWatch { events, timeout }
    }

    /// The first version from now on that satisfies `condition`.
    pub async fn until(&mut self, what: &str, condition: impl Fn(&Lease) -> bool) -> Lease {
        use futures::StreamExt;
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.events.next()).await {
                Ok(Some(Ok(kube::runtime::watcher::Event::Apply(lease)))) if condition(&lease) => return lease,
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the watch ended while waiting for {what}"),
                Err(_) => panic!("timed out after {:?} waiting for {what}", self.timeout),
            }
        }
    }

    /// The first version draining token `token`.
    pub async fn draining(&mut self, token: i64) -> Lease {
        let wanted = token.to_string();
        self.until(&format!("the Lease draining token {token}"), move |l| {
            l.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_DRAINING)) == Some(&wanted)
        })
        .await
    }
}
