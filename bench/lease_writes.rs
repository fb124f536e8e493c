//! The Lease writes of a window that are not the measured lock's, counted one by one from a
//! watch of every Lease: the apiserver's election and identity renewals, and the renewals
//! of any other lock held meanwhile. The apiserver's counters cannot tell them from the
//! measured lock's writes; subtracting them as seen, rather than a quiet window's average
//! rate, leaves exactly the measured lock's Lease writes.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};
use leasehold::crd::LABEL_LOCK;

use crate::observe::Writes;

/// One write seen: when it arrived, and `VERB leases` as the apiserver's counters name it.
type Seen = (Instant, &'static str);

/// A watch of every Lease but those of one lock.
pub struct OtherLeaseWrites {
    seen: Arc<Mutex<Vec<Seen>>>,
    ended: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl OtherLeaseWrites {
    /// Starts watching every Lease (from now: a list's resourceVersion) except the Leases
    /// of lock `lock` in `namespace`.
    pub async fn start(client: kube::Client, namespace: &str, lock: &str) -> anyhow::Result<Self> {
        let api: Api<Lease> = Api::all(client);
        let listed = api.list_metadata(&ListParams::default().limit(1)).await.context("list Leases")?;
        let from = listed.metadata.resource_version.context("a list of Leases without a resourceVersion")?;
        let mut stream = api.watch(&WatchParams::default(), &from).await.context("watch Leases")?.boxed();
        let (seen, ended) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(None)));
        let (namespace, lock) = (namespace.to_owned(), lock.to_owned());
        let (writes, end) = (seen.clone(), ended.clone());
        let task = tokio::spawn(async move {
            let measured = |l: &Lease| {
                l.namespace().as_deref() == Some(namespace.as_str())
                    && l.labels().get(LABEL_LOCK).map(String::as_str) == Some(lock.as_str())
            };
            let why = loop {
                let verb = match stream.next().await {
                    Some(Ok(WatchEvent::Added(l))) if !measured(&l) => "POST leases",
                    Some(Ok(WatchEvent::Modified(l))) if !measured(&l) => "PUT leases",
                    Some(Ok(WatchEvent::Deleted(l))) if !measured(&l) => "DELETE leases",
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => break format!("the watch of Leases failed: {e}"),
                    None => break "the watch of Leases ended".to_owned(),
                };
                writes.lock().expect("never poisoned").push((Instant::now(), verb));
            };
            *end.lock().expect("never poisoned") = Some(why);
        });
        Ok(Self { seen, ended, task })
    }

    /// The writes that arrived between `from` and `to`, by kind; an error if the watch
    /// ended before `to` (some may be missing).
    pub fn between(&self, from: Instant, to: Instant, seconds: f64) -> anyhow::Result<Writes> {
        if let Some(why) = self.ended.lock().expect("never poisoned").clone() {
            anyhow::bail!("{why}: other Lease writes cannot be told from the measured ones");
        }
        let mut writes = Writes { seconds, ..Writes::default() };
        for (_, verb) in self.seen.lock().expect("never poisoned").iter().filter(|(at, _)| (from..=to).contains(at)) {
            *writes.ok.entry((*verb).to_owned()).or_insert(0.0) += 1.0;
        }
        Ok(writes)
    }
}

impl Drop for OtherLeaseWrites {
    fn drop(&mut self) {
        self.task.abort();
    }
}
