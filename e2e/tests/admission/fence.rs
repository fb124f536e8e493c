//! Fenced objects on the real apiserver: writes, relabelling and deletion need the current
//! token of the lock the object is fenced by; a deleted lock fences nothing.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use leasehold::crd::{ANNOTATION_TOKEN, DistributedLock, DistributedLockSpec, LABEL_FENCED_BY};
use serde_json::json;

use super::{LOCK, WAIT, denial};
use crate::support::admission::WebhookController;
use crate::support::watch::until_gone;
use crate::support::{Env, TestPod};
use leasehold::claim::Hold;

/// Writes ConfigMap `inventory` fenced by [`LOCK`] with `token` (server-side apply).
pub async fn fenced_write(cms: &Api<ConfigMap>, token: Option<i64>, value: &str) -> kube::Result<ConfigMap> {
    let mut annotations = serde_json::Map::new();
    if let Some(t) = token {
        annotations.insert(ANNOTATION_TOKEN.into(), json!(t.to_string()));
    }
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "inventory", "labels": {"leasehold.dev/fenced-by": LOCK}, "annotations": annotations},
        "data": {"stock": value},
    });
    cms.patch("inventory", &PatchParams::apply("writer").force(), &Patch::Apply(&cm)).await
}

/// Writes `labels` and `annotations` of ConfigMap `name` (a merge patch: `null` removes).
async fn relabel(
    cms: &Api<ConfigMap>,
    name: &str,
    lock: serde_json::Value,
    token: serde_json::Value,
) -> kube::Result<ConfigMap> {
    let patch = json!({"metadata": {"labels": {LABEL_FENCED_BY: lock}, "annotations": {ANNOTATION_TOKEN: token}}});
    cms.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await
}

/// a holds [`LOCK`] and writes the fenced ConfigMap with its token, then lets go and b
/// holds it: a's token (now stale) and b's hold.
async fn a_then_b(env: &Env, cms: &Api<ConfigMap>, a: &TestPod, b: &TestPod) -> (i64, leasehold::claim::Hold) {
    let hold_a = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires");
    let stale = hold_a.token();
    fenced_write(cms, Some(stale), "10").await.expect("a's write with the current token");
    hold_a.release().await;
    (stale, b.claimant(env.name()).acquire(LOCK, WAIT).await.expect("b acquires"))
}

/// A namespace `prefix`-… with the webhooks' controller, [`LOCK`] held by pod a, pod b,
/// and the namespace's ConfigMaps.
async fn held_by_a(prefix: &str) -> (Env, WebhookController, TestPod, Api<ConfigMap>, Hold) {
    let env = Env::new(prefix).await;
    let controller = env.webhook_controller(None, &[]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let cms: Api<ConfigMap> = Api::namespaced(env.ns.client.clone(), env.name());
    let hold_a = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires");
    (env, controller, b, cms, hold_a)
}

#[tokio::test]
async fn a_fenced_configmap_rejects_writes_with_an_old_token() {
    let (env, _controller, b, cms, hold_a) = held_by_a("adm-fence").await;
    let token_a = hold_a.token();
    fenced_write(&cms, Some(token_a), "10").await.expect("a write with the current token is admitted");
    let message = denial(fenced_write(&cms, None, "9").await);
    assert!(message.contains("no leasehold.dev/fencing-token"), "{message}");

    hold_a.release().await;
    let hold_b = b.claimant(env.name()).acquire(LOCK, WAIT).await.expect("b acquires");
    let token_b = hold_b.token();
    let message = denial(fenced_write(&cms, Some(token_a), "9").await);
    let lock = format!("{}/{LOCK}", env.name());
    for needle in [lock.as_str(), &token_a.to_string(), &token_b.to_string()] {
        assert!(message.contains(needle), "the rejection must name the lock and both tokens: {message}");
    }
    fenced_write(&cms, Some(token_b), "8").await.expect("b's write is admitted");
    let message = denial(fenced_write(&cms, Some(token_b + 1_000_000), "7").await);
    assert!(message.contains("higher than any token issued"), "{message}");
    let stored = cms.get("inventory").await.expect("cm");
    assert_eq!(stored.data.expect("data")["stock"], "8");
    hold_b.release().await;
}

#[tokio::test]
async fn a_fenced_object_cannot_escape_its_lock_by_relabelling_unlabelling_or_deletion() {
    let env = Env::new("adm-fence-escape").await;
    let _controller = env.webhook_controller(None, &[]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    env.lock("other", DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let cms: Api<ConfigMap> = Api::namespaced(env.ns.client.clone(), env.name());

    // a writes under the lock; then b holds it, and a's token is stale.
    let (stale, hold_b) = a_then_b(&env, &cms, &a, &b).await;
    let current = hold_b.token();
    // The other lock's current token, which anyone who can read it knows.
    let other = a.claimant(env.name()).acquire("other", WAIT).await.expect("a acquires the other lock");
    let public = other.token();
    other.release().await;

    // Removing the label, or moving the object under the other lock with that lock's
    // token: refused by the lock it is fenced by, naming it and both tokens.
    let lock = format!("{}/{LOCK}", env.name());
    let message = denial(relabel(&cms, "inventory", json!(null), json!(stale.to_string())).await);
    for needle in [lock.as_str(), &stale.to_string(), &current.to_string(), "removing the label"] {
        assert!(message.contains(needle), "{message} lacks {needle}");
    }
    denial(relabel(&cms, "inventory", json!(null), json!(null)).await);
    let message = denial(relabel(&cms, "inventory", json!("other"), json!(public.to_string())).await);
    for needle in [lock.as_str(), &public.to_string(), &current.to_string()] {
        assert!(message.contains(needle), "{message} lacks {needle}");
    }
    // Deleting it while it records the stale token: refused.
    let message = denial(cms.delete("inventory", &DeleteParams::default()).await);
    for needle in ["delete refused", lock.as_str(), &stale.to_string(), &current.to_string()] {
        assert!(message.contains(needle), "{message} lacks {needle}");
    }
    let kept = cms.get("inventory").await.expect("still there");
    assert_eq!(kept.labels().get(LABEL_FENCED_BY).map(String::as_str), Some(LOCK));
    assert_eq!(kept.data.expect("data")["stock"], "10");

    // The holder writes with its token, then deletes with a precondition on that write.
    let written = fenced_write(&cms, Some(current), "8").await.expect("b's write");
    let precondition = Preconditions { resource_version: written.resource_version(), uid: None };
    let params = DeleteParams { preconditions: Some(precondition), ..DeleteParams::default() };
    cms.delete("inventory", &params).await.expect("the holder deletes what it wrote last");
    hold_b.release().await;

    // An object fenced by a lock that no longer exists is fenced by nothing.
    let hold = a.claimant(env.name()).acquire("other", WAIT).await.expect("a acquires the other lock");
    let shelf = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shelf", "labels": {LABEL_FENCED_BY: "other"}, "annotations": {ANNOTATION_TOKEN: hold.token().to_string()}}});
    cms.patch("shelf", &PatchParams::apply("writer"), &Patch::Apply(&shelf)).await.expect("fenced by the other lock");
    hold.release().await;
    let locks: kube::Api<DistributedLock> = env.locks();
    locks.delete("other", &DeleteParams::default()).await.expect("delete the other lock");
    until_gone(&locks, "other", WAIT, "the other lock deleted").await;
    relabel(&cms, "shelf", json!("other"), json!("1")).await.expect("no lock, no fence");
    cms.delete("shelf", &DeleteParams::default()).await.expect("no lock, no fence on delete either");
}

/// The user the tests' admin client authenticates as.
async fn whoami(client: &kube::Client) -> String {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = reviews.create(&Default::default(), &SelfSubjectReview::default()).await.expect("self subject review");
    review.status.and_then(|s| s.user_info).and_then(|u| u.username).expect("a user name")
}

#[tokio::test]
async fn a_refused_stale_write_is_counted_and_recorded_on_the_lock() {
    use k8s_openapi::api::events::v1::Event;
    let env = Env::new("adm-fence-seen").await;
    let controller = env.webhook_controller(None, &[]).await;
    let lock = env.lock(LOCK, DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let cms: Api<ConfigMap> = Api::namespaced(env.ns.client.clone(), env.name());
    let refused = "leasehold_webhook_stale_writes_refused_total{resource=\"configmaps\"}";
    let denied = "leasehold_webhook_requests_total{webhook=\"fence\",outcome=\"denied\"}";
    let allowed = "leasehold_webhook_requests_total{webhook=\"fence\",outcome=\"allowed\"}";

    let (stale, hold_b) = a_then_b(&env, &cms, &a, &b).await;
    let current = hold_b.token();
    assert_eq!(controller.process.metric(refused).await, None, "nothing refused yet");
    assert!(controller.process.metric(allowed).await >= Some(1.0), "the admitted write is counted");

    denial(fenced_write(&cms, Some(stale), "9").await);
    // Counted before the answer left.
    assert_eq!(controller.process.metric(refused).await, Some(1.0));
    assert_eq!(controller.process.metric(denied).await, Some(1.0));

    let user = whoami(&env.ns.client).await;
    let events: Api<Event> = Api::namespaced(env.ns.client.clone(), env.name());
    let uid = lock.metadata.uid.clone();
    let event = leasehold_harness::eventually("a StaleWriteRefused Event", WAIT, || async {
        let list = events.list(&Default::default()).await.map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("StaleWriteRefused"))
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let regarding = event.regarding.expect("regarding");
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref(), regarding.uid),
        (Some("DistributedLock"), Some(LOCK), uid),
        "the Event is about the lock"
    );
    let note = event.note.expect("a note");
    for needle in ["configmaps inventory", user.as_str(), &format!("token {stale}"), &format!("token is {current}")] {
        assert!(note.contains(needle), "{note} lacks {needle}");
    }
    hold_b.release().await;
}

#[tokio::test]
async fn a_holder_writes_while_a_waiter_is_named_next_and_the_handoff_fences_it_out() {
    let (env, _controller, b, cms, hold_a) = held_by_a("adm-fence-next").await;
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, WAIT).await });
    let b_id = b.identity().id;
    let named = crate::support::watch::until_named_next(&env.leases(), LOCK, &b_id, WAIT).await;
    // The token reserved for b is nobody's yet: a's writes stand until a hands on.
    let reserved = leasehold::lease::next::of_lease(&named).expect("a record").token;
    assert!(reserved > hold_a.token());
    fenced_write(&cms, Some(hold_a.token()), "10").await.expect("a's write while b is named next");
    let stale = hold_a.token();
    assert!(hold_a.release().await.was_held);
    let hold_b = waiting_b.await.expect("b's task").expect("b is handed the lock");
    assert_eq!(hold_b.token(), reserved);
    let message = denial(fenced_write(&cms, Some(stale), "11").await);
    assert!(message.contains(&stale.to_string()) && message.contains(&reserved.to_string()), "{message}");
    fenced_write(&cms, Some(hold_b.token()), "12").await.expect("b's write with the token it was handed");
}
