//! A stream of one Lease's latest state: `Some(lease)` after every change, `None` while it
//! does not exist. Built on kube's watcher, so it re-lists and resumes by itself.

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::debug;

/// Watches Lease `name`. Yields its state after the initial list and after every event.
pub fn lease_states(api: Api<Lease>, name: &str) -> impl Stream<Item = Option<Lease>> + Send + 'static {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_owned();
    watcher(api, config)
        .backoff(crate::lease::watch_backoff())
        .scan(None::<Option<Lease>>, move |init, event| {
            let out = match event {
                Ok(watcher::Event::Apply(lease)) => Some(Some(lease)),
                Ok(watcher::Event::Delete(_)) => Some(None),
                Ok(watcher::Event::Init) => {
                    *init = Some(None);
                    None
                }
                Ok(watcher::Event::InitApply(lease)) => {
                    *init = Some(Some(lease));
                    None
                }
                Ok(watcher::Event::InitDone) => init.take(),
                Err(error) => {
                    // The watcher retries with backoff; renewals do not depend on it.
                    debug!(lease = %name, %error, "lease watch interrupted");
                    None
                }
            };
            futures::future::ready(Some(out))
        })
        .filter_map(futures::future::ready)
}
