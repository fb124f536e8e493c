//! Audited, targeted force release. A request is the annotation
//! `leasehold.dev/force-release: <reason>` on a DistributedLock; the webhook stamps who
//! asked (`leasehold.dev/force-release-by`) and which hold it is about
//! (`leasehold.dev/force-release-target`: the token of the hold at admission, read fresh
//! from the lock Lease). The controller revokes only a hold with that token, so a request
//! that lingers (the controller could not clear it, or acted late) never revokes a later
//! holder.
//!
//! Refused: a request without a reason, and a request on a lock that is not held (nothing
//! to revoke — including a hold already being revoked, which is draining).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::lock::Hold;
use crate::crd::{ANNOTATION_FORCE_RELEASE, ANNOTATION_FORCE_RELEASE_BY, ANNOTATION_FORCE_RELEASE_TARGET};

/// Whether a DistributedLock write carries a new force-release request to stamp:
/// `Ok(Some(reason))` if so, `Ok(None)` if there is none or it is already stamped, `Err`
/// (the message) if it is refused. `old` is the previous annotations (UPDATE), `new` the
/// requested ones.
pub fn requested<'a>(
    old: Option<&BTreeMap<String, String>>,
    new: Option<&'a BTreeMap<String, String>>,
) -> Result<Option<&'a str>, String> {
    let Some(reason) = new.and_then(|a| a.get(ANNOTATION_FORCE_RELEASE)) else { return Ok(None) };
    if reason.trim().is_empty() {
        return Err(format!("annotation {ANNOTATION_FORCE_RELEASE} needs a reason: say why the hold must be revoked"));
    }
    // Another edit of a lock with a pending request (the controller adding a finalizer,
    // say): the request and its stamps unchanged, nothing to do.
    let same = |key: &str| old.and_then(|a| a.get(key)) == new.and_then(|a| a.get(key));
    let unchanged = [ANNOTATION_FORCE_RELEASE, ANNOTATION_FORCE_RELEASE_BY, ANNOTATION_FORCE_RELEASE_TARGET]
        .iter()
        .all(|key| same(key));
    // A request admitted before this webhook stamped targets gets its target from the
    // controller (the hold it first sees): completing that stamp is no new request.
    let target_completed = same(ANNOTATION_FORCE_RELEASE)
        && same(ANNOTATION_FORCE_RELEASE_BY)
        && old.is_some_and(|a| !a.contains_key(ANNOTATION_FORCE_RELEASE_TARGET));
    Ok((!unchanged && !target_completed).then_some(reason.as_str()))
}

/// The stamp for a request by `user` on lock `lock` (`<namespace>/<name>`) whose hold is
/// `hold`, or why it is refused.
pub fn stamp(lock: &str, hold: &Hold, user: &str) -> Result<json_patch::Patch, String> {
    let target = match hold {
        Hold::Held { token, .. } => *token,
        Hold::Free => return Err(format!("lock {lock} is not held: there is no hold to force-release")),
        Hold::Draining { token } => {
            return Err(format!(
                "lock {lock} is not held: its hold with token {token} is already being revoked (the next holder is granted once its holder lets go, or after one lease duration)"
            ));
        }
    };
    // Who asked and which hold are recorded by us, never taken from the request.
    let path = |key: &str| format!("/metadata/annotations/{}", key.replace('~', "~0").replace('/', "~1"));
    let ops = Value::Array(vec![
        json!({"op": "add", "path": path(ANNOTATION_FORCE_RELEASE_BY), "value": user}),
        json!({"op": "add", "path": path(ANNOTATION_FORCE_RELEASE_TARGET), "value": target.to_string()}),
    ]);
    serde_json::from_value(ops).map_err(|e| format!("internal error building the patch: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn requested_table() {
        let asked = annotations(&[(ANNOTATION_FORCE_RELEASE, "node died")]);
        assert_eq!(requested(None, Some(&asked)), Ok(Some("node died")));
        // A forged "by" or target is restamped.
        for forged in [ANNOTATION_FORCE_RELEASE_BY, ANNOTATION_FORCE_RELEASE_TARGET] {
            let stamped = annotations(&[
                (ANNOTATION_FORCE_RELEASE, "x"),
                (ANNOTATION_FORCE_RELEASE_BY, "alice"),
                (ANNOTATION_FORCE_RELEASE_TARGET, "7"),
            ]);
            let mut edited = stamped.clone();
            edited.insert(forged.into(), "8".into());
            assert_eq!(requested(Some(&stamped), Some(&edited)), Ok(Some("x")), "{forged}");
            edited.remove(forged);
            assert_eq!(requested(Some(&stamped), Some(&edited)), Ok(Some("x")), "{forged} removed");
        }
        // A new reason is a new request.
        let stamped = annotations(&[(ANNOTATION_FORCE_RELEASE, "a"), (ANNOTATION_FORCE_RELEASE_TARGET, "7")]);
        let again = annotations(&[(ANNOTATION_FORCE_RELEASE, "b"), (ANNOTATION_FORCE_RELEASE_TARGET, "7")]);
        assert_eq!(requested(Some(&stamped), Some(&again)), Ok(Some("b")));
        // Unchanged request (e.g. another edit of the lock): no restamp.
        assert_eq!(requested(Some(&stamped), Some(&stamped)), Ok(None));
        // The controller completing an older, untargeted request: no restamp (who asked
        // stays recorded).
        let untargeted = annotations(&[(ANNOTATION_FORCE_RELEASE, "a"), (ANNOTATION_FORCE_RELEASE_BY, "alice")]);
        let completed = annotations(&[
            (ANNOTATION_FORCE_RELEASE, "a"),
            (ANNOTATION_FORCE_RELEASE_BY, "alice"),
            (ANNOTATION_FORCE_RELEASE_TARGET, "7"),
        ]);
        assert_eq!(requested(Some(&untargeted), Some(&completed)), Ok(None));
        let reasked = annotations(&[(ANNOTATION_FORCE_RELEASE, "b"), (ANNOTATION_FORCE_RELEASE_BY, "alice")]);
        assert_eq!(requested(Some(&untargeted), Some(&reasked)), Ok(Some("b")), "a new reason is a new request");
        // No request, nothing to do; an empty reason is refused, naming the annotation.
        assert_eq!(requested(None, Some(&annotations(&[]))), Ok(None));
        assert_eq!(requested(None, None), Ok(None));
        for empty in ["", "   "] {
            let error = requested(None, Some(&annotations(&[(ANNOTATION_FORCE_RELEASE, empty)]))).expect_err("refused");
            assert!(error.contains(ANNOTATION_FORCE_RELEASE));
        }
    }

    #[test]
    fn stamp_table() {
        let patch = stamp("shop/orders", &Hold::Held { holder: "a_1".into(), token: 42 }, "alice").expect("a patch");
        let patch = serde_json::to_value(patch).expect("json");
        assert_eq!(patch[0]["path"], "/metadata/annotations/leasehold.dev~1force-release-by");
        assert_eq!(patch[0]["value"], "alice");
        assert_eq!(patch[1]["path"], "/metadata/annotations/leasehold.dev~1force-release-target");
        assert_eq!(patch[1]["value"], "42");
        let free = stamp("shop/orders", &Hold::Free, "alice").expect_err("refused");
        assert!(free.contains("lock shop/orders is not held"), "{free}");
        let draining = stamp("shop/orders", &Hold::Draining { token: "41".into() }, "alice").expect_err("refused");
        assert!(draining.contains("is not held") && draining.contains("41"), "{draining}");
    }
}
