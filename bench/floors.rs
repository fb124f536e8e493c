//! The floor from Rust: one Lease compare-and-swap through the apiserver with kube, the
//! client Leasehold itself uses (the peers add client-go's view and one etcd Put).

use std::time::Instant;

use anyhow::{Context as _, ensure};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use crate::record::{Panel, Series};
use crate::stats::ms;

/// The Lease a raw-CAS floor updates: held by `bench`, renewed now.
pub fn floor_lease(name: &str) -> Lease {
    Lease {
        metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
        spec: Some(LeaseSpec {
            holder_identity: Some("bench".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    }
}

/// `warmup` then `samples` Lease updates, each sending the object the previous one
/// returned (so its resourceVersion: a CAS, as a renewal is); only `replace` is timed.
/// Ends by checking that a stale resourceVersion is refused with 409.
pub async fn lease_cas(leases: Api<Lease>, warmup: usize, samples: usize) -> anyhow::Result<Series> {
    let name = "bench-floor-cas";
    let params = PostParams::default();
    let lease = floor_lease(name);
    let mut current = leases.create(&params, &lease).await.context("failed to create the floor Lease")?;
    let first = current.clone();
    let mut out = Vec::with_capacity(samples);
    for i in 0..warmup + samples {
        let mut next = current.clone();
        next.spec.get_or_insert_with(LeaseSpec::default).renew_time = Some(MicroTime(Timestamp::now()));
        let started = Instant::now();
        current = leases.replace(name, &params, &next).await.context("failed to update the floor Lease")?;
        let took = started.elapsed();
        if i >= warmup {
            out.push(ms(took));
        }
    }
    let stale = leases.replace(name, &params, &first).await;
    ensure!(
        matches!(&stale, Err(kube::Error::Api(s)) if s.code == 409),
        "a stale resourceVersion was not refused with 409: {stale:?}"
    );
    leases.delete(name, &Default::default()).await.context("failed to delete the floor Lease")?;
    Ok(Series::new(
        "floor.lease_cas.kube",
        "One Lease CAS (update with resourceVersion) through the apiserver, kube-rs",
        "floor",
        Panel::Fast,
        out,
        json!({
            "client": "kube-rs (JSON), admin token, one client, sequential",
            "warmup": warmup,
            "samples": samples,
            "sample_start": "replace() called",
            "sample_stop": "replace() returned the updated Lease",
            "stale_write_refused_409": true,
        }),
    ))
}

/// One watch hop: a Lease CAS → the change it made arrived on a watch of that Lease (the
/// bench's own, through the apiserver's watch cache), timed from the call and from its
/// return. Grant and handoff each pass through two such hops.
pub async fn watch_hop(leases: Api<Lease>, warmup: usize, samples: usize) -> anyhow::Result<Vec<Series>> {
    use futures::StreamExt;
    use kube::runtime::watcher;

    let name = "bench-floor-watch";
    let params = PostParams::default();
    let mut current = leases.create(&params, &floor_lease(name)).await.context("failed to create the watched Lease")?;
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(leases.clone(), config).boxed();
    // Listed first: every later change then arrives as an event.
    while !matches!(events.next().await.context("the watch ended")??, watcher::Event::InitDone) {}
    let (mut from_call, mut from_return) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for i in 0..warmup + samples {
        let mut next = current.clone();
        next.spec.get_or_insert_with(LeaseSpec::default).renew_time = Some(MicroTime(Timestamp::now()));
        let called = Instant::now();
        current = leases.replace(name, &params, &next).await.context("failed to update the watched Lease")?;
        let returned = Instant::now();
        let version = current.metadata.resource_version.clone();
        loop {
            match events.next().await.context("the watch ended")?? {
                watcher::Event::Apply(seen) if seen.metadata.resource_version == version => break,
                _ => continue,
            }
        }
        let seen = Instant::now();
        if i >= warmup {
            from_call.push(ms(seen - called));
            from_return.push(ms(seen.saturating_duration_since(returned)));
        }
    }
    drop(events);
    leases.delete(name, &Default::default()).await.context("failed to delete the watched Lease")?;
    let params = |start: &str| {
        json!({
            "client": "kube-rs (JSON), admin token, one client; the watch on its own connection",
            "warmup": warmup,
            "samples": samples,
            "sample_start": start,
            "sample_stop": "the watch event carrying the resourceVersion replace() returned was read from the watch",
        })
    };
    Ok(vec![
        Series::new(
            "floor.watch_hop.from_call",
            "Lease CAS called → the change read from a watch (kube-rs)",
            "floor",
            Panel::Fast,
            from_call,
            params("replace() called"),
        ),
        Series::new(
            "floor.watch_hop.from_return",
            "Lease CAS returned → the change read from a watch (kube-rs; 0 when it came first)",
            "floor",
            Panel::Fast,
            from_return,
            params("replace() returned"),
        ),
    ])
}

/// What an acquire that took a free Lease itself would wait for: the claimant's LockClaim
/// created and its compare-and-swap of the Lease sent together, timed until both have
/// returned (an answer would need both: the claim that puts the hold in the controller's
/// view, the CAS that takes the Lease). Each claim names a lock that does not exist, so no
/// controller acts on it; it is deleted, untimed, before the next sample.
pub async fn claim_and_cas(
    leases: Api<Lease>,
    claims: Api<leasehold::crd::LockClaim>,
    warmup: usize,
    samples: usize,
) -> anyhow::Result<Series> {
    use kube::ResourceExt as _;

    let name = "bench-floor-claim-cas";
    let params = PostParams::default();
    let mut current = leases.create(&params, &floor_lease(name)).await.context("failed to create the floor Lease")?;
    let mut out = Vec::with_capacity(samples);
    for i in 0..warmup + samples {
        let mut next = current.clone();
        next.spec.get_or_insert_with(LeaseSpec::default).renew_time = Some(MicroTime(Timestamp::now()));
        let claim = crate::request_cost::claim_of(name, i as i64);
        let started = Instant::now();
        let (cas, created) = tokio::join!(leases.replace(name, &params, &next), claims.create(&params, &claim));
        let took = started.elapsed();
        current = cas.context("failed to update the floor Lease")?;
        let created = created.context("failed to create the floor claim")?;
        claims.delete(&created.name_any(), &Default::default()).await.context("failed to delete the floor claim")?;
        if i >= warmup {
            out.push(ms(took));
        }
    }
    leases.delete(name, &Default::default()).await.context("failed to delete the floor Lease")?;
    Ok(Series::new(
        "floor.claim_and_cas",
        "LockClaim create and Lease CAS sent together → both returned (kube-rs; what an acquire taking a free Lease itself would wait for)",
        "floor",
        Panel::Fast,
        out,
        json!({
            "client": "kube-rs (JSON), admin token, one client; the two requests concurrent on it",
            "warmup": warmup,
            "samples": samples,
            "sample_start": "replace() and create() called together",
            "sample_stop": "both returned",
            "claim": "names a lock that does not exist; deleted (untimed) after each sample",
        }),
    ))
}
