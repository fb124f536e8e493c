//! What the controller and a sidecar export on their admin port, scraped from the real
//! processes: the build, the process, and the requests their clients sent the apiserver.

use std::time::Duration;

use leasehold::crd::{DistributedLock, DistributedLockSpec};

use crate::support::watch::until;
use crate::support::{Env, LeaseholdProcess};

const LOCK: &str = "orders";
const WAIT: Duration = Duration::from_secs(30);

/// The sample lines of `/metrics` whose name (labels included) starts with `prefix`, with
/// their values.
async fn samples(process: &LeaseholdProcess, prefix: &str) -> Vec<(String, f64)> {
    let (status, body) = process.admin_get("/metrics").await.expect("the admin server answers");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Build info, the process metrics, and apiserver requests answered 2xx.
async fn assert_common_metrics(process: &LeaseholdProcess) {
    let build = format!("leasehold_build_info{{version=\"{}\"}}", env!("CARGO_PKG_VERSION"));
    assert_eq!(samples(process, &build).await, [(build.clone(), 1.0)], "{}", process.name);
    let resident = samples(process, "process_resident_memory_bytes").await;
    assert!(resident.len() == 1 && resident[0].1 > 0.0, "{}: {resident:?}", process.name);
    let started = samples(process, "process_start_time_seconds").await;
    assert!(started.len() == 1 && started[0].1 > 1.7e9, "{}: {started:?}", process.name);
    let requests = samples(process, "leasehold_apiserver_requests_total{").await;
    assert!(
        requests.iter().any(|(name, value)| name.contains("code=\"2") && *value >= 1.0),
        "{}: no answered apiserver request counted: {requests:?}",
        process.name
    );
    let timed = samples(process, "leasehold_apiserver_request_seconds_count{").await;
    assert!(timed.iter().any(|(_, n)| *n >= 1.0), "{}: {timed:?}", process.name);
}

#[tokio::test]
async fn the_controller_and_a_sidecar_export_build_process_and_apiserver_metrics() {
    let env = Env::new("metrics-common").await;
    let controller = env.controller(&[]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let pod = env.pod("a").await;
    env.wait_claim_rbac(&pod).await;
    let sidecar = env.sidecar(&pod, &[]).await;
    let (status, body) = sidecar.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200, "{body}");

    // The controller listed its watch caches before it was ready.
    let lists = samples(&controller, "leasehold_apiserver_requests_total{verb=\"list\",code=\"200\"}").await;
    assert!(lists.first().is_some_and(|(_, n)| *n >= 1.0), "{lists:?}");
    assert_common_metrics(&controller).await;
    // The sidecar created a claim to acquire.
    let creates = samples(&sidecar.process, "leasehold_apiserver_requests_total{verb=\"create\",code=\"201\"}").await;
    assert!(creates.first().is_some_and(|(_, n)| *n >= 1.0), "{creates:?}");
    assert_common_metrics(&sidecar.process).await;
    let (status, body) = sidecar.release(LOCK).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn the_controller_exports_the_age_of_the_oldest_hold_and_zero_when_free() {
    let env = Env::new("metrics-oldest").await;
    let controller = env.controller(&[]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let pod = env.pod("a").await;
    env.wait_claim_rbac(&pod).await;
    let name = "leasehold_controller_oldest_hold_seconds";
    assert_eq!(controller.metric(name).await, Some(0.0), "nothing held yet");

    let hold = pod.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires");
    // The hold's age counts from the grant, recorded in the lock's status.
    let token = hold.token();
    until(&env.locks(), LOCK, WAIT, "the hold in the lock's status", move |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.holder.as_ref()).is_some_and(|h| h.fencing_token == token)
    })
    .await;
    leasehold_harness::eventually("an oldest hold older than 0 s", WAIT, || async {
        match controller.metric(name).await {
            Some(age) if age > 0.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    hold.release().await;
    leasehold_harness::eventually("no hold", WAIT, || async {
        match controller.metric(name).await {
            Some(0.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}
