//! The sidecar: a local lock API for the app in its pod, renewing on the pod's behalf.
//!
//! It claims with the pod's own identity (`<pod>_<uid>`, from the downward API) and its
//! Pod-bound service-account token, confirms every grant by compare-and-swap before
//! saying "acquired", renews every retry period, and self-fences at the renew deadline.
//! Callers in the pod queue locally ([`slots`]); each grant goes to one caller under an
//! owner handle, and ends when that caller lets go: a release, its session closing, its
//! heartbeat lapsing, or the app container that took it restarting ([`owner`], [`pod`]).
//! Hold mode ([`hold`]) holds one lock for the pod's whole life (or while the app is up)
//! and keeps a hold file whose deadline expires it by itself. On SIGTERM it stops
//! reporting ready, removes the hold file, reports every hold lost, gives each back once
//! its owner let go or everything the owner was told has run out, then exits.
//!
//! It rides in every opted-in pod, so it runs on a single-threaded runtime and does no
//! work while idle.

pub mod api;
pub mod hold;
pub mod owner;
pub mod pod;
pub mod request;
pub mod session;
pub mod slots;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::claim::Claimant;
use crate::crd::MANAGER_SIDECAR;
use crate::duration::parse_duration;
use crate::lease::Identity;
use crate::metrics::ClientMetrics;
use crate::supervise::Completion;

/// `leasehold sidecar` settings.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// The pod's namespace (downward API).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// The pod's name (downward API). Without it the identity is host-random.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// The pod's UID (downward API).
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// Address of the lock API (keep it on loopback: anything that reaches it acts as the pod).
    #[arg(long, env = "LEASEHOLD_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// Address of the admin server (/healthz, /readyz, /metrics).
    #[arg(long, env = "LEASEHOLD_ADMIN_ADDR", default_value = "0.0.0.0:7071")]
    pub admin_addr: SocketAddr,
    /// Hold mode: hold this lock for the pod's life (pod annotation `leasehold.dev/hold`).
    #[arg(long, env = "LEASEHOLD_HOLD")]
    pub hold: Option<String>,
    /// Hold mode: keep `{lock, fencingToken, acquiredAt, validUntilBoottimeMs}` here
    /// (atomically) while holding. Removed at start, on loss and before a shutdown release.
    #[arg(long, env = "LEASEHOLD_HOLD_FILE")]
    pub hold_file: Option<PathBuf>,
    /// Hold mode: report ready only while holding. Readiness lags the hold by the probe's
    /// period and stalls rollouts (non-holders never turn ready): not a safety signal.
    #[arg(long, env = "LEASEHOLD_READY_WHEN_HOLDING", default_value_t = false, action = clap::ArgAction::Set)]
    pub ready_when_holding: bool,
    /// Hold mode: give leadership up when an app container of the pod has not been running
    /// and ready for this long (and claim only while they all are). Needs --watch-pod.
    #[arg(long, env = "LEASEHOLD_HOLD_APP_DOWN_AFTER", value_parser = parse_duration)]
    pub hold_app_down_after: Option<Duration>,
    /// Watch this Pod's container statuses (needs get, list and watch on the Pod): a
    /// pod-scoped hold ends when the app container that took it restarts or stops.
    #[arg(long, env = "LEASEHOLD_WATCH_POD", default_value_t = true, action = clap::ArgAction::Set)]
    pub watch_pod: bool,
    /// The longest `waitSeconds` accepted.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub max_wait: Duration,
}

impl Config {
    /// The claimant identity: the pod's from the downward API, else asked of the apiserver.
    pub async fn identity(&self, client: &kube::Client) -> anyhow::Result<Identity> {
        match (&self.pod_name, &self.pod_uid) {
            (Some(name), Some(uid)) if !name.is_empty() && !uid.is_empty() => Ok(Identity::for_pod(name, uid)),
            _ => Identity::discover(client).await.context("failed to learn who we are (SelfSubjectReview)"),
        }
    }
}

/// Runs the sidecar until `shutdown`, then releases every hold.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    // Before anything else: a hold file left by an earlier run of this container (killed,
    // crashed) may still be within its deadline while the lock is granted elsewhere.
    let hold_file = config.hold_file.as_ref().map(hold::HoldFile::new);
    if let Some(file) = &hold_file {
        file.clear().with_context(|| format!("failed to remove the leftover hold file {}", file.path().display()))?;
    }
    if let Some(lock) = &config.hold {
        crate::names::validate_lock_name(lock)
            .map_err(|_| anyhow::anyhow!("--hold {lock:?} is not a valid lock name"))?;
    }
    let mut registry = Registry::default();
    let apiserver_metrics = crate::metrics::register_common(&mut registry);
    let client =
        crate::kube_client::observed(apiserver_metrics).await.context("failed to build a Kubernetes client")?;
    let identity = config.identity(&client).await?;
    info!(namespace = %config.namespace, %identity, "sidecar starting");
    let metrics = ClientMetrics::register(&mut registry);
    let owner_metrics = owner::OwnerMetrics::register(&mut registry);
    let mut tasks = JoinSet::new();
    // Cancelled once every hold is given back: until then apps can still release, keep
    // alive and read their holds (and container ends are still followed), so a hold ends
    // as soon as its owner lets go.
    let drained = CancellationToken::new();
    // The Pod's container statuses, when it is a Pod and may read itself.
    let pod_view = match (&config.pod_name, &config.pod_uid, config.watch_pod) {
        (Some(name), Some(uid), true) if !name.is_empty() && !uid.is_empty() => {
            let (view, watching) = pod::watch_pod(client.clone(), &config.namespace, name, uid);
            let stop = drained.clone();
            tasks.spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = watching => {}
                }
                Ok(Completion::Stopped)
            });
            Some(view)
        }
        _ => None,
    };
    let app_watch = match (config.hold_app_down_after, &pod_view) {
        (None, _) => None,
        (Some(down_after), Some(view)) => Some(hold::AppWatch { view: view.clone(), down_after }),
        (Some(_), None) => anyhow::bail!(
            "--hold-app-down-after needs the Pod's container statuses: --watch-pod, with POD_NAME and POD_UID set"
        ),
    };
    let claimant = Claimant::new(client, &config.namespace, identity, MANAGER_SIDECAR).with_metrics(metrics);
    let mut slots = slots::Slots::new(claimant, config.max_wait).with_metrics(owner_metrics);
    if let Some(view) = pod_view {
        slots = slots.with_pod(view);
        let (following, stop) = (slots.clone(), drained.clone());
        tasks.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = following.follow_containers() => {}
            }
            Ok(Completion::Stopped)
        });
    }

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("failed to bind the lock API to {}", config.listen))?;
    info!(addr = %listener.local_addr()?, "lock API listening");
    let serving = Arc::new(AtomicBool::new(true));
    let router = api::router(api::Api { slots: slots.clone(), max_wait: config.max_wait });
    let stop = drained.clone();
    tasks.spawn(async move {
        // Once every hold is given back, open event streams and sessions are cut after a
        // moment rather than waited for: they would otherwise hold the exit up.
        let cut = async {
            stop.cancelled().await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        tokio::select! {
            served = crate::admin::serve(listener, router, stop.clone()) => served?,
            _ = cut => {}
        }
        Ok(Completion::Stopped)
    });

    let holding = Arc::new(AtomicBool::new(false));
    if let Some(lock) = config.hold.clone() {
        let (slots, file, flag, stop) = (slots.clone(), hold_file.clone(), holding.clone(), shutdown.clone());
        tasks.spawn(async move {
            hold::run(slots, lock, file, flag, app_watch, stop).await;
            Ok(Completion::Stopped)
        });
    }

    let ready_lock = config.hold.clone().filter(|_| config.ready_when_holding);
    let (ready_slots, ready_serving, ready_holding) = (slots.clone(), serving.clone(), holding.clone());
    let admin = crate::admin::Admin {
        registry: Arc::new(registry),
        live: crate::admin::always_ok(),
        ready: Arc::new(move || {
            if !ready_serving.load(Ordering::Acquire) {
                return Err("shutting down".into());
            }
            match &ready_lock {
                Some(lock) if !(ready_holding.load(Ordering::Acquire) && ready_slots.holds(lock)) => {
                    Err(format!("not holding {lock}"))
                }
                _ => Ok(()),
            }
        }),
    };
    let admin_listener = tokio::net::TcpListener::bind(config.admin_addr)
        .await
        .with_context(|| format!("failed to bind the admin server to {}", config.admin_addr))?;
    info!(addr = %admin_listener.local_addr()?, "admin server listening");
    let stop = shutdown.clone();
    tasks.spawn(async move {
        crate::admin::serve(admin_listener, crate::admin::router(admin), stop).await?;
        Ok(Completion::Stopped)
    });

    // On shutdown: stop reporting ready, take the hold file away (before the release lets
    // another pod be granted), give every hold back once its owner can no longer believe
    // it holds, then let the servers end.
    let (releaser, stop) = (slots.clone(), shutdown.clone());
    tasks.spawn(async move {
        stop.cancelled().await;
        serving.store(false, Ordering::Release);
        holding.store(false, Ordering::Release);
        if let Some(file) = &hold_file {
            file.remove();
        }
        releaser.release_all().await;
        drained.cancel();
        info!("released every hold");
        Ok(Completion::Done)
    });

    crate::supervise::supervise(tasks, shutdown).await
}
