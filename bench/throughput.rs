//! Aggregate lock cycles per second: `locks` locks with `clients` contending claimants
//! each, every claimant looping acquire → release as fast as it is granted; on mutexes,
//! or on locks with several permits (a semaphore, or a read-write lock with some
//! claimants writing). Claimants are
//! in-process [`leasehold::claim::Claimant`]s (the API the sidecar wraps; 1,000 sidecar
//! processes would not fit this machine), outside any Pod, with one client per lock built
//! like the product's own ([`leasehold::kube_client`]), each as a ServiceAccount of its own
//! (bench/accounts.rs says why not as the admin).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use leasehold::claim::Claimant;
use leasehold::claim::edit::holder;
use leasehold::crd::{ClaimMode, DistributedLockSpec, LABEL_LOCK, LockClaim};
use leasehold::lease::Identity;

use crate::observe::Writes;
use crate::record::Throughput;
use crate::sidecar::create_lock_with;
use crate::stats::{Summary, ms_between};
use crate::support::Env;

/// The locks of a run: how many permits, and how many of each lock's claimants write.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Permits per lock (1: a mutex).
    pub permits: u32,
    /// Claimants per lock in write mode (the rest read).
    pub writers: usize,
}

impl Shape {
    /// Mutexes.
    pub const MUTEX: Shape = Shape { permits: 1, writers: 0 };

    /// Whether claimant `c` of `clients` writes: writers are spread through the queue,
    /// every (clients / writers)-th claimant.
    fn writes(&self, c: usize, clients: usize) -> bool {
        let every = (clients / self.writers.max(1)).max(1);
        self.writers > 0 && (c + 1).is_multiple_of(every) && (c + 1) / every <= self.writers
    }

    /// The lock names' prefix: distinct per shape and lock count.
    fn prefix(&self, locks: usize) -> String {
        match (self.permits, self.writers) {
            (1, 0) => format!("tp{locks}"),
            (p, 0) => format!("sem{p}-{locks}"),
            (p, w) => format!("rw{p}w{w}-{locks}"),
        }
    }
}

/// The longest the window waits for every claimant's first claim: with 1,000 locks × 10
/// claimants, the apiserver admits the first herd's requests over tens of seconds.
const ALL_CLAIMED: Duration = Duration::from_secs(180);

/// The longest the window waits, once every claimant has claimed, for every claimant to
/// be granted once more: a turn of every queue. With 1,000 locks × 10 claimants the
/// apiserver is still absorbing the first herd when the last claim is created (grants go
/// unconfirmed, the controller's caches lag), and a turn of a queue there takes minutes.
const TURNED: Duration = Duration::from_secs(300);

/// How long the claimants still queued when the window closes get to be granted in turn
/// and leave.
const DRAIN: Duration = Duration::from_secs(120);

/// How long a run's leftovers get to close their connections before the next run starts:
/// claimants cut off at the end of [`DRAIN`] withdraw their claims in the background, and
/// their Lease watches linger 30 s after their last reader. With 1,000 locks × 10
/// claimants that is ~10,000 watches and as many withdrawals at once.
const SETTLE: Duration = Duration::from_secs(180);

/// How long a run's locks get to fall quiet before the next run starts: no claim of theirs
/// left and no slot Lease of theirs naming a holder. Claimants cut off at the end of
/// [`DRAIN`] leave claims that age out and grants the controller revokes unconfirmed, one
/// after another; with 1,000 locks × 10 that took the controller most of a minute after
/// the claimants' connections had closed, and the next run's window counted those
/// revocations, their Events and their status writes as its own.
const QUIET: Duration = Duration::from_secs(300);

/// Open files a run may leave behind (the admin client's connections, the runtime's own).
const LEFT_OPEN: usize = 256;

/// How long a claimant waits for a grant: longer than any run (the drain ends those still
/// waiting), so that it waits its turn however long the queue. With 10 claimants on each
/// of 1,000 locks a turn of the queue outlasts a wait of minutes; claimants that gave up
/// would withdraw, claim again at the back, and the run would measure their timeouts
/// instead of the grants.
const PATIENCE: Duration = Duration::from_secs(3600);

/// One measured configuration.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    env: &Env,
    admin: &kube::Client,
    meter: &crate::cpu::Meter,
    background: &Writes,
    locks: usize,
    clients: usize,
    shape: Shape,
    warmup: Duration,
    window: Duration,
) -> anyhow::Result<Throughput> {
    let prefix = shape.prefix(locks);
    let names: Vec<String> = (0..locks).map(|i| format!("{prefix}-{i}")).collect();
    let spec = DistributedLockSpec { permits: i32::try_from(shape.permits)?, ..DistributedLockSpec::default() };
    futures::stream::iter(names.iter().map(|n| create_lock_with(env, n, spec.clone())))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;

    let files_before = crate::observe::open_files()?;
    let stop = Arc::new(AtomicBool::new(false));
    // (acquire returned, acquire latency ms, which claimant) per cycle; errors by instant.
    let cycles: Arc<Mutex<Vec<(Instant, f64, usize)>>> = Arc::default();
    let errors: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    // (release returned, release latency ms) per cycle.
    let releases: Arc<Mutex<Vec<(Instant, f64)>>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    // The client the product's components build for themselves (TCP_NODELAY), one per
    // lock, each as a ServiceAccount of its own.
    let accounts = crate::accounts::for_clients(env, locks).await?;
    // From here the claimants start: the warm-up, and the wait for their first claims.
    let counted = (crate::observe::scrape(admin).await?, Instant::now());
    for (l, (lock, account)) in names.iter().zip(accounts).enumerate() {
        let client = leasehold::kube_client::from_config(account.config)?;
        for c in 0..clients {
            let who = l * clients + c;
            let mode = if shape.writes(c, clients) { ClaimMode::Write } else { ClaimMode::Read };
            let identity = Identity::for_user(&account.username);
            let claimant = Claimant::new(client.clone(), env.name(), identity, "leasehold-bench");
            let (lock, stop, cycles, errors) = (lock.clone(), stop.clone(), cycles.clone(), errors.clone());
            let releases = releases.clone();
            tasks.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    match claimant.acquire_in(&lock, PATIENCE, mode).await {
                        Ok(hold) => {
                            let now = Instant::now();
                            cycles.lock().expect("not poisoned").push((now, ms_between(started, now), who));
                            hold.release().await;
                            let released = Instant::now();
                            releases.lock().expect("not poisoned").push((released, ms_between(now, released)));
                        }
                        Err(e) => {
                            errors
                                .lock()
                                .expect("not poisoned")
                                .push((Instant::now(), format!("{}: {e}", e.category())));
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
            });
        }
    }
    // The window measures the steady state: it starts after the warm-up, not before every
    // claimant has claimed once, and not before each has been granted once since (a turn
    // of every queue). Where the window used to start, right after the claims, the cycles
    // of a window as long are counted too.
    let all_claimed =
        crate::observe::claims_created(admin, (&counted.0, counted.1), locks * clients, ALL_CLAIMED).await?;
    let claimed = Instant::now();
    let first = claimed + warmup.saturating_sub(counted.1.elapsed());
    let turned = turned_over(&cycles, claimed, locks * clients, TURNED).await;
    let wait = first.saturating_duration_since(Instant::now());
    // Everyone still queued is granted in turn and leaves; give that a bounded time.
    let ((before, start), (after, end), cpu) = crate::observe::window(
        admin,
        meter,
        &format!("throughput-{prefix}x{clients}"),
        (wait, window),
        &stop,
        &mut tasks,
        DRAIN,
    )
    .await?;

    // The sample lists' mutex guards end here, before the wait for the leftovers.
    let result = {
        let inside = |t: &Instant| *t >= start && *t < end;
        let cycles = cycles.lock().expect("not poisoned");
        let in_window: Vec<f64> = cycles.iter().filter(|(t, _, _)| inside(t)).map(|(_, ms, _)| *ms).collect();
        let first_end = first + (end - start);
        let in_first = cycles.iter().filter(|(t, _, _)| *t >= first && *t < first_end).count();
        let released: Vec<f64> =
            releases.lock().expect("not poisoned").iter().filter(|(t, _)| inside(t)).map(|(_, ms)| *ms).collect();
        let errors = errors.lock().expect("not poisoned");
        let failed: Vec<&String> = errors.iter().filter(|(t, _)| inside(t)).map(|(_, e)| e).collect();
        // A few distinct failures, by category, to say what went wrong.
        let mut kinds: BTreeMap<String, (usize, String)> = BTreeMap::new();
        for e in &failed {
            let category = e.split(':').next().unwrap_or("").to_owned();
            kinds.entry(category).or_insert((0, (*e).clone())).0 += 1;
        }
        let error_kinds = kinds.into_iter().map(|(k, (n, example))| format!("{k} ×{n}, e.g. {example}")).collect();
        let seconds = (end - start).as_secs_f64();
        let writes = Writes::between(&before, &after, seconds);
        let net = writes.less_background(background);
        let n = in_window.len().max(1) as f64;
        let requests = after.since(&before);
        Throughput {
            locks,
            clients_per_lock: clients,
            permits: shape.permits,
            writers_per_lock: shape.writers,
            cycles: in_window.len(),
            seconds,
            all_claimed_s: all_claimed.map(|d| d.as_secs_f64()),
            turned_s: turned.map(|d| d.as_secs_f64()),
            first_per_second: in_first as f64 / (end - start).as_secs_f64(),
            per_second: in_window.len() as f64 / seconds,
            errors: failed.len(),
            error_kinds,
            writes_per_cycle: net.total() / n,
            conflicts_per_cycle: writes.conflicts_total() / n,
            breakdown: net.breakdown(n),
            requests_per_cycle: requests.values().sum::<f64>() / n,
            requests: crate::observe::per_kind(&requests, n),
            request_counts: requests.iter().map(|(k, v)| (k.clone(), v / n)).collect(),
            acquire_ms: Summary::of(&in_window),
            release_ms: Summary::of(&released),
            cpu,
        }
    };
    settle(&mut tasks, locks, clients, files_before).await;
    quiet(admin, env.name(), &names, clients).await?;
    Ok(result)
}

/// Waits until each of `claimants` has been granted since `since` (a turn of every
/// queue), or `limit` has passed; returns how long that took (`None`: not within it).
async fn turned_over(
    cycles: &Mutex<Vec<(Instant, f64, usize)>>,
    since: Instant,
    claimants: usize,
    limit: Duration,
) -> Option<Duration> {
    loop {
        let granted: std::collections::HashSet<usize> = {
            let cycles = cycles.lock().expect("not poisoned");
            cycles.iter().filter(|(t, _, _)| *t >= since).map(|(_, _, who)| *who).collect()
        };
        if granted.len() >= claimants {
            return Some(since.elapsed());
        }
        if since.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Ends what is left of a run — claimants cut off at the end of [`DRAIN`] — and waits for
/// their connections to close, so that the next run neither runs out of open files nor
/// shares the machine with this one's leftovers. Said on stderr if they do not close in
/// [`SETTLE`].
async fn settle(tasks: &mut tokio::task::JoinSet<()>, locks: usize, clients: usize, files_before: usize) {
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    match crate::observe::files_closed(files_before + LEFT_OPEN, SETTLE).await {
        Some(took) if took >= Duration::from_secs(1) => {
            eprintln!("bench: {locks} × {clients}: the run's connections closed {:.1} s after it", took.as_secs_f64());
        }
        Some(_) => {}
        None => eprintln!("bench: {locks} × {clients}: files still open {} s after the run", SETTLE.as_secs()),
    }
}

/// Waits until none of `locks` has a claim left or a slot Lease naming a holder (the
/// controller has done with the run), at most [`QUIET`]; said on stderr if that took a
/// second or more, or did not happen. Claims are told apart by their `spec.lock`, Leases
/// by their lock label: one list of each in the namespace per look.
async fn quiet(admin: &kube::Client, namespace: &str, locks: &[String], clients: usize) -> anyhow::Result<()> {
    let names: HashSet<&str> = locks.iter().map(String::as_str).collect();
    let ours = |lock: &str| names.contains(lock);
    let claims: Api<LockClaim> = Api::namespaced(admin.clone(), namespace);
    let leases: Api<Lease> = Api::namespaced(admin.clone(), namespace);
    let labelled = ListParams::default().labels(LABEL_LOCK);
    let started = Instant::now();
    let run = format!("{} × {clients}", locks.len());
    loop {
        let claimed = claims.list(&labelled).await?.items.iter().filter(|c| ours(&c.spec.lock)).count();
        let held = leases
            .list(&labelled)
            .await?
            .items
            .iter()
            .filter(|l| l.labels().get(LABEL_LOCK).is_some_and(|lock| ours(lock)))
            .filter(|l| holder(l).is_some())
            .count();
        let took = started.elapsed();
        if claimed == 0 && held == 0 {
            if took >= Duration::from_secs(1) {
                eprintln!("bench: {run}: the run's locks fell quiet {:.1} s after it", took.as_secs_f64());
            }
            return Ok(());
        }
        if took >= QUIET {
            eprintln!("bench: {run}: {claimed} claims and {held} holders left {} s after the run", QUIET.as_secs());
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
