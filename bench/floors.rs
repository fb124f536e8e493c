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
