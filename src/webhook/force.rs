//! Audited force release: the webhook stamps who asked on the DistributedLock, and refuses
//! a request without a reason. The controller does the rest (revokes, raises the token,
//! records `status.lastForceRelease`, emits an Event, clears the annotations).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::crd::{ANNOTATION_FORCE_RELEASE, ANNOTATION_FORCE_RELEASE_BY};

/// The patch to apply to a DistributedLock write by `user`, or why it is refused.
/// `old` is the previous annotations (UPDATE), `new` the requested ones.
pub fn stamp(
    old: Option<&BTreeMap<String, String>>,
    new: Option<&BTreeMap<String, String>>,
    user: &str,
) -> Result<Option<json_patch::Patch>, String> {
    let requested = new.and_then(|a| a.get(ANNOTATION_FORCE_RELEASE));
    let Some(reason) = requested else { return Ok(None) };
    if reason.trim().is_empty() {
        return Err(format!("annotation {ANNOTATION_FORCE_RELEASE} needs a reason: say why the hold must be revoked"));
    }
    let unchanged = old.and_then(|a| a.get(ANNOTATION_FORCE_RELEASE)) == Some(reason)
        && old.and_then(|a| a.get(ANNOTATION_FORCE_RELEASE_BY)) == new.and_then(|a| a.get(ANNOTATION_FORCE_RELEASE_BY));
    if unchanged {
        return Ok(None);
    }
    // Whoever asked is recorded by us, never taken from the request.
    let path = format!("/metadata/annotations/{}", ANNOTATION_FORCE_RELEASE_BY.replace('~', "~0").replace('/', "~1"));
    let ops = Value::Array(vec![json!({"op": "add", "path": path, "value": user})]);
    serde_json::from_value(ops).map(Some).map_err(|e| format!("internal error building the patch: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn stamp_table() {
        let asked = annotations(&[(ANNOTATION_FORCE_RELEASE, "node died")]);
        let patch = stamp(None, Some(&asked), "alice").expect("ok").expect("a patch");
        let patch = serde_json::to_value(patch).expect("json");
        assert_eq!(patch[0]["path"], "/metadata/annotations/leasehold.dev~1force-release-by");
        assert_eq!(patch[0]["value"], "alice");
        // A forged "by" is overwritten.
        let forged = annotations(&[(ANNOTATION_FORCE_RELEASE, "x"), (ANNOTATION_FORCE_RELEASE_BY, "bob")]);
        assert!(stamp(None, Some(&forged), "alice").expect("ok").is_some());
        // Unchanged request (e.g. another edit of the lock): no restamp.
        let stamped = annotations(&[(ANNOTATION_FORCE_RELEASE, "node died"), (ANNOTATION_FORCE_RELEASE_BY, "alice")]);
        assert_eq!(stamp(Some(&stamped), Some(&stamped), "carol"), Ok(None));
        // No request, nothing to do; an empty reason is refused, naming the annotation.
        assert_eq!(stamp(None, Some(&annotations(&[])), "alice"), Ok(None));
        for empty in ["", "   "] {
            let error =
                stamp(None, Some(&annotations(&[(ANNOTATION_FORCE_RELEASE, empty)])), "alice").expect_err("refused");
            assert!(error.contains(ANNOTATION_FORCE_RELEASE));
        }
    }
}
