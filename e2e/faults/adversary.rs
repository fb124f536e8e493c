//! Writes no holder may make, attempted with a worker pod's own credentials — what a
//! compromised or buggy app could do with the RBAC its pod is given (a waiting worker's,
//! or the holder's for a handoff it may not write). Each must be refused
//! (by RBAC, the Lease guard or the fenced-object webhook); the fault records what the
//! apiserver answered, and an accepted write is a violation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use leasehold::claim::edit;
use leasehold::crd::{
    ANNOTATION_CLAIM, ANNOTATION_TOKEN, LABEL_FENCED_BY, LABEL_LOCK, LABEL_ROLE, LockClaim, ROLE_LOCK,
};
use leasehold::lease::{next, token};
use serde_json::json;

use super::history::{Fault, Op};
use super::world::{IDLE_LOCK, LEASE, Worker, World};

/// The outcome of one attempt: accepted, and the answer.
type Answer = (bool, String);

fn answer<T>(result: Result<T, kube::Error>, accepted: &str) -> Option<Answer> {
    match result {
        Ok(_) => Some((true, accepted.to_owned())),
        Err(kube::Error::Api(s)) => {
            let message: String = s.message.chars().take(200).collect();
            Some((false, format!("{} {}: {message}", s.code, s.reason)))
        }
        // No answer (the apiserver is restarting, a timeout): nothing to judge.
        Err(_) => None,
    }
}

/// Attempts adversarial write `kind` on `lock` with a waiting worker's credentials.
pub async fn attempt(world: &Arc<World>, kind: &'static str, lock: &str) -> Option<Fault> {
    let holder = world.holder(lock).map(|w| w.name.clone());
    let actor = world.other_worker(lock, holder.as_deref())?;
    let start = Instant::now();
    let (accepted, what) = match kind {
        "adv-lease-delete" => answer(leases(&actor, world).delete(lock, &DeleteParams::default()).await, "deleted")?,
        "adv-lease-recreate" => recreate(world, &actor, lock).await?,
        "adv-claim-delete" => claim_delete(world, &actor, lock).await?,
        "adv-free-lease-write" => free_lease_write(world, &actor).await?,
        "adv-fenced-relabel" => relabel(world, &actor, lock, true).await?,
        "adv-fenced-unlabel" => relabel(world, &actor, lock, false).await?,
        "adv-fenced-delete" => fenced_delete(world, &actor, lock).await?,
        "adv-forged-handoff" => forged_handoff(world, &actor, lock).await?,
        other => panic!("unknown adversarial write {other}"),
    };
    world.history.log(&actor.name, lock, Op::Adversary { kind, accepted, answer: what.clone() });
    Some(Fault {
        kind,
        locks: vec![lock.to_owned()],
        start,
        recover_from: start,
        lease: LEASE,
        victim: None,
        note: what,
    })
}

fn leases(actor: &Worker, world: &World) -> Api<Lease> {
    Api::namespaced(actor.pod.client.clone(), world.env.name())
}

/// Deletes the lock Lease, then creates one naming the actor as holder.
async fn recreate(world: &World, actor: &Worker, lock: &str) -> Option<Answer> {
    let (deleted, delete_answer) =
        answer(leases(actor, world).delete(lock, &DeleteParams::default()).await, "deleted")?;
    let token = world.leases.current(lock).and_then(|s| s.token).unwrap_or(0) + 1000;
    let forged: Lease = serde_json::from_value(json!({
        "metadata": {
            "name": lock,
            "labels": {LABEL_LOCK: lock, LABEL_ROLE: ROLE_LOCK},
            "annotations": {ANNOTATION_TOKEN: token.to_string()},
        },
        "spec": {"holderIdentity": actor.pod.identity().id, "leaseDurationSeconds": 5},
    }))
    .expect("a Lease");
    let created = leases(actor, world).create(&PostParams::default(), &forged).await;
    let (created, create_answer) = answer(created, "created")?;
    Some((deleted || created, format!("delete: {delete_answer}; create: {create_answer}")))
}

/// Deletes another pod's claim (LockClaim) on `lock`.
async fn claim_delete(world: &World, actor: &Worker, lock: &str) -> Option<Answer> {
    let me = actor.pod.identity().id;
    let selector = ListParams::default().labels(&format!("{LABEL_LOCK}={lock}"));
    let claims: Api<LockClaim> = Api::namespaced(world.env.ns.client.clone(), world.env.name());
    let other = claims.list(&selector).await.ok()?.items.into_iter().find(|c| c.spec.claimant != me)?;
    let name = other.metadata.name.clone()?;
    let mine: Api<LockClaim> = Api::namespaced(actor.pod.client.clone(), world.env.name());
    answer(mine.delete(&name, &DeleteParams::default()).await, &format!("deleted LockClaim {name}"))
}

/// With the holder's own credentials, hands the lock on in a release to the actor under a
/// token of the holder's choosing: to a waiter the Lease does not name as next, or to the
/// one it names but with another token than the one recorded for it.
async fn forged_handoff(world: &World, actor: &Worker, lock: &str) -> Option<Answer> {
    let holder = world.holder(lock)?;
    let api = leases(&holder, world);
    let mut lease = api.get(lock).await.ok()?;
    if edit::holder(&lease) != Some(holder.pod.identity().id.as_str()) || edit::draining(&lease).is_some() {
        return None;
    }
    let actor_id = actor.pod.identity().id;
    let forged = match next::of_lease(&lease) {
        Some(recorded) if recorded.holder == actor_id => recorded.token + 1,
        _ => token::of_lease(&lease)? + 1,
    };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now());
    next::record(&mut lease, None);
    let spec = lease.spec.get_or_insert_default();
    spec.holder_identity = Some(actor_id);
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    let annotations = lease.metadata.annotations.get_or_insert_default();
    annotations.insert(ANNOTATION_TOKEN.into(), forged.to_string());
    annotations.insert(ANNOTATION_CLAIM.into(), actor.pod.identity().claim_name(lock));
    let handed = api.replace(lock, &PostParams::default(), &lease).await;
    answer(handed, &format!("handed on by {} to {} with token {forged}", holder.name, actor.name))
}

/// Writes the free Lease of the idle lock, naming the actor as holder.
async fn free_lease_write(world: &World, actor: &Worker) -> Option<Answer> {
    let mut lease = leases(actor, world).get(IDLE_LOCK).await.ok()?;
    let spec = lease.spec.get_or_insert_default();
    if spec.holder_identity.as_deref().is_some_and(|h| !h.is_empty()) {
        return None;
    }
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now());
    spec.holder_identity = Some(actor.pod.identity().id);
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    answer(leases(actor, world).replace(IDLE_LOCK, &PostParams::default(), &lease).await, "written")
}

/// Moves the fenced ConfigMap of `lock` out of its fence: to the idle lock, carrying the
/// idle lock's current token (`relabel`), or off any lock with a stale token.
async fn relabel(world: &World, actor: &Worker, lock: &str, relabel: bool) -> Option<Answer> {
    let name = format!("inventory-{lock}");
    let current = world.leases.current(lock).and_then(|s| s.token)?;
    let patch = if relabel {
        let idle = world.leases.current(IDLE_LOCK).and_then(|s| s.token)?;
        json!({
            "metadata": {"labels": {LABEL_FENCED_BY: IDLE_LOCK}, "annotations": {ANNOTATION_TOKEN: idle.to_string()}},
            "data": {"writer": format!("{}/adversary", actor.name)},
        })
    } else {
        let stale = actor.last_token.lock().expect("lock").filter(|t| *t < current).unwrap_or(current - 1);
        json!({
            "metadata": {"labels": {LABEL_FENCED_BY: null}, "annotations": {ANNOTATION_TOKEN: stale.to_string()}},
            "data": {"writer": format!("{}/adversary", actor.name)},
        })
    };
    let cms: Api<ConfigMap> = Api::namespaced(actor.pod.client.clone(), world.env.name());
    let result = cms.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
    if let Err(kube::Error::Api(s)) = &result
        && s.code == 404
    {
        // No app has written it yet: nothing to attack.
        return None;
    }
    answer(result, if relabel { "relabelled" } else { "unlabelled" })
}

/// Deletes a fenced object whose token is provably stale (the lock's token has risen
/// past it since it was written).
async fn fenced_delete(world: &World, actor: &Worker, lock: &str) -> Option<Answer> {
    let name = format!("stale-{lock}");
    let admin: Api<ConfigMap> = Api::namespaced(world.env.ns.client.clone(), world.env.name());
    let stored = match admin.get_opt(&name).await.ok()? {
        Some(cm) => cm,
        None => {
            // Written once with the lock's current token; stale from the next grant on.
            let token = world.leases.current(lock).and_then(|s| s.token)?;
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {LABEL_FENCED_BY: lock}, "annotations": {ANNOTATION_TOKEN: token.to_string()}},
                "data": {"writer": "fault-suite"},
            }))
            .expect("a ConfigMap");
            admin.create(&PostParams::default(), &cm).await.ok()?
        }
    };
    let token: i64 = stored.metadata.annotations.as_ref()?.get(ANNOTATION_TOKEN)?.parse().ok()?;
    world.leases.wait_for(lock, Duration::from_secs(15), |s| s.token.is_some_and(|t| t > token)).await?;
    let cms: Api<ConfigMap> = Api::namespaced(actor.pod.client.clone(), world.env.name());
    let params = DeleteParams {
        preconditions: Some(Preconditions { resource_version: stored.metadata.resource_version.clone(), uid: None }),
        ..DeleteParams::default()
    };
    let result = cms.delete(&name, &params).await;
    answer(result, &format!("deleted {name}, which carries stale token {token}"))
}
