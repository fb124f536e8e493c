//! What a reconcile reads about force releases besides the requests themselves: the
//! lock's policy (how many approvals a force release needs) and which request the lock
//! records as carried out. Requests are judged in the plan ([`super::plan`]).

use kube::ResourceExt;

use super::context::{AppliedStatus, Context, LockKey};
use crate::crd::DistributedLock;
use crate::crd_force::limits::MAX_APPROVALS;

/// How many approvals a force release of `lock` needs: its `spec.forceRelease.approvals`,
/// else the controller's default.
pub fn required(ctx: &Context, lock: &DistributedLock) -> u32 {
    match lock.spec.force_release.as_ref().and_then(|p| p.approvals) {
        Some(n) => u32::try_from(n.clamp(0, MAX_APPROVALS)).unwrap_or(0),
        None => ctx.settings.force_release_approvals,
    }
}

/// The request the lock records as carried out, with the token it revoked: from a status
/// not yet written, the status last written, or the cached lock.
pub fn executed(ctx: &Context, key: &LockKey, lock: &DistributedLock) -> Option<(String, Option<i64>)> {
    let uid = lock.uid().unwrap_or_default();
    let of = |f: &crate::crd::ForceRelease| f.request.clone().map(|r| (r, f.revoked_token));
    let remembered = ctx.with_memory(key, &uid, |m| {
        m.pending
            .as_ref()
            .and_then(|p| p.forced.as_ref())
            .or_else(|| m.status.as_ref().and_then(AppliedStatus::status).and_then(|s| s.last_force_release.as_ref()))
            .and_then(of)
    });
    remembered.or_else(|| lock.status.as_ref()?.last_force_release.as_ref().and_then(of))
}
