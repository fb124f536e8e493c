//! The LockClaim policy. A claim is a place in a lock's queue; its name is derived from
//! its claimant, so a claimant has at most one claim per lock, and nobody can take or
//! remove someone else's place. Except for the controller:
//! - a Pod creates only `<lock>.<pod-uid>`, with `spec.claimant: <pod-name>_<pod-uid>` and
//!   `spec.pod: <pod-name>` (name and UID from its Pod-bound token);
//! - anyone else creates only `<lock>.<suffix>` with a suffix starting `u-` (never a Pod
//!   UID) and `spec.claimant: <username>/<suffix>`, without `spec.pod`;
//! - label `leasehold.dev/lock` equals `spec.lock`;
//! - only the claimant the old object names updates or deletes a claim (the cluster's
//!   garbage collector and namespace controller may delete too).
//!
//! The CustomResourceDefinition's own rules keep `spec.lock`, `spec.claimant`, `spec.pod`
//! and `spec.requestTime` immutable.

use serde_json::{Value, json};

use super::is_requester;
use crate::crd::{GROUP, LABEL_LOCK};

/// Name of the policy and of its binding.
pub const POLICY_NAME: &str = "leasehold-claim-guard";

fn variables() -> Vec<Value> {
    let spec = |object: &str, field: &str| {
        format!("{object} != null && has({object}.spec) && has({object}.spec.{field}) ? {object}.spec.{field} : ''")
    };
    vec![
        json!({"name": "lock", "expression": spec("object", "lock")}),
        json!({"name": "claimant", "expression": spec("object", "claimant")}),
        json!({"name": "pod", "expression": spec("object", "pod")}),
        json!({"name": "oldClaimant", "expression": spec("oldObject", "claimant")}),
        json!({"name": "claimName", "expression": "object != null ? object.metadata.name : oldObject.metadata.name"}),
        json!({"name": "suffix", "expression": "variables.lock != '' && variables.claimName.startsWith(variables.lock + '.') ? variables.claimName.substring(size(variables.lock) + 1) : ''"}),
        json!({"name": "label", "expression": format!("object != null && has(object.metadata.labels) && '{LABEL_LOCK}' in object.metadata.labels ? object.metadata.labels['{LABEL_LOCK}'] : ''")}),
    ]
}

fn validations() -> Value {
    let create = "request.operation != 'CREATE'";
    json!([
        {
            "expression": format!("{create} || !variables.isPod || (variables.suffix == variables.podUid && variables.claimant == variables.podName + '_' + variables.podUid && variables.pod == variables.podName)"),
            "messageExpression": "'a claim by pod ' + variables.podName + ' must be named ' + variables.lock + '.' + variables.podUid + ' with spec.claimant ' + variables.podName + '_' + variables.podUid + ' and spec.pod ' + variables.podName + ' (one claim per claimant and lock), not ' + variables.claimName + ' for ' + variables.claimant",
            "message": "a claim by a pod must be named <lock>.<pod-uid> with spec.claimant <pod-name>_<pod-uid> and spec.pod <pod-name>",
            "reason": "Forbidden",
        },
        {
            "expression": format!("{create} || variables.isPod || (variables.suffix.startsWith('u-') && variables.claimant == request.userInfo.username + '/' + variables.suffix && variables.pod == '')"),
            "messageExpression": "'a claim by user ' + request.userInfo.username + ' must be named ' + variables.lock + '.u-<suffix> with spec.claimant ' + request.userInfo.username + '/u-<suffix> and no spec.pod, not ' + variables.claimName + ' for ' + variables.claimant",
            "message": "a claim by a user must be named <lock>.u-<suffix> with spec.claimant <username>/u-<suffix> and no spec.pod",
            "reason": "Forbidden",
        },
        {
            "expression": format!("request.operation == 'CREATE' || {}", is_requester("variables.oldClaimant")),
            "messageExpression": "'only its claimant ' + variables.oldClaimant + ' may change or delete claim ' + variables.claimName + ', not ' + variables.requester",
            "message": "only its claimant may change or delete a claim",
            "reason": "Forbidden",
        },
        {
            "expression": "request.operation == 'DELETE' || variables.label == variables.lock",
            "messageExpression": format!("'label {LABEL_LOCK} of claim ' + variables.claimName + ' must be its spec.lock (' + variables.lock + '), not \"' + variables.label + '\"'"),
            "message": format!("label {LABEL_LOCK} of a claim must be its spec.lock"),
            "reason": "Invalid",
        },
    ])
}

/// The policy, with the given exemptions.
pub fn policy(exempt: super::Exempt<'_>) -> Value {
    let constraints = json!({
        "resourceRules": [{
            "apiGroups": [GROUP],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["lockclaims"],
        }],
    });
    super::policy(POLICY_NAME, exempt, constraints, variables(), validations())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_every_claim_write_whatever_its_labels() {
        let policy = policy(super::super::Exempt { controller: "c", cleanup: &[] });
        let constraints = &policy["spec"]["matchConstraints"];
        assert!(constraints.get("objectSelector").is_none(), "{constraints}");
        assert_eq!(constraints["resourceRules"][0]["resources"], json!(["lockclaims"]));
        assert_eq!(constraints["resourceRules"][0]["operations"], json!(["CREATE", "UPDATE", "DELETE"]));
    }

    #[test]
    fn names_are_derived_from_the_claimant() {
        let text = validations().to_string();
        assert!(text.contains("variables.suffix == variables.podUid"), "{text}");
        assert!(text.contains("variables.suffix.startsWith('u-')"), "{text}");
        assert!(text.contains("request.userInfo.username + '/' + variables.suffix"), "{text}");
    }
}
