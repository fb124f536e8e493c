//! Admission of ForceReleaseRequests: everything a request records about people is
//! stamped here from the admission request's `userInfo`, never taken from the client.
//!
//! - CREATE: the requester, the target (the lock's current holder and token, read fresh;
//!   a target the client named must be that hold) and the expiry are stamped. Refused: a
//!   lock that does not exist or is not held, a target that is not the holder, approvals
//!   or a denial written by the client.
//! - UPDATE: `spec.approvals` and `spec.denial` change only through the annotations
//!   `leasehold.dev/approve` and `leasehold.dev/deny: <reason>`, which are turned into an
//!   entry naming the user (and removed). Approving needs the `approve` verb on
//!   `forcereleaserequests/approval` (checked by a SubjectAccessReview, as for
//!   CertificateSigningRequests) and is refused to the requester; denying needs the same
//!   verb, or being the requester (withdrawing).

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::lock::Hold;
use crate::crd::{ANNOTATION_APPROVE, ANNOTATION_DENY, Approval, Denial, ForceReleaseRequest};

/// The RBAC resource and verb an approver needs (on the request's name, in its namespace).
pub const APPROVAL_SUBRESOURCE: &str = "approval";
/// See [`APPROVAL_SUBRESOURCE`].
pub const APPROVE_VERB: &str = "approve";

fn pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn patch(ops: Vec<Value>) -> Result<json_patch::Patch, String> {
    serde_json::from_value(Value::Array(ops)).map_err(|e| format!("internal error building the patch: {e}"))
}

/// The stamp for a new request `request` (named `name`) by `user` on a lock (`lock`:
/// `<namespace>/<name>`) whose holds (one per slot Lease) are `holds`, or why it is
/// refused.
pub fn admit_create(
    name: &str,
    request: &ForceReleaseRequest,
    lock: &str,
    holds: Option<&[Hold]>,
    user: &str,
    now: Timestamp,
) -> Result<json_patch::Patch, String> {
    let spec = &request.spec;
    if spec.reason.trim().is_empty() {
        return Err(format!("forcereleaserequest {name}: spec.reason must say why the hold must be revoked"));
    }
    if !spec.approvals.is_empty() || spec.denial.is_some() {
        return Err(format!(
            "forcereleaserequest {name}: spec.approvals and spec.denial are written only at approval (annotation {ANNOTATION_APPROVE} or {ANNOTATION_DENY}), not at creation"
        ));
    }
    let annotations = request.metadata.annotations.as_ref();
    if annotations.is_some_and(|a| a.contains_key(ANNOTATION_APPROVE) || a.contains_key(ANNOTATION_DENY)) {
        return Err(format!("forcereleaserequest {name}: a request cannot be approved or denied as it is created"));
    }
    let Some(holds) = holds else { return Err(format!("lock {lock} does not exist")) };
    let (holder, token) = target(lock, holds, spec.target_holder.as_deref(), spec.target_token)?;
    let ttl = jiff::SignedDuration::from_secs(i64::from(spec.ttl_seconds));
    let expires = now.checked_add(ttl).map_err(|e| format!("forcereleaserequest {name}: spec.ttlSeconds: {e}"))?;
    // Who asked, which hold and until when are ours to say, whatever the client wrote.
    patch(vec![
        json!({"op": "add", "path": "/spec/requester", "value": user}),
        json!({"op": "add", "path": "/spec/targetHolder", "value": holder}),
        json!({"op": "add", "path": "/spec/targetToken", "value": token}),
        json!({"op": "add", "path": "/spec/expiresAt", "value": Time(expires)}),
    ])
}

/// The hold a request is about: the one it names (by holder, token or both), or the only
/// one; or why there is none. A lock with several permits has a hold per slot.
pub fn target<'a>(
    lock: &str,
    holds: &'a [Hold],
    holder: Option<&str>,
    token: Option<i64>,
) -> Result<(&'a str, i64), String> {
    let held: Vec<(&str, i64)> = holds
        .iter()
        .filter_map(|h| match h {
            Hold::Held { holder, token } => Some((holder.as_str(), *token)),
            _ => None,
        })
        .collect();
    let named = |(h, t): &(&str, i64)| holder.is_none_or(|n| n == *h) && token.is_none_or(|n| n == *t);
    let chosen = holder.is_some() || token.is_some() || held.len() == 1;
    if let Some(found) = held.iter().find(|h| named(h)).filter(|_| chosen) {
        return Ok(*found);
    }
    let listed = || held.iter().map(|(h, t)| format!("{h} (token {t})")).collect::<Vec<_>>().join(", ");
    match (held.as_slice(), holder, token) {
        ([], _, _) => {
            match holds.iter().find_map(|h| if let Hold::Draining { token } = h { Some(token) } else { None }) {
                Some(token) => Err(format!(
                    "lock {lock} is not held: its hold with token {token} is already being revoked (the next holder is granted once its holder lets go, or after one lease duration)"
                )),
                None => Err(format!("lock {lock} is not held: there is no hold to force-release")),
            }
        }
        ([(h, t)], Some(n), _) if n != *h => {
            Err(format!("lock {lock} is held by {h} (token {t}), not by {n}: the request would revoke someone else"))
        }
        ([(_, t)], _, Some(n)) => Err(format!("lock {lock} is held with token {t}, not {n}: that hold has ended")),
        (_, None, None) => Err(format!(
            "lock {lock} has {} holders ({}): name the hold to revoke with spec.targetToken (leasehold release --force --token)",
            held.len(),
            listed()
        )),
        _ => Err(format!(
            "lock {lock} has no hold{}{}: its holders are {}",
            holder.map(|n| format!(" by {n}")).unwrap_or_default(),
            token.map(|n| format!(" with token {n}")).unwrap_or_default(),
            listed()
        )),
    }
}

/// What an update asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing about approvals (labels, say): admitted as is.
    Other,
    /// An approval by the user.
    Approve,
    /// A denial by the user, with its reason.
    Deny(String),
}

/// What an update of `old` into `new` (named `name`) asks for, or why it is refused.
pub fn classify_update(name: &str, old: &ForceReleaseRequest, new: &ForceReleaseRequest) -> Result<Change, String> {
    if new.spec.approvals != old.spec.approvals || new.spec.denial != old.spec.denial {
        return Err(format!(
            "forcereleaserequest {name}: spec.approvals and spec.denial are written only by the admission webhook: approve with the annotation {ANNOTATION_APPROVE} (`leasehold approve`), deny with {ANNOTATION_DENY}: <reason>"
        ));
    }
    let annotation = |key: &str| new.metadata.annotations.as_ref().and_then(|a| a.get(key));
    match (annotation(ANNOTATION_APPROVE), annotation(ANNOTATION_DENY)) {
        (None, None) => Ok(Change::Other),
        (Some(_), Some(_)) => Err(format!("forcereleaserequest {name}: approve or deny, not both")),
        (Some(_), None) => Ok(Change::Approve),
        (None, Some(reason)) if reason.trim().is_empty() => {
            Err(format!("forcereleaserequest {name}: annotation {ANNOTATION_DENY} needs a reason"))
        }
        (None, Some(reason)) => Ok(Change::Deny(reason.trim().to_owned())),
    }
}

/// The patch recording `change` by `user` (`may_approve`: whether a SubjectAccessReview
/// allows them the `approve` verb) on request `old`/`new`, or why it is refused.
pub fn admit_change(
    name: &str,
    new: &ForceReleaseRequest,
    change: &Change,
    user: &str,
    may_approve: bool,
    now: Timestamp,
) -> Result<Option<json_patch::Patch>, String> {
    let spec = &new.spec;
    let requester = spec.requester.as_deref().unwrap_or_default();
    let remove = |key: &str| json!({"op": "remove", "path": format!("/metadata/annotations/{}", pointer(key))});
    if let Some(phase) = new.status.as_ref().and_then(|s| s.phase).filter(|p| p.is_final()) {
        return Err(format!("forcereleaserequest {name} is already {}: nothing more can change it", phase.as_str()));
    }
    let not_allowed = || {
        format!(
            "user {user} may not approve or deny force-release requests here: that needs the `{APPROVE_VERB}` verb on `forcereleaserequests/{APPROVAL_SUBRESOURCE}` (group leasehold.dev)"
        )
    };
    match change {
        Change::Other => Ok(None),
        Change::Approve => {
            if user == requester {
                return Err(format!(
                    "user {user} requested forcereleaserequest {name} and cannot approve it: another person must"
                ));
            }
            if !may_approve {
                return Err(not_allowed());
            }
            if spec.expires_at.as_ref().is_some_and(|t| now >= t.0) {
                return Err(format!("forcereleaserequest {name} has expired: it can no longer take effect"));
            }
            let mut ops = vec![remove(ANNOTATION_APPROVE)];
            if !spec.approvals.iter().any(|a| a.by == user) {
                let approval = Approval { by: user.to_owned(), at: Time(now) };
                ops.push(if spec.approvals.is_empty() {
                    json!({"op": "add", "path": "/spec/approvals", "value": [approval]})
                } else {
                    json!({"op": "add", "path": "/spec/approvals/-", "value": approval})
                });
            }
            patch(ops).map(Some)
        }
        Change::Deny(reason) => {
            if user != requester && !may_approve {
                return Err(not_allowed());
            }
            if spec.denial.is_some() {
                return Err(format!("forcereleaserequest {name} is already denied"));
            }
            let denial = Denial { by: user.to_owned(), at: Time(now), reason: reason.clone() };
            patch(vec![remove(ANNOTATION_DENY), json!({"op": "add", "path": "/spec/denial", "value": denial})])
                .map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{ForceReleaseRequestSpec, ForceReleaseRequestStatus, Phase};

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).expect("valid")
    }

    fn request(annotations: &[(&str, &str)]) -> ForceReleaseRequest {
        let mut r = ForceReleaseRequest::new(
            "r1",
            ForceReleaseRequestSpec {
                lock: "orders".into(),
                reason: "frozen".into(),
                target_holder: None,
                target_token: None,
                ttl_seconds: 600,
                requester: None,
                expires_at: None,
                approvals: vec![],
                denial: None,
            },
        );
        if !annotations.is_empty() {
            r.metadata.annotations =
                Some(annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
        }
        r
    }

    fn ops(patch: json_patch::Patch) -> Value {
        serde_json::to_value(patch).expect("json")
    }

    #[test]
    fn create_stamps_requester_target_and_expiry() {
        let held = Hold::Held { holder: "a_1".into(), token: 42 };
        let mut forged = request(&[]);
        forged.spec.requester = Some("mallory".into());
        let patch = ops(admit_create("r1", &forged, "shop/orders", Some(std::slice::from_ref(&held)), "alice", ts(0))
            .expect("admitted"));
        assert_eq!(patch[0], json!({"op": "add", "path": "/spec/requester", "value": "alice"}), "never the client's");
        assert_eq!(patch[1]["value"], "a_1");
        assert_eq!(patch[2]["value"], 42);
        assert_eq!(patch[3]["value"], json!(Time(ts(600))));
        // The client named the holder and token right: admitted.
        let mut named = request(&[]);
        (named.spec.target_holder, named.spec.target_token) = (Some("a_1".into()), Some(42));
        assert!(admit_create("r1", &named, "shop/orders", Some(std::slice::from_ref(&held)), "alice", ts(0)).is_ok());
    }

    #[test]
    fn create_refusals_name_the_problem() {
        let held = Hold::Held { holder: "a_1".into(), token: 42 };
        let refused = |r: &ForceReleaseRequest, hold: Option<&[Hold]>| {
            admit_create("r1", r, "shop/orders", hold, "alice", ts(0)).expect_err("refused")
        };
        assert!(refused(&request(&[]), None).contains("lock shop/orders does not exist"));
        assert!(refused(&request(&[]), Some(&[Hold::Free][..])).contains("is not held"));
        assert!(
            refused(&request(&[]), Some(&[Hold::Draining { token: "41".into() }][..]))
                .contains("already being revoked")
        );
        let mut other = request(&[]);
        other.spec.target_holder = Some("b_2".into());
        let m = refused(&other, Some(std::slice::from_ref(&held)));
        assert!(m.contains("held by a_1") && m.contains("not by b_2"), "{m}");
        let mut old_token = request(&[]);
        old_token.spec.target_token = Some(41);
        assert!(refused(&old_token, Some(std::slice::from_ref(&held))).contains("not 41"));
        let mut pre_approved = request(&[]);
        pre_approved.spec.approvals = vec![Approval { by: "bob".into(), at: Time(ts(0)) }];
        assert!(refused(&pre_approved, Some(std::slice::from_ref(&held))).contains("spec.approvals"));
        assert!(
            refused(&request(&[(ANNOTATION_APPROVE, "yes")]), Some(std::slice::from_ref(&held)))
                .contains("as it is created")
        );
        let mut blank = request(&[]);
        blank.spec.reason = "  ".into();
        assert!(refused(&blank, Some(std::slice::from_ref(&held))).contains("spec.reason"));
    }

    #[test]
    fn the_target_among_the_holds_of_every_slot() {
        let a = Hold::Held { holder: "a_1".into(), token: 42 };
        let b = Hold::Held { holder: "b_2".into(), token: 43 };
        let holds = [Hold::Free, a.clone(), b.clone(), Hold::Draining { token: "40".into() }];
        assert_eq!(target("shop/pool", &holds, None, Some(43)), Ok(("b_2", 43)));
        assert_eq!(target("shop/pool", &holds, Some("a_1"), None), Ok(("a_1", 42)));
        assert_eq!(target("shop/pool", &holds, Some("a_1"), Some(42)), Ok(("a_1", 42)));
        assert_eq!(
            target("shop/pool", &holds, None, None),
            Err("lock shop/pool has 2 holders (a_1 (token 42), b_2 (token 43)): name the hold to revoke with spec.targetToken (leasehold release --force --token)".into())
        );
        assert_eq!(
            target("shop/pool", &holds, Some("a_1"), Some(43)),
            Err("lock shop/pool has no hold by a_1 with token 43: its holders are a_1 (token 42), b_2 (token 43)"
                .into())
        );
        assert_eq!(
            target("shop/pool", &holds, None, Some(41)),
            Err("lock shop/pool has no hold with token 41: its holders are a_1 (token 42), b_2 (token 43)".into())
        );
        // One hold, as on a mutex: the only one, whichever slot it is on.
        assert_eq!(target("shop/pool", &[Hold::Free, b], None, None), Ok(("b_2", 43)));
        let draining = [Hold::Free, Hold::Draining { token: "40".into() }];
        assert!(
            target("shop/pool", &draining, None, None)
                .expect_err("none held")
                .contains("token 40 is already being revoked")
        );
    }

    fn stamped(approvals: &[&str]) -> ForceReleaseRequest {
        let mut r = request(&[]);
        r.spec.requester = Some("alice".into());
        r.spec.expires_at = Some(Time(ts(600)));
        r.spec.approvals = approvals.iter().map(|b| Approval { by: (*b).into(), at: Time(ts(1)) }).collect();
        r
    }

    #[test]
    fn updates_change_approvals_only_through_the_annotations() {
        let old = stamped(&[]);
        assert_eq!(classify_update("r1", &old, &old), Ok(Change::Other));
        let mut approving = old.clone();
        approving.metadata.annotations = Some([(ANNOTATION_APPROVE.to_owned(), "true".to_owned())].into());
        assert_eq!(classify_update("r1", &old, &approving), Ok(Change::Approve));
        let mut denying = old.clone();
        denying.metadata.annotations = Some([(ANNOTATION_DENY.to_owned(), " not stuck ".to_owned())].into());
        assert_eq!(classify_update("r1", &old, &denying), Ok(Change::Deny("not stuck".into())));
        // A client writing an approval (anyone's name, its own included) is refused.
        let forged = stamped(&["bob"]);
        assert!(classify_update("r1", &old, &forged).expect_err("refused").contains("only by the admission webhook"));
        let mut both = approving.clone();
        both.metadata.annotations.as_mut().expect("some").insert(ANNOTATION_DENY.into(), "x".into());
        assert!(classify_update("r1", &old, &both).is_err());
    }

    #[test]
    fn approval_table() {
        let fresh = stamped(&[]);
        let now = ts(10);
        // Another person with the verb: recorded under their name, annotation removed.
        let patch = ops(admit_change("r1", &fresh, &Change::Approve, "bob", true, now).expect("ok").expect("a patch"));
        assert_eq!(patch[0], json!({"op": "remove", "path": "/metadata/annotations/leasehold.dev~1approve"}));
        assert_eq!(patch[1]["path"], "/spec/approvals");
        assert_eq!(patch[1]["value"][0]["by"], "bob");
        // A second approver is appended.
        let patch = ops(admit_change("r1", &stamped(&["bob"]), &Change::Approve, "carol", true, now)
            .expect("ok")
            .expect("a patch"));
        assert_eq!(patch[1]["path"], "/spec/approvals/-");
        // The same approver again: only the annotation goes.
        let patch = ops(admit_change("r1", &stamped(&["bob"]), &Change::Approve, "bob", true, now)
            .expect("ok")
            .expect("a patch"));
        assert_eq!(patch.as_array().map(Vec::len), Some(1));
        // Refused: the requester (even with the verb), no verb, expired, final.
        let own = admit_change("r1", &fresh, &Change::Approve, "alice", true, now).expect_err("refused");
        assert!(own.contains("cannot approve"), "{own}");
        let no_verb = admit_change("r1", &fresh, &Change::Approve, "eve", false, now).expect_err("refused");
        assert!(no_verb.contains("forcereleaserequests/approval") && no_verb.contains("eve"), "{no_verb}");
        assert!(
            admit_change("r1", &fresh, &Change::Approve, "bob", true, ts(600))
                .expect_err("refused")
                .contains("expired")
        );
        let mut done = fresh.clone();
        done.status = Some(ForceReleaseRequestStatus { phase: Some(Phase::Executed), ..Default::default() });
        assert!(
            admit_change("r1", &done, &Change::Approve, "bob", true, now)
                .expect_err("refused")
                .contains("already Executed")
        );
        // Denial: an approver or the requester; recorded with the reason.
        let deny = Change::Deny("not stuck".into());
        let patch = ops(admit_change("r1", &fresh, &deny, "alice", false, now).expect("ok").expect("a patch"));
        assert_eq!(patch[1]["value"]["by"], "alice");
        assert_eq!(patch[1]["value"]["reason"], "not stuck");
        assert!(admit_change("r1", &fresh, &deny, "bob", true, now).is_ok());
        assert!(admit_change("r1", &fresh, &deny, "eve", false, now).is_err());
        assert_eq!(admit_change("r1", &fresh, &Change::Other, "eve", false, now), Ok(None));
    }
}
