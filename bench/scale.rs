//! Controller resident memory with many locks: a controller of its own in a namespace of
//! its own; locks created in parallel (politely: a bounded number of requests in flight),
//! then waited on until the controller has reconciled every one (its Lease exists and its
//! status is written); then memory is read. Ends with a quiet window: apiserver writes
//! caused by that many idle locks.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, ResourceExt};
use leasehold::crd::{DistributedLock, DistributedLockSpec, LABEL_ROLE, ROLE_LOCK};
use serde_json::json;

use crate::observe::{Writes, memory, scrape};
use crate::record::{Memory, Run, WriteCount};
use crate::support::{Env, LeaseholdProcess};

/// What to do.
pub struct Plan {
    /// Lock counts at which memory is read, ascending.
    pub counts: Vec<usize>,
    /// Creates in flight.
    pub concurrency: usize,
    /// Quiet window at the largest count.
    pub idle_window: Duration,
    /// Give up waiting for reconciliation after this, per 10,000 locks a step creates (at
    /// least once).
    pub timeout: Duration,
}

fn controller_memory(controller: &LeaseholdProcess, what: String, params: serde_json::Value) -> anyhow::Result<Memory> {
    let pid = controller.process.as_ref().context("the controller is running")?.pid();
    memory(pid, &what, params)
}

/// Runs the plan against `controller`, which serves `env`'s namespace only.
pub async fn run(
    env: &Env,
    controller: &LeaseholdProcess,
    admin: &kube::Client,
    background: &Writes,
    plan: &Plan,
) -> anyhow::Result<Run> {
    let mut run = Run::default();
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.memory.push(controller_memory(controller, "controller, 0 locks".into(), json!({"after": "ready + 3 s"}))?);

    // The bench's own caches of locks and lock Leases, to count reconciled locks without
    // listing 10,000 objects over and over.
    let (locks, lock_writer) = reflector::store::<DistributedLock>();
    let lock_watch = watcher(env.locks(), watcher::Config::default()).default_backoff().reflect(lock_writer);
    let (leases, lease_writer) = reflector::store::<Lease>();
    let leases_api: Api<Lease> = env.leases();
    let selector = format!("{LABEL_ROLE}={ROLE_LOCK}");
    let lease_watch =
        watcher(leases_api, watcher::Config::default().labels(&selector)).default_backoff().reflect(lease_writer);
    let watches = tokio::spawn(async move {
        futures::join!(lock_watch.for_each(|_| async {}), lease_watch.for_each(|_| async {}));
    });

    let mut created = 0;
    let mut rates = Vec::new();
    for &count in &plan.counts {
        // The apiserver's writes while this step's locks are created and reconciled, per
        // new lock: what a start or a re-list costs it.
        let requests_before = scrape(admin).await?;
        let new_locks = count.saturating_sub(created);
        let started = Instant::now();
        let api = env.locks();
        let results: Vec<Result<DistributedLock, kube::Error>> = futures::stream::iter(created..count)
            .map(|i| {
                let api = api.clone();
                async move {
                    api.create(
                        &Default::default(),
                        &DistributedLock::new(&format!("s{i:05}"), DistributedLockSpec::default()),
                    )
                    .await
                }
            })
            .buffer_unordered(plan.concurrency)
            .collect()
            .await;
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            bail!("failed to create a lock: {e}");
        }
        let create_s = started.elapsed().as_secs_f64();
        let timeout = plan.timeout * u32::try_from((count - created).div_ceil(10_000)).unwrap_or(u32::MAX);
        created = count;
        let deadline = started + timeout;
        loop {
            let reconciled = locks.state().iter().filter(|l| l.status.is_some()).count();
            let leased = leases.state().len();
            if reconciled >= count && leased >= count {
                break;
            }
            if Instant::now() > deadline {
                // Worth knowing in itself: record which, then measure what there is.
                let missing: Vec<String> = locks
                    .state()
                    .iter()
                    .filter(|l| {
                        l.status.is_none()
                            || leases.get(&reflector::ObjectRef::new(&l.name_any()).within(env.name())).is_none()
                    })
                    .map(|l| l.name_any())
                    .collect();
                run.failures.push(format!(
                    "{} of {count} locks were not reconciled (no status or no Lease) {:?} after their creation began: {}",
                    count.saturating_sub(reconciled.min(leased)),
                    timeout,
                    missing.join(", ")
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let reconciled_s = started.elapsed().as_secs_f64();
        let during = Writes::between(&requests_before, &scrape(admin).await?, reconciled_s).less_background(background);
        let per = new_locks.max(1) as f64;
        run.writes.push(WriteCount {
            what: format!(
                "apiserver writes per new lock while {new_locks} locks are created and reconciled (the bench's own creates included)"
            ),
            value: during.total() / per,
            unit: "writes/lock".into(),
            breakdown: during.breakdown(per),
            params: json!({
                "locks_created": new_locks,
                "locks_after": count,
                "window_s": reconciled_s,
                "raw_writes": during.total(),
                "conflicts": during.conflicts_total(),
            }),
        });
        // Let allocations settle, then read.
        tokio::time::sleep(Duration::from_secs(5)).await;
        run.memory.push(controller_memory(
            controller,
            format!("controller, {count} locks"),
            json!({
                "after": "every lock reconciled (Lease exists, status written) + 5 s",
                "create_concurrency": plan.concurrency,
                "created_in_s": (create_s * 10.0).round() / 10.0,
                "all_reconciled_in_s": (reconciled_s * 10.0).round() / 10.0,
            }),
        )?);
        rates.push(json!({"locks": count, "create_s": create_s, "reconciled_s": reconciled_s}));
    }

    // Exact attribution for the quiet window: the resourceVersion of every lock, Lease and
    // Event of the namespace before and after (the apiserver's counters cannot tell this
    // namespace's Lease writes from the background's).
    let events: Api<Event> = Api::namespaced(env.ns.client.clone(), env.name());
    let versions = |objects: Vec<(String, Option<String>)>| objects.into_iter().collect::<BTreeMap<_, _>>();
    let snapshot = || async {
        let locks = versions(locks.state().iter().map(|o| (o.name_any(), o.resource_version())).collect());
        let lease_versions = versions(leases.state().iter().map(|o| (o.name_any(), o.resource_version())).collect());
        let event_list = events.list_metadata(&Default::default()).await?;
        let event_versions = versions(event_list.items.iter().map(|o| (o.name_any(), o.resource_version())).collect());
        anyhow::Ok([locks, lease_versions, event_versions])
    };
    let (before, t0) = (scrape(admin).await?, Instant::now());
    let objects_before = snapshot().await?;
    tokio::time::sleep(plan.idle_window).await;
    let writes = Writes::between(&before, &scrape(admin).await?, t0.elapsed().as_secs_f64());
    let objects_after = snapshot().await?;
    let changed: Vec<usize> = objects_before
        .iter()
        .zip(&objects_after)
        .map(|(a, b)| {
            b.iter().filter(|(k, v)| a.get(*k) != Some(*v)).count() + a.keys().filter(|k| !b.contains_key(*k)).count()
        })
        .collect();
    let net = writes.less_background(background);
    run.writes.push(WriteCount {
        what: format!(
            "objects of the {created} idle locks written during the quiet window (exact: resourceVersions compared)"
        ),
        value: changed.iter().sum::<usize>() as f64,
        unit: "objects changed".into(),
        breakdown: format!("DistributedLocks {}, Leases {}, Events {}", changed[0], changed[1], changed[2]),
        params: json!({"locks": created, "window_s": writes.seconds}),
    });
    run.writes.push(WriteCount {
        what: format!("apiserver writes per minute caused by {created} idle locks"),
        value: net.total() * 60.0 / writes.seconds,
        unit: "writes/min".into(),
        breakdown: net.breakdown(writes.seconds / 60.0),
        params: json!({
            "locks": created,
            "window_s": writes.seconds,
            "raw_writes": writes.total(),
            "raw_breakdown_per_min": writes.breakdown(writes.seconds / 60.0),
            "background_subtracted": writes.total() - net.total(),
        }),
    });
    run.memory.push(controller_memory(
        controller,
        format!("controller, {created} idle locks, end of the quiet window"),
        json!({"after": format!("{:.0} s idle", writes.seconds)}),
    )?);
    run.facts.insert("scale_rates".into(), json!(rates));
    watches.abort();
    Ok(run)
}
