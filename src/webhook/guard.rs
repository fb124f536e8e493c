//! The Lease guard: a ValidatingAdmissionPolicy in CEL, evaluated by the apiserver itself
//! on every write of a Lease labelled `leasehold.dev/lock` (the label on either the old or
//! the new object, so removing the labels is no way around it).
//!
//! Except for the controller's own ServiceAccount:
//! - nobody creates a lock Lease, and nobody but the holder touches a hold: a writer may
//!   renew (only `renewTime` changes) or release (holder cleared) a hold whose identity is
//!   its own — for a pod, `<pod-name>_<pod-uid>` from the Pod-bound token's user info; for
//!   anyone else, an identity starting with `<username>/`;
//! - the token, claim and revocation annotations, `acquireTime`, `leaseDurationSeconds`,
//!   `leaseTransitions`, labels and owner references of a lock Lease never change;
//! - a claim Lease must name its creator, and only its creator may change it.
//!
//! Deletions are not guarded: deleting a Lease takes nothing (the holder loses its hold,
//! and the controller re-creates the Lease with a higher token).

use serde_json::{Value, json};

/// Name of the policy and of its binding.
pub const POLICY_NAME: &str = "leasehold-lease-guard";

const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// CEL: the requester's own identity, as a prefix test on a holder identity.
fn variables() -> Value {
    let extra = |key: &str| {
        format!(
            "has(request.userInfo.extra) && '{key}' in request.userInfo.extra && size(request.userInfo.extra['{key}']) > 0 ? request.userInfo.extra['{key}'][0] : ''"
        )
    };
    json!([
        {"name": "podName", "expression": extra(POD_NAME)},
        {"name": "podUid", "expression": extra(POD_UID)},
        {"name": "isPod", "expression": "variables.podName != '' && variables.podUid != ''"},
        {"name": "me", "expression": "variables.isPod ? variables.podName + '_' + variables.podUid : request.userInfo.username + '/'"},
        {"name": "role", "expression": "oldObject != null && has(oldObject.metadata.labels) && 'leasehold.dev/role' in oldObject.metadata.labels ? oldObject.metadata.labels['leasehold.dev/role'] : (has(object.metadata.labels) && 'leasehold.dev/role' in object.metadata.labels ? object.metadata.labels['leasehold.dev/role'] : '')"},
        {"name": "newHolder", "expression": "has(object.spec) && has(object.spec.holderIdentity) ? object.spec.holderIdentity : ''"},
        {"name": "oldHolder", "expression": "oldObject != null && has(oldObject.spec) && has(oldObject.spec.holderIdentity) ? oldObject.spec.holderIdentity : ''"},
        {"name": "ownsNew", "expression": "variables.isPod ? variables.newHolder == variables.me : variables.newHolder.startsWith(variables.me)"},
        {"name": "ownsOld", "expression": "variables.isPod ? variables.oldHolder == variables.me : variables.oldHolder.startsWith(variables.me)"},
        {"name": "isUpdate", "expression": "request.operation == 'UPDATE'"},
    ])
}

/// CEL: `field` of `spec` is the same in the old and the new object (absent in both counts).
fn same_spec(field: &str) -> String {
    format!(
        "(has(object.spec) && has(object.spec.{field})) == (has(oldObject.spec) && has(oldObject.spec.{field})) && (!(has(object.spec) && has(object.spec.{field})) || object.spec.{field} == oldObject.spec.{field})"
    )
}

fn same_meta(field: &str) -> String {
    format!(
        "has(object.metadata.{field}) == has(oldObject.metadata.{field}) && (!has(object.metadata.{field}) || object.metadata.{field} == oldObject.metadata.{field})"
    )
}

fn validations() -> Value {
    let frozen = ["acquireTime", "leaseDurationSeconds", "leaseTransitions"].map(same_spec).join(" && ")
        + " && "
        + &same_meta("annotations")
        + " && "
        + &same_meta("ownerReferences");
    json!([
        {
            "expression": format!("!variables.isUpdate || ({})", same_meta("labels")),
            "message": "the labels of a Leasehold Lease can only be changed by the Leasehold controller",
            "reason": "Forbidden",
        },
        {
            "expression": "variables.role == 'claim' || (variables.role == 'lock' && variables.isUpdate)",
            "message": "only the Leasehold controller creates lock Leases; others may create only claim Leases (leasehold.dev/role: claim)",
            "reason": "Forbidden",
        },
        {
            "expression": "variables.role != 'lock' || (variables.newHolder == variables.oldHolder && (variables.newHolder == '' || variables.ownsNew)) || (variables.newHolder == '' && variables.ownsOld)",
            "messageExpression": "'only the Leasehold controller grants a lock: ' + (variables.me.endsWith('/') ? 'user ' + request.userInfo.username : 'pod ' + variables.me) + ' may renew or release only its own hold (holder ' + variables.oldHolder + ')'",
            "reason": "Forbidden",
        },
        {
            "expression": format!("variables.role != 'lock' || !variables.isUpdate || ({frozen})"),
            "message": "only the Leasehold controller may change a lock Lease's token, claim, acquireTime, leaseDurationSeconds, leaseTransitions or owner",
            "reason": "Forbidden",
        },
        {
            "expression": "variables.role != 'claim' || (variables.ownsNew && (!variables.isUpdate || variables.ownsOld))",
            "messageExpression": "'a claim Lease must name its creator: holderIdentity must be ' + (variables.isPod ? variables.me : variables.me + '<suffix>') + ', not ' + variables.newHolder",
            "reason": "Forbidden",
        },
    ])
}

/// The policy, exempting `controller_user` (e.g. `system:serviceaccount:leasehold-system:leasehold`).
pub fn policy(controller_user: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": ["coordination.k8s.io"],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["leases"],
                }],
                "objectSelector": {"matchExpressions": [{"key": "leasehold.dev/lock", "operator": "Exists"}]},
            },
            "matchConditions": [{
                "name": "not-the-leasehold-controller",
                "expression": format!("request.userInfo.username != '{}'", controller_user.replace('\'', "")),
            }],
            "variables": variables(),
            "validations": validations(),
        },
    })
}

/// The binding, for all namespaces or only those matching `namespace_labels`.
pub fn binding(namespace_labels: Option<&serde_json::Map<String, Value>>) -> Value {
    let mut spec = json!({"policyName": POLICY_NAME, "validationActions": ["Deny"]});
    if let Some(labels) = namespace_labels {
        spec["matchResources"] = json!({"namespaceSelector": {"matchLabels": labels}});
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME},
        "spec": spec,
    })
}

/// Policy and binding as one YAML stream.
pub fn manifests(controller_user: &str) -> String {
    let docs = [policy(controller_user), binding(None)];
    docs.iter()
        .map(|d| serde_saphyr::to_string(d).expect("JSON values always serialize"))
        .collect::<Vec<_>>()
        .join("---\n")
}
