//! Leasehold through its sidecar processes, as an app sees it: uncontended acquire,
//! voluntary handoff, crash failover (SIGKILL) and Pod-deletion failover, apiserver writes
//! per cycle and per held lock, and the sidecar's resident memory.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use leasehold::crd::{DistributedLock, DistributedLockSpec, LockClaim};
use rand::Rng;
use serde_json::{Value, json};

use crate::acquire_split::{self, AcquireSplit};
use crate::lease_writes::OtherLeaseWrites;
use crate::observe::{Latest, Writes, memory, scrape};
use crate::plan::Settle;
use crate::record::{Memory, Panel, Run, Series, WriteCount};
use crate::stats::ms_between;
use crate::support::watch::GrantLog;
use crate::support::{Env, Sidecar, TestPod, http_request};

/// How long any single wait may take before the phase fails.
const WAIT: Duration = Duration::from_secs(60);

/// Creates lock `name` (default spec: lease 15 s, renew deadline 10 s, retry 2 s, FIFO)
/// and waits until the controller has reconciled it (status written).
pub async fn create_lock(env: &Env, name: &str) -> anyhow::Result<()> {
    create_lock_with(env, name, DistributedLockSpec::default()).await
}

/// [`create_lock`] with `spec`.
pub async fn create_lock_with(env: &Env, name: &str, spec: DistributedLockSpec) -> anyhow::Result<()> {
    env.locks().create(&Default::default(), &DistributedLock::new(name, spec)).await?;
    let dl = Latest::start(env.locks(), name);
    dl.wait(&format!("lock {name} reconciled"), WAIT, |d| d.status.is_some()).await?;
    Ok(())
}

fn stats(dl: &DistributedLock) -> leasehold::crd::LockStats {
    dl.status.as_ref().map(|s| s.stats.clone()).unwrap_or_default()
}

fn waiting(dl: &DistributedLock, id: &str) -> bool {
    dl.status.as_ref().is_some_and(|s| s.waiters.iter().any(|w| w.identity == id))
}

/// A sidecar's resident memory now, as a record.
pub fn sidecar_memory(sidecar: &Sidecar, what: &str, params: Value) -> anyhow::Result<Memory> {
    let pid = sidecar.process.process.as_ref().context("the sidecar is running")?.pid();
    memory(pid, what, params)
}

/// Starts `POST /v1/locks/{lock}/acquire` in the background; resolves to the instant the
/// response arrived, the status and the JSON body.
fn acquire_in_background(
    api: SocketAddr,
    lock: &str,
    wait_seconds: f64,
) -> tokio::task::JoinHandle<(Instant, Option<(u16, String)>)> {
    let path = format!("/v1/locks/{lock}/acquire");
    let body = json!({ "waitSeconds": wait_seconds }).to_string();
    tokio::spawn(async move {
        let response = http_request(api, "POST", &path, Some(&body)).await;
        (Instant::now(), response)
    })
}

fn granted(response: &Option<(u16, String)>) -> anyhow::Result<i64> {
    let (status, body) = response.as_ref().context("the sidecar did not answer the acquire")?;
    let json: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    ensure!(*status == 200, "acquire answered {status}: {body}");
    json["fencingToken"].as_i64().with_context(|| format!("acquire answered without a token: {body}"))
}

/// Uncontended acquire through the sidecar's HTTP API, and the apiserver writes of the
/// measured acquire/release cycles with, apart, the writes of every other Lease in the same
/// window (raw: [`cycle_writes`] makes the row once every round is in). Before each cycle
/// the controller has recorded the previous release in status (so the lock is free in its
/// view: the steady state of an idle lock).
pub async fn uncontended(
    env: &Env,
    admin: &kube::Client,
    sidecar: &Sidecar,
    lock: &str,
    warmup: usize,
    samples: usize,
) -> anyhow::Result<(Run, Writes, Writes)> {
    let others = OtherLeaseWrites::start(admin.clone(), env.name(), lock).await?;
    let dl = Latest::start(env.locks(), lock);
    let base = stats(&dl.wait("status", WAIT, |d| d.status.is_some()).await?.1).releases;
    let mut grants = GrantLog::start(env.leases(), lock);
    let claims: Api<LockClaim> = Api::namespaced(env.ns.client.clone(), env.name());
    let (mut acquire, mut release, mut split) = (Vec::new(), Vec::new(), AcquireSplit::default());
    let mut before = None;
    let mut last_token = 0;
    for i in 0..warmup + samples {
        if i == warmup {
            before = Some((scrape(admin).await?, Instant::now()));
        }
        let seen_before = grants.grants().len();
        let (started, sent) = (Instant::now(), Timestamp::now());
        let (status, body) = sidecar.acquire(lock, 30.0).await;
        let acquired = Instant::now();
        ensure!(status == 200, "acquire answered {status}: {body}");
        let token = body["fencingToken"].as_i64().context("acquire answered without a token")?;
        ensure!(token > last_token, "token {token} after {last_token}");
        last_token = token;
        // Read after the answer, outside the sample: where the acquire's time went.
        let grant = grants.wait_for(seen_before + 1, WAIT).await.pop().context("a grant")?;
        ensure!(grant.token == token, "the watch saw token {} for the answer's {token}", grant.token);
        if i >= warmup {
            let holder = body["holder"].as_str().context("acquire answered without a holder")?;
            let requested = acquire_split::request_time(&claims, lock, holder).await?;
            let total = ms_between(started, acquired);
            split.push(total, sent, requested, grant.acquire_time, ms_between(grant.seen, acquired));
        }
        let releasing = Instant::now();
        let (status, body) = sidecar.release(lock).await;
        let released = Instant::now();
        ensure!(status == 200 && body["wasHeld"] == json!(true), "release answered {status}: {body}");
        let want = base + i64::try_from(i).unwrap_or(0) + 1;
        dl.wait("the release recorded in status", WAIT, |d| stats(d).releases >= want).await?;
        if i >= warmup {
            acquire.push(ms_between(started, acquired));
            release.push(ms_between(releasing, released));
        }
    }
    // Let the asynchronous Events of the last cycle land inside the window.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (before, t0) = before.context("at least one measured cycle")?;
    let after = scrape(admin).await?;
    let (t1, seconds) = (Instant::now(), t0.elapsed().as_secs_f64());
    let writes = Writes::between(&before, &after, seconds);
    let other = others.between(t0, t1, seconds)?;
    let mut run = Run::default();
    let params = json!({
        "warmup": warmup,
        "samples": samples,
        "client": "HTTP/1.1 over loopback, a new connection per request (support::http_request)",
        "between_cycles": "wait until the controller's status counts the release (lock free in its view)",
        "lock": "default spec: leaseDuration 15 s, renewDeadline 10 s, retryPeriod 2 s, FIFO",
    });
    run.series.push(Series::new(
        "leasehold.acquire",
        "Leasehold uncontended acquire via sidecar HTTP (request → 200 with token)",
        "Leasehold",
        Panel::Fast,
        acquire,
        params.clone(),
    ));
    run.series.extend(split.series(&params));
    run.series.push(Series::new(
        "leasehold.release",
        "Leasehold release via sidecar HTTP (request → 200)",
        "Leasehold",
        Panel::Fast,
        release,
        params,
    ));
    Ok((run, writes, other))
}

/// The row of apiserver writes per uncontended cycle, from the raw writes of `cycles`
/// measured cycles, less the writes of every other Lease in the same windows (`others`).
pub fn cycle_writes(writes: &Writes, others: &Writes, cycles: usize) -> WriteCount {
    let net = writes.less(others);
    let n = cycles.max(1) as f64;
    WriteCount {
        what: "apiserver writes per uncontended acquire/release cycle".into(),
        value: net.total() / n,
        unit: "writes/cycle".into(),
        breakdown: net.breakdown(n),
        params: json!({
            "cycles": cycles,
            "window_s": writes.seconds,
            "raw_writes": writes.total(),
            "background_subtracted": writes.total() - net.total(),
            "background": "every write of another Lease in the window, as a watch of all Leases saw it arrive (election and identity renewals, other locks' holders), subtracted one by one",
            "conflicts_409_per_cycle": writes.conflicts_total() / n,
            "failed": writes.failed,
        }),
    }
}

/// Voluntary handoff between two sidecars: the waiter's acquire is pending and the
/// controller lists it as waiting (plus the `settle`); then the holder releases. Sample:
/// holder's release returned → waiter's acquire returned. With the steady settle the series
/// are `leasehold.handoff*`; with any other, `leasehold.handoff_short_settle*`.
pub async fn handoff(
    env: &Env,
    a: (&Sidecar, &TestPod),
    b: (&Sidecar, &TestPod),
    lock: &str,
    settle: Settle,
    warmup: usize,
    samples: usize,
) -> anyhow::Result<Run> {
    let (key, label) = if settle == Settle::STEADY {
        ("leasehold.handoff", String::new())
    } else {
        ("leasehold.handoff_short_settle", format!(", settle {}", settle.describe()))
    };
    let dl = Latest::start(env.locks(), lock);
    let mut grants = GrantLog::start(env.leases(), lock);
    let (status, body) = a.0.acquire(lock, 30.0).await;
    ensure!(status == 200, "first acquire answered {status}: {body}");
    let (mut holder, mut waiter) = (a, b);
    let (mut from_return, mut from_call, mut to_grant) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..warmup + samples {
        let waiter_id = waiter.1.identity().id;
        let pending = acquire_in_background(waiter.0.api, lock, 60.0);
        dl.wait("the waiter queued", WAIT, |d| waiting(d, &waiter_id)).await?;
        tokio::time::sleep(settle.pause()).await;
        let seen_before = grants.grants().len();
        let call = Instant::now();
        let (status, body) = holder.0.release(lock).await;
        let returned = Instant::now();
        ensure!(status == 200 && body["wasHeld"] == json!(true), "release answered {status}: {body}");
        let (acquired, response) = pending.await?;
        granted(&response)?;
        let grant = grants.wait_for(seen_before + 1, WAIT).await.pop().context("a grant")?;
        ensure!(grant.holder == waiter_id, "granted to {} instead of the waiter", grant.holder);
        if i >= warmup {
            from_return.push(ms_between(returned, acquired));
            from_call.push(ms_between(call, acquired));
            to_grant.push(ms_between(returned, grant.seen));
        }
        std::mem::swap(&mut holder, &mut waiter);
    }
    let (status, _) = holder.0.release(lock).await;
    ensure!(status == 200, "final release answered {status}");
    let params = json!({
        "warmup": warmup,
        "samples": samples,
        "choreography": format!("waiter's acquire pending; release once status lists the waiter, plus {}", settle.describe()),
        "settle": settle,
        "sample_start": "holder's POST .../release returned 200 (claim deleted, holder cleared by CAS)",
        "sample_stop": "waiter's POST .../acquire returned 200 with a token (grant seen and confirmed by CAS)",
    });
    let mut run = Run::default();
    run.series.push(Series::new(
        key,
        &format!("Leasehold voluntary handoff via sidecars (release returned → waiter's acquire returned){label}"),
        "Leasehold",
        Panel::Handoff,
        from_return,
        params.clone(),
    ));
    run.series.push(Series::new(
        &format!("{key}_from_call"),
        &format!("Leasehold voluntary handoff via sidecars, from the release call{label}"),
        "Leasehold",
        Panel::Handoff,
        from_call,
        params.clone(),
    ));
    run.series.push(Series::new(
        &format!("{key}_grant_seen"),
        &format!("Leasehold release returned → next grant visible on a Lease watch{label}"),
        "Leasehold",
        Panel::Handoff,
        to_grant,
        params,
    ));
    Ok(run)
}

/// Holds `locks` through one sidecar for `window`: apiserver writes per held lock per
/// minute, and the sidecar's memory holding one lock and all of them.
pub async fn held(
    admin: &kube::Client,
    namespace: &str,
    sidecar: &Sidecar,
    locks: &[String],
    background: &Writes,
    window: Duration,
) -> anyhow::Result<Run> {
    let mut run = Run::default();
    let (status, body) = sidecar.acquire(&locks[0], 30.0).await;
    ensure!(status == 200, "acquire answered {status}: {body}");
    // A few renewals first (retry period 2 s), so the reading is of a steady hold.
    tokio::time::sleep(Duration::from_secs(5)).await;
    run.memory.push(sidecar_memory(sidecar, "sidecar holding 1 lock", json!({"after": "5 s of holding"}))?);
    for lock in &locks[1..] {
        let (status, body) = sidecar.acquire(lock, 30.0).await;
        ensure!(status == 200, "acquire of {lock} answered {status}: {body}");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (before, t0) = (scrape(admin).await?, Instant::now());
    // Besides the apiserver's counters (whose background is subtracted, and which count
    // whole renewals in or out of the window), the held Leases' own changes: the mean
    // time between two writes of one held Lease.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), namespace);
    let changes = crate::observe::changes(leases, locks, window).await;
    let writes = Writes::between(&before, &scrape(admin).await?, t0.elapsed().as_secs_f64());
    let interval = crate::observe::mean_interval(&changes);
    let net = writes.less_background(background);
    let lock_minutes = locks.len() as f64 * writes.seconds / 60.0;
    run.memory.push(sidecar_memory(
        sidecar,
        &format!("sidecar holding {} locks", locks.len()),
        json!({"after": format!("{:.0} s of holding", writes.seconds + 3.0)}),
    )?);
    run.writes.push(WriteCount {
        what: format!("apiserver writes per held lock per minute ({} locks held by one sidecar)", locks.len()),
        value: net.total() / lock_minutes,
        unit: "writes/lock/min".into(),
        breakdown: net.breakdown(lock_minutes),
        params: json!({
            "locks": locks.len(),
            "window_s": writes.seconds,
            "raw_writes": writes.total(),
            "background_subtracted": writes.total() - net.total(),
            "retry_period_s": 2,
            "lease_changes": changes.values().map(Vec::len).sum::<usize>(),
            "mean_s_between_writes_of_one_lease": interval.map(|d| crate::observe::round2(d.as_secs_f64())),
        }),
    });
    for lock in locks {
        let (status, _) = sidecar.release(lock).await;
        ensure!(status == 200, "release of {lock} answered {status}");
    }
    Ok(run)
}

/// Pod-deletion failover: the holder's Pod object is deleted while a waiter (another pod's
/// sidecar) queues. Sample: delete call → waiter's acquire returned.
pub async fn pod_deletion(env: &Env, lock: &str, samples: usize) -> anyhow::Result<Run> {
    let dl = Latest::start(env.locks(), lock);
    let mut grants = GrantLog::start(env.leases(), lock);
    let pods: Api<Pod> = Api::namespaced(env.ns.client.clone(), env.name());
    let first = env.pod(&format!("{lock}-0")).await;
    let first_sidecar = env.sidecar(&first, &[]).await;
    let (status, body) = first_sidecar.acquire(lock, 30.0).await;
    ensure!(status == 200, "first acquire answered {status}: {body}");
    let mut holder = (first, first_sidecar);
    let (mut to_acquired, mut to_grant) = (Vec::new(), Vec::new());
    for i in 1..=samples {
        let pod = env.pod(&format!("{lock}-{i}")).await;
        let sidecar = env.sidecar(&pod, &[]).await;
        let id = pod.identity().id;
        let pending = acquire_in_background(sidecar.api, lock, 60.0);
        dl.wait("the waiter queued", WAIT, |d| waiting(d, &id)).await?;
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(50..150))).await;
        let seen_before = grants.grants().len();
        let deleting = Instant::now();
        pods.delete(&holder.0.name, &Default::default()).await.context("failed to delete the holder's Pod")?;
        let (acquired, response) = pending.await?;
        granted(&response)?;
        let grant = grants.wait_for(seen_before + 1, WAIT).await.pop().context("a grant")?;
        ensure!(grant.holder == id, "granted to {} instead of the waiter", grant.holder);
        to_acquired.push(ms_between(deleting, acquired));
        to_grant.push(ms_between(deleting, grant.seen));
        let (_, mut old) = std::mem::replace(&mut holder, (pod, sidecar));
        old.process.kill();
    }
    let params = json!({
        "samples": samples,
        "choreography": "a new Pod + sidecar queues (status lists it, plus U[50,150) ms), then the holder's Pod is deleted",
        "pods": "Pod objects without a kubelet or node: deleted at once (no grace period)",
        "sample_start": "DELETE of the holder's Pod called",
    });
    let mut run = Run::default();
    run.series.push(Series::new(
        "leasehold.pod_delete_failover",
        "Leasehold Pod-deletion failover (Pod DELETE called → waiter's acquire returned)",
        "Leasehold",
        Panel::Failover,
        to_acquired,
        params.clone(),
    ));
    run.series.push(Series::new(
        "leasehold.pod_delete_failover_grant",
        "Leasehold Pod-deletion failover (Pod DELETE called → grant visible on a watch)",
        "Leasehold",
        Panel::Failover,
        to_grant,
        params,
    ));
    Ok(run)
}

/// Crash failover samples of one lock: holder and waiter sidecars swap roles each round,
/// the crashed one restarted as a new process of the same pod.
#[derive(Default)]
pub struct CrashSamples {
    /// SIGKILL → waiter's acquire returned, ms.
    pub to_acquired: Vec<f64>,
    /// SIGKILL → grant visible on a watch, ms.
    pub to_grant: Vec<f64>,
    /// The holder's last renewTime → the grant's acquireTime (both wall clock, this machine), ms.
    pub from_last_renewal: Vec<f64>,
}

/// `rounds` crash failovers on lock `lock` with pods `a` and `b`: the waiter queues, then
/// after U[1, 3) s (a random phase of the holder's 2 s renewal cycle) the holder sidecar is
/// SIGKILLed.
pub async fn crash_failover(
    env: &Env,
    lock: &str,
    a: TestPod,
    b: TestPod,
    rounds: usize,
) -> anyhow::Result<CrashSamples> {
    let dl = Latest::start(env.locks(), lock);
    let lease = Latest::start(env.leases(), lock);
    let mut grants = GrantLog::start(env.leases(), lock);
    let mut holder = (env.sidecar(&a, &[]).await, a);
    let mut waiter = (env.sidecar(&b, &[]).await, b);
    let (status, body) = holder.0.acquire(lock, 30.0).await;
    ensure!(status == 200, "first acquire answered {status}: {body}");
    let mut out = CrashSamples::default();
    for _ in 0..rounds {
        let id = waiter.1.identity().id;
        let pending = acquire_in_background(waiter.0.api, lock, 60.0);
        dl.wait("the waiter queued", WAIT, |d| waiting(d, &id)).await?;
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(1000..3000))).await;
        let last_renewal = lease_renew_time(lease.get().as_ref());
        let seen_before = grants.grants().len();
        let killed = Instant::now();
        holder.0.process.kill();
        let (acquired, response) = pending.await?;
        granted(&response)?;
        let grant = grants.wait_for(seen_before + 1, WAIT).await.pop().context("a grant")?;
        ensure!(grant.holder == id, "granted to {} instead of the waiter", grant.holder);
        out.to_acquired.push(ms_between(killed, acquired));
        out.to_grant.push(ms_between(killed, grant.seen));
        if let Some(renewed) = last_renewal {
            out.from_last_renewal.push(grant.acquire_time.duration_since(renewed).as_secs_f64() * 1000.0);
        }
        // The crashed pod comes back as a new sidecar process and waits next round.
        holder.0 = env.sidecar(&holder.1, &[]).await;
        std::mem::swap(&mut holder, &mut waiter);
    }
    Ok(out)
}

impl CrashSamples {
    /// Adds `other`'s samples.
    pub fn extend(&mut self, other: CrashSamples) {
        self.to_acquired.extend(other.to_acquired);
        self.to_grant.extend(other.to_grant);
        self.from_last_renewal.extend(other.from_last_renewal);
    }
}

fn lease_renew_time(lease: Option<&Lease>) -> Option<jiff::Timestamp> {
    lease?.spec.as_ref()?.renew_time.as_ref().map(|t| t.0)
}

/// App crash failover with session-bound holds: an app process (`curl`, holding the lock
/// through its session) is SIGKILLed while a waiter (another pod's sidecar) queues. The
/// kernel closes the dead app's connection; its sidecar lets the hold go at once. Sample:
/// SIGKILL → waiter's acquire returned.
pub async fn app_crash(env: &Env, lock: &str, samples: usize) -> anyhow::Result<Run> {
    use tokio::io::AsyncBufReadExt;
    let dl = Latest::start(env.locks(), lock);
    let mut grants = GrantLog::start(env.leases(), lock);
    let (a, b) = (env.pod(&format!("{lock}-a")).await, env.pod(&format!("{lock}-b")).await);
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);
    let waiter_id = b.identity().id;
    let (mut to_acquired, mut to_grant) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        // The app: curl holding a session on a's sidecar; its first line is the grant.
        let mut app = tokio::process::Command::new("curl")
            .args(["-sS", "-N", "-X", "POST", "-H", "Content-Type: application/json"])
            .args(["-d", r#"{"session": true, "waitSeconds": 30}"#])
            .arg(format!("http://{}/v1/locks/{lock}/acquire", sa.api))
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("failed to start curl")?;
        let mut lines = tokio::io::BufReader::new(app.stdout.take().context("curl's stdout")?).lines();
        let grant = tokio::time::timeout(WAIT, lines.next_line()).await.context("the app's grant")??;
        let grant: Value = serde_json::from_str(grant.as_deref().unwrap_or_default()).context("the grant line")?;
        let app_token = grant["fencingToken"].as_i64().with_context(|| format!("no grant: {grant}"))?;
        let pending = acquire_in_background(sb.api, lock, 60.0);
        dl.wait("the waiter queued", WAIT, |d| waiting(d, &waiter_id)).await?;
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(50..100))).await;
        let seen_before = grants.grants().len();
        let killed = Instant::now();
        app.start_kill().context("failed to SIGKILL the app")?;
        let (acquired, response) = pending.await?;
        let token = granted(&response)?;
        ensure!(token > app_token, "token {token} after the app's {app_token}");
        let grant = grants.wait_for(seen_before + 1, WAIT).await.pop().context("a grant")?;
        ensure!(grant.holder == waiter_id, "granted to {} instead of the waiter", grant.holder);
        to_acquired.push(ms_between(killed, acquired));
        to_grant.push(ms_between(killed, grant.seen));
        app.wait().await.context("reap the app")?;
        let (status, body) = sb.release(lock).await;
        ensure!(status == 200 && body["wasHeld"] == json!(true), "the waiter's release answered {status}: {body}");
    }
    let params = json!({
        "samples": samples,
        "app": "curl -N holding a session-bound acquire ({\"session\": true}) on its pod's sidecar",
        "choreography": "the waiter (another pod's sidecar) queues (status lists it, plus U[50,100) ms), then the app process is SIGKILLed",
        "sample_start": "SIGKILL sent to the app process",
        "lock": "default spec: leaseDuration 15 s, renewDeadline 10 s, retryPeriod 2 s",
    });
    let mut run = Run::default();
    run.series.push(Series::new(
        "leasehold.app_crash_failover",
        "app crash failover (app process SIGKILL → next holder's acquire returned)",
        "Leasehold",
        Panel::Failover,
        to_acquired,
        params.clone(),
    ));
    run.series.push(Series::new(
        "leasehold.app_crash_failover_grant",
        "app crash failover (app process SIGKILL → grant visible on a watch)",
        "Leasehold",
        Panel::Failover,
        to_grant,
        params,
    ));
    Ok(run)
}
