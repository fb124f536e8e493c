//! The apiserver's own write ceiling: how many Lease compare-and-swaps per second it takes
//! from as many clients as a throughput run uses. A throughput run gives each lock one
//! client (bench/throughput.rs), so the ceiling for `n` locks is `n` clients, each built
//! like the product's ([`leasehold::kube_client`]) and authenticated as the throughput
//! run's clients are (a ServiceAccount each, bench/accounts.rs), each looping
//! read-modify-replace on a Lease of its own (no two clients share one, so the ceiling is
//! never spent on conflicts) as fast as its answers come back, for the same warm-up and
//! window. Leasehold's writes per second are then read as a fraction of it.
//!
//! A ceiling can also be measured with watchers: each Lease watched by as many watches as a
//! lock has claimants in the throughput run, each the watch a claimant keeps of its lock's
//! Lease (`leasehold::claim::lease_states`), so that every write is sent to that many
//! watchers, as every change of a contended lock's Lease is. The two ceilings side by side
//! say what sending the changes costs the apiserver's writes, with nothing of Leasehold's
//! in between.
//!
//! The watches can instead select by holder ([`Selection::Holder`]): each also selects a
//! label naming it, and each write moves that label to the next watch, so a write is sent
//! to two watches (the one the Lease leaves, the one it enters) rather than to all. That is
//! what a lock's changes would cost if each claimant's watch were sent only the changes of
//! holds in its own name, as a grant moves a Lease from its old holder to its new one.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use leasehold::lease::unmanaged::UnmanagedLease;

use crate::observe::Writes;
use crate::record::Ceiling;
use crate::stats::{Summary, ms_between};
use crate::support::Env;

/// The label on the ceiling's Leases, so that they are removed in one call afterwards.
const LABEL: &str = "leasehold-bench/ceiling";

/// The label naming the one watch a Lease is in the selection of, under [`Selection::Holder`].
const HOLDER: &str = "leasehold-bench/holder";

/// How each watch of a ceiling's Lease selects the changes it is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Selection {
    /// By the Lease's name: every change, as a claimant's watch of its lock's Lease is sent.
    Name,
    /// By the Lease's name and a label naming the watch, which each write moves to the next
    /// watch: a change is sent to the watch it leaves and the one it enters.
    Holder,
}

/// How long the watchers may take to start (each has listed its Lease) before the writes.
const WATCHERS_READY: Duration = Duration::from_secs(120);

/// One measured ceiling with `clients` clients, each Lease watched by `watchers` watches.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    env: &Env,
    admin: &kube::Client,
    meter: &crate::cpu::Meter,
    background: &Writes,
    clients: usize,
    (watchers, selection): (usize, Selection),
    warmup: Duration,
    window: Duration,
) -> anyhow::Result<Ceiling> {
    let leases: Api<Lease> = env.leases();
    let by_holder = selection == Selection::Holder && watchers > 0;
    let run = format!("{clients}w{watchers}{}", if by_holder { "h" } else { "" });
    let names: Vec<String> = (0..clients).map(|i| format!("ceiling{run}-{i}")).collect();
    let create = |name: &String| {
        let mut lease = crate::floors::floor_lease(name);
        let mut labels = std::collections::BTreeMap::from([(LABEL.to_owned(), run.clone())]);
        if by_holder {
            labels.insert(HOLDER.to_owned(), "0".to_owned());
        }
        lease.metadata.labels = Some(labels);
        let leases = leases.clone();
        async move { leases.create(&PostParams::default(), &lease).await.context("failed to create a ceiling Lease") }
    };
    // As politely as the throughput run creates its locks: 16 in flight.
    futures::stream::iter(names.iter().map(create))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<Lease>>>()?;

    let watched = Api::namespaced(leases.clone().into_client(), env.name());
    let (watches, events) = watch(&watched, &names, (watchers, selection)).await?;

    let stop = Arc::new(AtomicBool::new(false));
    // (replace returned, its latency ms) per successful write; 409s and other failures by instant.
    let writes: Arc<Mutex<Vec<(Instant, f64)>>> = Arc::default();
    let conflicts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let errors: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    crate::accounts::allow_lease_writes(env).await?;
    let accounts = crate::accounts::for_clients(env, clients).await?;
    let mut tasks = tokio::task::JoinSet::new();
    for (name, account) in names.into_iter().zip(accounts) {
        let client = leasehold::kube_client::from_config(account.config)?;
        let api: Api<Lease> = Api::namespaced(client, env.name());
        let (stop, writes, conflicts, errors) = (stop.clone(), writes.clone(), conflicts.clone(), errors.clone());
        tasks.spawn(async move {
            let params = PostParams::default();
            // Read once; afterwards each write sends the object the previous one returned,
            // as a holder renewing its Lease does, and reads again only when refused.
            let mut current = None;
            while !stop.load(Ordering::Relaxed) {
                let mut next = match current.take() {
                    Some(lease) => lease,
                    None => match api.get(&name).await {
                        Ok(lease) => lease,
                        Err(e) => {
                            errors.lock().expect("not poisoned").push((Instant::now(), format!("get: {e}")));
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            continue;
                        }
                    },
                };
                next.spec.get_or_insert_with(LeaseSpec::default).renew_time = Some(MicroTime(Timestamp::now()));
                if by_holder {
                    move_holder(&mut next, watchers);
                }
                let started = Instant::now();
                match api.replace(&name, &params, &next).await {
                    Ok(lease) => {
                        let now = Instant::now();
                        writes.lock().expect("not poisoned").push((now, ms_between(started, now)));
                        current = Some(lease);
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => conflicts.lock().expect("not poisoned").push(started),
                    Err(e) => {
                        errors.lock().expect("not poisoned").push((Instant::now(), format!("replace: {e}")));
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
    }
    // Each loop ends after its write in flight.
    let ((before, start), (after, end), cpu) = crate::observe::window(
        admin,
        meter,
        &format!("ceiling-{run}"),
        (warmup, window),
        &stop,
        &mut tasks,
        Duration::from_secs(60),
    )
    .await?;
    let watch_events = events.load(Ordering::Relaxed);
    drop(watches);
    let selector = format!("{LABEL}={run}");
    leases
        .delete_collection(&DeleteParams::default(), &ListParams::default().labels(&selector))
        .await
        .context("failed to delete the ceiling Leases")?;

    let inside = |t: &Instant| *t >= start && *t < end;
    let writes = writes.lock().expect("not poisoned");
    let watch_events_per_write = watch_events as f64 / writes.len().max(1) as f64;
    let in_window: Vec<f64> = writes.iter().filter(|(t, _)| inside(t)).map(|(_, ms)| *ms).collect();
    let conflicts = conflicts.lock().expect("not poisoned").iter().filter(|t| inside(t)).count();
    let errors = errors.lock().expect("not poisoned");
    let failed: Vec<&String> = errors.iter().filter(|(t, _)| inside(t)).map(|(_, e)| e).collect();
    let seconds = (end - start).as_secs_f64();
    let counted = Writes::between(&before, &after, seconds).less_background(background);
    Ok(Ceiling {
        clients,
        watchers_per_lease: watchers,
        selection,
        watch_events_per_write,
        writes: in_window.len(),
        seconds,
        per_second: in_window.len() as f64 / seconds,
        conflicts,
        errors: failed.len(),
        first_error: failed.first().map(|e| (*e).clone()),
        apiserver_writes_per_second: counted.total() / seconds,
        breakdown: counted.breakdown(seconds),
        cas_ms: Summary::of(&in_window),
        cpu,
    })
}

/// What a ceiling's watch reports: that it has listed, then each change it was sent.
enum Seen {
    Listed,
    Change,
}

/// Starts `watchers` watches of each Lease in `names` and waits until each has listed. By
/// [`Selection::Name`] each is a claimant's own ([`leasehold::claim::lease_states`]: a
/// field selector on the Lease's name, the claimant's backoff, each state parsed as a
/// claimant parses it); by [`Selection::Holder`] watch `k` also selects the holder label
/// `k`. The watches run until the returned set is dropped; the counter counts the changes
/// they receive after their list (a state, or a Lease entering or leaving a selection).
async fn watch(
    leases: &Api<UnmanagedLease>,
    names: &[String],
    (watchers, selection): (usize, Selection),
) -> anyhow::Result<(tokio::task::JoinSet<()>, Arc<AtomicUsize>)> {
    let events = Arc::new(AtomicUsize::new(0));
    let mut watches = tokio::task::JoinSet::new();
    let (ready, mut started) = tokio::sync::mpsc::unbounded_channel();
    for name in names {
        for k in 0..watchers {
            let mut seen = seen(leases, name, k, selection);
            let (events, ready) = (events.clone(), ready.clone());
            watches.spawn(async move {
                while let Some(s) = seen.next().await {
                    match s {
                        Seen::Listed => {
                            let _ = ready.send(());
                        }
                        Seen::Change => {
                            events.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    }
    let all = names.len() * watchers;
    tokio::time::timeout(WATCHERS_READY, async {
        for _ in 0..all {
            started.recv().await;
        }
    })
    .await
    .with_context(|| format!("{all} watches of the ceiling's Leases not all started within {WATCHERS_READY:?}"))?;
    Ok((watches, events))
}

/// Watch `k` of Lease `name`, selecting as `selection` says.
fn seen(
    leases: &Api<UnmanagedLease>,
    name: &str,
    k: usize,
    selection: Selection,
) -> futures::stream::BoxStream<'static, Seen> {
    use kube::runtime::{WatchStreamExt as _, watcher};
    match selection {
        Selection::Name => leasehold::claim::lease_states(leases.clone(), name)
            .enumerate()
            .map(|(i, _)| if i == 0 { Seen::Listed } else { Seen::Change })
            .boxed(),
        Selection::Holder => {
            let config =
                watcher::Config::default().fields(&format!("metadata.name={name}")).labels(&format!("{HOLDER}={k}"));
            watcher(leases.clone(), config)
                .backoff(leasehold::lease::watch_backoff())
                .filter_map(|event| {
                    futures::future::ready(match event {
                        Ok(watcher::Event::InitDone) => Some(Seen::Listed),
                        Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => Some(Seen::Change),
                        _ => None,
                    })
                })
                .boxed()
        }
    }
}

/// Moves `lease`'s holder label to the next of `watchers` watches.
fn move_holder(lease: &mut Lease, watchers: usize) {
    let labels = lease.metadata.labels.get_or_insert_with(Default::default);
    let now: usize = labels.get(HOLDER).and_then(|v| v.parse().ok()).unwrap_or(0);
    labels.insert(HOLDER.to_owned(), ((now + 1) % watchers).to_string());
}
