//! The wait queue as the controller reads it from its LockClaim cache, and the claim
//! deletions it makes (always with a precondition: a claim re-created meanwhile is a new
//! claim, never deleted on an old judgement).

use kube::runtime::reflector::ObjectRef;
use tracing::{debug, warn};

use super::context::{Context, LockKey};
use super::view::{self, Claim};
use crate::crd::LockClaim;
use crate::lease::{CasError, CasStore, Precondition, Timing};

/// The well-formed claims on lock `key`, in grant order, their TTLs capped by the lock's
/// timing ([`view::claim`]).
pub fn of_lock(ctx: &Context, key: &LockKey, timing: &Timing) -> Vec<Claim> {
    let names = ctx.claim_index.lock().expect("claim index is never poisoned").claims_of(key);
    let mut claims: Vec<Claim> = names
        .iter()
        .filter_map(|name| ctx.claims.get(&ObjectRef::new(name).within(&key.namespace)))
        .filter_map(|c| view::claim(&c, &key.name, timing))
        .collect();
    super::queue::order(&mut claims);
    claims
}

/// Deletes claims judged stale, each only if unchanged since it was judged; returns those
/// refused because they had changed (our cache is behind: judged again once it shows how).
pub async fn delete_stale<'a>(store: &CasStore<LockClaim>, key: &LockKey, stale: &'a [Claim]) -> Vec<&'a Claim> {
    let mut refused = Vec::new();
    for claim in stale {
        match store.delete_if(&claim.name, Precondition::ResourceVersion(&claim.resource_version)).await {
            Ok(()) => {
                debug!(namespace = %key.namespace, lock = %key.name, claim = %claim.name, uid = %claim.uid, "dropped a stale claim");
            }
            Err(CasError::Conflict { .. }) => {
                debug!(namespace = %key.namespace, lock = %key.name, claim = %claim.name, "a stale claim changed since it was read: judged again once the cache shows it");
                refused.push(claim);
            }
            Err(e) => {
                warn!(namespace = %key.namespace, lock = %key.name, claim = %claim.name, error = %e, "failed to delete stale claim");
            }
        }
    }
    refused
}

/// Deletes the claim of a holder whose hold was revoked (the claimant claims again, at the
/// back, if it still wants the lock): the one it had when revoked, if it is still cached.
pub async fn delete_revoked(store: &CasStore<LockClaim>, key: &LockKey, claim: Option<&Claim>) {
    let Some(claim) = claim else { return };
    if let Err(e) = store.delete_if(&claim.name, Precondition::Uid(&claim.uid)).await {
        warn!(namespace = %key.namespace, lock = %key.name, claim = %claim.name, error = %e, "failed to delete the revoked holder's claim");
    }
}
