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

/// The states of a lock's slot Leases, each tagged with its slot: slot 0 (the Lease named
/// like the lock) from the start, the others once asked for — a waiting claimant learns
/// from slot 0 how many there are.
pub struct SlotWatches {
    api: Api<Lease>,
    lock: String,
    watched: u32,
    streams: futures::stream::SelectAll<futures::stream::BoxStream<'static, (u32, Option<Lease>)>>,
}

impl SlotWatches {
    /// Starts watching slot 0 of `lock`.
    pub fn new(api: Api<Lease>, lock: &str) -> SlotWatches {
        let mut watches =
            SlotWatches { api, lock: lock.to_owned(), watched: 0, streams: futures::stream::SelectAll::new() };
        watches.watch_up_to(1);
        watches
    }

    /// How many slots are watched (slots `0..watched`).
    pub fn watched(&self) -> u32 {
        self.watched
    }

    /// Watches slots up to `permits` (never fewer than now, never more than a lock has).
    pub fn watch_up_to(&mut self, permits: u32) {
        while self.watched < permits.min(crate::lease::slot::MAX_PERMITS) {
            let slot = self.watched;
            let states = lease_states(self.api.clone(), &crate::lease::slot::lease_name(&self.lock, slot));
            self.streams.push(states.map(move |state| (slot, state)).boxed());
            self.watched += 1;
        }
    }

    /// The next state of any watched slot.
    pub async fn next(&mut self) -> Option<(u32, Option<Lease>)> {
        self.streams.next().await
    }

    /// Slot `slot`'s states alone from now on; the other slots' watches end.
    pub fn into_slot(self, slot: u32) -> futures::stream::BoxStream<'static, Option<Lease>> {
        if self.watched == 1 && slot == 0 {
            // A mutex: its one watch goes on.
            if let Some(only) = self.streams.into_iter().next() {
                return only.map(|(_, state)| state).boxed();
            }
        }
        lease_states(self.api, &crate::lease::slot::lease_name(&self.lock, slot)).boxed()
    }
}
