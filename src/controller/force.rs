//! Forced releases: reading an operator's request from a DistributedLock's annotations,
//! deciding which hold it targets, and clearing it once carried out.
//!
//! A request revokes only the hold whose token it targets
//! (`leasehold.dev/force-release-target`, stamped at admission with the holder's token, or
//! `none` when nothing was held). So a request the controller could not clear at once —
//! its clearing write failed, the controller restarted — never touches a later holder: by
//! then its target is no longer the holder, and it is recorded as done without revoking.
//! A request without a target (admitted by an older webhook, or with no webhook at all)
//! targets the holder at the time the controller first sees it: the controller stamps the
//! target itself, by compare-and-swap, before acting on it, so the choice survives a
//! restart.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;
use tracing::info;

use super::context::{Context, LockKey};
use super::error::Error;
use super::events::publish;
use super::status::Outcome;
use super::view::LeaseState;
use crate::crd::{
    ANNOTATION_FORCE_RELEASE, ANNOTATION_FORCE_RELEASE_BY, ANNOTATION_FORCE_RELEASE_TARGET, DistributedLock,
    ForceRelease,
};
use crate::lease::RevokeReason;
use crate::lease::token;

/// The value of the target annotation when nothing was held.
pub const NO_TARGET: &str = "none";

/// Which hold a request targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The hold with this token.
    Token(i64),
    /// Nothing was held when it was made, or the target is unreadable: it revokes nothing.
    Nothing,
    /// Not stamped yet.
    Unstamped,
}

/// An operator's request for a forced release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The operator's reason.
    pub reason: String,
    /// Who asked, as stamped by the webhook (`unknown` without one).
    pub by: String,
    /// Which hold it revokes.
    pub target: Target,
    /// The ForceReleaseRequest it comes from (`None`: the annotation).
    pub request: Option<String>,
    /// Who approved it (a ForceReleaseRequest's counted approvals).
    pub approved_by: Vec<String>,
}

/// The request on a lock, if any.
pub fn request(annotations: &BTreeMap<String, String>) -> Option<Request> {
    let reason = annotations.get(ANNOTATION_FORCE_RELEASE)?.clone();
    let target = match annotations.get(ANNOTATION_FORCE_RELEASE_TARGET) {
        None => Target::Unstamped,
        Some(value) => token::parse(value).map_or(Target::Nothing, Target::Token),
    };
    let by = annotations.get(ANNOTATION_FORCE_RELEASE_BY).cloned().unwrap_or_else(|| "unknown".into());
    Some(Request { reason, by, target, request: None, approved_by: Vec::new() })
}

/// The target to stamp on a request first seen while the hold with `held` (or nothing)
/// is granted.
pub fn target_of(held: Option<i64>) -> String {
    held.map_or_else(|| NO_TARGET.to_owned(), |t| t.to_string())
}

/// Whether `request` revokes the granted hold with token `held`.
pub fn targets(request: &Request, held: Option<i64>) -> bool {
    matches!((&request.target, held), (Target::Token(t), Some(h)) if *t == h)
}

fn annotation_error(error: kube::Error, key: &LockKey) -> Error {
    Error::Annotation { namespace: key.namespace.clone(), name: key.name.clone(), source: error }
}

/// Stamps the target of an unstamped request, by compare-and-swap on the lock's
/// resourceVersion (a lock changed meanwhile is looked at again).
pub async fn stamp(ctx: &Context, lock: &DistributedLock, key: &LockKey, target: &str) -> Result<(), Error> {
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let patch = json!({"metadata": {
        "resourceVersion": lock.resource_version(),
        "annotations": {ANNOTATION_FORCE_RELEASE_TARGET: target},
    }});
    api.patch(&key.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(|e| annotation_error(e, key))
}

/// Clears a request carried out (or found stale), only if the lock is unchanged since it
/// was read: a new request made meanwhile is never cleared unseen.
pub async fn clear(ctx: &Context, lock: &DistributedLock, key: &LockKey) -> Result<(), Error> {
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &key.namespace);
    // A JSON merge patch with null removes the annotations; a typed None would be dropped.
    let patch = json!({"metadata": {
        "resourceVersion": lock.resource_version(),
        "annotations": {ANNOTATION_FORCE_RELEASE: null, ANNOTATION_FORCE_RELEASE_BY: null, ANNOTATION_FORCE_RELEASE_TARGET: null},
    }});
    api.patch(&key.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(|e| annotation_error(e, key))
}

/// Settles a force-release request after this reconcile's writes: carried out (its
/// target revoked now, or being drained already) or stale (its target is not the
/// holder): recorded and cleared. One whose target still holds (its revocation could not
/// be written) stays for the next reconcile.
pub async fn settle(
    ctx: &Context,
    lock: &DistributedLock,
    key: &LockKey,
    request: Option<Request>,
    held: Option<i64>,
    before: &LeaseState,
    outcome: &mut Outcome,
) -> Result<(), Error> {
    let Some(request) = request else { return Ok(()) };
    let revoked_now = outcome.revoked == Some(RevokeReason::Forced);
    if request.request.is_some() {
        // A ForceReleaseRequest: nothing to clear; its own status records the outcome.
        if revoked_now {
            let revoked_token = match request.target {
                Target::Token(t) => Some(t),
                _ => None,
            };
            outcome.forced = Some(ForceRelease {
                by: request.by,
                reason: request.reason,
                at: Time(Timestamp::now()),
                revoked_token,
                request: request.request,
                approved_by: request.approved_by,
            });
        }
        return Ok(());
    }
    if !revoked_now && targets(&request, held) {
        return Ok(());
    }
    let target = match request.target {
        Target::Token(t) => Some(t),
        _ => None,
    };
    let draining_target = matches!(before, LeaseState::Draining(d) if d.revoked.is_some() && d.revoked == target);
    // Carried out earlier, its clearing failed: recorded then; clear it now.
    let recorded = lock.status.as_ref().and_then(|s| s.last_force_release.as_ref()).is_some_and(|r| {
        r.by == request.by && r.reason == request.reason && r.revoked_token.is_some() && r.revoked_token == target
    });
    if recorded && !revoked_now {
        return clear(ctx, lock, key).await;
    }
    let revoked_token = (revoked_now || draining_target).then_some(target).flatten();
    if revoked_token.is_none() {
        let what = target.map_or_else(|| "nothing was held".to_owned(), |t| format!("token {t} no longer holds"));
        info!(namespace = %key.namespace, lock = %key.name, %what, "force release cleared without revoking");
        let note = format!("force release by {} ({}) revoked nothing: {what}", request.by, request.reason);
        publish(ctx, lock, EventType::Normal, "ForceReleaseSkipped", note, None);
    }
    outcome.forced = Some(ForceRelease {
        by: request.by,
        reason: request.reason,
        at: Time(Timestamp::now()),
        revoked_token,
        request: None,
        approved_by: Vec::new(),
    });
    clear(ctx, lock, key).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn request_table() {
        assert_eq!(request(&annotations(&[])), None);
        let read = |pairs: &[(&str, &str)]| request(&annotations(pairs)).expect("a request");
        let asked = [(ANNOTATION_FORCE_RELEASE, "node died"), (ANNOTATION_FORCE_RELEASE_BY, "alice")];
        assert_eq!(
            read(&asked),
            Request {
                reason: "node died".into(),
                by: "alice".into(),
                target: Target::Unstamped,
                request: None,
                approved_by: vec![]
            }
        );
        let stamped = |target| read(&[asked[0], asked[1], (ANNOTATION_FORCE_RELEASE_TARGET, target)]).target;
        assert_eq!(stamped("1700000000000"), Target::Token(1_700_000_000_000));
        for nothing in [NO_TARGET, "", "-3", "0", "x"] {
            assert_eq!(stamped(nothing), Target::Nothing, "{nothing:?}");
        }
        assert_eq!(read(&[asked[0]]).by, "unknown");
    }

    #[test]
    fn a_request_revokes_only_the_hold_it_targets() {
        let request =
            |target| Request { reason: "r".into(), by: "b".into(), target, request: None, approved_by: vec![] };
        assert!(targets(&request(Target::Token(7)), Some(7)));
        assert!(!targets(&request(Target::Token(7)), Some(8)), "a later holder");
        assert!(!targets(&request(Target::Token(7)), None), "nothing granted (free or draining)");
        assert!(!targets(&request(Target::Nothing), Some(7)), "made while nothing was held");
        assert!(!targets(&request(Target::Unstamped), Some(7)), "stamped first");
        assert_eq!((target_of(Some(7)), target_of(None)), ("7".to_owned(), NO_TARGET.to_owned()));
        assert_eq!(request(Target::Token(1)).target, Target::Token(1));
    }
}
