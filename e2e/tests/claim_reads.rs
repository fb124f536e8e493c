//! What a waiting claimant reads, against the real control plane, recorded by a client
//! layer that notes every request it sends: its claim's refresh replaces the claim as its
//! create returned it, without reading it; a claim found gone at a refresh is made again
//! without reading it either; and the lock Lease is read at a refresh only when its watch
//! showed no change since the claimant began waiting (the watch may be dead).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use leasehold::claim::{Claimant, Hold, edit};
use leasehold::crd::LockClaim;
use tokio::task::JoinHandle;

use crate::controller::{ManualClaimant, fast};
use crate::drain::timing;
use crate::sidecar_owner::setup;
use crate::support::watch::until;
use crate::support::{Env, LeaseholdProcess, TestPod};

const LOCK: &str = "orders";
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_waiting_claimant_whose_watch_shows_the_holder_renewing_refreshes_its_claim_without_reading_the_claim_or_the_lease()
 {
    let (env, _controller, b, hold) = held_by_a("reads-alive").await;

    let mut waiting = Waiting::start(&env, &b).await;
    waiting.refreshed().await;
    assert!(hold.release().await.was_held);
    let (_, sent) = waiting.granted().await;

    let claim = claim_path(&env, &b);
    assert_eq!(kinds(&sent, &claims_path(&env)), ["POST", "PUT"], "b's claim requests: {sent:#?}");
    assert!(!sent.contains(&format!("GET {claim}")), "b read its claim: {sent:#?}");
    assert!(!sent.contains(&format!("GET {}", lease_path(&env))), "b read the Lease its watch showed: {sent:#?}");
}

#[tokio::test]
async fn a_waiting_claimant_whose_watch_shows_no_change_since_it_claimed_reads_the_lease_at_its_refresh() {
    // Lease 30 s: the holder below confirms once and never renews, so the Lease stays as
    // it is for 30 s. b's claim lives 90 s; its first refresh comes 15 s after it was made.
    let (env, _controller, a, b) = setup("reads-silent", timing(30, 20, 5)).await;
    let holder = ManualClaimant::claim(&a, env.name(), LOCK).await;
    holder.confirm(LOCK).await;
    // c queues first and is named next on the Lease: b's claim, behind it, changes nothing
    // there.
    let c = env.pod("c").await;
    let _c = ManualClaimant::claim(&c, env.name(), LOCK).await;
    let c_id = c.identity().id;
    crate::support::watch::until_named_next(&env.leases(), LOCK, &c_id, WAIT).await;

    let mut waiting = Waiting::start(&env, &b).await;
    waiting.refreshed().await;
    // c leaves (b is named next instead), then a lets go.
    env.claims().delete(&c.identity().claim_name(LOCK), &DeleteParams::default()).await.expect("delete c's claim");
    let b_id = b.identity().id;
    crate::support::watch::until_named_next(&env.leases(), LOCK, &b_id, WAIT).await;
    release_by_hand(&env, &a).await;
    let (_, sent) = waiting.granted().await;

    let lease = format!("GET {}", lease_path(&env));
    let refresh = sent.iter().position(|r| r.starts_with("PUT ") && r.contains("/lockclaims/"));
    let read = sent.iter().position(|r| *r == lease);
    assert!(matches!((refresh, read), (Some(p), Some(g)) if p < g), "b read the Lease after its refresh: {sent:#?}");
    assert_eq!(sent.iter().filter(|r| **r == lease).count(), 1, "one refresh, one read: {sent:#?}");
}

#[tokio::test]
async fn a_waiting_claimant_whose_claim_was_deleted_makes_it_again_at_its_refresh_without_reading_it() {
    let (env, _controller, b, hold) = held_by_a("reads-gone").await;

    let mut waiting = Waiting::start(&env, &b).await;
    let name = b.identity().claim_name(LOCK);
    env.claims().delete(&name, &DeleteParams::default()).await.expect("delete b's claim");
    waiting.recreated().await;
    assert!(hold.release().await.was_held);
    let (next, sent) = waiting.granted().await;
    next.release().await;

    assert_eq!(kinds(&sent, &claims_path(&env)), ["POST", "PUT", "POST"], "b's claim requests: {sent:#?}");
    assert!(!sent.contains(&format!("GET {}", claim_path(&env, &b))), "b read its claim: {sent:#?}");
}

/// A namespace `prefix`-… with a controller and a lock of lease 3 s held by pod a, whose
/// claimant renews it every second: a waiter's watch shows a change every second, and a
/// waiter's claim lives 30 s and is refreshed 10 s after it was made. Returns pod b.
async fn held_by_a(prefix: &str) -> (Env, LeaseholdProcess, TestPod, Hold) {
    let (env, controller, a, b) = setup(prefix, fast()).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a holds");
    (env, controller, b, hold)
}

/// b's acquisition, waiting behind a's hold, through a client that records its requests;
/// and a watch of b's claim.
struct Waiting {
    acquiring: JoinHandle<Result<Hold, leasehold::claim::AcquireError>>,
    sent: Arc<Mutex<Vec<String>>>,
    claims: futures::stream::BoxStream<'static, Result<LockClaim, watcher::Error>>,
    /// The UID of b's first claim.
    first: Option<String>,
}

impl Waiting {
    async fn start(env: &Env, pod: &TestPod) -> Waiting {
        let name = pod.identity().claim_name(LOCK);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let claims = watcher(env.claims(), config).applied_objects().boxed();
        let (client, sent) = recording_client(env, pod).await;
        let claimant = Claimant::new(client, env.name(), pod.identity(), "leasehold-e2e");
        let acquiring = tokio::spawn(async move { claimant.acquire(LOCK, Duration::from_secs(90)).await });
        let mut waiting = Waiting { acquiring, sent, claims, first: None };
        waiting.first = waiting.claim_until("b's claim", |_| true).await.metadata.uid;
        waiting
    }

    /// Waits until b's claim shows its first refresh (a lifetime other than a new
    /// claim's 45 s).
    async fn refreshed(&mut self) {
        self.claim_until("b's claim refreshed", |c| c.spec.ttl_seconds != 45).await;
        assert!(!self.acquiring.is_finished(), "b's acquire ended while a held");
    }

    /// Waits until b's claim is made again after it was deleted: a claim of b's name
    /// with another UID.
    async fn recreated(&mut self) {
        let first = self.first.clone();
        self.claim_until("b's claim made again", |c| c.metadata.uid != first).await;
    }

    async fn claim_until(&mut self, what: &str, done: impl Fn(&LockClaim) -> bool) -> LockClaim {
        tokio::time::timeout(Duration::from_secs(40), async {
            while let Some(claim) = self.claims.next().await {
                let claim = claim.expect("watch b's claim");
                if done(&claim) {
                    return claim;
                }
            }
            panic!("the watch of b's claim ended")
        })
        .await
        .unwrap_or_else(|_| panic!("{what}: not within 40 s"))
    }

    /// b's hold once granted, and the requests b sent up to then.
    async fn granted(self) -> (Hold, Vec<String>) {
        let hold = self.acquiring.await.expect("join").expect("b is granted once a lets go");
        let sent = self.sent.lock().expect("requests").clone();
        (hold, sent)
    }
}

/// A client of `pod`'s that records the method and path of every request it sends.
async fn recording_client(env: &Env, pod: &TestPod) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let record = sent.clone();
    let recorder = tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
        record.lock().expect("requests").push(format!("{} {}", request.method(), request.uri().path()));
        request
    });
    let config = env.cp.config_with_token(&pod.token).await;
    let client = kube::client::ClientBuilder::try_from(config).expect("a client stack").with_layer(&recorder).build();
    (client, sent)
}

/// a lets go of a hold it confirmed by hand: its claim deleted, the holder cleared by CAS.
async fn release_by_hand(env: &Env, a: &TestPod) {
    let claims: Api<LockClaim> = Api::namespaced(a.client.clone(), env.name());
    claims.delete(&a.identity().claim_name(LOCK), &DeleteParams::default()).await.expect("delete a's claim");
    let leases: Api<Lease> = Api::namespaced(a.client.clone(), env.name());
    let held = until(&leases, LOCK, WAIT, "a's hold", |_| true).await;
    leases.replace(LOCK, &PostParams::default(), &edit::released(&held)).await.expect("a clears the holder");
}

/// The methods of the requests to paths under `prefix`, in order.
fn kinds(sent: &[String], prefix: &str) -> Vec<String> {
    sent.iter()
        .filter_map(|r| r.split_once(' '))
        .filter(|(_, path)| path.starts_with(prefix))
        .map(|(method, _)| method.to_owned())
        .collect()
}

fn claims_path(env: &Env) -> String {
    format!("/apis/leasehold.dev/v1alpha1/namespaces/{}/lockclaims", env.name())
}

fn claim_path(env: &Env, pod: &TestPod) -> String {
    format!("{}/{}", claims_path(env), pod.identity().claim_name(LOCK))
}

fn lease_path(env: &Env) -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{}/leases/{LOCK}", env.name())
}
