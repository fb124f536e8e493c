//! The sidecar: a local lock API for the app in its pod, renewing on the pod's behalf.
//!
//! It claims with the pod's own identity (`<pod>_<uid>`, from the downward API) and its
//! Pod-bound service-account token, confirms every grant by compare-and-swap before
//! saying "acquired", renews every retry period, and self-fences at the renew deadline.
//! Callers in the pod queue locally ([`slots`]); hold mode ([`hold`]) holds one lock for
//! the pod's whole life. On SIGTERM it releases every hold, then exits.
//!
//! It rides in every opted-in pod, so it runs on a single-threaded runtime and does no
//! work while idle.

pub mod api;
pub mod hold;
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
use crate::controller::parse_duration;
use crate::crd::MANAGER_SIDECAR;
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
    /// Hold mode: write `{lock, fencingToken, acquiredAt}` here (atomically) while holding.
    #[arg(long, env = "LEASEHOLD_HOLD_FILE")]
    pub hold_file: Option<PathBuf>,
    /// Hold mode: report ready only while holding, so a Service routes only to the holder.
    #[arg(long, env = "LEASEHOLD_READY_WHEN_HOLDING", default_value_t = false, action = clap::ArgAction::Set)]
    pub ready_when_holding: bool,
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
    if let Some(lock) = &config.hold {
        api::validate_lock_name(lock).map_err(|_| anyhow::anyhow!("--hold {lock:?} is not a valid lock name"))?;
    }
    let client = crate::kube_client::client().await.context("failed to build a Kubernetes client")?;
    let identity = config.identity(&client).await?;
    info!(namespace = %config.namespace, %identity, "sidecar starting");
    let mut registry = Registry::default();
    let metrics = ClientMetrics::register(&mut registry);
    let claimant = Claimant::new(client, &config.namespace, identity, MANAGER_SIDECAR).with_metrics(metrics);
    let slots = slots::Slots::new(claimant, config.max_wait);
    let mut tasks = JoinSet::new();

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("failed to bind the lock API to {}", config.listen))?;
    info!(addr = %listener.local_addr()?, "lock API listening");
    let serving = Arc::new(AtomicBool::new(true));
    let router = api::router(api::Api { slots: slots.clone(), max_wait: config.max_wait });
    let stop = shutdown.clone();
    tasks.spawn(async move {
        crate::admin::serve(listener, router, stop).await?;
        Ok(Completion::Stopped)
    });

    let holding = Arc::new(AtomicBool::new(false));
    if let Some(lock) = config.hold.clone() {
        let (slots, file, flag, stop) = (slots.clone(), config.hold_file.clone(), holding.clone(), shutdown.clone());
        tasks.spawn(async move {
            hold::run(slots, lock, file, flag, stop).await;
            Ok(Completion::Stopped)
        });
    }

    let ready_lock = config.hold.clone().filter(|_| config.ready_when_holding);
    let (ready_slots, ready_serving) = (slots.clone(), serving.clone());
    let admin = crate::admin::Admin {
        registry: Arc::new(registry),
        live: crate::admin::always_ok(),
        ready: Arc::new(move || {
            if !ready_serving.load(Ordering::Acquire) {
                return Err("shutting down".into());
            }
            match &ready_lock {
                Some(lock) if !(holding.load(Ordering::Acquire) && ready_slots.holds(lock)) => {
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

    // On shutdown: stop reporting ready, release every hold, then let the servers end.
    let (releaser, stop) = (slots.clone(), shutdown.clone());
    tasks.spawn(async move {
        stop.cancelled().await;
        serving.store(false, Ordering::Release);
        releaser.release_all().await;
        info!("released every hold");
        Ok(Completion::Done)
    });

    crate::supervise::supervise(tasks, shutdown).await
}
