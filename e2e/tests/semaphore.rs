//! Locks with several permits (semaphores, read-write locks) against the real control
//! plane: at most `spec.permits` hold at once, each on a slot Lease of its own, the rest
//! served in claim order as slots free up, with tokens rising across the whole lock; a
//! writer holds every permit alone; through the claimant API, the sidecar (its `mode`) and
//! `leasehold run`; fenced per slot; and a shrink that revokes nobody.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams};
use leasehold::crd::{ANNOTATION_TOKEN, ClaimMode, DistributedLock, DistributedLockSpec, LABEL_FENCED_BY, LABEL_LOCK};
use leasehold_harness::Supervised;
use serde_json::json;

use crate::support::watch::{until, until_gone};
use crate::support::{Env, leasehold_bin};

const LOCK: &str = "pool";
const WAIT: Duration = Duration::from_secs(30);

fn permits(n: i32) -> DistributedLockSpec {
    DistributedLockSpec { permits: n, ..DistributedLockSpec::default() }
}

async fn status_where(
    env: &Env,
    what: &str,
    condition: impl Fn(&leasehold::crd::DistributedLockStatus) -> bool,
) -> DistributedLock {
    until(&env.locks(), LOCK, WAIT, what, move |l: &DistributedLock| l.status.as_ref().is_some_and(&condition)).await
}

async fn slot_lease_names(env: &Env) -> BTreeSet<String> {
    let listed = env.leases().list(&ListParams::default().labels(&format!("{LABEL_LOCK}={LOCK}"))).await.expect("list");
    listed.items.into_iter().filter_map(|l: Lease| l.metadata.name).collect()
}

#[tokio::test]
async fn a_semaphore_holds_up_to_its_permits_and_serves_the_rest_in_claim_order_with_rising_tokens() {
    let env = Env::new("sem-basic").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, permits(3)).await;
    let pods = [env.pod("a").await, env.pod("b").await, env.pod("c").await, env.pod("d").await];
    env.wait_claim_rbac(&pods[0]).await;

    // Three hold at once, each on a slot of its own, tokens rising in grant order.
    let mut holds = Vec::new();
    for pod in &pods[..3] {
        holds.push(pod.claimant(env.name()).acquire(LOCK, WAIT).await.expect("granted beside the others"));
    }
    let slots: BTreeSet<u32> = holds.iter().map(|h| h.slot()).collect();
    assert_eq!(slots, BTreeSet::from([0, 1, 2]), "one slot each");
    assert!(holds.windows(2).all(|w| w[1].token() > w[0].token()), "tokens rise across the lock");
    assert!(holds.iter().all(|h| h.is_held()), "all three hold at once");
    assert_eq!(slot_lease_names(&env).await, BTreeSet::from(["pool".into(), "pool.1".into(), "pool.2".into()]));

    // The fourth waits; status lists every holder and the waiter.
    let claimant_d = pods[3].claimant(env.name());
    let waiting_d = tokio::spawn(async move { claimant_d.acquire(LOCK, Duration::from_secs(60)).await });
    let lock =
        status_where(&env, "three holders and one waiter", |s| s.holders.len() == 3 && s.queue_length == 1).await;
    let status = lock.status.expect("status");
    assert_eq!(status.held_permits.as_deref(), Some("3/3"));
    let listed: Vec<(i32, i64)> = status.holders.iter().map(|h| (h.slot, h.fencing_token)).collect();
    let mut expected: Vec<(i32, i64)> = holds.iter().map(|h| (h.slot() as i32, h.token())).collect();
    expected.sort();
    assert_eq!(listed, expected, "every holder with its slot and token");
    assert_eq!(status.waiters.first().and_then(|w| w.pod.as_deref()), Some("d"));
    let table = env.cp.kubectl().args(["get", "dlock", LOCK, "-n", env.name()]).output().expect("kubectl");
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert_eq!(table.lines().nth(1).and_then(|row| row.split_whitespace().nth(3)), Some("3/3"), "{table}");
    assert!(!waiting_d.is_finished(), "d was granted beyond the permits");

    // b lets go: d is granted b's slot, with a token above every earlier one.
    let highest = holds.iter().map(|h| h.token()).max().expect("tokens");
    let b = holds.remove(1);
    let b_slot = b.slot();
    assert!(b.release().await.was_held);
    let d = waiting_d.await.expect("join").expect("d is granted once a permit frees");
    assert_eq!(d.slot(), b_slot, "the freed slot");
    assert!(d.token() > highest, "d's token {} is above every earlier token ({highest})", d.token());
    assert!(holds.iter().all(|h| h.is_held()), "the others kept holding");
    for hold in holds {
        hold.release().await;
    }
    d.release().await;
}

#[tokio::test]
async fn the_sidecar_and_leasehold_run_hold_a_permit_and_say_which() {
    let env = Env::new("sem-shells").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, permits(2)).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;

    let sidecar = env.sidecar(&a, &[]).await;
    let (status, held) = sidecar.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200, "{held}");
    let sidecar_slot = held["slot"].as_u64().expect("the answer names the slot");
    assert!(sidecar_slot < 2, "{held}");

    // `leasehold run` of another pod holds the other permit meanwhile, and tells its
    // command which slot and token.
    let kubeconfig = env.log_dir().join("kubeconfig-run-b");
    env.ns.kubeconfig_for_token(&b.token, &kubeconfig).expect("kubeconfig");
    let out = env.log_dir().join("run-b.out");
    let mut command = Command::new(leasehold_bin());
    command
        .args(["run", "--lock", &format!("{}/{LOCK}", env.name()), "--wait", "30s", "--"])
        .args(["sh", "-c", &format!("echo $LEASEHOLD_SLOT $LEASEHOLD_FENCING_TOKEN > {}", out.display())])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn");
    let mut run = Supervised::spawn("run-b", command, &env.log_dir().join("run-b.log")).expect("start run");
    let exit = run.wait_exit(Duration::from_secs(60)).await.expect("run finishes");
    assert_eq!(exit.code(), Some(0), "{}", run.log_tail(20));
    let written = std::fs::read_to_string(&out).expect("the command ran");
    let fields: Vec<i64> = written.split_whitespace().map(|f| f.parse().expect("a number")).collect();
    let [slot, token] = fields.as_slice() else { panic!("{written:?}") };
    assert_eq!(*slot as u64, 1 - sidecar_slot, "the other permit, while the sidecar holds its own");
    assert!(*token > held["fencingToken"].as_i64().expect("a token"), "granted after the sidecar's");
    let (status, released) = sidecar.release(LOCK).await;
    assert_eq!((status, released["wasHeld"].as_bool()), (200, Some(true)), "{released}");
}

#[tokio::test]
async fn shrinking_the_permits_revokes_nobody_and_grants_again_only_below_the_new_number() {
    let env = Env::new("sem-shrink").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, permits(3)).await;
    let pods = [env.pod("a").await, env.pod("b").await, env.pod("c").await, env.pod("d").await];
    env.wait_claim_rbac(&pods[0]).await;
    let mut holds = Vec::new();
    for pod in &pods[..3] {
        holds.push(pod.claimant(env.name()).acquire(LOCK, WAIT).await.expect("granted"));
    }
    let claimant_d = pods[3].claimant(env.name());
    let waiting_d = tokio::spawn(async move { claimant_d.acquire(LOCK, Duration::from_secs(90)).await });
    status_where(&env, "d queued", |s| s.queue_length == 1).await;

    // Down to one permit: the three holds stand, nobody is revoked.
    let edit = json!({"spec": {"permits": 1}});
    let edited = env.locks().patch(LOCK, &PatchParams::default(), &Patch::Merge(&edit)).await.expect("shrink");
    let generation = edited.metadata.generation;
    let lock = status_where(&env, "the shrink observed", move |s| s.observed_generation == generation).await;
    let status = lock.status.expect("status");
    assert_eq!((status.holders.len(), status.held_permits.as_deref()), (3, Some("3/1")));
    assert_eq!(status.stats.expirations + status.stats.forced_releases, 0, "nobody revoked");
    assert!(holds.iter().all(|h| h.is_held()));

    // Two let go: one still holds, which is the new number: d still waits.
    let last = holds.pop().expect("a hold");
    for hold in holds {
        assert!(hold.release().await.was_held);
    }
    status_where(&env, "one holder left", |s| s.holders.len() == 1 && s.stats.releases == 2).await;
    assert!(!waiting_d.is_finished(), "d was granted while as many held as the permits");
    assert!(last.is_held());

    // The last lets go: d is granted slot 0, and the slot Leases above it go.
    let last_token = last.token();
    assert!(last.release().await.was_held);
    let d = waiting_d.await.expect("join").expect("d is granted");
    assert_eq!(d.slot(), 0);
    assert!(d.token() > last_token);
    until_gone(&env.leases(), "pool.1", WAIT, "slot 1's Lease deleted").await;
    until_gone(&env.leases(), "pool.2", WAIT, "slot 2's Lease deleted").await;
    d.release().await;
}

async fn fenced_write(env: &Env, name: &str, fenced_by: &str, token: i64) -> kube::Result<ConfigMap> {
    let cms: Api<ConfigMap> = Api::namespaced(env.ns.client.clone(), env.name());
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {LABEL_FENCED_BY: fenced_by},
                     "annotations": {ANNOTATION_TOKEN: token.to_string()}},
        "data": {"writer": token.to_string()},
    });
    cms.patch(name, &PatchParams::apply("writer").force(), &Patch::Apply(&cm)).await
}

fn refused(result: kube::Result<ConfigMap>) -> String {
    match result {
        Err(kube::Error::Api(s)) => s.message,
        other => panic!("the write was admitted: {other:?}"),
    }
}

#[tokio::test]
async fn an_object_fenced_per_slot_takes_only_that_slots_current_token() {
    let env = Env::new("sem-fence").await;
    let _controller = env.webhook_controller(None, &[]).await;
    env.lock(LOCK, permits(2)).await;
    let pods = [env.pod("a").await, env.pod("b").await, env.pod("c").await];
    env.wait_claim_rbac(&pods[0]).await;
    let a = pods[0].claimant(env.name()).acquire(LOCK, WAIT).await.expect("a granted");
    let b = pods[1].claimant(env.name()).acquire(LOCK, WAIT).await.expect("b granted");
    let (fence_a, fence_b) = (format!("{LOCK}.{}", a.slot()), format!("{LOCK}.{}", b.slot()));

    // Each holder writes the row of its slot with its token. The other's token is refused
    // there, though it is a valid token of the lock.
    fenced_write(&env, "row-a", &fence_a, a.token()).await.expect("a writes its slot's row");
    fenced_write(&env, "row-b", &fence_b, b.token()).await.expect("b writes its slot's row");
    let message = refused(fenced_write(&env, "row-a", &fence_a, b.token()).await);
    assert!(message.contains(&fence_a), "{message}");

    // a's slot changes hands: a's token is stale there at once; the new holder writes.
    let (a_slot, a_token) = (a.slot(), a.token());
    assert!(a.release().await.was_held);
    let c = pods[2].claimant(env.name()).acquire(LOCK, WAIT).await.expect("c granted the freed slot");
    assert_eq!(c.slot(), a_slot);
    refused(fenced_write(&env, "row-a", &fence_a, a_token).await);
    fenced_write(&env, "row-a", &fence_a, c.token()).await.expect("the slot's new holder writes");
    fenced_write(&env, "row-b", &fence_b, b.token()).await.expect("b's slot is untouched");

    // A fence naming no slot a lock can have is refused, as a lock that does not exist.
    let message = refused(fenced_write(&env, "row-x", &format!("{LOCK}.01"), c.token()).await);
    assert!(message.contains("pool.01"), "{message}");
    b.release().await;
    c.release().await;
}

#[tokio::test]
async fn a_writer_holds_every_permit_alone_and_readers_that_queued_behind_it_wait_for_it() {
    let env = Env::new("sem-rw").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, permits(3)).await;
    let [r1, r2, w, r3, w2] =
        [env.pod("r1").await, env.pod("r2").await, env.pod("w").await, env.pod("r3").await, env.pod("w2").await];
    env.wait_claim_rbac(&r1).await;
    let reader_1 = r1.claimant(env.name()).acquire_in(LOCK, WAIT, ClaimMode::Read).await.expect("r1 reads");
    let reader_2 = r2.claimant(env.name()).acquire(LOCK, WAIT).await.expect("r2 reads beside r1");

    // A writer queues, then a reader behind it: both wait, though a permit is free.
    let claimant_w = w.claimant(env.name());
    let writing =
        tokio::spawn(async move { claimant_w.acquire_in(LOCK, Duration::from_secs(60), ClaimMode::Write).await });
    until(&env.claims(), &w.identity().claim_name(LOCK), WAIT, "the writer's claim", |_| true).await;
    let claimant_r3 = r3.claimant(env.name());
    let reading = tokio::spawn(async move { claimant_r3.acquire(LOCK, Duration::from_secs(90)).await });
    let lock = status_where(&env, "two readers, a writer and a reader waiting", |s| {
        s.holders.len() == 2 && s.queue_length == 2
    })
    .await;
    let status = lock.status.expect("status");
    let waiting: Vec<(Option<&str>, Option<ClaimMode>)> =
        status.waiters.iter().map(|w| (w.pod.as_deref(), w.mode)).collect();
    assert_eq!(waiting, [(Some("w"), Some(ClaimMode::Write)), (Some("r3"), None)]);
    assert!(!writing.is_finished() && !reading.is_finished(), "granted beside the readers");

    // The readers leave: the writer alone, on slot 0, above every earlier token.
    let highest = reader_1.token().max(reader_2.token());
    assert!(reader_1.release().await.was_held && reader_2.release().await.was_held);
    let writer = writing.await.expect("join").expect("the writer is granted once the readers are gone");
    assert_eq!(writer.slot(), 0);
    assert!(writer.token() > highest, "a write grant's token is above every token before it");
    let lock =
        status_where(&env, "the writer holding, r3 waiting", |s| s.holders.len() == 1 && s.queue_length == 1).await;
    let holder = &lock.status.expect("status").holders[0];
    assert_eq!((holder.pod.as_deref(), holder.mode, holder.slot), (Some("w"), Some(ClaimMode::Write), 0));
    assert!(!reading.is_finished(), "a reader beside the writer");

    // The writer leaves: r3 reads. `leasehold run --mode write` then waits for r3.
    let writer_token = writer.token();
    assert!(writer.release().await.was_held);
    let reader_3 = reading.await.expect("join").expect("r3 reads once the writer is gone");
    assert!(reader_3.token() > writer_token);
    let kubeconfig = env.log_dir().join("kubeconfig-run-w2");
    env.ns.kubeconfig_for_token(&w2.token, &kubeconfig).expect("kubeconfig");
    let out = env.log_dir().join("run-w2.out");
    let mut command = Command::new(leasehold_bin());
    command
        .args(["run", "--mode", "write", "--lock", &format!("{}/{LOCK}", env.name()), "--wait", "60s", "--"])
        .args(["sh", "-c", &format!("echo $LEASEHOLD_SLOT $LEASEHOLD_FENCING_TOKEN > {}", out.display())])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn");
    let mut run = Supervised::spawn("run-w2", command, &env.log_dir().join("run-w2.log")).expect("start run");
    status_where(&env, "the run queued behind r3", |s| s.queue_length == 1).await;
    assert!(!out.exists(), "the writer's command ran beside a reader");
    let r3_token = reader_3.token();
    assert!(reader_3.release().await.was_held);
    let exit = run.wait_exit(Duration::from_secs(60)).await.expect("run finishes");
    assert_eq!(exit.code(), Some(0), "{}", run.log_tail(20));
    let written = std::fs::read_to_string(&out).expect("the command ran");
    let fields: Vec<i64> = written.split_whitespace().map(|f| f.parse().expect("a number")).collect();
    assert_eq!(fields.first(), Some(&0), "a writer holds slot 0: {written:?}");
    assert!(fields.get(1).is_some_and(|t| *t > r3_token), "{written:?}");
}

#[tokio::test]
async fn a_sidecar_caller_asks_for_write_and_holds_every_permit_alone_a_bad_mode_changes_nothing() {
    let env = Env::new("sem-side-rw").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock(LOCK, permits(2)).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let (reader, writer) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);

    // A mode the API does not know is refused by name, and nothing is claimed.
    let (status, refused) = writer.acquire_with(LOCK, json!({"mode": "exclusive", "waitSeconds": 5})).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("invalid_mode")), "{refused}");
    assert_eq!(refused["error"]["message"], "mode must be \"read\" or \"write\", got \"exclusive\"");
    let claims = env.claims().list(&ListParams::default()).await.expect("list claims");
    assert!(claims.items.is_empty(), "a refused acquire claimed: {:?}", claims.items);

    let (status, read) = reader.acquire_with(LOCK, json!({"waitSeconds": 30})).await;
    assert_eq!((status, read["mode"].as_str()), (200, Some("read")), "{read}");

    // The writer waits for the reader, though a permit is free.
    let writing = tokio::spawn(async move {
        let answer = writer.acquire_with(LOCK, json!({"mode": "write", "waitSeconds": 60})).await;
        (writer, answer)
    });
    let lock = status_where(&env, "the writer queued", |s| s.queue_length == 1).await;
    let waiter = &lock.status.expect("status").waiters[0];
    assert_eq!((waiter.pod.as_deref(), waiter.mode), (Some("b"), Some(ClaimMode::Write)));
    assert!(!writing.is_finished(), "a writer granted beside a reader");

    let (status, released) = reader.release(LOCK).await;
    assert_eq!((status, released["wasHeld"].as_bool()), (200, Some(true)), "{released}");
    let (writer, (status, written)) = writing.await.expect("join");
    assert_eq!(
        (status, written["mode"].as_str(), written["slot"].as_u64()),
        (200, Some("write"), Some(0)),
        "{written}"
    );
    assert!(written["fencingToken"].as_i64() > read["fencingToken"].as_i64(), "{written} after {read}");
    let lock = status_where(&env, "the writer alone", |s| s.holders.len() == 1).await;
    let holder = &lock.status.expect("status").holders[0];
    assert_eq!((holder.pod.as_deref(), holder.mode), (Some("b"), Some(ClaimMode::Write)));

    // A reader now waits for the writer.
    let reading = tokio::spawn(async move { reader.acquire_with(LOCK, json!({"waitSeconds": 60})).await });
    status_where(&env, "the reader queued behind the writer", |s| s.queue_length == 1).await;
    assert!(!reading.is_finished(), "a reader granted beside the writer");
    let (status, released) = writer.release(LOCK).await;
    assert_eq!((status, released["wasHeld"].as_bool()), (200, Some(true)), "{released}");
    let (status, read_again) = reading.await.expect("join");
    assert_eq!((status, read_again["mode"].as_str()), (200, Some("read")), "{read_again}");
}
