//! A release handing the lock on to the waiter the controller recorded as next, on the
//! real apiserver with the guard in force, against pods holding the client's RBAC: the
//! holder hands on only to that waiter, with the token minted for it and nothing else
//! changed, never while its hold drains; nobody else writes the record or the handoff;
//! and the handoff needs no controller running.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use leasehold::claim::edit;
use leasehold::crd::{
    ANNOTATION_CLAIM_UID, ANNOTATION_DRAINING, ANNOTATION_NEXT_HOLDER, ANNOTATION_RENEW_DEADLINE, ANNOTATION_TOKEN,
    DistributedLock,
};
use leasehold::lease::next;
use serde_json::json;

use super::guard::{DRY_RUN, guarded, quiet, refused};
use super::{LOCK, WAIT, denial};
use crate::support::watch::until;

/// An edit of a handoff, given another waiter's identity.
type Forge = fn(&mut Lease, &str);

#[tokio::test]
async fn a_holder_hands_its_lock_on_only_to_the_waiter_recorded_as_next_and_with_no_controller_running() {
    let (env, controller, mut process) = guarded("adm-guard-handoff").await;
    env.lock(LOCK, quiet()).await;
    let (a, b, c) = (env.pod("a").await, env.pod("b").await, env.pod("c").await);
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a is granted through the guard");
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, Duration::from_secs(60)).await });
    let b_id = b.identity().id;
    let named = crate::support::watch::until_named_next(&env.leases(), LOCK, &b_id, WAIT).await;
    let recorded = next::of_lease(&named).expect("a record");
    assert!(recorded.token > hold.token(), "{} after {}", recorded.token, hold.token());
    assert_eq!(recorded.claim, b.identity().claim_name(LOCK));
    let (as_a, as_b, as_c): (Api<Lease>, Api<Lease>, Api<Lease>) = (
        Api::namespaced(a.client.clone(), env.name()),
        Api::namespaced(b.client.clone(), env.name()),
        Api::namespaced(c.client.clone(), env.name()),
    );
    let handoff = next::handed_on(&named, Timestamp::now()).expect("a handoff");

    // The holder hands on to the recorded waiter alone, with its token and claim, as an
    // unconfirmed grant under the same terms, the record consumed.
    let only_to = format!("may hand it on only to the waiter the Leasehold controller recorded as next ({b_id})");
    let edits: [(&str, Forge); 6] = [
        ("to another waiter", |l, c| l.spec.as_mut().expect("spec").holder_identity = Some(c.to_owned())),
        ("with another token", |l, _| {
            let token = l.annotations()[ANNOTATION_TOKEN].parse::<i64>().expect("a token") + 1;
            l.annotations_mut().insert(ANNOTATION_TOKEN.into(), token.to_string());
        }),
        ("on the holder's own claim", |l, _| {
            l.annotations_mut().insert(ANNOTATION_CLAIM_UID.into(), "0b8f3a1e-5d2c-4c55-9a57-2f3c1e7b9d10".into());
        }),
        ("under longer terms", |l, _| {
            l.annotations_mut().insert(ANNOTATION_RENEW_DEADLINE.into(), "3600".into());
        }),
        ("as a confirmed grant", |l, _| {
            let spec = l.spec.as_mut().expect("spec");
            spec.renew_time = Some(MicroTime(Timestamp::now() + Duration::from_secs(5)));
        }),
        ("keeping the record", |l, c| {
            l.annotations_mut().insert(ANNOTATION_NEXT_HOLDER.into(), c.to_owned());
        }),
    ];
    for (case, edit) in edits {
        let mut forged = handoff.clone();
        edit(&mut forged, &c.identity().id);
        let message = denial(as_a.replace(LOCK, &DRY_RUN, &forged).await);
        assert!(message.contains(&only_to), "{case}: {message}");
    }
    // Nobody else hands a's hold on, not even the waiter recorded; nobody writes the record.
    refused(as_b.replace(LOCK, &DRY_RUN, &handoff).await, "written only by the Leasehold controller");
    refused(as_c.replace(LOCK, &DRY_RUN, &handoff).await, "written only by the Leasehold controller");
    let mut self_named = named.clone();
    next::record(&mut self_named, Some(&next::Next { holder: c.identity().id, ..recorded.clone() }));
    refused(as_a.replace(LOCK, &DRY_RUN, &self_named).await, "written only by the Leasehold controller");
    as_a.replace(LOCK, &DRY_RUN, &handoff).await.expect("the holder hands on to the recorded waiter");

    // With no controller running, a's release hands the lock to b in the same write.
    process.kill();
    assert!(hold.release().await.was_held);
    let b_hold = waiting_b.await.expect("b's task").expect("b is granted by a's release");
    assert_eq!(b_hold.token(), recorded.token, "the token the controller minted for b");
    assert!(b_hold.is_held());
    let lease = env.leases().get(LOCK).await.expect("the lock Lease");
    assert_eq!(edit::holder(&lease), Some(b.identity().id.as_str()));
    assert!(!next::any_recorded(&lease) && !edit::is_confirmed(&lease), "an unconfirmed grant, the record gone");

    // A controller started afterwards takes b's hold for what it is.
    let mut process = env.controller_as(Some(&controller.kubeconfig), &["--leader-elect=false"]).await;
    let lock = until(&env.locks(), LOCK, WAIT, "b's hold in status", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.holder.as_ref()).is_some_and(|h| h.identity == b.identity().id)
    })
    .await;
    let holder = lock.status.and_then(|s| s.holder).expect("a holder");
    assert_eq!(holder.fencing_token, recorded.token);

    // A revoked hold hands on to nobody, though a waiter is recorded: it only lets go.
    let claimant_c = c.claimant(env.name());
    let _waiting_c = tokio::spawn(async move { claimant_c.acquire(LOCK, Duration::from_secs(60)).await });
    let c_id = c.identity().id;
    let named = crate::support::watch::until_named_next(&env.leases(), LOCK, &c_id, WAIT).await;
    // Revoked as the controller would (stopped, so that nothing else writes the Lease).
    process.kill();
    let as_controller: Api<Lease> = Api::namespaced(controller.client.clone(), env.name());
    let draining = json!({"metadata": {"annotations": {ANNOTATION_DRAINING: b_hold.token().to_string()}}});
    let revoked = as_controller
        .patch(LOCK, &PatchParams::default(), &Patch::Merge(&draining))
        .await
        .expect("the controller writes a lock Lease");
    assert_eq!(next::of_lease(&revoked).map(|n| n.holder), Some(c.identity().id), "c still recorded");
    let mut handoff = next::handed_on(&named, Timestamp::now()).expect("a handoff");
    handoff.metadata.resource_version = revoked.resource_version();
    handoff.annotations_mut().insert(ANNOTATION_DRAINING.into(), b_hold.token().to_string());
    refused(as_b.replace(LOCK, &DRY_RUN, &handoff).await, "was revoked");
}

#[tokio::test]
async fn a_waiter_that_left_while_named_next_gives_back_the_lock_it_is_handed() {
    let (env, _controller, mut process) = guarded("adm-guard-handoff-left").await;
    env.lock(LOCK, quiet()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a is granted through the guard");
    // b waits a moment, long enough to be named next, and gives up.
    let claimant_b = b.claimant(env.name());
    let waiting_b = tokio::spawn(async move { claimant_b.acquire(LOCK, Duration::from_secs(60)).await });
    let b_id = b.identity().id;
    crate::support::watch::until_named_next(&env.leases(), LOCK, &b_id, WAIT).await;
    // With no controller running, nobody names another: a's release hands the lock to
    // b's withdrawn claim, and b gives it back.
    process.kill();
    waiting_b.abort();
    let claim = b.identity().claim_name(LOCK);
    crate::support::watch::until_gone(&env.claims(), &claim, WAIT, "b's claim withdrawn").await;
    let mut watch = crate::support::locks::LeaseWatch::start(env.leases(), LOCK, WAIT).await;
    assert!(hold.release().await.was_held);
    let handed = watch.until("a's release handing the lock to b", |l| edit::holder(l) == Some(b_id.as_str())).await;
    let freed = watch.until("b giving it back", |l| edit::holder(l).is_none()).await;
    assert_eq!(
        leasehold::lease::token::of_lease(&freed),
        leasehold::lease::token::of_lease(&handed),
        "given back as it was handed"
    );
    assert!(!edit::is_confirmed(&handed), "never confirmed: b never reported it held");
}
