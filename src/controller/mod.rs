//! The controller: the arbiter that turns Leases into a fair, fenced lock.
//!
//! Every replica keeps its watch caches warm (DistributedLocks, lock Leases, LockClaims,
//! Pod metadata) and serves the admission webhooks; only the elected leader reconciles.
//! A new term (the election Lease taken over) forgets everything judged on the old one's
//! clock; every (re)gained leadership, new term or resumed, reconciles every lock.
//!
//! Pipeline of one reconcile ([`reconcile`]): read caches → judge ages on our monotonic
//! clock → [`decide`] (pure) → write the lock Lease by compare-and-swap ([`build`]) →
//! delete stale claims → apply the [`status`] that follows if it changed.

pub mod apply;
pub mod build;
pub mod caches;
pub mod claims;
pub mod clocks;
pub mod coalesce;
pub mod confirm;
pub mod context;
pub mod decide;
pub mod dispatch;
pub mod ended;
pub mod error;
pub mod events;
pub mod finalize;
pub mod force;
pub mod force_requests;
pub mod index;
pub mod lock_lease;
pub mod observe;
pub mod oldest_hold;
pub mod plan;
pub mod pods;
pub mod queue;
pub mod rbac;
pub mod reconcile;
pub mod record;
pub mod recreate;
pub mod relist;
pub mod requests;
pub mod runner;
pub mod serve;
pub mod status;
pub mod trim;
pub mod view;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::crd::{DistributedLock, ForceReleaseRequest, LABEL_LOCK, LockClaim};
use crate::duration::parse_duration;
use crate::lease::election::{Elector, Leadership};
use crate::lease::unmanaged::{UnmanagedLease, lease_event};
use crate::lease::{LeaseStore, Timing};
use crate::metrics::{ControllerMetrics, WebhookMetrics};
use crate::supervise::Completion;
use caches::Synced;
use context::{Context, LockKey, Settings};
use index::{ClaimIndex, SlotIndex};

/// `leasehold controller` settings.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Watch and grant locks in this namespace only (default: all namespaces).
    #[arg(long, env = "LEASEHOLD_WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Address of the admin server (/livez, /readyz, /metrics).
    #[arg(long, default_value = "0.0.0.0:8080", env = "LEASEHOLD_ADMIN_ADDR")]
    pub admin_addr: SocketAddr,
    /// Elect a leader among replicas (disable only for a single replica).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "LEASEHOLD_LEADER_ELECT")]
    pub leader_elect: bool,
    /// Namespace of the election Lease (default: the Pod's namespace, else `default`).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub election_namespace: String,
    /// Name of the election Lease.
    #[arg(long, default_value = "leasehold-controller")]
    pub election_name: String,
    /// This replica's identity in the election (default: the Pod name, else host-random).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Election lease duration.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub election_lease_duration: Duration,
    /// Election renew deadline.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub election_renew_deadline: Duration,
    /// Election retry period.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub election_retry_period: Duration,
    /// Revoke a grant its claimant has not confirmed within this, once its claim was first
    /// seen a lease duration ago (a grant on a younger claim may have been answered already).
    /// Doubled for each grant of the lock in a row that went unconfirmed (at most a lease
    /// duration), until one is answered.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub confirm_timeout: Duration,
    /// Prepare claimant RBAC (Role and RoleBinding `leasehold-client`) in namespaces with locks.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub manage_rbac: bool,
    /// Bytes of lock Lease names (about two more per name for their encoding) the client
    /// Role holds; past them the names are spread over 16 Roles `leasehold-client-leases-N`
    /// bound to the same clients. etcd refuses an object over its request limit
    /// (`--max-request-bytes`, 1.5 MiB by default), and the Role holds other rules too.
    #[arg(long, default_value_t = rbac::shards::DEFAULT_BUDGET, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_048_576))]
    pub client_role_lease_bytes: usize,
    /// Approvals (by people other than the requester) a force release needs on a lock
    /// whose `spec.forceRelease.approvals` is unset; 0 keeps the one-step
    /// `leasehold.dev/force-release` annotation. The chart sets 1.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=5), env = "LEASEHOLD_FORCE_RELEASE_APPROVALS")]
    pub force_release_approvals: u32,
    /// A ClusterRole that owns what the controller creates outside its locks (client Roles
    /// and RoleBindings, the election Lease): deleting it (uninstalling the chart) has the
    /// garbage collector delete them. The chart names its own.
    #[arg(long)]
    pub owner_cluster_role: Option<String>,
    /// Locks reconciled at once. Each reconcile in flight holds a connection to the
    /// apiserver and its buffers: unbounded, thousands of locks becoming due together (a
    /// start, a failover) open thousands of connections and keep their memory; bounded,
    /// they queue, and one lock is never reconciled twice at once either way.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..), env = "LEASEHOLD_MAX_CONCURRENT_RECONCILES")]
    pub max_concurrent_reconciles: u16,
    /// Admission webhooks.
    #[command(flatten)]
    pub webhook: crate::webhook::Config,
}

fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the controller until `shutdown`: election, watches, reconciler, admin server.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut registry = Registry::default();
    let apiserver_metrics = crate::metrics::register_common(&mut registry);
    let client =
        crate::kube_client::observed(apiserver_metrics).await.context("failed to build a Kubernetes client")?;
    let identity = config.identity.clone().unwrap_or_else(|| crate::lease::Identity::for_process().id);
    let metrics = ControllerMetrics::register(&mut registry);
    let webhook_metrics = WebhookMetrics::register(&mut registry);
    let mut tasks = tokio::task::JoinSet::new();
    let owner = match &config.owner_cluster_role {
        Some(name) => Some(rbac::owner(&client, name).await?),
        None => None,
    };
    let managed: std::collections::BTreeMap<String, String> =
        crate::crd::MANAGED_LABELS.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();

    let leadership = if config.leader_elect {
        let timing = Timing {
            lease_duration: config.election_lease_duration,
            renew_deadline: config.election_renew_deadline,
            retry_period: config.election_retry_period,
        };
        timing.validate().map_err(|e| anyhow::anyhow!("invalid election timing: {e}"))?;
        let store = LeaseStore::new(client.clone(), &config.election_namespace, crate::crd::MANAGER_CONTROLLER);
        let (elector, leadership) = Elector::new(store, &config.election_name, &identity, timing);
        let elector = elector.created_with(managed, owner.iter().cloned().collect());
        let stop = shutdown.clone();
        tasks.spawn(async move {
            elector.run(stop).await;
            Ok(Completion::Stopped)
        });
        leadership
    } else {
        Leadership::always()
    };

    // Watch caches, kept warm on every replica so that a new leader starts at once. Each
    // stream marks its cache synced on its first complete list (kube's Store readiness
    // future wakes only one waiter, and the reconcile runner is already that waiter).
    let ns = config.namespace.as_deref();
    let synced = Synced::default();
    let (leases, lease_writer) = reflector::store::<Lease>();
    let slot_index = Arc::new(Mutex::new(SlotIndex::slots()));
    // Re-lists read the latest (the default list semantic), so a cached Lease never goes
    // back to an older version: `lock_lease::caught_up` relies on it.
    // Parsed without their field managers, which the cache would drop anyway ([`trim`]).
    let lease_stream = watcher(scoped::<UnmanagedLease>(&client, ns), watcher::Config::default().labels(LABEL_LOCK))
        .backoff(crate::lease::watch_backoff())
        .map_ok(lease_event)
        .reflect(lease_writer)
        // After the cache, before the reconcile the event triggers, as for claims.
        .inspect(SlotIndex::follower(slot_index.clone()))
        .inspect(synced.marker("leases"));
    let (claims, claim_writer) = reflector::store::<LockClaim>();
    let claim_index = Arc::new(Mutex::new(ClaimIndex::claims()));
    let claim_stream = watcher(scoped::<LockClaim>(&client, ns), watcher::Config::default())
        .backoff(crate::lease::watch_backoff())
        .modify(trim::forget_unread)
        .reflect(claim_writer)
        // After the cache, before the reconcile the event triggers: that reconcile finds
        // the claim through the index.
        .inspect(ClaimIndex::follower(claim_index.clone()))
        .inspect(synced.marker("lockclaims"));
    let (rbac_tx, rbac_rx) = tokio::sync::mpsc::unbounded_channel();
    let (pods, pod_writer) = reflector::store();
    let pod_stream = watcher(scoped::<PartialObjectMeta<Pod>>(&client, ns), watcher::Config::default())
        .backoff(crate::lease::watch_backoff())
        .modify(trim::forget_unread)
        .reflect(pod_writer)
        .inspect(synced.marker("pods"))
        .inspect(rbac::on_pod_event(rbac_tx.clone()));
    let (requests, request_writer) = reflector::store::<ForceReleaseRequest>();
    let request_stream = watcher(scoped::<ForceReleaseRequest>(&client, ns), watcher::Config::default())
        .backoff(crate::lease::watch_backoff())
        .modify(trim::forget_unread)
        .reflect(request_writer)
        .inspect(synced.marker("forcereleaserequests"));
    let (locks, lock_writer) = reflector::store();
    let lock_stream = watcher(scoped::<DistributedLock>(&client, ns), watcher::Config::default())
        .backoff(crate::lease::watch_backoff())
        // Nothing reads field managers or kubectl's applied copy ([`trim`]); 10,000 locks'
        // worth of field managers is tens of MiB.
        .modify(trim::forget_unread)
        .reflect(lock_writer)
        .inspect(synced.marker("distributedlocks"))
        .inspect(rbac::on_lock_event(rbac_tx));
    registry.register_collector(Box::new(oldest_hold::OldestHold { locks: locks.clone() }));

    let reporter = Reporter { controller: crate::crd::MANAGER_CONTROLLER.into(), instance: Some(identity.clone()) };
    let ctx = Arc::new(Context {
        client: client.clone(),
        locks: locks.clone(),
        leases: leases.clone(),
        claims: claims.clone(),
        claim_index,
        slot_index,
        pods: pods.clone(),
        requests: requests.clone(),
        metrics: metrics.clone(),
        recorder: Recorder::new(client.clone(), reporter.clone()),
        settings: Settings {
            confirm_timeout: config.confirm_timeout,
            manage_rbac: config.manage_rbac,
            client_role_lease_bytes: config.client_role_lease_bytes,
            force_release_approvals: config.force_release_approvals,
            owner,
        },
        leadership: leadership.clone(),
        memory: Mutex::default(),
        tokens: Mutex::default(),
        holders: Arc::default(),
        rbac: Mutex::default(),
        pod_accounts: Mutex::default(),
        routine_events: Mutex::default(),
        confirmations: Mutex::default(),
        status_budget: coalesce::routine_status_budget(),
    });

    {
        let (mut leadership, gauge, stop) = (leadership.clone(), metrics.leader.clone(), shutdown.clone());
        tasks.spawn(async move {
            let track = async {
                loop {
                    leadership.acquired().await;
                    gauge.set(1);
                    leadership.lost().await;
                    gauge.set(0);
                }
            };
            tokio::select! { _ = stop.cancelled() => Ok(Completion::Stopped), _ = track => Ok(Completion::Stopped) }
        });
    }

    if config.manage_rbac {
        let (ctx, stop, namespace) = (ctx.clone(), shutdown.clone(), config.namespace.clone());
        tasks.spawn(async move {
            rbac::follow(ctx, namespace, rbac_rx, stop).await?;
            Ok(Completion::Stopped)
        });
    }

    let holders = ctx.holders.clone();
    // Each watch names the locks its events concern once its cache shows them
    // ([`relist`]); a lock's own deletion names it too, and finds it gone.
    let triggers = futures::stream::select_all([
        relist::due_locks(lock_stream, locks.clone(), |lock: &DistributedLock| vec![LockKey::of(lock)]).boxed(),
        relist::due_locks(lease_stream, leases.clone(), |lease: &Lease| {
            let ns = lease.namespace().unwrap_or_default();
            lease.labels().get(LABEL_LOCK).map(|lock| LockKey::new(ns, lock)).into_iter().collect()
        })
        .boxed(),
        relist::due_locks(claim_stream, claims.clone(), |claim: &LockClaim| {
            vec![LockKey::new(claim.namespace().unwrap_or_default(), claim.spec.lock.clone())]
        })
        .boxed(),
        relist::due_locks(request_stream, requests.clone(), |request: &ForceReleaseRequest| {
            vec![LockKey::new(request.namespace().unwrap_or_default(), request.spec.lock.clone())]
        })
        .boxed(),
        relist::due_locks(pod_stream, pods.clone(), move |pod: &PartialObjectMeta<Pod>| {
            let ns = pod.namespace().unwrap_or_default();
            let locks = holders.lock().expect("holder index is never poisoned").locks_of(&ns, &pod.name_any());
            locks.into_iter().map(|lock| LockKey::new(ns.clone(), lock)).collect()
        })
        .boxed(),
    ]);
    let regained = futures::stream::unfold(leadership.regains(), |mut regains| async move {
        regains.changed().await.ok()?;
        Some(((), regains))
    });
    let (stop, limit) = (shutdown.clone(), usize::from(config.max_concurrent_reconciles));
    tasks.spawn(async move {
        runner::run(triggers, regained, ctx, limit, stop).await;
        Ok(Completion::Stopped)
    });

    // The webhooks are served by every replica, leader or not.
    let webhook_bound = Arc::new(AtomicBool::new(config.webhook.webhook_addr.is_none()));
    let (refusals, refused) = crate::webhook::refusals::queue(webhook_metrics.clone());
    if let Some(server) = crate::webhook::server::start(
        &config.webhook,
        client.clone(),
        config.force_release_approvals,
        webhook_metrics.clone(),
        refusals,
        webhook_bound.clone(),
        shutdown.clone(),
    )
    .await?
    {
        let (recorder, stop) = (Recorder::new(client.clone(), reporter.clone()), shutdown.clone());
        tasks.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = crate::webhook::refusals::record(recorder, refused, webhook_metrics) => {}
            }
            Ok(Completion::Stopped)
        });
        tasks.spawn(async move {
            server.await?;
            Ok(Completion::Stopped)
        });
    }

    let admin = crate::admin::Admin {
        registry: Arc::new(registry),
        live: crate::admin::always_ok(),
        ready: Arc::new(move || {
            synced.check()?;
            if webhook_bound.load(Ordering::Acquire) { Ok(()) } else { Err("webhook server not listening".into()) }
        }),
    };
    let listener = tokio::net::TcpListener::bind(config.admin_addr)
        .await
        .with_context(|| format!("failed to bind the admin server to {}", config.admin_addr))?;
    info!(addr = %listener.local_addr()?, "admin server listening");
    let stop = shutdown.clone();
    tasks.spawn(async move {
        crate::admin::serve(listener, crate::admin::router(admin), stop).await?;
        Ok(Completion::Stopped)
    });

    crate::supervise::supervise(tasks, shutdown).await
}
