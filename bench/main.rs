//! `make bench`: Leasehold against the floors and the peer libraries, in one run
//! on this machine, against a control plane of its own.
//!
//! Order matters: the quiet baseline of apiserver writes first (before any lock exists),
//! then the latency-sensitive measurements, interleaved in rounds so that each sees the same
//! load (bench/rounds.rs), then the held locks and failovers, then throughput (each lock
//! count beside the apiserver's own write ceiling with as many clients), then the slow
//! timer-bound runs (peers' handoffs and failovers, Leasehold's crash failover) side by
//! side, and the 10,000-lock memory run last (it leaves the apiserver with a lot to carry).
//! Every phase's failure is recorded and the run goes on; the exit status says whether
//! any failed. `LEASEHOLD_BENCH_QUICK=1` runs tiny sample counts (a smoke test of the
//! driver); `LEASEHOLD_BENCH_PHASES=word,...` runs only the phases whose names contain
//! one of the words. See bench/README.md.

use leasehold_e2e_support as support;

mod accounts;
mod acquire_split;
mod ceiling;
mod cpu;
mod floors;
mod lease_level;
mod lease_writes;
mod node;
mod observe;
mod output;
mod peers;
mod plain_cas;
mod plan;
mod record;
mod report;
mod report_ceiling;
mod report_costs;
mod report_profile;
mod request_cost;
mod rounds;
mod scale;
mod sidecar;
mod slow;
mod stats;
mod throughput;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::FutureExt;
use serde_json::json;

use observe::{Writes, scrape};
use plan::{Plan, Settle};
use record::{Panel, Phase, Run};
use support::Env;

fn main() -> ExitCode {
    if let Ok(filter) = std::env::var("LEASEHOLD_BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    match runtime.block_on(bench()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Prints a progress line with the time since start.
fn say(began: Instant, what: &str) {
    eprintln!("bench [{:>6.1}s] {what}", began.elapsed().as_secs_f64());
}

/// Whether phase `name` runs: all do, unless `LEASEHOLD_BENCH_PHASES` lists words (comma
/// separated, case-insensitive) of which the name must contain one (setup always runs).
fn selected(name: &str) -> bool {
    let name = name.to_lowercase();
    match std::env::var("LEASEHOLD_BENCH_PHASES") {
        Ok(words) if !words.trim().is_empty() => {
            name.starts_with("setup")
                || words.split(',').map(|w| w.trim().to_lowercase()).any(|w| !w.is_empty() && name.contains(&w))
        }
        _ => true,
    }
}

/// Runs one phase: its records merged into `run`, its wall time noted, a failure (error or
/// panic) recorded instead of ending the run.
async fn phase<F: Future<Output = anyhow::Result<Run>>>(run: &mut Run, began: Instant, name: &str, f: F) {
    if !selected(name) {
        run.notes.push(format!("phase skipped (LEASEHOLD_BENCH_PHASES): {name}"));
        return;
    }
    say(began, &format!("{name} ..."));
    let load_start = output::loadavg();
    let started = Instant::now();
    let outcome = AssertUnwindSafe(f).catch_unwind().await;
    let seconds = started.elapsed().as_secs_f64();
    run.phases.push(Phase { name: name.to_owned(), seconds, load_start, load_end: output::loadavg() });
    match outcome {
        Ok(Ok(records)) => run.merge(records),
        Ok(Err(error)) => run.failures.push(format!("{name}: {error:#}")),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panicked".into());
            run.failures.push(format!("{name}: panicked: {message}"));
        }
    }
    say(began, &format!("{name} done in {seconds:.1}s"));
}

/// The most open files this process (and what it starts) may have, raised first as far as
/// the system allows (`fs.nr_open`): with 1,000 locks × 10 claimants, every claimant's
/// Lease watch holds an HTTP/1.1 connection, whose two ends both live on this machine —
/// ~20,000 sockets in the bench and as many in the apiserver. A lower limit would measure
/// the limit, not Leasehold.
fn raise_open_files_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let most = std::fs::read_to_string("/proc/sys/fs/nr_open").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let raised = hard.max(most);
        // Raising the hard limit needs privilege; without it, the soft limit rises to it.
        if setrlimit(Resource::RLIMIT_NOFILE, raised, raised).is_err() {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
    getrlimit(Resource::RLIMIT_NOFILE).map_or(0, |(soft, _)| soft)
}

/// Rounds to one decimal.
fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

async fn bench() -> anyhow::Result<bool> {
    let began = Instant::now();
    let plan = Plan::from_env()?;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::var_os("LEASEHOLD_BENCH_OUT").map_or_else(|| repo.join("target/bench"), PathBuf::from);
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("failed to create {}", logs.display()))?;
    let mut run = Run::default();

    // Not timed: builds of the peers and the plotting venv (no-ops when up to date).
    say(began, "preparing (bench/prepare.sh) ...");
    let prepared = Instant::now();
    let cache = output::prepare(&repo)?;
    run.facts.insert(
        "prepare (s; untimed builds, a no-op when warm)".into(),
        json!(round1(prepared.elapsed().as_secs_f64())),
    );
    let bins = peers::Bins::in_dir(&cache.join("peers"))?;
    output::facts(&mut run, &repo, &plan);
    run.facts.insert(
        "open files limit (this process and the control plane it starts)".into(),
        json!(raise_open_files_limit()),
    );
    let measured = Instant::now();

    let env = Env::new("bench").await;
    let cp = env.cp;
    run.facts.insert("control plane start-up (s)".into(), json!(round1(cp.startup_time().as_secs_f64())));
    let admin = cp.admin_client().await;
    let controller = env.controller(&[]).await;
    let peers = peers::Peers {
        bins,
        kubeconfig: cp.kubeconfig_path().display().to_string(),
        namespace: cp.namespace("bench-peers").await.name.clone(),
        etcd: cp.etcd_url().to_owned(),
        logs: logs.clone(),
    };

    // 1. The background of apiserver writes with no lock anywhere (the controller's and the
    //    apiserver's own Lease renewals), and meanwhile the etcd floor, which never touches
    //    the apiserver.
    let mut background = Writes::default();
    let baseline = baseline(&admin, &peers, &plan, &mut background);
    phase(&mut run, began, "baseline writes + etcd floor", baseline).await;

    // Locks, pods and sidecars for what follows (their creation writes fall in no window).
    let mut world = None;
    phase(&mut run, began, "setup: locks, pods, sidecars", async {
        let (w, r) = World::set_up(&env, &plan).await?;
        world = Some(w);
        Ok(r)
    })
    .await;
    let Some(world) = world else {
        return output::finish(run, &out, &logs, began, measured).await;
    };

    // 2. The latency series, interleaved in rounds so that each sees the same load: the
    //    floors, Leasehold's acquire and handoffs, the etcd lock's handoff.
    let controller_pid = controller.process.as_ref().map(|p| p.pid());
    let name = "interleaved rounds: floor (Lease CAS: kube-rs, plain HTTPS, client-go), acquire, handoff (sidecars, Lease level, etcd)";
    phase(&mut run, began, name, interleaved(&env, &admin, controller_pid, &peers, &world, &plan)).await;
    phase(&mut run, began, "Leasehold: held locks (writes, sidecar memory)", async {
        let locks: Vec<String> = (0..plan.held_locks).map(|i| format!("held-{i}")).collect();
        sidecar::held(&admin, env.name(), &world.acquirer, &locks, &background, plan.held_window).await
    })
    .await;
    phase(&mut run, began, "Leasehold: Pod-deletion failover", async {
        sidecar::pod_deletion(&env, "poddel", plan.pod_deletions).await
    })
    .await;
    phase(&mut run, began, "Leasehold: app crash failover (session-bound holds)", async {
        sidecar::app_crash(&env, "appcrash", plan.app_crashes).await
    })
    .await;
    // Where the CPU goes in each throughput and ceiling window: the control plane's, the
    // controller's, and this process's (the claimants, or the ceiling's clients).
    let mut metered = vec![("bench (claimants or clients)", std::process::id())];
    metered.extend(controller_pid.map(|pid| ("controller", pid)));
    let children = cp.child_pids();
    metered.extend(["kube-apiserver", "etcd"].into_iter().filter_map(|c| cpu::find(&children, c).map(|pid| (c, pid))));
    let mut meter = cpu::Meter::new(&metered);
    if plan.apiserver_profiles {
        meter = meter.with_profiles(&admin, &out.join("apiserver-profiles"));
    }
    // What each kind of request a grant makes costs the apiserver, in a namespace of its own
    // that no controller reconciles: read against the throughput runs' requests per grant.
    phase(&mut run, began, "apiserver CPU per request, by kind", async {
        let (apiserver, etcd) = (cpu::find(&children, "kube-apiserver"), cpu::find(&children, "etcd"));
        let pids = request_cost::Pids {
            apiserver: apiserver.context("no kube-apiserver process")?,
            etcd: etcd.context("no etcd process")?,
        };
        let costs = Env::new("bench-cost").await;
        let request_costs = request_cost::run(&admin, costs.name(), &pids, plan.rounds, plan.cost_requests).await?;
        Ok(Run { request_costs, ..Default::default() })
    })
    .await;
    for &locks in &plan.throughput_locks {
        // The apiserver's ceiling first, from as many clients as the run below has (one per
        // lock), for the same warm-up and window: the run's writes are read against it.
        let name = format!("apiserver ceiling (beside throughput): raw Lease CAS, clients: {locks}");
        phase(&mut run, began, &name, async {
            let (warmup, window) = (plan.throughput_warmup, plan.throughput_window);
            let mut r = Run::default();
            let unwatched = (0, ceiling::Selection::Name);
            r.ceilings.push(ceiling::run(&env, &admin, &meter, &background, locks, unwatched, warmup, window).await?);
            Ok(r)
        })
        .await;
        // The same ceiling with each Lease watched as a contended lock's Lease is: what
        // sending every write to its watchers costs the apiserver; then with the watches
        // selecting by holder, each write sent to two of them: what routing a lock's
        // changes to the holds they concern would leave of that cost.
        if plan.watched_ceilings.contains(&locks) {
            let watchers = plan.clients_per_lock;
            for (selection, by) in [(ceiling::Selection::Name, ""), (ceiling::Selection::Holder, ", by holder label")] {
                let name =
                    format!("apiserver ceiling, {watchers} watchers per Lease{by}: raw Lease CAS, clients: {locks}");
                phase(&mut run, began, &name, async {
                    let (warmup, window) = (plan.throughput_warmup, plan.throughput_window);
                    let mut r = Run::default();
                    let watched = (watchers, selection);
                    r.ceilings
                        .push(ceiling::run(&env, &admin, &meter, &background, locks, watched, warmup, window).await?);
                    Ok(r)
                })
                .await;
            }
        }
        let name = format!("Leasehold: throughput, {locks} locks × {} clients", plan.clients_per_lock);
        phase(&mut run, began, &name, async {
            let (clients, warmup, window) = (plan.clients_per_lock, plan.throughput_warmup, plan.throughput_window);
            let mut r = Run::default();
            let shape = throughput::Shape::MUTEX;
            r.throughput
                .push(throughput::run(&env, &admin, &meter, &background, locks, clients, shape, warmup, window).await?);
            Ok(r)
        })
        .await;
    }
    for &(permits, clients, writers) in &plan.permit_runs {
        let name = match writers {
            0 => format!("Leasehold: throughput, a semaphore of {permits} permits × {clients} clients"),
            w => format!(
                "Leasehold: throughput, a read-write lock of {permits} permits × {clients} clients, {w} writing"
            ),
        };
        phase(&mut run, began, &name, async {
            let (warmup, window) = (plan.throughput_warmup, plan.throughput_window);
            let shape = throughput::Shape { permits, writers };
            let mut r = Run::default();
            r.throughput
                .push(throughput::run(&env, &admin, &meter, &background, 1, clients, shape, warmup, window).await?);
            Ok(r)
        })
        .await;
    }
    if let Some(pid) = controller.process.as_ref().map(|p| p.pid()) {
        let locks = 6
            + plan.held_locks
            + plan.crash_pairs
            + plan.throughput_locks.iter().sum::<usize>()
            + plan.permit_runs.len();
        let what = "controller (main namespace), after the throughput runs";
        match observe::memory(pid, what, json!({ "locks": locks })) {
            Ok(m) => run.memory.push(m),
            Err(e) => run.failures.push(format!("{e:#}")),
        }
    }

    // 4. The slow, timer-bound runs side by side.
    let name = "slow block: peers (client-go, etcd, kube-lease-manager) + Leasehold crash failover";
    phase(&mut run, began, name, slow::run(&env, &peers, &plan)).await;

    // 5. Controller memory with many locks. Everything above is stopped first, so that the
    //    quiet window sees the same background as the baseline (one controller electing).
    drop(world);
    drop(controller);
    let scale_plan = scale::Plan {
        counts: plan.scale_counts.clone(),
        concurrency: plan.create_concurrency,
        idle_window: plan.idle_window,
        timeout: plan.scale_timeout,
    };
    phase(&mut run, began, "controller memory with many locks + idle writes", async {
        let env = Env::new("bench-scale").await;
        let controller = env.controller(&[]).await;
        scale::run(&env, &controller, &admin, &background, &scale_plan).await
    })
    .await;

    // 6. On a real node, last: its kubelet, containerd and second control plane would
    //    otherwise share the cores with every measurement above.
    phase(&mut run, began, "real node: container memory, failover after app kill and pod deletion", async {
        node::run(&repo, plan.node_failovers).await
    })
    .await;

    output::finish(run, &out, &logs, began, measured).await
}

/// The series measured in rounds, each round a share of every series in a rotating order
/// (bench/rounds.rs): the raw Lease CAS through kube-rs, a plain HTTPS client and client-go;
/// Leasehold's uncontended acquire (with its writes per cycle and the CPU time per 1,000
/// grants of the controller and the apiserver); the voluntary handoffs of Leasehold (via
/// sidecars, with the steady and the short settle; at the Lease level, by a release that
/// clears the holder and by one that hands the lock on) and of the etcd lock,
/// each with the same steady settle ([`Settle::STEADY`]); the Lease-level grant latency.
async fn interleaved(
    env: &Env,
    admin: &kube::Client,
    controller: Option<u32>,
    peers: &peers::Peers,
    world: &World,
    plan: &Plan,
) -> anyhow::Result<Run> {
    let cp = env.cp;
    let mut processes = Vec::new();
    processes.extend(controller.map(|pid| ("controller", pid)));
    processes.extend(cpu::find(&cp.child_pids(), "kube-apiserver").map(|pid| ("kube-apiserver", pid)));
    let mut tally = cpu::Tally::new(&processes);
    let (mut acquire_writes, mut acquire_others) = (Writes::default(), Writes::default());
    let mut acquire_cycles = 0;
    let ((sa, a), (sb, b)) = &world.handoff;
    let mut rounds = Vec::new();
    for r in 0..plan.rounds {
        let n = rounds::share(plan.samples, plan.rounds, r);
        // The first round warms up fully; later ones only re-establish their watches.
        let (warmup, handoff_warmup) =
            if r == 0 { (plan.warmup, plan.handoff_warmup) } else { (plan.warmup.min(3), plan.handoff_warmup.min(2)) };
        let mut round = Run::default();
        for step in rounds::order(10, r) {
            let part = match step {
                0 => {
                    let cas = floors::lease_cas(env.leases(), warmup, n).await?;
                    let mut series = vec![cas];
                    series.extend(floors::watch_hop(env.leases(), warmup, n).await?);
                    series.push(floors::claim_and_cas(env.leases(), env.claims(), warmup, n).await?);
                    Run { series, ..Run::default() }
                }
                1 => {
                    let s = plain_cas::lease_cas(cp.server_url(), cp.ca_pem(), cp.admin_token(), env.name(), warmup, n);
                    Run { series: vec![s.await?], ..Run::default() }
                }
                2 => {
                    // The same warm-up as the other floors in this round.
                    let warm = warmup.to_string();
                    let cas = peers.run("lease-cas", n, &["--warmup", &warm], &format!("lease-cas-{r}")).await?;
                    let title = "One Lease CAS (update with resourceVersion) through the apiserver, client-go";
                    Run { series: vec![cas.series("floor.lease_cas.clientgo", title, Panel::Fast)], ..Run::default() }
                }
                3 => {
                    let samples = rounds::share(plan.etcd_handoff, plan.rounds, r);
                    let handoff = peers.run("etcd-handoff", samples, &[], &format!("etcd-handoff-{r}")).await?;
                    let title = "etcd concurrency.Mutex handoff (Unlock returned → waiter's Lock returned)";
                    Run { series: vec![handoff.series("peer.etcd.handoff", title, Panel::Handoff)], ..Run::default() }
                }
                4 => {
                    let mark = tally.mark()?;
                    let (part, writes, others) =
                        sidecar::uncontended(env, admin, &world.acquirer, "acquire", warmup, n).await?;
                    tally.add(&mark, warmup + n)?;
                    acquire_writes.add(&writes);
                    acquire_others.add(&others);
                    acquire_cycles += n;
                    part
                }
                5 => sidecar::handoff(env, (sa, a), (sb, b), "handoff", Settle::STEADY, handoff_warmup, n).await?,
                6 => sidecar::handoff(env, (sa, a), (sb, b), "handoff", Settle::SHORT, handoff_warmup, n).await?,
                7 => lease_level::grant_latency(env, "lease-grant", handoff_warmup, n).await?,
                8 => {
                    let release = lease_level::Release::Clear;
                    lease_level::handoff(env, "lease-handoff", Settle::STEADY, release, (handoff_warmup, n)).await?
                }
                _ => {
                    let release = lease_level::Release::HandOn;
                    lease_level::handoff(env, "lease-handon", Settle::STEADY, release, (handoff_warmup, n)).await?
                }
            };
            round.merge(part);
        }
        rounds.push(round);
    }
    let mut run = rounds::join(rounds);
    run.writes.insert(0, sidecar::cycle_writes(&acquire_writes, &acquire_others, acquire_cycles));
    run.cpu.extend(tally.rows("uncontended acquire/release cycles through a sidecar, one grant each")?);
    run.facts.insert(
        "handoff settle (waiter seen queued → holder lets go)".into(),
        json!(format!(
            "{} for every handoff that takes one (Leasehold sidecars and Lease level, etcd lock); Leasehold sidecars also at {}; the poll-based peers (client-go, kube-lease-manager) release at a random phase of the waiter's poll instead",
            Settle::STEADY.describe(),
            Settle::SHORT.describe()
        )),
    );
    Ok(run)
}

/// The quiet baseline: apiserver writes over `plan.baseline_window` with no lock anywhere,
/// into `background`; meanwhile the etcd floor.
async fn baseline(
    admin: &kube::Client,
    peers: &peers::Peers,
    plan: &Plan,
    background: &mut Writes,
) -> anyhow::Result<Run> {
    let before = scrape(admin).await?;
    let t0 = Instant::now();
    let etcd = peers.run("etcd-put", plan.etcd_put, &[], "etcd-put");
    let (etcd, ()) = tokio::join!(etcd, tokio::time::sleep(plan.baseline_window));
    let writes = Writes::between(&before, &scrape(admin).await?, t0.elapsed().as_secs_f64());
    let mut r = Run::default();
    r.facts.insert(
        "background apiserver writes/min (no locks; subtracted from every write count)".into(),
        json!(writes.breakdown(writes.seconds / 60.0)),
    );
    r.facts.insert("background window (s)".into(), json!(round1(writes.seconds)));
    *background = writes;
    r.series.push(etcd?.series("floor.etcd_put", "One etcd Put (512 B value)", Panel::Fast));
    Ok(r)
}

/// The locks, pods and sidecars the Leasehold phases share.
struct World {
    /// The sidecar of pod `acq`: uncontended acquire, then the held locks.
    acquirer: support::Sidecar,
    /// Two pods' sidecars for the handoff.
    handoff: ((support::Sidecar, support::TestPod), (support::Sidecar, support::TestPod)),
}

impl World {
    /// Creates every lock of the run and the long-lived sidecars; reads the idle sidecar's
    /// memory.
    async fn set_up(env: &Env, plan: &Plan) -> anyhow::Result<(World, Run)> {
        let mut names: Vec<String> =
            ["acquire", "handoff", "lease-grant", "lease-handoff", "lease-handon", "poddel", "appcrash"]
                .map(str::to_owned)
                .into();
        names.extend((0..plan.held_locks).map(|i| format!("held-{i}")));
        names.extend((0..plan.crash_pairs).map(|i| format!("crash-{i}")));
        for name in &names {
            sidecar::create_lock(env, name).await?;
        }
        let pod = env.pod("acq").await;
        env.wait_claim_rbac(&pod).await;
        let acquirer = env.sidecar(&pod, &[]).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut r = Run::default();
        let idle = json!({"after": "healthy + 2 s, no lock yet"});
        r.memory.push(sidecar::sidecar_memory(&acquirer, "sidecar idle", idle)?);
        let (a, b) = (env.pod("ha").await, env.pod("hb").await);
        let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);
        Ok((World { acquirer, handoff: ((sa, a), (sb, b)) }, r))
    }
}
