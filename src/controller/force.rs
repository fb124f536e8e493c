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
use kube::api::{Api, Patch};
use serde_json::json;

use super::context::{Context, LockKey, merge_patch_params};
use super::error::Error;
use crate::crd::{
    ANNOTATION_FORCE_RELEASE, ANNOTATION_FORCE_RELEASE_BY, ANNOTATION_FORCE_RELEASE_TARGET, DistributedLock,
};
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
    api.patch(&key.name, &merge_patch_params(), &Patch::Merge(patch))
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
    api.patch(&key.name, &merge_patch_params(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(|e| annotation_error(e, key))
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
