//! What one request of each kind a grant makes costs the apiserver: its CPU time
//! (`utime + stime` of `/proc/<pid>/stat`) per request, from one client sending each kind
//! back to back, the kinds interleaved in rounds, in a namespace no controller reconciles.
//! The objects are shaped like the product's: a lock's status as the controller writes it
//! for a held mutex with nine waiters (written by server-side apply under the controller's
//! field manager, a new holder and token each time, as a grant does), a lock Lease replaced
//! by compare-and-swap, a claimant's LockClaim created and deleted, the lock read for its
//! terms. The report multiplies these costs by the requests each throughput run made per
//! grant, to say how much of the apiserver's CPU per grant each kind of request explains.

use std::time::Instant;

use anyhow::Context as _;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Resource, ResourceExt};
use leasehold::controller::build;
use leasehold::crd::{
    ANNOTATION_CLAIM, ANNOTATION_CLAIM_UID, ANNOTATION_RENEW_DEADLINE, ANNOTATION_RETRY_PERIOD, ANNOTATION_TOKEN,
    DistributedLock, DistributedLockSpec, DistributedLockStatus, HolderStatus, LockClaim, LockClaimSpec, LockStats,
    MANAGER_CONTROLLER, WaiterStatus,
};
use serde_json::json;

use crate::record::RequestCost;
use crate::stats::{Summary, ms_between};

/// The waiters a contended lock's status lists in the throughput runs (ten claimants).
const WAITERS: usize = 9;

/// The kinds measured, each as `apiserver_request_total` names it (`VERB resource code`).
const KINDS: [(&str, &str); 5] = [
    ("PUT leases 200", "lock Lease replaced by compare-and-swap (holder, renew time, token annotation)"),
    (
        "APPLY distributedlocks/status 200",
        "lock status applied as the controller writes it at a grant: a held mutex, 9 waiters",
    ),
    ("POST lockclaims 201", "LockClaim created, as a claimant's"),
    ("DELETE lockclaims 200", "LockClaim deleted with a UID precondition, as a claimant's"),
    ("GET distributedlocks 200", "lock read (for its terms), with that status"),
];

/// Apiserver and etcd pids, read around each batch.
pub struct Pids {
    /// kube-apiserver.
    pub apiserver: u32,
    /// etcd.
    pub etcd: u32,
}

/// Sends `per_round` requests of each kind, in `rounds` rounds, on objects in `ns` (which
/// no controller reconciles), and returns each kind's cost.
pub async fn run(
    client: &kube::Client,
    ns: &str,
    pids: &Pids,
    rounds: usize,
    per_round: usize,
) -> anyhow::Result<Vec<RequestCost>> {
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), ns);
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let claims: Api<LockClaim> = Api::namespaced(client.clone(), ns);
    let name = "request-cost";
    let lock = locks
        .create(&PostParams::default(), &DistributedLock::new(name, DistributedLockSpec::default()))
        .await
        .context("create the lock")?;
    let mut lease = leases
        .create(&PostParams::default(), &build::new_lock_lease(&lock, 0, token(0)))
        .await
        .context("create the lock Lease")?;
    let mut sent = 0_i64;
    let mut tally: Vec<Tally> = KINDS.iter().map(|_| Tally::default()).collect();
    // The claims each round creates, for its deletes.
    let mut created: Vec<LockClaim> = Vec::new();
    // One untimed round first: connections, caches and the status's managed fields settle.
    for round in 0..=rounds {
        for (kind, t) in tally.iter_mut().enumerate() {
            let mark = Mark::now(pids)?;
            let mut wall_ms = Vec::with_capacity(per_round);
            for _ in 0..per_round {
                sent += 1;
                let started = Instant::now();
                match kind {
                    0 => {
                        granted(&mut lease, sent);
                        lease =
                            leases.replace(name, &PostParams::default(), &lease).await.context("replace the Lease")?;
                    }
                    1 => {
                        let patch = json!({
                            "apiVersion": DistributedLock::api_version(&()),
                            "kind": DistributedLock::kind(&()),
                            "status": status(sent),
                        });
                        let params = PatchParams::apply(MANAGER_CONTROLLER).force();
                        locks
                            .patch_status(name, &params, &Patch::Apply(patch))
                            .await
                            .context("apply the lock status")?;
                    }
                    2 => created.push(
                        claims.create(&PostParams::default(), &claim_of(name, sent)).await.context("create a claim")?,
                    ),
                    3 => {
                        let claim = created.pop().context("a claim to delete")?;
                        let preconditions = Preconditions { uid: claim.uid(), resource_version: None };
                        let params = DeleteParams { preconditions: Some(preconditions), ..Default::default() };
                        claims.delete(&claim.name_any(), &params).await.context("delete a claim")?;
                    }
                    _ => {
                        locks.get(name).await.context("get the lock")?;
                    }
                }
                wall_ms.push(ms_between(started, Instant::now()));
            }
            if round > 0 {
                mark.add_to(t, pids, wall_ms)?;
            }
        }
    }
    locks.delete(name, &DeleteParams::default()).await.context("delete the lock")?;
    leases.delete(name, &DeleteParams::default()).await.context("delete the Lease")?;
    Ok(KINDS
        .iter()
        .zip(tally)
        .map(|((key, what), t)| RequestCost {
            key: (*key).to_owned(),
            what: (*what).to_owned(),
            requests: t.requests,
            apiserver_ms: t.apiserver_s * 1000.0 / t.requests.max(1) as f64,
            etcd_ms: t.etcd_s * 1000.0 / t.requests.max(1) as f64,
            wall_ms: Summary::of(&t.wall_ms),
        })
        .collect())
}

/// One kind's sums over the timed rounds.
#[derive(Default)]
struct Tally {
    requests: usize,
    apiserver_s: f64,
    etcd_s: f64,
    wall_ms: Vec<f64>,
}

/// CPU seconds of the apiserver and etcd at the start of a batch.
struct Mark {
    apiserver: f64,
    etcd: f64,
}

impl Mark {
    fn now(pids: &Pids) -> anyhow::Result<Mark> {
        Ok(Mark { apiserver: crate::cpu::seconds(pids.apiserver)?, etcd: crate::cpu::seconds(pids.etcd)? })
    }

    /// Adds the CPU time since the mark, and the batch's requests, to `t`.
    fn add_to(&self, t: &mut Tally, pids: &Pids, wall_ms: Vec<f64>) -> anyhow::Result<()> {
        t.apiserver_s += crate::cpu::seconds(pids.apiserver)? - self.apiserver;
        t.etcd_s += crate::cpu::seconds(pids.etcd)? - self.etcd;
        t.requests += wall_ms.len();
        t.wall_ms.extend(wall_ms);
        Ok(())
    }
}

/// The identity of claimant `n`, shaped like a Pod's (`<pod>_<uid>`).
fn identity(n: i64) -> String {
    format!("worker-{}_6f1c2d3e-4a5b-4c6d-8e7f-{:012}", n % 10, n % 10)
}

/// `lease` as a grant to claimant `n` leaves it: holder, times, token, the claim served
/// and the timing granted under.
fn granted(lease: &mut Lease, n: i64) {
    let now = MicroTime(Timestamp::now());
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(identity(n));
    spec.lease_duration_seconds = Some(15);
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or_default().wrapping_add(1));
    let annotations = lease.annotations_mut();
    for (key, value) in [
        (ANNOTATION_TOKEN, token(n).to_string()),
        (ANNOTATION_CLAIM, format!("request-cost.{n}")),
        (ANNOTATION_CLAIM_UID, format!("0c9e4f1a-2b3c-4d5e-8f90-{n:012}")),
        (ANNOTATION_RENEW_DEADLINE, "10".to_owned()),
        (ANNOTATION_RETRY_PERIOD, "2".to_owned()),
    ] {
        annotations.insert(key.to_owned(), value);
    }
}

/// Tokens as the controller mints them: the wall clock in ms, and above every earlier one.
fn token(n: i64) -> i64 {
    Timestamp::now().as_millisecond().max(n)
}

/// The status of a held mutex with [`WAITERS`] waiters, the `n`th grant.
fn status(n: i64) -> DistributedLockStatus {
    let now = Timestamp::now();
    let time = Time(now);
    let holder = HolderStatus {
        identity: identity(n),
        slot: 0,
        mode: None,
        pod: Some(format!("worker-{}", n % 10)),
        fencing_token: token(n),
        acquired_at: time.clone(),
        renewed_at: Some(time.clone()),
        expires_at: Some(Time(now + jiff::SignedDuration::from_secs(15))),
        waited_seconds: 0.585,
    };
    let waiters = (1..=WAITERS as i64)
        .map(|i| WaiterStatus {
            identity: identity(n + i),
            pod: Some(format!("worker-{}", (n + i) % 10)),
            mode: None,
            since: time.clone(),
        })
        .collect();
    let condition = |type_: &str, reason: &str, message: String| Condition {
        type_: type_.to_owned(),
        status: "True".to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: Some(1),
        last_transition_time: time.clone(),
    };
    DistributedLockStatus {
        holder: Some(Box::new(holder.clone())),
        holders: vec![holder.clone()],
        held_permits: Some("1/1".to_owned()),
        fencing_token: Some(holder.fencing_token),
        waiters,
        queue_length: WAITERS as i32,
        stats: LockStats {
            grants: n,
            releases: n - 1,
            last_wait_seconds: Some(0.585),
            last_handoff_milliseconds: Some(3),
            ..Default::default()
        },
        force_release_approvals: Some(0),
        conditions: vec![
            condition("Ready", "LeaseOwned", "the lock Lease is owned by this lock".to_owned()),
            condition("Held", "Held", format!("held by {} (token {})", holder.identity, holder.fencing_token)),
        ],
        observed_generation: Some(1),
        ..Default::default()
    }
}

/// Claimant `n`'s claim on lock `lock`.
pub fn claim_of(lock: &str, n: i64) -> LockClaim {
    let now = MicroTime(Timestamp::now());
    let spec = LockClaimSpec {
        lock: lock.to_owned(),
        mode: None,
        claimant: identity(n),
        pod: Some(format!("worker-{}", n % 10)),
        request_time: now.clone(),
        renew_time: now,
        ttl_seconds: 30,
    };
    LockClaim::new(&format!("{lock}.{n}"), spec)
}
