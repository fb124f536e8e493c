//! The lock Lease policy. A lock Lease is the grant itself: whoever could write it freely
//! could hand the lock to anyone, revive a revoked hold or wedge the lock. So, except for
//! the controller:
//! - nobody creates or deletes a lock Lease (deleting one would end the hold under its
//!   holder's feet and, re-created by someone else first, wedge the lock);
//! - nobody writes a free lock Lease (only the controller grants);
//! - only the holder writes a held one, and only to renew (`renewTime` alone changes,
//!   refused while `leasehold.dev/draining` says the hold was revoked), to release or
//!   acknowledge a revocation (`holderIdentity` cleared, nothing else), or to hand the lock
//!   on in its release to the waiter the controller recorded as next (`leasehold.dev/next-*`)
//!   — exactly the grant the controller would write: that waiter, its claim, its mode and
//!   the token minted for it (above the Lease's), `acquireTime` equal to `renewTime`, one
//!   more `leaseTransitions`, the record and the last revocation's reason removed, never
//!   while draining;
//! - labels, owner references, finalizers, `leaseDurationSeconds`, `preferredHolder` and
//!   `strategy` never change; annotations (token, claim, timing, draining, next waiter),
//!   `acquireTime` and `leaseTransitions` change only in a handoff.
//!
//! The policy selects Leases labelled `leasehold.dev/role: lock` on the old or the new
//! object (the apiserver matches an object selector against both), so removing the label
//! is no way around it. A Lease without the label is not a lock Lease, and nothing in
//! Leasehold treats it as one.

use serde_json::{Value, json};

use super::{is_requester, same_meta, same_spec};
use crate::crd::{
    ANNOTATION_CLAIM as CLAIM, ANNOTATION_CLAIM_UID as CLAIM_UID, ANNOTATION_DRAINING as DRAINING,
    ANNOTATION_MODE as MODE, ANNOTATION_NEXT_CLAIM as NEXT_CLAIM, ANNOTATION_NEXT_CLAIM_UID as NEXT_CLAIM_UID,
    ANNOTATION_NEXT_HOLDER as NEXT_HOLDER, ANNOTATION_NEXT_MODE as NEXT_MODE, ANNOTATION_NEXT_TOKEN as NEXT_TOKEN,
    ANNOTATION_REVOKED as REVOKED, ANNOTATION_TOKEN as TOKEN, LABEL_ROLE, ROLE_LOCK,
};
use crate::lease::next::ANNOTATIONS as NEXT_ANNOTATIONS;

/// Test only (`broken-guard-handoff`): a holder may hand its lock on to anyone, with any
/// token and annotations, to show that the fault suite catches a guard that lets it.
const UNGUARDED_HANDOFF: bool = cfg!(feature = "broken-guard-handoff");

/// Name of the policy and of its binding.
pub const POLICY_NAME: &str = "leasehold-lease-guard";

fn variables() -> Vec<Value> {
    vec![
        json!({"name": "oldHolder", "expression": "oldObject != null && has(oldObject.spec) && has(oldObject.spec.holderIdentity) ? oldObject.spec.holderIdentity : ''"}),
        json!({"name": "newHolder", "expression": "object != null && has(object.spec) && has(object.spec.holderIdentity) ? object.spec.holderIdentity : ''"}),
        json!({"name": "holderWrites", "expression": format!("request.operation == 'UPDATE' && variables.oldHolder != '' && {}", is_requester("variables.oldHolder"))}),
        json!({"name": "draining", "expression": format!("oldObject != null && has(oldObject.metadata.annotations) && '{DRAINING}' in oldObject.metadata.annotations")}),
        json!({"name": "handsOn", "expression": "variables.holderWrites && variables.newHolder != '' && variables.newHolder != variables.oldHolder"}),
    ]
}

/// CEL list of quoted annotation keys.
fn keys(keys: &[&str]) -> String {
    format!("[{}]", keys.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", "))
}

/// CEL: the update is exactly the grant the controller recorded as next — see the module
/// documentation. `old` and `new` are the two objects' annotations.
fn handoff_is_the_recorded_grant() -> String {
    let (old, new) = ("oldObject.metadata.annotations", "object.metadata.annotations");
    let required = keys(&[NEXT_HOLDER, NEXT_CLAIM, NEXT_CLAIM_UID, NEXT_TOKEN]);
    let next = keys(&NEXT_ANNOTATIONS);
    let written =
        keys(&[TOKEN, CLAIM, CLAIM_UID, MODE, REVOKED, NEXT_HOLDER, NEXT_CLAIM, NEXT_CLAIM_UID, NEXT_TOKEN, NEXT_MODE]);
    [
        "has(oldObject.metadata.annotations) && has(object.metadata.annotations)".to_owned(),
        format!("{required}.all(k, k in {old})"),
        format!("variables.newHolder == {old}['{NEXT_HOLDER}']"),
        format!("{old}['{NEXT_TOKEN}'].matches('^[1-9][0-9]{{0,18}}$')"),
        format!("(!('{TOKEN}' in {old}) || int({old}['{NEXT_TOKEN}']) > int({old}['{TOKEN}']))"),
        format!("'{TOKEN}' in {new} && {new}['{TOKEN}'] == {old}['{NEXT_TOKEN}']"),
        format!("'{CLAIM}' in {new} && {new}['{CLAIM}'] == {old}['{NEXT_CLAIM}']"),
        format!("'{CLAIM_UID}' in {new} && {new}['{CLAIM_UID}'] == {old}['{NEXT_CLAIM_UID}']"),
        format!("('{NEXT_MODE}' in {old} ? ('{MODE}' in {new} && {new}['{MODE}'] == {old}['{NEXT_MODE}']) : !('{MODE}' in {new}))"),
        format!("!('{REVOKED}' in {new}) && {next}.all(k, !(k in {new}))"),
        format!("{new}.all(k, k in {written} || (k in {old} && {old}[k] == {new}[k]))"),
        format!("{old}.all(k, k in {written} || k in {new})"),
        "has(object.spec) && has(object.spec.acquireTime) && has(object.spec.renewTime) && object.spec.acquireTime == object.spec.renewTime".to_owned(),
        "has(object.spec.leaseTransitions) && object.spec.leaseTransitions == (has(oldObject.spec.leaseTransitions) ? oldObject.spec.leaseTransitions : 0) + 1".to_owned(),
    ]
    .join(" && ")
}

fn validations() -> Value {
    let update = "request.operation != 'UPDATE'";
    let frozen_meta = ["labels", "ownerReferences", "finalizers"].map(same_meta).join(" && ");
    let same_annotations = same_meta("annotations");
    let frozen_spec = ["leaseDurationSeconds", "preferredHolder", "strategy"].map(same_spec).join(" && ");
    let granted_spec = ["acquireTime", "leaseTransitions"].map(same_spec).join(" && ");
    let same_renew_time = same_spec("renewTime");
    json!([
        {
            "expression": "request.operation != 'CREATE'",
            "messageExpression": "'only the Leasehold controller creates lock Leases (leasehold.dev/role: lock): ' + variables.requester + ' may not create ' + object.metadata.name",
            "message": "only the Leasehold controller creates lock Leases (leasehold.dev/role: lock)",
            "reason": "Forbidden",
        },
        {
            "expression": "request.operation != 'DELETE'",
            "messageExpression": "'only the Leasehold controller deletes lock Lease ' + request.name + ' (it does when its DistributedLock is deleted): ' + variables.requester + ' may not'",
            "message": "only the Leasehold controller deletes lock Leases (it does when their DistributedLock is deleted)",
            "reason": "Forbidden",
        },
        {
            "expression": format!("{update} || ({frozen_meta})"),
            "messageExpression": "'the labels, owner references and finalizers of lock Lease ' + request.name + ' are written only by the Leasehold controller'",
            "message": "the labels, owner references and finalizers of a lock Lease are written only by the Leasehold controller",
            "reason": "Forbidden",
        },
        {
            "expression": format!("{update} || variables.handsOn || ({same_annotations})"),
            "messageExpression": "'the annotations (token, claim, timing, draining, next waiter) of lock Lease ' + request.name + ' are written only by the Leasehold controller, or by its holder handing it on to the waiter recorded as next'",
            "message": "the annotations of a lock Lease are written only by the Leasehold controller, or by its holder handing it on to the waiter recorded as next",
            "reason": "Forbidden",
        },
        {
            "expression": format!("{update} || ({frozen_spec})"),
            "messageExpression": "'leaseDurationSeconds, preferredHolder and strategy of lock Lease ' + request.name + ' are written only by the Leasehold controller'",
            "message": "leaseDurationSeconds, preferredHolder and strategy of a lock Lease are written only by the Leasehold controller",
            "reason": "Forbidden",
        },
        {
            "expression": format!("{update} || variables.handsOn || ({granted_spec})"),
            "messageExpression": "'acquireTime and leaseTransitions of lock Lease ' + request.name + ' change only with a grant: written by the Leasehold controller, or by its holder handing it on to the waiter recorded as next'",
            "message": "acquireTime and leaseTransitions of a lock Lease change only with a grant",
            "reason": "Forbidden",
        },
        {
            "expression": format!("{update} || variables.oldHolder != ''"),
            "messageExpression": "'lock Lease ' + request.name + ' is free: only the Leasehold controller writes a free lock Lease (it grants the lock to the head of the queue)'",
            "message": "only the Leasehold controller writes a free lock Lease",
            "reason": "Forbidden",
        },
        {
            "expression": format!("{update} || variables.oldHolder == '' || variables.holderWrites"),
            "messageExpression": "'only the holder of lock Lease ' + request.name + ' (' + variables.oldHolder + ') may renew or release it, not ' + variables.requester + '; only the Leasehold controller grants'",
            "message": "only the holder of a lock Lease may renew or release it; only the Leasehold controller grants",
            "reason": "Forbidden",
        },
        {
            "expression": "!variables.holderWrites || !variables.draining || variables.newHolder == ''",
            "messageExpression": format!("'the hold on lock Lease ' + request.name + ' with token ' + oldObject.metadata.annotations['{DRAINING}'] + ' was revoked: its holder may only release it (clear holderIdentity), not renew it'"),
            "message": "this hold was revoked (leasehold.dev/draining): its holder may only release it, not renew it",
            "reason": "Forbidden",
        },
        {
            "expression": format!(
                "!variables.holderWrites || variables.handsOn || (variables.newHolder == variables.oldHolder && has(object.spec) && has(object.spec.renewTime)) || (variables.newHolder == '' && {same_renew_time})"
            ),
            "messageExpression": "'the holder of lock Lease ' + request.name + ' may only renew it (change renewTime alone), release it (clear holderIdentity alone) or hand it on to the waiter recorded as next'",
            "message": "the holder of a lock Lease may only renew it (change renewTime alone), release it (clear holderIdentity alone) or hand it on to the waiter recorded as next",
            "reason": "Forbidden",
        },
        {
            "expression": if UNGUARDED_HANDOFF { "true".to_owned() } else { format!("!variables.handsOn || ({})", handoff_is_the_recorded_grant()) },
            "messageExpression": format!("'the holder of lock Lease ' + request.name + ' may hand it on only to the waiter the Leasehold controller recorded as next (' + (has(oldObject.metadata.annotations) && '{NEXT_HOLDER}' in oldObject.metadata.annotations ? oldObject.metadata.annotations['{NEXT_HOLDER}'] : 'none') + '), with its claim, mode and token and nothing else changed, not to ' + variables.newHolder"),
            "message": "the holder of a lock Lease may hand it on only to the waiter the Leasehold controller recorded as next, with its claim, mode and token and nothing else changed",
            "reason": "Forbidden",
        },
    ])
}

/// The policy, with the given exemptions.
pub fn policy(exempt: super::Exempt<'_>) -> Value {
    let constraints = json!({
        "resourceRules": [{
            "apiGroups": ["coordination.k8s.io"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["leases"],
        }],
        "objectSelector": {"matchLabels": {LABEL_ROLE: ROLE_LOCK}},
    });
    super::policy(POLICY_NAME, exempt, constraints, variables(), validations())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_lock_leases_for_every_write() {
        let policy = policy(super::super::Exempt { controller: "c", cleanup: &[] });
        let constraints = &policy["spec"]["matchConstraints"];
        assert_eq!(constraints["objectSelector"]["matchLabels"][LABEL_ROLE], ROLE_LOCK);
        assert_eq!(constraints["resourceRules"][0]["operations"], json!(["CREATE", "UPDATE", "DELETE"]));
    }

    #[test]
    fn every_update_rule_freezes_what_only_the_controller_writes() {
        let text = validations().to_string();
        for field in [
            "metadata.labels",
            "metadata.annotations",
            "metadata.ownerReferences",
            "metadata.finalizers",
            "spec.acquireTime",
            "spec.leaseDurationSeconds",
            "spec.leaseTransitions",
            "spec.preferredHolder",
            "spec.strategy",
        ] {
            assert!(text.contains(&format!("object.{field} == oldObject.{field}")), "{field} is not frozen");
        }
    }

    #[test]
    fn a_handoff_must_write_exactly_what_the_controller_recorded() {
        let rule = handoff_is_the_recorded_grant();
        for (written, recorded) in [(TOKEN, NEXT_TOKEN), (CLAIM, NEXT_CLAIM), (CLAIM_UID, NEXT_CLAIM_UID)] {
            let check =
                format!("object.metadata.annotations['{written}'] == oldObject.metadata.annotations['{recorded}']");
            assert!(rule.contains(&check), "{written} is not checked against {recorded}");
        }
        assert!(rule.contains(&format!("variables.newHolder == oldObject.metadata.annotations['{NEXT_HOLDER}']")));
        assert!(rule.contains(&format!(
            "int(oldObject.metadata.annotations['{NEXT_TOKEN}']) > int(oldObject.metadata.annotations['{TOKEN}'])"
        )));
        assert!(rule.contains("object.spec.acquireTime == object.spec.renewTime"), "an unconfirmed grant");
        assert!(rule.contains("oldObject.spec.leaseTransitions : 0) + 1"), "one more transition");
        // Every other annotation is kept, both ways.
        assert!(rule.contains("object.metadata.annotations.all(k, k in ["));
        assert!(rule.contains("oldObject.metadata.annotations.all(k, k in ["));
        // Only a handoff relaxes the annotations, acquireTime and leaseTransitions.
        let text = validations().to_string();
        assert!(text.contains("variables.handsOn || (has(object.metadata.annotations)"), "{text}");
        assert!(!UNGUARDED_HANDOFF || text.contains("\"expression\":\"true\""));
    }

    #[test]
    fn every_rule_names_the_lease_and_says_forbidden() {
        let rules = validations();
        for rule in rules.as_array().expect("a list") {
            assert_eq!(rule["reason"], "Forbidden");
            assert!(rule["message"].as_str().is_some_and(|m| !m.is_empty()), "{rule}");
            let message = rule["messageExpression"].as_str().expect("a message expression");
            assert!(message.contains("request.name") || message.contains("object.metadata.name"), "{message}");
        }
    }
}
