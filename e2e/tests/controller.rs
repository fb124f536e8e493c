//! The controller against the real control plane: FIFO grants with increasing tokens,
//! expiry judged on its own clock (never early), restarts, HA, conflicts, schema
//! validation, quiet status, and a status put back when removed. Revocations that drain
//! are in `drain.rs`; the lock Lease's ownership and tokens in `lease.rs`.

use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::runtime::{WatchStreamExt, watcher};
use leasehold::claim::edit;
use leasehold::crd::{DistributedLock, DistributedLockSpec, DistributedLockStatus, LockClaim};
use serde_json::json;

use crate::support::watch::{GrantLog, until};
use crate::support::{Env, TestPod};
use leasehold_harness::eventually;

const LOCK: &str = "orders";
const WAIT: Duration = Duration::from_secs(30);

/// The fastest timing the CRD allows: lease 3 s, renew deadline 2 s, retry 1 s.
pub fn fast() -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: 3,
        renew_deadline_seconds: 2,
        retry_period_seconds: 1,
        ..DistributedLockSpec::default()
    }
}

/// A claimant driven by hand through the Lease API: it claims, confirms one grant, and
/// then never renews — a holder that stopped (crashed, paused, partitioned).
pub struct ManualClaimant<'a> {
    pod: &'a TestPod,
    leases: Api<Lease>,
}

impl<'a> ManualClaimant<'a> {
    pub async fn claim(pod: &'a TestPod, namespace: &str, lock: &str) -> ManualClaimant<'a> {
        let leases: Api<Lease> = Api::namespaced(pod.client.clone(), namespace);
        let claims: Api<LockClaim> = Api::namespaced(pod.client.clone(), namespace);
        let claim = edit::lock_claim(lock, &pod.identity(), 45, Timestamp::now());
        claims.create(&PostParams::default(), &claim).await.expect("create the claim");
        ManualClaimant { pod, leases }
    }

    /// Waits for the grant, confirms it once; returns the token and the wall-clock time
    /// just before the confirmation was sent (the last renewal anyone can have seen).
    pub async fn confirm(&self, lock: &str) -> (i64, Timestamp) {
        let identity = self.pod.identity();
        let granted = until(&self.leases, lock, WAIT, "grant to the manual claimant", |l: &Lease| {
            edit::granted_token(l, &identity).is_some()
        })
        .await;
        let token = edit::granted_token(&granted, &identity).expect("granted");
        let sent = Timestamp::now();
        self.leases
            .replace(lock, &PostParams::default(), &edit::renewed(&granted, sent))
            .await
            .expect("confirm the grant");
        (token, sent)
    }
}

async fn kubectl_get_dlock(env: &Env) -> String {
    let output = env.cp.kubectl().args(["get", "dlock", LOCK, "-n", env.name()]).output().expect("run kubectl");
    assert!(output.status.success(), "kubectl failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn three_claimants_are_granted_in_claim_order_with_increasing_tokens() {
    let env = Env::new("fifo").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let (a, b, c) = (env.pod("a").await, env.pod("b").await, env.pod("c").await);
    env.wait_claim_rbac(&a).await;
    let mut grants = GrantLog::start(env.leases(), LOCK);

    let hold_a = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires the free lock");
    // b then c claim, in that order: c starts only once b's claim exists.
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, Duration::from_secs(60)).await });
    until(&env.claims(), &b.identity().claim_name(LOCK), WAIT, "b's claim", |_| true).await;
    let claimant_c = c.claimant(env.name());
    let waiting_c = tokio::spawn(async move { claimant_c.acquire(LOCK, Duration::from_secs(60)).await });

    let lock = until(&env.locks(), LOCK, WAIT, "two waiters in status", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.queue_length == 2)
    })
    .await;
    let status = lock.status.expect("status");
    let holder = status.holder.expect("a holder");
    assert_eq!(holder.identity, a.identity().id);
    assert_eq!(holder.pod.as_deref(), Some("a"));
    assert_eq!(holder.fencing_token, hold_a.token());
    assert_eq!(status.fencing_token, Some(hold_a.token()));
    let waiters: Vec<&str> = status.waiters.iter().map(|w| w.pod.as_deref().unwrap_or("")).collect();
    assert_eq!(waiters, ["b", "c"], "waiters in claim order");
    assert!(status.waiters[0].since <= status.waiters[1].since, "since follows claim order");

    let table = kubectl_get_dlock(&env).await;
    let header: Vec<&str> = table.lines().next().expect("a header").split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "READY", "HOLDER", "HOLDERS", "TOKEN", "WAITERS", "HELD", "LAST-WAIT", "AGE"],
        "{table}"
    );
    let row = table.lines().nth(1).expect("a row");
    assert!(row.contains(&a.identity().id) && row.contains(&hold_a.token().to_string()), "{table}");
    assert_eq!(row.split_whitespace().nth(1), Some("True"), "READY column: {table}");
    assert_eq!(row.split_whitespace().nth(3), Some("1/1"), "HOLDERS column: {table}");
    assert_eq!(row.split_whitespace().nth(5), Some("2"), "WAITERS column: {table}");

    let tokens = [hold_a.token()];
    assert!(hold_a.release().await.was_held);
    let hold_b = waiting_b.await.expect("join").expect("b is granted after a releases");
    let lock = until(&env.locks(), LOCK, WAIT, "b in status", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.holder.as_ref()).is_some_and(|h| h.identity == b.identity().id)
    })
    .await;
    let status = lock.status.expect("status");
    assert!(status.holder.expect("holder").waited_seconds > 0.0, "b waited");
    assert_eq!(status.stats.releases, 1);
    let tokens = [tokens[0], hold_b.token()];
    assert!(hold_b.release().await.was_held);
    let hold_c = waiting_c.await.expect("join").expect("c is granted after b releases");
    let tokens = [tokens[0], tokens[1], hold_c.token()];
    assert!(hold_c.release().await.was_held);

    let seen = grants.wait_for(3, WAIT).await;
    let holders: Vec<&str> = seen.iter().map(|g| g.holder.as_str()).collect();
    assert_eq!(holders, [a.identity().id, b.identity().id, c.identity().id], "grant order");
    assert!(seen.windows(2).all(|w| w[0].token < w[1].token), "tokens strictly increase: {seen:?}");
    assert_eq!(seen.iter().map(|g| g.token).collect::<Vec<_>>(), tokens);
}

#[tokio::test]
async fn a_holder_that_stops_renewing_expires_after_lease_duration_and_not_before() {
    let env = Env::new("expiry").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, fast()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;

    let manual = ManualClaimant::claim(&a, env.name(), LOCK).await;
    let (token_a, last_renewal) = manual.confirm(LOCK).await;
    let hold_b = b.claimant(env.name()).acquire(LOCK, WAIT).await.expect("b is granted once a expires");

    let lease = env.leases().get(LOCK).await.expect("lock lease");
    let granted_at = lease.spec.and_then(|s| s.acquire_time).expect("acquireTime").0;
    let lease_duration = Duration::from_secs(3);
    let gap = granted_at.duration_since(last_renewal);
    assert!(
        gap >= jiff::SignedDuration::try_from(lease_duration).expect("fits"),
        "b was granted {gap:?} after a's last renewal, before the lease duration {lease_duration:?}"
    );
    assert!(hold_b.token() > token_a, "the next token {} is higher than {token_a}", hold_b.token());
    let lock = until(&env.locks(), LOCK, WAIT, "expiration counted", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.stats.expirations == 1)
    })
    .await;
    assert_eq!(lock.status.expect("status").holder.expect("holder").fencing_token, hold_b.token());
    hold_b.release().await;
}

#[tokio::test]
async fn a_restarted_controller_keeps_tokens_queue_order_and_never_expires_early() {
    let env = Env::new("restart").await;
    let mut controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, fast()).await;
    let (a, b, c) = (env.pod("a").await, env.pod("b").await, env.pod("c").await);
    env.wait_claim_rbac(&a).await;
    let mut grants = GrantLog::start(env.leases(), LOCK);

    let manual = ManualClaimant::claim(&a, env.name(), LOCK).await;
    let (token_a, _) = manual.confirm(LOCK).await;
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, Duration::from_secs(60)).await });
    until(&env.claims(), &b.identity().claim_name(LOCK), WAIT, "b's claim", |_| true).await;
    let claimant_c = c.claimant(env.name());
    let waiting_c = tokio::spawn(async move { claimant_c.acquire(LOCK, Duration::from_secs(60)).await });
    until(&env.claims(), &c.identity().claim_name(LOCK), WAIT, "c's claim", |_| true).await;

    // Mid-hold (a stopped renewing but is not yet expired) and mid-queue.
    controller.kill();
    let restarted = Timestamp::now();
    let _controller = env.controller(&["--leader-elect=false"]).await;

    let hold_b = waiting_b.await.expect("join").expect("b is granted after a expires");
    let lease = env.leases().get(LOCK).await.expect("lease");
    let granted_b = lease.spec.and_then(|s| s.acquire_time).expect("acquireTime").0;
    assert!(
        granted_b.duration_since(restarted) >= jiff::SignedDuration::from_secs(3),
        "the new controller expired a's hold {:?} after starting, before a full lease duration",
        granted_b.duration_since(restarted)
    );
    hold_b.release().await;
    let hold_c = waiting_c.await.expect("join").expect("c is granted after b");
    hold_c.release().await;

    let seen = grants.wait_for(3, WAIT).await;
    let holders: Vec<&str> = seen.iter().map(|g| g.holder.as_str()).collect();
    assert_eq!(holders, [a.identity().id, b.identity().id, c.identity().id], "queue order kept across the restart");
    assert_eq!(seen[0].token, token_a);
    assert!(seen.windows(2).all(|w| w[0].token < w[1].token), "no token reuse or regression: {seen:?}");
}

#[tokio::test]
async fn tokens_keep_rising_across_lease_deletion_and_lock_recreation() {
    let env = Env::new("recreate").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let claimant = a.claimant(env.name());
    let mut issued = Vec::new();

    let hold = claimant.acquire(LOCK, WAIT).await.expect("first grant");
    issued.push(hold.token());
    hold.release().await;

    // The lock Lease deleted by hand: recreated, and the next token is still higher.
    let leases = env.leases();
    let old_uid = leases.get(LOCK).await.expect("lease").uid();
    leases.delete(LOCK, &DeleteParams::default()).await.expect("delete the lock lease");
    until(&leases, LOCK, WAIT, "the lease re-created", |l: &Lease| l.uid() != old_uid).await;
    let hold = claimant.acquire(LOCK, WAIT).await.expect("grant after lease deletion");
    issued.push(hold.token());
    hold.release().await;

    // The DistributedLock deleted and re-created under the same name.
    let locks = env.locks();
    let old = locks.get(LOCK).await.expect("lock");
    locks.delete(LOCK, &DeleteParams::default()).await.expect("delete the lock");
    crate::support::watch::until_gone(&locks, LOCK, WAIT, "the lock deleted").await;
    let recreated = env.lock(LOCK, DistributedLockSpec::default()).await;
    assert_ne!(recreated.uid(), old.uid());
    let hold = claimant.acquire(LOCK, WAIT).await.expect("grant after lock re-creation");
    issued.push(hold.token());
    hold.release().await;

    assert!(issued.windows(2).all(|w| w[0] < w[1]), "tokens must strictly increase: {issued:?}");
    let lease = leases.get(LOCK).await.expect("lease");
    let owner = &lease.owner_references()[0];
    assert_eq!(Some(&owner.uid), recreated.uid().as_ref(), "the lease belongs to the new lock");
}

async fn leader_of(controllers: &[&crate::support::LeaseholdProcess]) -> Vec<usize> {
    let mut leaders = Vec::new();
    for (i, c) in controllers.iter().enumerate() {
        if c.metric("leasehold_controller_leader").await == Some(1.0) {
            leaders.push(i);
        }
    }
    leaders
}

async fn granted_by(env: &Env) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(env.ns.client.clone(), env.name());
    let mut list = events.list(&ListParams::default()).await.expect("list events").items;
    list.retain(|e| e.reason.as_deref() == Some("Granted"));
    list.into_iter().filter_map(|e| e.reporting_instance).collect()
}

#[tokio::test]
async fn two_replicas_elect_one_granter_and_fail_over() {
    let env = Env::new("ha").await;
    let election = ["--election-lease-duration=3s", "--election-renew-deadline=2s", "--election-retry-period=500ms"];
    let first = env.controller(&election).await;
    let second = env.controller(&election).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let a = env.pod("a").await;

    let leaders = eventually("exactly one leader", WAIT, || async {
        let leaders = leader_of(&[&first, &second]).await;
        if leaders.len() == 1 { Ok(leaders) } else { Err(format!("leaders: {leaders:?}")) }
    })
    .await;
    let (mut leader, follower) = if leaders[0] == 0 { (first, second) } else { (second, first) };
    env.wait_claim_rbac(&a).await;
    let claimant = a.claimant(env.name());
    for _ in 0..3 {
        claimant.acquire(LOCK, WAIT).await.expect("granted by the leader").release().await;
    }
    // The recorder folds repeated events into one series per reporting instance.
    let reporters = eventually("Granted events", WAIT, || async {
        let r = granted_by(&env).await;
        if r.is_empty() { Err("none yet".to_owned()) } else { Ok(r) }
    })
    .await;
    assert!(reporters.iter().all(|r| *r == leader.name), "only the leader grants: {reporters:?}");

    leader.kill();
    eventually("the follower leads", WAIT, || async {
        if follower.metric("leasehold_controller_leader").await == Some(1.0) { Ok(()) } else { Err("not yet") }
    })
    .await;
    let hold = claimant.acquire(LOCK, WAIT).await.expect("grants continue after failover");
    hold.release().await;
    let reporters = eventually("a Granted event by the new leader", WAIT, || async {
        let r = granted_by(&env).await;
        if r.contains(&follower.name) { Ok(r) } else { Err(format!("{r:?}")) }
    })
    .await;
    assert_eq!(reporters.iter().filter(|r| **r == follower.name).count(), 1);
}

#[tokio::test]
async fn a_foreign_lease_is_reported_as_conflict_and_left_untouched() {
    let env = Env::new("conflict").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    let foreign = Lease {
        metadata: ObjectMeta { name: Some(LOCK.into()), ..ObjectMeta::default() },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some("someone-else".into()),
            ..Default::default()
        }),
    };
    let foreign = env.leases().create(&PostParams::default(), &foreign).await.expect("create the foreign lease");
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let lock = until(&env.locks(), LOCK, WAIT, "a LeaseConflict condition", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "LeaseConflict")
        })
    })
    .await;
    assert!(lock.status.expect("status").holder.is_none());
    let table = kubectl_get_dlock(&env).await;
    let header: Vec<&str> = table.lines().next().expect("a header").split_whitespace().collect();
    let row: Vec<&str> = table.lines().nth(1).expect("a row").split_whitespace().collect();
    assert_eq!((header[1], row[1]), ("READY", "False"), "`kubectl get dlock` shows it not Ready:\n{table}");
    let after = env.leases().get(LOCK).await.expect("the foreign lease");
    assert_eq!(after.resource_version(), foreign.resource_version(), "the foreign lease was modified");
    assert!(after.owner_references().is_empty());
    let events: Api<Event> = Api::namespaced(env.ns.client.clone(), env.name());
    eventually("a LeaseConflict event", WAIT, || async {
        let list = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        if list.items.iter().any(|e| e.reason.as_deref() == Some("LeaseConflict")) {
            Ok(())
        } else {
            Err("none".to_owned())
        }
    })
    .await;
}

#[tokio::test]
async fn invalid_specs_are_rejected_with_a_message_naming_the_field() {
    let env = Env::new("invalid").await;
    let resource = ApiResource::erase::<DistributedLock>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(env.ns.client.clone(), env.name(), &resource);
    let cases = [
        (
            "l1",
            json!({"leaseDurationSeconds": 10, "renewDeadlineSeconds": 10}),
            "spec.leaseDurationSeconds must be greater than spec.renewDeadlineSeconds",
        ),
        (
            "l2",
            json!({"leaseDurationSeconds": 15, "renewDeadlineSeconds": 2, "retryPeriodSeconds": 2}),
            "spec.renewDeadlineSeconds must be greater than 1.2 x spec.retryPeriodSeconds",
        ),
        ("l3", json!({"leaseDurationSeconds": 1}), "spec.leaseDurationSeconds"),
        ("l4", json!({"retryPeriodSeconds": 0}), "spec.retryPeriodSeconds"),
        ("l5", json!({"fairness": "Random"}), "spec.fairness"),
        ("l6", json!({"maxHoldSeconds": -5}), "spec.maxHoldSeconds"),
        ("l7", json!({"clients": [""]}), "spec.clients[0]"),
        ("bad.name", json!({}), "metadata.name must be a DNS label"),
        (&"x".repeat(64), json!({}), "metadata.name must be a DNS label"),
    ];
    for (name, spec, expected) in cases {
        let mut object = DynamicObject::new(name, &resource);
        object.data = json!({"spec": spec});
        match api.create(&PostParams::default(), &object).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{name}: {}", status.message);
                assert!(status.message.contains(expected), "{name}: {:?} does not name {expected:?}", status.message);
            }
            other => panic!("{name} with {spec} was accepted: {other:?}"),
        }
    }
    assert!(env.locks().list(&ListParams::default()).await.expect("list").items.is_empty(), "nothing was created");
}

#[tokio::test]
async fn a_contended_locks_status_counts_every_grant_and_release_once() {
    let env = Env::new("counted").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let pods = [env.pod("a").await, env.pod("b").await, env.pod("c").await];
    env.wait_claim_rbac(&pods[0]).await;
    let mut grants = GrantLog::start(env.leases(), LOCK);
    // Three claimants take the lock in turn, each queuing again as soon as it let go: while
    // they wait, the lock's status changes are held back and written together.
    const ROUNDS: usize = 8;
    let mut workers = Vec::new();
    for pod in &pods {
        let claimant = pod.claimant(env.name());
        workers.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let hold = claimant.acquire(LOCK, Duration::from_secs(60)).await.expect("acquire");
                assert!(hold.release().await.was_held);
            }
        }));
    }
    for worker in workers {
        worker.await.expect("a claimant's rounds");
    }
    let cycles = pods.len() * ROUNDS;
    let seen = grants.wait_for(cycles, WAIT).await;
    assert_eq!(seen.len(), cycles, "grants on the Lease");
    let lock = until(&env.locks(), LOCK, WAIT, "status free with nobody waiting", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.holders.is_empty() && s.queue_length == 0)
    })
    .await;
    let status = lock.status.expect("status");
    let count = i64::try_from(cycles).expect("a count");
    assert_eq!(status.stats.grants, count, "grants counted: {:?}", status.stats);
    assert_eq!(status.stats.releases, count, "releases counted: {:?}", status.stats);
    assert_eq!(status.stats.expirations + status.stats.forced_releases, 0, "{:?}", status.stats);
    assert_eq!(status.fencing_token, seen.last().map(|g| g.token), "the last token issued");
}

#[tokio::test]
async fn idle_and_steadily_held_locks_cause_no_status_writes_for_30_seconds() {
    let env = Env::new("quiet").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock("idle", fast()).await;
    env.lock("held", fast()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire("held", WAIT).await.expect("acquire");
    let settled = until(&env.locks(), "held", WAIT, "the holder in status", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.holder.as_ref()).is_some_and(|h| h.fencing_token == hold.token())
    })
    .await;
    let idle =
        until(&env.locks(), "idle", WAIT, "the idle lock's status", |l: &DistributedLock| l.status.is_some()).await;
    let renew_before = env.leases().get("held").await.expect("lease").spec.and_then(|s| s.renew_time).expect("renewed");

    let expected = [(idle.name_any(), idle.resource_version()), (settled.name_any(), settled.resource_version())];
    let mut events = watcher(env.locks(), watcher::Config::default()).applied_objects().boxed();
    let mut writes = Vec::new();
    let quiet = tokio::time::sleep(Duration::from_secs(30));
    tokio::pin!(quiet);
    loop {
        tokio::select! {
            _ = &mut quiet => break,
            Some(Ok(lock)) = events.next() => {
                if !expected.contains(&(lock.name_any(), lock.resource_version())) {
                    writes.push(format!("{} rv {:?}: {:?}", lock.name_any(), lock.resource_version(), lock.status));
                }
            }
        }
    }
    assert!(writes.is_empty(), "status writes during 30 s of quiet: {writes:#?}");
    let renew_after = env.leases().get("held").await.expect("lease").spec.and_then(|s| s.renew_time).expect("renewed");
    assert!(
        renew_after.0.duration_since(renew_before.0) >= jiff::SignedDuration::from_secs(25),
        "the hold kept renewing"
    );
    assert!(hold.is_held());
    hold.release().await;
}

/// Removes `lock`'s status at once, as an administrator could; returns the status the
/// controller writes again.
async fn remove_status(env: &Env, lock: &str) -> DistributedLockStatus {
    let removal = Patch::Merge(json!({ "status": null }));
    env.locks().patch_status(lock, &PatchParams::default(), &removal).await.expect("remove the status");
    until(&env.locks(), lock, WAIT, "the status written again", |l: &DistributedLock| l.status.is_some())
        .await
        .status
        .expect("status")
}

#[tokio::test]
async fn a_free_locks_status_removed_right_after_it_was_written_is_written_again() {
    let env = Env::new("rewrite-free").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, fast()).await;
    let written = until(&env.locks(), LOCK, WAIT, "the lock's first status", |l: &DistributedLock| l.status.is_some())
        .await
        .status
        .expect("status");
    let restored = remove_status(&env, LOCK).await;
    // The same status, but for when its conditions changed: a lock at rest is not kept in
    // the controller's memory, so it learns them anew when it writes them again.
    let unstamped = |mut status: DistributedLockStatus| {
        status
            .conditions
            .iter_mut()
            .for_each(|c| c.last_transition_time = written.conditions[0].last_transition_time.clone());
        status
    };
    assert_eq!(unstamped(restored.clone()), unstamped(written.clone()), "the status written again is the one removed");
    for (again, before) in restored.conditions.iter().zip(&written.conditions) {
        assert!(again.last_transition_time.0 >= before.last_transition_time.0, "{again:?} went back in time");
    }
}

#[tokio::test]
async fn a_held_locks_status_removed_right_after_it_was_written_is_written_again_unchanged() {
    // The controller remembers the status it wrote for a held lock, and a reconcile that
    // does not see it waits a moment for the write's own event: a status removed meanwhile
    // must still be put back once that moment has passed, not taken for the write on its way.
    let env = Env::new("rewrite-held").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, fast()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("acquire");
    let written = until(&env.locks(), LOCK, WAIT, "the holder in status", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.holder.as_ref()).is_some_and(|h| h.fencing_token == hold.token())
    })
    .await
    .status
    .expect("status");
    let restored = remove_status(&env, LOCK).await;
    assert_eq!(restored, written, "the status written again is the one removed");
    assert!(hold.is_held());
    hold.release().await;
}

#[tokio::test]
async fn the_controllers_finalizer_and_status_are_under_its_own_field_manager() {
    let env = Env::new("managers").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, fast()).await;
    let lock = until(&env.locks(), LOCK, WAIT, "the finalizer and the status", |l: &DistributedLock| {
        l.status.is_some() && l.finalizers().iter().any(|f| f == leasehold::crd::FINALIZER)
    })
    .await;
    let entries = lock.metadata.managed_fields.clone().unwrap_or_default();
    let owners = |field: &str| -> Vec<String> {
        entries
            .iter()
            .filter(|e| e.fields_v1.as_ref().is_some_and(|f| f.0.to_string().contains(field)))
            .map(|e| e.manager.clone().unwrap_or_default())
            .collect()
    };
    let controller = [leasehold::crd::MANAGER_CONTROLLER];
    assert_eq!(owners("\"f:finalizers\""), controller, "the finalizer's field managers: {entries:#?}");
    assert_eq!(owners("\"f:status\""), controller, "the status's field managers: {entries:#?}");
}

#[tokio::test]
async fn only_the_locks_clients_are_granted() {
    let env = Env::new("clients").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.lock(LOCK, DistributedLockSpec { clients: vec![a.service_account.clone()], ..DistributedLockSpec::default() })
        .await;
    env.wait_claim_rbac(&a).await;
    // RBAC binds only the lock's clients: b may not even claim.
    match b.claimant(env.name()).acquire(LOCK, Duration::from_secs(3)).await {
        Err(leasehold::claim::AcquireError::Forbidden { .. }) => {}
        other => panic!("b claimed a lock whose clients exclude it: {:?}", other.map(|h| h.token())),
    }
    // Another lock open to everyone widens the namespace's RBAC; the controller still
    // grants `orders` only to its clients.
    env.lock("open", DistributedLockSpec::default()).await;
    env.wait_claim_rbac(&b).await;
    let refused = b.claimant(env.name()).acquire(LOCK, Duration::from_secs(4)).await;
    assert!(
        matches!(refused, Err(leasehold::claim::AcquireError::Timeout { .. })),
        "b was granted: {:?}",
        refused.map(|h| h.token())
    );
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a, a client, is granted");
    hold.release().await;
    let open = b.claimant(env.name()).acquire("open", WAIT).await.expect("b may hold the open lock");
    open.release().await;
}

#[tokio::test]
async fn lock_claims_are_validated_by_the_apiserver() {
    let env = Env::new("claim-schema").await;
    let resource = ApiResource::erase::<leasehold::crd::LockClaim>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(env.ns.client.clone(), env.name(), &resource);
    let claim = |name: &str, spec: serde_json::Value| {
        let mut object = DynamicObject::new(name, &resource);
        object.data = json!({"spec": spec});
        object
    };
    let good = json!({"lock": LOCK, "claimant": "u/u-host-1", "requestTime": "2026-11-30T10:00:05.250000Z",
                      "renewTime": "2026-11-30T10:00:05.250000Z", "ttlSeconds": 45});
    let mut bad_ttl = good.clone();
    bad_ttl["ttlSeconds"] = json!(0);
    let mut no_lock = good.clone();
    no_lock.as_object_mut().expect("object").remove("lock");
    let cases = [
        ("other.u-host-1", good.clone(), "metadata.name must be <spec.lock>.<pod-uid> or <spec.lock>.u-<suffix>"),
        ("orders.u-host-1", bad_ttl, "spec.ttlSeconds"),
        ("orders.u-host-1", no_lock, "spec.lock"),
    ];
    for (name, spec, expected) in cases {
        match api.create(&PostParams::default(), &claim(name, spec.clone())).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{name}: {}", status.message);
                assert!(status.message.contains(expected), "{name}: {:?} does not name {expected:?}", status.message);
            }
            other => panic!("{name} with {spec} was accepted: {other:?}"),
        }
    }
    let created =
        api.create(&PostParams::default(), &claim("orders.u-host-1", good.clone())).await.expect("a valid claim");
    // A refresh may change renewTime and ttlSeconds; lock, claimant, pod and requestTime never change.
    let mut refreshed = created.clone();
    refreshed.data["spec"]["renewTime"] = json!("2026-11-30T10:00:20.000000Z");
    refreshed.data["spec"]["ttlSeconds"] = json!(30);
    let refreshed = api.replace("orders.u-host-1", &PostParams::default(), &refreshed).await.expect("a refresh");
    for (field, value) in
        [("claimant", json!("u/u-host-2")), ("requestTime", json!("2026-11-30T09:00:00.000000Z")), ("pod", json!("p"))]
    {
        let mut changed = refreshed.clone();
        changed.data["spec"][field] = value;
        match api.replace("orders.u-host-1", &PostParams::default(), &changed).await {
            Err(kube::Error::Api(status)) => {
                assert!(status.message.contains(&format!("spec.{field} is immutable")), "{field}: {}", status.message)
            }
            other => panic!("changing spec.{field} was accepted: {other:?}"),
        }
    }
}
