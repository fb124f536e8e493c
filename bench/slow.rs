//! The slow, timer-bound runs, side by side: the peers' handoffs and failovers (client-go,
//! etcd, kube-lease-manager) and Leasehold's crash failover (lock pairs in parallel). Each
//! sample costs about a lease duration whatever the code does, and the load they put on
//! the machine is a few requests a second, so they share the time instead of adding up.

use serde_json::json;

use crate::peers::{Output, Peers};
use crate::plan::Plan;
use crate::record::{Panel, Run, Series};
use crate::sidecar;
use crate::support::Env;

/// Leasehold's lease duration here (the CRD default), in ms.
pub const LEASE_MS: f64 = 15_000.0;

/// Runs the block; a peer that fails is recorded and the others still count.
pub async fn run(env: &Env, peers: &Peers, plan: &Plan) -> anyhow::Result<Run> {
    let crash = async {
        let mut pairs = Vec::new();
        for i in 0..plan.crash_pairs {
            pairs.push((format!("crash-{i}"), env.pod(&format!("c{i}a")).await, env.pod(&format!("c{i}b")).await));
        }
        let rounds = plan.crash_rounds;
        let results = futures::future::join_all(
            pairs
                .into_iter()
                .map(|(lock, a, b)| async move { sidecar::crash_failover(env, &lock, a, b, rounds).await }),
        )
        .await;
        let mut all = sidecar::CrashSamples::default();
        for r in results {
            all.extend(r?);
        }
        anyhow::Ok(all)
    };
    let (cg_handoff, cg_failover, etcd_failover, klm_handoff, klm_failover, crash) = tokio::join!(
        peers.run("clientgo-handoff", plan.clientgo_handoff, &[], "clientgo-handoff"),
        peers.run("clientgo-failover", plan.clientgo_failover, &[], "clientgo-failover"),
        peers.run("etcd-failover", plan.etcd_failover, &["--ttl", "15"], "etcd-failover"),
        peers.run("handoff", plan.klm_handoff, &[], "rust-peer-handoff"),
        peers.run("failover", plan.klm_failover, &[], "rust-peer-failover"),
        crash,
    );

    let mut r = Run::default();
    let mut keep = |result: anyhow::Result<Output>, key: &str, title: &str, panel: Panel| match result {
        Ok(o) => r.series.push(o.series(key, title, panel)),
        Err(e) => r.failures.push(format!("{key}: {e:#}")),
    };
    keep(
        cg_handoff,
        "peer.clientgo.handoff",
        "client-go leader election handoff (ReleaseOnCancel: release returned → OnStartedLeading)",
        Panel::Handoff,
    );
    keep(
        cg_failover,
        "peer.clientgo.failover",
        "client-go leader election failover (crash → OnStartedLeading)",
        Panel::Failover,
    );
    keep(
        etcd_failover,
        "peer.etcd.failover",
        "etcd concurrency.Mutex failover, TTL 15 s (crash → waiter's Lock returned)",
        Panel::Failover,
    );
    keep(
        klm_handoff,
        "peer.klm.handoff",
        "kube-lease-manager handoff (release() returned → changed() true)",
        Panel::Handoff,
    );
    keep(klm_failover, "peer.klm.failover", "kube-lease-manager failover (crash → changed() true)", Panel::Failover);

    let crash = crash?;
    let params = json!({
        "pairs_in_parallel": plan.crash_pairs,
        "rounds": plan.crash_rounds,
        "lease_duration_ms": LEASE_MS,
        "choreography": "the waiter's acquire is pending and listed in status; after U[1,3) s (a random phase of \
                         the holder's 2 s renewal) the holder sidecar is SIGKILLed; it restarts as a new process \
                         of the same pod and waits next round",
        "concurrent_with": "the peers' slow runs (timer-bound, light load)",
    });
    let series = |key: &str, title: &str, samples: Vec<f64>| {
        Series::new(key, title, "Leasehold", Panel::Failover, samples, params.clone())
    };
    r.series.push(series(
        "leasehold.crash_failover",
        "Leasehold crash failover (SIGKILL of holder sidecar → waiter's acquire returned)",
        crash.to_acquired,
    ));
    r.series.push(series(
        "leasehold.crash_failover_grant",
        "Leasehold crash failover (SIGKILL → grant visible on a watch)",
        crash.to_grant,
    ));
    r.series.push(series(
        "leasehold.crash_from_last_renewal",
        "Leasehold crash: holder's last renewTime → next grant's acquireTime (wall clock)",
        crash.from_last_renewal,
    ));
    Ok(r)
}
