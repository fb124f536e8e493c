//! `rust-peer`: the Rust-library peer of `make bench`.
//!
//! Measures lock handoff and holder failover with
//! [`kube-lease-manager`](https://crates.io/crates/kube-lease-manager), a
//! Lease-based leader-election/lock crate, at its default timings, the same way
//! the Go `peers clientgo-handoff` / `clientgo-failover` programs measure
//! client-go. Prints one JSON object on stdout:
//!
//! ```json
//! {"peer": "kube-lease-manager@0.13.1", "scenario": "handoff", "samples_ms": [...], "params": {...}}
//! ```
//!
//! and progress on stderr. See `../README.md` for the exact sample boundaries.
//!
//! How the crate behaves (kube-lease-manager 0.13, `src/manager.rs`), which
//! explains the numbers:
//! - the holder renews `grace` (5 s) before the expiry it wrote, i.e. every
//!   `duration - grace` = 25 s;
//! - a waiter does not poll: it sleeps until the expiry it last read
//!   (`renewTime + leaseDurationSeconds`), then re-reads the Lease. A release
//!   is therefore noticed only at that wake-up, and a waiter's wake-ups fall
//!   every 25 s, 5 s after each renewal;
//! - a waiter that wakes to find the lock expired force-clears it, sleeps a
//!   random 100–1000 ms to avoid collisions, then acquires.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client, Config,
    api::DeleteParams,
    config::{KubeConfigOptions, Kubeconfig},
};
use kube_lease_manager::{
    DEFAULT_LEASE_DURATION_SECONDS, DEFAULT_LEASE_GRACE_SECONDS, LeaseCreateMode, LeaseManager, LeaseParams,
};
use rand::{RngExt, rng};
use serde_json::{Value, json};
use tokio::{sync::mpsc, task::JoinHandle, time::sleep_until};

const CRATE_NAME: &str = "kube-lease-manager";
const CRATE_VERSION: &str = env!("PEER_CRATE_VERSION");
const KUBE_VERSION: &str = env!("PEER_KUBE_VERSION");

/// The crate's defaults, as `LeaseParams::default()` uses them.
const DURATION: Duration = Duration::from_secs(DEFAULT_LEASE_DURATION_SECONDS);
const GRACE: Duration = Duration::from_secs(DEFAULT_LEASE_GRACE_SECONDS);
/// The holder's renewal interval, and the period of a waiter's wake-ups.
const RENEW_EVERY: Duration = DURATION.saturating_sub(GRACE);

struct Args {
    scenario: String,
    kubeconfig: Option<String>,
    namespace: String,
    samples: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: rust-peer <handoff|failover> [--kubeconfig PATH] [--namespace NS] [--samples N]\n\
         \n\
         handoff   holder releases (LeaseManager::release) to a waiter; default 5 samples, ~30 s each\n\
         failover  holder stops renewing without releasing; default 3 samples, ~31 s each"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut it = std::env::args().skip(1);
    let scenario = match it.next().as_deref() {
        Some(s @ ("handoff" | "failover")) => s.to_string(),
        _ => usage(),
    };
    let mut args = Args {
        samples: if scenario == "handoff" { 5 } else { 3 },
        scenario,
        kubeconfig: None,
        namespace: "default".into(),
    };
    while let Some(flag) = it.next() {
        // Accept both `--flag value` and `--flag=value`, like Go's flag package.
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag.clone(), None),
        };
        let value = inline.or_else(|| it.next()).unwrap_or_else(|| usage());
        match name.trim_start_matches('-') {
            "kubeconfig" => args.kubeconfig = Some(value),
            "namespace" => args.namespace = value,
            "samples" => args.samples = value.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    if args.samples == 0 {
        usage();
    }
    args
}

async fn load_config(path: Option<&str>) -> Result<Config> {
    match path {
        Some(p) => {
            let kc = Kubeconfig::read_from(p).with_context(|| format!("reading kubeconfig {p}"))?;
            Ok(Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?)
        }
        None => Ok(Config::infer().await?),
    }
}

fn log(msg: impl AsRef<str>) {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let day = now.as_secs() % 86_400;
    eprintln!(
        "{:02}:{:02}:{:02}.{:03} rust-peer: {}",
        day / 3600,
        day / 60 % 60,
        day % 60,
        now.subsec_millis(),
        msg.as_ref()
    );
}

fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// One lock contender: its own `kube::Client` (own connection pool, as a
/// separate process would have) and its own `LeaseManager`, driven by the
/// crate's "partially manual" API: a task keeps `changed()` running, which
/// acquires and renews, and reports every state change with the instant
/// `changed()` returned.
struct Candidate {
    id: String,
    manager: Arc<LeaseManager>,
    events: mpsc::UnboundedReceiver<(bool, Instant)>,
    task: JoinHandle<()>,
}

impl Candidate {
    async fn start(config: &Config, namespace: &str, lease: &str, id: String) -> Result<Self> {
        let client = Client::try_from(config.clone())?;
        let params = LeaseParams::new(id.clone(), DEFAULT_LEASE_DURATION_SECONDS, DEFAULT_LEASE_GRACE_SECONDS);
        let manager = Arc::new(LeaseManager::new(client, lease, namespace, params, LeaseCreateMode::AutoCreate).await?);
        let (tx, events) = mpsc::unbounded_channel();
        let m = manager.clone();
        let who = id.clone();
        let task = tokio::spawn(async move {
            loop {
                match m.changed().await {
                    Ok(held) => {
                        if tx.send((held, Instant::now())).is_err() {
                            return;
                        }
                    }
                    // The crate's own watch() loop backs off and retries on
                    // errors; do the same, loudly.
                    Err(e) => {
                        log(format!("{who}: changed() failed: {e}; retrying in 1 s"));
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        Ok(Self { id, manager, events, task })
    }

    /// Waits for the next state change and requires it to be "now holding".
    async fn acquired(&mut self, timeout: Duration) -> Result<Instant> {
        let (held, at) = tokio::time::timeout(timeout, self.events.recv())
            .await
            .map_err(|_| anyhow!("{} did not acquire within {timeout:?}", self.id))?
            .ok_or_else(|| anyhow!("{}: manager task ended", self.id))?;
        ensure!(held, "{}: expected to acquire, lost the lock instead", self.id);
        Ok(at)
    }

    /// Stops the `changed()` loop: no further renewals or acquisitions. The
    /// future is dropped wherever it is, as a killed process would stop.
    async fn stop_renewing(&mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }

    /// Stops renewing and releases the lock (used between samples).
    async fn stop_and_release(mut self) -> Result<()> {
        self.stop_renewing().await;
        self.manager.release().await?;
        Ok(())
    }
}

/// Uniform random duration in `[lo, hi)`.
fn uniform(lo: Duration, hi: Duration) -> Duration {
    lo + Duration::from_secs_f64(rng().random_range(0.0..(hi - lo).as_secs_f64()))
}

fn common_params(args: &Args, lease: &str) -> serde_json::Map<String, Value> {
    let p = json!({
        "namespace": args.namespace,
        "lease": lease,
        "samples": args.samples,
        "lease_duration_ms": millis(DURATION),
        "grace_ms": millis(GRACE),
        "renew_interval_ms": millis(RENEW_EVERY),
        "expired_release_pause_ms": [100, 1000],
        "crate_version": CRATE_VERSION,
        "kube_version": KUBE_VERSION,
        "api": "LeaseManager::changed() loop per candidate; LeaseManager::release()",
        "transport": "one kube::Client per candidate (rustls + ring), JSON",
        "candidates": "fresh pair per sample (identities <lease>-a-<i>, <lease>-b-<i>) on one Lease per run",
        "clock": "tokio/std monotonic Instant, one process",
        "lease_deleted_at_end": true,
    });
    match p {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

/// Handoff. Per sample: A acquires the free Lease (instant `t_a`); B starts
/// and goes to sleep until A's expiry. A releases at `t_a + U[grace,
/// duration)`: one full period of B's wake-up schedule (B wakes at `t_a +
/// duration + k * (duration - grace)`), so the samples estimate the
/// steady-state handoff, uniform on (0, duration - grace] = (0, 25 s].
///
/// Sample start: A's `release()` returned (its SSA-free strategic-merge patch
/// clearing the holder committed, plus one read-back GET the crate does).
/// Sample stop: B's `changed()` returned `true`.
async fn handoff(args: &Args, config: &Config, lease: &str) -> Result<(Vec<f64>, Value)> {
    let mut samples = Vec::with_capacity(args.samples);
    let mut holds = Vec::with_capacity(args.samples);
    for i in 0..args.samples {
        let mut a = Candidate::start(config, &args.namespace, lease, format!("{lease}-a-{i}")).await?;
        let t_a = a.acquired(3 * DURATION).await.context("A acquiring")?;
        let mut b = Candidate::start(config, &args.namespace, lease, format!("{lease}-b-{i}")).await?;
        let hold = uniform(GRACE, DURATION);
        sleep_until((t_a + hold).into()).await;
        ensure!(b.events.is_empty(), "sample {i}: B changed state while A held the lock");
        a.stop_renewing().await;
        a.manager.release().await.context("A releasing")?;
        let released = Instant::now();
        let t_b = b.acquired(3 * DURATION).await.context("B acquiring after release")?;
        let sample = millis(t_b - released);
        log(format!(
            "handoff sample {}/{}: {sample:.3} ms (A released {:.1} s after acquiring)",
            i + 1,
            args.samples,
            hold.as_secs_f64()
        ));
        samples.push(sample);
        holds.push(millis(hold));
        b.stop_and_release().await.context("B releasing")?;
    }
    let mut p = common_params(args, lease);
    p.insert(
        "sample_start".into(),
        "A's LeaseManager::release() returned (holder cleared, then one read-back GET)".into(),
    );
    p.insert("sample_stop".into(), "B's LeaseManager::changed() returned true".into());
    p.insert(
        "release_phase".into(),
        "A releases uniform-randomly in [grace, duration) after acquiring: one period of B's wake-up schedule".into(),
    );
    p.insert("hold_ms".into(), json!(holds));
    Ok((samples, Value::Object(p)))
}

/// Failover. Per sample: A acquires (`t_a`), B starts waiting, and at `t_a +
/// U[0, duration - grace)` — a random phase of A's 25 s renewal cycle — A
/// "crashes": its `changed()` task is aborted and the manager dropped without
/// `release()`. Nothing more is written, the Lease keeps A's holder and last
/// renewTime (checked with a GET), which is what a SIGKILL leaves behind. The
/// crate has no Drop-time release, so dropping is silent.
///
/// Sample start: the crash instant. Sample stop: B's `changed()` returned
/// `true`. Expected: duration - (crash - last renewal) + 0.1..1 s, i.e. about
/// 5–31 s. `from_last_renewal_ms` measures the same takeovers from the Lease's
/// last renewTime (wall clock of this same machine).
async fn failover(args: &Args, config: &Config, lease: &str) -> Result<(Vec<f64>, Value)> {
    let leases: Api<Lease> = Api::namespaced(Client::try_from(config.clone())?, &args.namespace);
    let mut samples = Vec::with_capacity(args.samples);
    let mut from_renewal = Vec::with_capacity(args.samples);
    for i in 0..args.samples {
        let mut a = Candidate::start(config, &args.namespace, lease, format!("{lease}-a-{i}")).await?;
        let t_a = a.acquired(3 * DURATION).await.context("A acquiring")?;
        let mut b = Candidate::start(config, &args.namespace, lease, format!("{lease}-b-{i}")).await?;
        sleep_until((t_a + uniform(Duration::ZERO, RENEW_EVERY)).into()).await;
        ensure!(b.events.is_empty(), "sample {i}: B changed state while A held the lock");
        let crash = Instant::now();
        a.stop_renewing().await;
        let a_id = a.id.clone();
        drop(a);
        let spec = leases.get(lease).await?.spec.unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(a_id.as_str()) {
            bail!("sample {i}: after the crash the Lease names {:?}, want {a_id}", spec.holder_identity);
        }
        let renewed: SystemTime =
            spec.renew_time.ok_or_else(|| anyhow!("sample {i}: Lease has no renewTime"))?.0.into();
        let t_b = b.acquired(3 * DURATION).await.context("B taking over")?;
        let b_wall = SystemTime::now() - t_b.elapsed();
        let sample = millis(t_b - crash);
        let since_renewal = millis(b_wall.duration_since(renewed).unwrap_or_default());
        log(format!(
            "failover sample {}/{}: {sample:.3} ms after crash ({since_renewal:.3} ms after last renewal)",
            i + 1,
            args.samples
        ));
        samples.push(sample);
        from_renewal.push(since_renewal);
        b.stop_and_release().await.context("B releasing")?;
    }
    let mut p = common_params(args, lease);
    p.insert(
        "crash".into(),
        "abort A's changed() task and drop its LeaseManager without release() (Lease verified to still name A)".into(),
    );
    p.insert(
        "crash_phase".into(),
        "uniform random in [0, duration - grace) after A acquired: one renewal cycle".into(),
    );
    p.insert("sample_start".into(), "crash instant (immediately before the abort)".into());
    p.insert("sample_stop".into(), "B's LeaseManager::changed() returned true".into());
    p.insert("from_last_renewal_ms".into(), json!(from_renewal));
    Ok((samples, Value::Object(p)))
}

async fn run(args: Args) -> Result<Value> {
    let config = load_config(args.kubeconfig.as_deref()).await?;
    let epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH)?.as_nanos();
    let lease = format!("peers-klm-{}-{epoch}", args.scenario);
    let started = Instant::now();
    let outcome = tokio::select! {
        r = async {
            if args.scenario == "handoff" {
                handoff(&args, &config, &lease).await
            } else {
                failover(&args, &config, &lease).await
            }
        } => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
    };
    // Best-effort cleanup whatever happened, so reruns start from nothing.
    let leases: Api<Lease> = Api::namespaced(Client::try_from(config.clone())?, &args.namespace);
    if let Err(e) = leases.delete(&lease, &DeleteParams::default()).await {
        log(format!("warning: could not delete Lease {}/{lease}: {e}", args.namespace));
    }
    let (samples, mut params) = outcome?;
    params["wall_s"] = json!((started.elapsed().as_secs_f64() * 1e3).round() / 1e3);
    Ok(json!({
        "peer": format!("{CRATE_NAME}@{CRATE_VERSION}"),
        "scenario": args.scenario,
        "samples_ms": samples,
        "params": params,
    }))
}

fn summarize(samples: &[f64]) -> String {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let q = |p: f64| s[((s.len() - 1) as f64 * p).round() as usize];
    let mean = s.iter().sum::<f64>() / s.len() as f64;
    format!("n={} min={:.3}ms p50={:.3}ms mean={mean:.3}ms max={:.3}ms", s.len(), s[0], q(0.5), s[s.len() - 1])
}

fn main() {
    let args = parse_args();
    // The crate logs through `tracing`; show its warnings and errors (or more
    // with RUST_LOG) on stderr, never on stdout where the JSON goes.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let scenario = args.scenario.clone();
    match runtime.block_on(run(args)) {
        Ok(out) => {
            if let Some(s) = out["samples_ms"].as_array() {
                let v: Vec<f64> = s.iter().filter_map(Value::as_f64).collect();
                log(format!("{scenario}: {}", summarize(&v)));
            }
            println!("{out}");
        }
        Err(e) => {
            eprintln!("rust-peer {scenario}: error: {e:#}");
            std::process::exit(1);
        }
    }
}
