//! The apiserver's own write ceiling: how many Lease compare-and-swaps per second it takes
//! from as many clients as a throughput run uses. A throughput run gives each lock one
//! client (bench/throughput.rs), so the ceiling for `n` locks is `n` clients, each built
//! like the product's ([`leasehold::kube_client`]) and authenticated as the throughput
//! run's clients are (a ServiceAccount each, bench/accounts.rs), each looping
//! read-modify-replace on a Lease of its own (no two clients share one, so the ceiling is
//! never spent on conflicts) as fast as its answers come back, for the same warm-up and
//! window. Leasehold's writes per second are then read as a fraction of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

use crate::observe::Writes;
use crate::record::Ceiling;
use crate::stats::{Summary, ms_between};
use crate::support::Env;

/// The label on the ceiling's Leases, so that they are removed in one call afterwards.
const LABEL: &str = "leasehold-bench/ceiling";

/// One measured ceiling with `clients` clients.
pub async fn run(
    env: &Env,
    admin: &kube::Client,
    meter: &crate::cpu::Meter,
    background: &Writes,
    clients: usize,
    warmup: Duration,
    window: Duration,
) -> anyhow::Result<Ceiling> {
    let leases: Api<Lease> = env.leases();
    let names: Vec<String> = (0..clients).map(|i| format!("ceiling{clients}-{i}")).collect();
    let create = |name: &String| {
        let mut lease = crate::floors::floor_lease(name);
        lease.metadata.labels = Some([(LABEL.to_owned(), clients.to_string())].into());
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
    let ((before, start), (after, end), cpu) =
        crate::observe::window(admin, meter, (warmup, window), &stop, &mut tasks, Duration::from_secs(60)).await?;
    let selector = format!("{LABEL}={clients}");
    leases
        .delete_collection(&DeleteParams::default(), &ListParams::default().labels(&selector))
        .await
        .context("failed to delete the ceiling Leases")?;

    let inside = |t: &Instant| *t >= start && *t < end;
    let writes = writes.lock().expect("not poisoned");
    let in_window: Vec<f64> = writes.iter().filter(|(t, _)| inside(t)).map(|(_, ms)| *ms).collect();
    let conflicts = conflicts.lock().expect("not poisoned").iter().filter(|t| inside(t)).count();
    let errors = errors.lock().expect("not poisoned");
    let failed: Vec<&String> = errors.iter().filter(|(t, _)| inside(t)).map(|(_, e)| e).collect();
    let seconds = (end - start).as_secs_f64();
    let counted = Writes::between(&before, &after, seconds).less_background(background);
    Ok(Ceiling {
        clients,
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
