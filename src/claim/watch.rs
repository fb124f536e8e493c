//! A stream of one Lease's latest state: `Some(lease)` after every change, `None` while it
//! does not exist. Built on kube's watcher, so it re-lists and resumes by itself. A
//! claimant shares one watch per Lease among its acquisitions and holds, and keeps it a
//! while after the last of them ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::debug;

use crate::lease::unmanaged::UnmanagedLease;

/// Watches Lease `name`. Yields its state after the initial list and after every event,
/// without its field managers ([`UnmanagedLease`]): every change reaches every claimant
/// waiting on the lock, and those are most of what a claimant would parse.
pub fn lease_states(api: Api<UnmanagedLease>, name: &str) -> impl Stream<Item = Option<Lease>> + Send + 'static {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_owned();
    watcher(api, config)
        .backoff(crate::lease::watch_backoff())
        .scan(None::<Option<Lease>>, move |init, event| {
            let out = match event {
                Ok(watcher::Event::Apply(UnmanagedLease(lease))) => Some(Some(lease)),
                Ok(watcher::Event::Delete(_)) => Some(None),
                Ok(watcher::Event::Init) => {
                    *init = Some(None);
                    None
                }
                Ok(watcher::Event::InitApply(UnmanagedLease(lease))) => {
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

/// How long a Lease's watch outlives its last reader. A claimant that takes the same lock
/// again within it (a worker taking a lock per job, a sidecar serving one app) starts no
/// new list and watch: its next acquisition reads the state the running watch holds.
const LINGER: Duration = Duration::from_secs(30);

/// One Lease's shared watch: its latest state (`None` until the watch has listed), and
/// when its last reader left.
struct Shared {
    latest: watch::Sender<Option<Option<Lease>>>,
    left: Mutex<tokio::time::Instant>,
}

/// One watch per Lease, shared by every reader of that Lease in this claimant and kept for
/// [`LINGER`] after its last reader is gone. A reader gets the latest state the watch has
/// shown, then each change; changes that come faster than it reads arrive as the latest of
/// them (as after a watch's re-list), never out of order.
#[derive(Clone)]
pub struct LeaseWatches {
    source: Source,
    open: Arc<Mutex<HashMap<String, Arc<Shared>>>>,
}

/// Starts watching the Lease of a name.
type Source = Arc<dyn Fn(&str) -> BoxStream<'static, Option<Lease>> + Send + Sync>;

/// A reader of a shared watch; records when it leaves.
struct Reader {
    states: watch::Receiver<Option<Option<Lease>>>,
    shared: Arc<Shared>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        *self.shared.left.lock().expect("the leaving time is never poisoned") = tokio::time::Instant::now();
    }
}

impl LeaseWatches {
    /// Watches of Leases in `api`'s namespace.
    pub fn new(api: Api<UnmanagedLease>) -> LeaseWatches {
        LeaseWatches::from_source(Arc::new(move |name: &str| lease_states(api.clone(), name).boxed()))
    }

    fn from_source(source: Source) -> LeaseWatches {
        LeaseWatches { source, open: Arc::default() }
    }

    /// Lease `name`'s states: the latest one known once its watch has listed, then every
    /// change.
    pub fn states(&self, name: &str) -> BoxStream<'static, Option<Lease>> {
        let reader = {
            let mut open = self.open.lock().expect("the watch map is never poisoned");
            let shared = match open.get(name) {
                Some(shared) => shared.clone(),
                None => {
                    let (latest, _) = watch::channel(None);
                    let shared = Arc::new(Shared { latest, left: Mutex::new(tokio::time::Instant::now()) });
                    open.insert(name.to_owned(), shared.clone());
                    // The reader subscribes before the feed can see no readers.
                    let reader = Reader { states: shared.latest.subscribe(), shared: shared.clone() };
                    tokio::spawn(feed(Arc::downgrade(&self.open), (self.source)(name), name.to_owned(), shared));
                    return read(reader);
                }
            };
            Reader { states: shared.latest.subscribe(), shared }
        };
        read(reader)
    }
}

/// A reader's states: the latest known, then each change.
fn read(reader: Reader) -> BoxStream<'static, Option<Lease>> {
    futures::stream::unfold((reader, true), |(mut reader, first)| async move {
        if !first {
            reader.states.changed().await.ok()?;
        }
        loop {
            let state = reader.states.borrow_and_update().clone();
            if let Some(state) = state {
                return Some((state, (reader, false)));
            }
            reader.states.changed().await.ok()?;
        }
    })
    .boxed()
}

/// Keeps `shared`'s latest state up to date from `states` until nobody has read it for
/// [`LINGER`], then forgets the watch (under the map's lock, so that no reader joins as it
/// ends).
async fn feed(
    open: Weak<Mutex<HashMap<String, Arc<Shared>>>>,
    states: impl Stream<Item = Option<Lease>>,
    name: String,
    shared: Arc<Shared>,
) {
    tokio::pin!(states);
    let left = || *shared.left.lock().expect("the leaving time is never poisoned");
    // Since when nobody reads (as far as this task has noticed).
    let mut idle_since: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            state = states.next() => match state {
                Some(state) => { shared.latest.send_replace(Some(state)); }
                None => break,
            },
            () = shared.latest.closed(), if idle_since.is_none() => idle_since = Some(left()),
            () = tokio::time::sleep_until(idle_since.unwrap_or_else(tokio::time::Instant::now) + LINGER), if idle_since.is_some() => {
                let Some(open) = open.upgrade() else { return };
                let mut open = open.lock().expect("the watch map is never poisoned");
                if shared.latest.receiver_count() > 0 {
                    idle_since = None;
                } else if left() + LINGER <= tokio::time::Instant::now() {
                    forget(&mut open, &name, &shared);
                    return;
                } else {
                    // A reader came and went meanwhile: the linger counts from its leaving.
                    idle_since = Some(left());
                }
            }
        }
    }
    if let Some(open) = open.upgrade() {
        forget(&mut open.lock().expect("the watch map is never poisoned"), &name, &shared);
    }
}

/// Removes `name`'s watch from `open` if it is still `shared` (not a newer one).
fn forget(open: &mut HashMap<String, Arc<Shared>>, name: &str, shared: &Arc<Shared>) {
    if open.get(name).is_some_and(|current| Arc::ptr_eq(current, shared)) {
        open.remove(name);
    }
}

/// The states of a lock's slot Leases, each tagged with its slot: slot 0 (the Lease named
/// like the lock) from the start, the others once asked for — a waiting claimant learns
/// from slot 0 how many there are.
pub struct SlotWatches {
    watches: LeaseWatches,
    lock: String,
    watched: u32,
    streams: futures::stream::SelectAll<BoxStream<'static, (u32, Option<Lease>)>>,
}

impl SlotWatches {
    /// Starts watching slot 0 of `lock`.
    pub fn new(watches: LeaseWatches, lock: &str) -> SlotWatches {
        let mut slots =
            SlotWatches { watches, lock: lock.to_owned(), watched: 0, streams: futures::stream::SelectAll::new() };
        slots.watch_up_to(1);
        slots
    }

    /// How many slots are watched (slots `0..watched`).
    pub fn watched(&self) -> u32 {
        self.watched
    }

    /// Watches slots up to `permits` (never fewer than now, never more than a lock has).
    pub fn watch_up_to(&mut self, permits: u32) {
        while self.watched < permits.min(crate::lease::slot::MAX_PERMITS) {
            let slot = self.watched;
            let states = self.watches.states(&crate::lease::slot::lease_name(&self.lock, slot));
            self.streams.push(states.map(move |state| (slot, state)).boxed());
            self.watched += 1;
        }
    }

    /// The next state of any watched slot.
    pub async fn next(&mut self) -> Option<(u32, Option<Lease>)> {
        self.streams.next().await
    }

    /// Slot `slot`'s states alone from now on; the other slots' readers end.
    pub fn into_slot(self, slot: u32) -> BoxStream<'static, Option<Lease>> {
        if self.watched == 1 && slot == 0 {
            // A mutex: its one reader goes on.
            if let Some(only) = self.streams.into_iter().next() {
                return only.map(|(_, state)| state).boxed();
            }
        }
        self.watches.states(&crate::lease::slot::lease_name(&self.lock, slot))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::channel::mpsc;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    /// Watches whose states the test sends, counting the watches started.
    struct Fed {
        watches: LeaseWatches,
        started: Arc<AtomicUsize>,
        senders: Arc<Mutex<Vec<mpsc::UnboundedSender<Option<Lease>>>>>,
    }

    impl Fed {
        fn new() -> Fed {
            let started = Arc::new(AtomicUsize::new(0));
            let senders: Arc<Mutex<Vec<mpsc::UnboundedSender<Option<Lease>>>>> = Arc::default();
            let (count, keep) = (started.clone(), senders.clone());
            let watches = LeaseWatches::from_source(Arc::new(move |_: &str| {
                count.fetch_add(1, Ordering::SeqCst);
                let (tx, rx) = mpsc::unbounded();
                keep.lock().unwrap().push(tx);
                rx.boxed()
            }));
            Fed { watches, started, senders }
        }

        /// Sends `state` on the latest watch started.
        fn send(&self, state: Option<Lease>) {
            self.senders.lock().unwrap().last().unwrap().unbounded_send(state).unwrap();
        }

        fn started(&self) -> usize {
            self.started.load(Ordering::SeqCst)
        }
    }

    fn lease(version: &str) -> Option<Lease> {
        Some(Lease {
            metadata: ObjectMeta {
                name: Some("orders".into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            spec: None,
        })
    }

    fn version(state: Option<Lease>) -> Option<String> {
        state.and_then(|l| l.metadata.resource_version)
    }

    /// Lets the feed task run.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn readers_of_one_lease_share_one_watch_and_a_later_reader_starts_from_the_latest_state() {
        let fed = Fed::new();
        let mut first = fed.watches.states("orders");
        fed.send(lease("1"));
        assert_eq!(version(first.next().await.unwrap()).as_deref(), Some("1"));
        fed.send(lease("2"));
        settle().await;
        let mut second = fed.watches.states("orders");
        assert_eq!(fed.started(), 1, "the second reader shares the first's watch");
        assert_eq!(version(second.next().await.unwrap()).as_deref(), Some("2"), "the latest state first");
        fed.send(None);
        assert_eq!(version(first.next().await.unwrap()).as_deref(), Some("2"), "the first reader reads on in order");
        assert_eq!(first.next().await.unwrap(), None, "then the deletion");
        assert_eq!(second.next().await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_read_before_the_watch_has_listed() {
        let fed = Fed::new();
        let mut reader = fed.watches.states("orders");
        settle().await;
        assert!(futures::poll!(reader.next()).is_pending(), "an unlisted watch shows no state, not a missing Lease");
        fed.send(None);
        assert_eq!(reader.next().await.unwrap(), None, "a Lease the list did not find");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_outlives_its_last_reader_by_the_linger_and_no_longer() {
        let fed = Fed::new();
        let mut reader = fed.watches.states("orders");
        fed.send(lease("1"));
        reader.next().await.unwrap();
        drop(reader);
        settle().await;
        tokio::time::advance(LINGER - Duration::from_secs(1)).await;
        settle().await;
        let mut again = fed.watches.states("orders");
        assert_eq!(fed.started(), 1, "taken again within the linger: the same watch");
        assert_eq!(version(again.next().await.unwrap()).as_deref(), Some("1"));
        drop(again);
        settle().await;
        // The linger starts again from when the last reader left.
        tokio::time::advance(LINGER - Duration::from_secs(2)).await;
        settle().await;
        let third = fed.watches.states("orders");
        assert_eq!(fed.started(), 1, "a reader came and went within the linger: it starts again");
        drop(third);
        settle().await;
        tokio::time::advance(LINGER + Duration::from_secs(1)).await;
        settle().await;
        let mut fresh = fed.watches.states("orders");
        assert_eq!(fed.started(), 2, "unread for a whole linger: the watch ended, a new one starts");
        fed.send(lease("7"));
        assert_eq!(version(fresh.next().await.unwrap()).as_deref(), Some("7"));
    }
}
