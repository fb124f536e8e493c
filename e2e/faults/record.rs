//! Recorders fed by watches: every state the lock Leases went through (holder, token,
//! drain and revocation annotations), and every version of the fenced ConfigMaps — what
//! the apiserver stored, including writes whose client timed out but which landed.
//!
//! A watch that has to re-list shows only the latest state: states in between can be
//! missing. Re-lists are recorded, so that checks relying on completeness can allow for
//! them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use leasehold::crd::{
    ANNOTATION_DRAINING, ANNOTATION_REVOKED, ANNOTATION_TOKEN, LABEL_FENCED_BY, LABEL_ROLE, ROLE_LOCK,
};
use leasehold::lease::slot;

/// One state of a lock Lease, as the watch saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseState {
    /// When the watch delivered it.
    pub seen: Instant,
    /// The Lease exists (false: deleted).
    pub exists: bool,
    /// `holderIdentity`, if set.
    pub holder: Option<String>,
    /// The token annotation.
    pub token: Option<i64>,
    /// The drain annotation (a revoked hold that may still be believed).
    pub draining: Option<String>,
    /// The revocation annotation.
    pub revoked: Option<String>,
}

impl LeaseState {
    /// Whether this state is a grant to a holder (not a hold being drained).
    pub fn is_grant(&self) -> bool {
        self.exists && self.holder.is_some() && self.token.is_some() && self.draining.is_none()
    }

    fn same(&self, other: &LeaseState) -> bool {
        (self.exists, &self.holder, self.token, &self.draining, &self.revoked)
            == (other.exists, &other.holder, other.token, &other.draining, &other.revoked)
    }
}

/// What every lock Lease went through.
#[derive(Clone, Debug, Default)]
pub struct LeaseHistory {
    /// Distinct states per Lease, in the order seen: by Lease name, which is the lock's
    /// name for a mutex (and slot 0), `<lock>.<slot>` for the other slots of a lock with
    /// several permits.
    pub states: BTreeMap<String, Vec<LeaseState>>,
    /// When the watch re-listed.
    pub relists: Vec<Instant>,
}

impl LeaseHistory {
    /// The states of every slot Lease of `lock`.
    fn slots<'a>(&'a self, lock: &'a str) -> impl Iterator<Item = &'a Vec<LeaseState>> + 'a {
        self.states.iter().filter(move |(name, _)| slot::of_lease_name(lock, name).is_some()).map(|(_, list)| list)
    }

    /// The grants of `lock` on any of its slots, in the order seen: (holder, token, seen).
    pub fn grants(&self, lock: &str) -> Vec<(String, i64, Instant)> {
        let mut grants: Vec<(String, i64, Instant)> = self
            .states
            .keys()
            .filter(|name| slot::of_lease_name(lock, name).is_some())
            .flat_map(|name| self.lease_grants(name))
            .collect();
        grants.sort_by_key(|(_, _, seen)| *seen);
        grants
    }

    /// The grants of the Lease named `lease` in Lease order: (holder, token, seen).
    pub fn lease_grants(&self, lease: &str) -> Vec<(String, i64, Instant)> {
        let mut grants: Vec<(String, i64, Instant)> = Vec::new();
        for s in self.states.get(lease).into_iter().flatten().filter(|s| s.is_grant()) {
            let (holder, token) = (s.holder.clone().unwrap_or_default(), s.token.unwrap_or_default());
            if grants.last().is_none_or(|(h, t, _)| (h, *t) != (&holder, token)) {
                grants.push((holder, token, s.seen));
            }
        }
        grants
    }

    /// When a slot Lease of `lock` was first seen carrying a token above `token`.
    pub fn superseded(&self, lock: &str, token: i64) -> Option<Instant> {
        self.slots(lock).flatten().filter(|s| s.token.is_some_and(|t| t > token)).map(|s| s.seen).min()
    }

    /// Whether a re-list happened within `window` of `at`.
    pub fn relisted_near(&self, at: Instant, window: std::time::Duration) -> bool {
        self.relists.iter().any(|r| r.saturating_duration_since(at).max(at.saturating_duration_since(*r)) < window)
    }
}

/// Records the states of every lock Lease of a namespace.
pub struct LeaseLog {
    history: Arc<Mutex<LeaseHistory>>,
    changed: tokio::sync::watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

fn state_of(lease: &Lease, seen: Instant) -> LeaseState {
    let annotation = |key: &str| lease.annotations().get(key).cloned();
    LeaseState {
        seen,
        exists: true,
        holder: lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty()),
        token: annotation(ANNOTATION_TOKEN).and_then(|t| t.parse().ok()),
        draining: annotation(ANNOTATION_DRAINING),
        revoked: annotation(ANNOTATION_REVOKED),
    }
}

impl LeaseLog {
    /// Starts recording the lock Leases (every slot's) of `api`'s namespace.
    pub fn start(api: Api<Lease>) -> LeaseLog {
        let history: Arc<Mutex<LeaseHistory>> = Arc::default();
        let (tx, changed) = tokio::sync::watch::channel(0);
        let recorded = history.clone();
        let config = watcher::Config::default().labels(&format!("{LABEL_ROLE}={ROLE_LOCK}"));
        let mut events = watcher::watcher(api, config).backoff(leasehold::lease::watch_backoff()).boxed();
        let task = tokio::spawn(async move {
            let mut first_list = true;
            while let Some(event) = events.next().await {
                let now = Instant::now();
                let (lock, state) = match event {
                    Ok(Event::Apply(l) | Event::InitApply(l)) => (l.name_any(), state_of(&l, now)),
                    Ok(Event::Delete(l)) => (l.name_any(), LeaseState { exists: false, ..state_of(&l, now) }),
                    Ok(Event::Init) => {
                        if !std::mem::take(&mut first_list) {
                            recorded.lock().expect("not poisoned").relists.push(now);
                        }
                        continue;
                    }
                    _ => continue,
                };
                let mut h = recorded.lock().expect("not poisoned");
                let list = h.states.entry(lock).or_default();
                if list.last().is_none_or(|last| !last.same(&state)) {
                    list.push(state);
                    tx.send_modify(|n| *n += 1);
                }
            }
        });
        LeaseLog { history, changed, task }
    }

    /// Everything so far.
    pub fn history(&self) -> LeaseHistory {
        self.history.lock().expect("not poisoned").clone()
    }

    /// Waits until `lock` is granted after `after` (a new holder or token), up to
    /// `limit`; returns when the watch saw it.
    pub async fn wait_grant_after(&self, lock: &str, after: Instant, limit: std::time::Duration) -> Option<Instant> {
        let mut changed = self.changed.clone();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let seen = self.history().grants(lock).into_iter().map(|(_, _, seen)| seen).find(|seen| *seen > after);
            if seen.is_some() {
                return seen;
            }
            if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
                return None;
            }
        }
    }

    /// Waits until the Lease of `lock` goes through a state, seen after `after`, that
    /// satisfies `condition`, up to `limit`; returns the first such state.
    pub async fn wait_seen(
        &self,
        lock: &str,
        after: Instant,
        limit: std::time::Duration,
        condition: impl Fn(&LeaseState) -> bool,
    ) -> Option<LeaseState> {
        let mut changed = self.changed.clone();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let found = {
                let h = self.history.lock().expect("not poisoned");
                h.states.get(lock).and_then(|l| l.iter().find(|s| s.seen > after && condition(s)).cloned())
            };
            if found.is_some() {
                return found;
            }
            if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
                return None;
            }
        }
    }

    /// The current state of `lock`'s Lease (slot 0's, for a lock with several permits).
    pub fn current(&self, lock: &str) -> Option<LeaseState> {
        self.history.lock().expect("not poisoned").states.get(lock).and_then(|l| l.last().cloned())
    }

    /// Waits until the Lease of `lock` satisfies `condition`, up to `limit`.
    pub async fn wait_for(
        &self,
        lock: &str,
        limit: std::time::Duration,
        condition: impl Fn(&LeaseState) -> bool,
    ) -> Option<LeaseState> {
        let mut changed = self.changed.clone();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(state) = self.current(lock).filter(|s| condition(s)) {
                return Some(state);
            }
            if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
                return None;
            }
        }
    }
}

impl Drop for LeaseLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One stored version of a fenced ConfigMap.
#[derive(Clone, Debug, PartialEq)]
pub struct Version {
    /// resourceVersion (etcd's revision: the commit order).
    pub rv: u64,
    /// The ConfigMap's name.
    pub name: String,
    /// The `fenced-by` label (None: the label was removed).
    pub fenced_by: Option<String>,
    /// The token annotation.
    pub token: Option<i64>,
    /// The writer recorded in the data.
    pub writer: Option<String>,
    /// Deleted.
    pub deleted: bool,
}

/// Records every version of every ConfigMap of a namespace.
pub struct ConfigMapLog {
    versions: Arc<Mutex<BTreeMap<u64, Version>>>,
    answered: Mutex<std::collections::BTreeSet<u64>>,
    task: tokio::task::JoinHandle<()>,
}

/// The version of `cm` as stored.
pub fn version_of(cm: &ConfigMap, deleted: bool) -> Option<Version> {
    Some(Version {
        rv: cm.resource_version()?.parse().ok()?,
        name: cm.name_any(),
        fenced_by: cm.labels().get(LABEL_FENCED_BY).cloned(),
        token: cm.annotations().get(ANNOTATION_TOKEN).and_then(|t| t.parse().ok()),
        writer: cm.data.as_ref().and_then(|d| d.get("writer").cloned()),
        deleted,
    })
}

impl ConfigMapLog {
    /// Starts recording the ConfigMaps of `api`'s namespace.
    pub fn start(api: Api<ConfigMap>) -> ConfigMapLog {
        let versions: Arc<Mutex<BTreeMap<u64, Version>>> = Arc::default();
        let recorded = versions.clone();
        let mut events =
            watcher::watcher(api, watcher::Config::default()).backoff(leasehold::lease::watch_backoff()).boxed();
        let task = tokio::spawn(async move {
            while let Some(event) = events.next().await {
                let version = match event {
                    Ok(Event::Apply(cm) | Event::InitApply(cm)) => version_of(&cm, false),
                    // A deletion carries the revision of the delete.
                    Ok(Event::Delete(cm)) => version_of(&cm, true),
                    _ => None,
                };
                if let Some(v) = version {
                    recorded.lock().expect("not poisoned").entry(v.rv).or_insert(v);
                }
            }
        });
        ConfigMapLog { versions, answered: Mutex::default(), task }
    }

    /// Adds a version a client was answered with (the watch may have missed it).
    pub fn add(&self, version: Version) {
        self.answered.lock().expect("not poisoned").insert(version.rv);
        self.versions.lock().expect("not poisoned").entry(version.rv).or_insert(version);
    }

    /// Whether a client was answered with version `rv`.
    pub fn answered(&self, rv: u64) -> bool {
        self.answered.lock().expect("not poisoned").contains(&rv)
    }

    /// Every version seen, in commit order.
    pub fn versions(&self) -> Vec<Version> {
        self.versions.lock().expect("not poisoned").values().cloned().collect()
    }
}

impl Drop for ConfigMapLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}
