//! The guard: two ValidatingAdmissionPolicies in CEL, evaluated by the apiserver itself,
//! so that nobody but the controller decides who holds a lock.
//!
//! - [`lease`] guards lock Leases (labelled `leasehold.dev/role: lock`, on the old or the
//!   new object): nobody creates or deletes one, nobody writes a free one, and a holder
//!   may only renew (`renewTime` alone, never while the hold is draining) or release
//!   (`holderIdentity` cleared, nothing else).
//! - [`claim`] guards LockClaims: a claim is named after its claimant, who must be the
//!   requester (one claim per claimant and lock), and only that claimant changes or
//!   deletes it.
//!
//! Two policies rather than one with two resource rules: the Lease policy selects lock
//! Leases by label, so the apiserver skips every other Lease write (node heartbeats,
//! leader elections) without evaluating any CEL; a claim must be checked whatever its
//! labels say, so the claim policy cannot share that selector.
//!
//! Exempt: the controller's own user; the cluster's garbage collector and namespace
//! controller ([`CLEANUP_USERS`]) for deletions and for updates of nothing but owner
//! references and finalizers, so that owner references, orphaning, foreground and
//! namespace deletion keep working.

pub mod claim;
pub mod lease;

use serde_json::{Value, json};

/// Who deletes objects on the cluster's behalf: kube-controller-manager's garbage
/// collector and namespace controller, with per-controller credentials or with its own.
pub const CLEANUP_USERS: [&str; 3] = [
    "system:serviceaccount:kube-system:generic-garbage-collector",
    "system:serviceaccount:kube-system:namespace-controller",
    "system:kube-controller-manager",
];

const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// CEL: who the requester is. A Pod-bound token carries the Pod's name and UID in its
/// user info; anyone else is their user name.
fn requester_variables() -> Vec<Value> {
    let extra = |key: &str| {
        format!(
            "has(request.userInfo.extra) && '{key}' in request.userInfo.extra && size(request.userInfo.extra['{key}']) > 0 ? request.userInfo.extra['{key}'][0] : ''"
        )
    };
    vec![
        json!({"name": "podName", "expression": extra(POD_NAME)}),
        json!({"name": "podUid", "expression": extra(POD_UID)}),
        json!({"name": "isPod", "expression": "variables.podName != '' && variables.podUid != ''"}),
        json!({"name": "requester", "expression": "variables.isPod ? 'pod ' + variables.podName + '_' + variables.podUid : 'user ' + request.userInfo.username"}),
    ]
}

/// CEL: claimant identity `id` (a CEL string expression) is the requester's own — for a
/// Pod `<pod-name>_<pod-uid>`; for anyone else `<username>/<suffix>`, the suffix being
/// everything after the last `/` (so a user name containing `/` cannot pass for a
/// shorter one).
fn is_requester(id: &str) -> String {
    format!(
        "(variables.isPod ? {id} == variables.podName + '_' + variables.podUid : ({id}.lastIndexOf('/') > 0 && {id}.substring(0, {id}.lastIndexOf('/')) == request.userInfo.username))"
    )
}

/// CEL: `field` of `object.metadata` is the same in the old and the new object (absent in
/// both counts).
fn same_meta(field: &str) -> String {
    format!(
        "has(object.metadata.{field}) == has(oldObject.metadata.{field}) && (!has(object.metadata.{field}) || object.metadata.{field} == oldObject.metadata.{field})"
    )
}

/// CEL: `field` of `spec` is the same in the old and the new object (absent in both counts).
fn same_spec(field: &str) -> String {
    format!(
        "(has(object.spec) && has(object.spec.{field})) == (has(oldObject.spec) && has(oldObject.spec.{field})) && (!(has(object.spec) && has(object.spec.{field})) || object.spec.{field} == oldObject.spec.{field})"
    )
}

/// Who the policies exempt.
#[derive(Clone, Copy, Debug)]
pub struct Exempt<'a> {
    /// The controller's user: exempt from everything.
    pub controller: &'a str,
    /// The cluster's cleanup controllers ([`CLEANUP_USERS`]): exempt from deletions, and
    /// from updates that change nothing but owner references and finalizers (orphaning
    /// dependents, finishing a foreground deletion), which would otherwise leave an owner
    /// or the object itself stuck terminating.
    pub cleanup: &'a [&'a str],
}

/// CEL: an update changes nothing but `metadata.ownerReferences` and
/// `metadata.finalizers` (and what the apiserver maintains).
fn only_owners_and_finalizers() -> String {
    format!(
        "request.operation == 'UPDATE' && {} && {} && (has(object.spec) == has(oldObject.spec)) && (!has(object.spec) || object.spec == oldObject.spec)",
        same_meta("labels"),
        same_meta("annotations")
    )
}

/// The match conditions shared by both policies.
fn exemptions(exempt: Exempt<'_>) -> Value {
    let quoted = |user: &str| format!("'{}'", user.replace(['\'', '\\'], ""));
    let cleanup = exempt.cleanup.iter().map(|u| quoted(u)).collect::<Vec<_>>().join(", ");
    json!([
        {
            "name": "not-the-leasehold-controller",
            "expression": format!("request.userInfo.username != {}", quoted(exempt.controller)),
        },
        {
            "name": "not-a-cleanup-by-the-cluster",
            "expression": format!(
                "!(request.userInfo.username in [{cleanup}]) || !(request.operation == 'DELETE' || ({}))",
                only_owners_and_finalizers()
            ),
        },
    ])
}

/// A policy named `name` with the shared exemptions.
fn policy(
    name: &str,
    exempt: Exempt<'_>,
    match_constraints: Value,
    variables: Vec<Value>,
    validations: Value,
) -> Value {
    let mut all = requester_variables();
    all.extend(variables);
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": match_constraints,
            "matchConditions": exemptions(exempt),
            "variables": all,
            "validations": validations,
        },
    })
}

/// The binding of policy `policy_name`, for all namespaces or only those matching
/// `namespace_labels`.
pub fn binding(policy_name: &str, namespace_labels: Option<&serde_json::Map<String, Value>>) -> Value {
    let mut spec = json!({"policyName": policy_name, "validationActions": ["Deny"]});
    if let Some(labels) = namespace_labels {
        spec["matchResources"] = json!({"namespaceSelector": {"matchLabels": labels}});
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy_name},
        "spec": spec,
    })
}

/// Both policies, exempting `controller_user` (e.g.
/// `system:serviceaccount:leasehold-system:leasehold-controller`) and the cluster's
/// cleanup controllers.
pub fn policies(controller_user: &str) -> [Value; 2] {
    policies_exempting(Exempt { controller: controller_user, cleanup: &CLEANUP_USERS })
}

/// Both policies with the given exemptions.
pub fn policies_exempting(exempt: Exempt<'_>) -> [Value; 2] {
    [lease::policy(exempt), claim::policy(exempt)]
}

/// Both policies and their bindings (all namespaces) as one YAML stream.
pub fn manifests(controller_user: &str) -> String {
    let [lease, claim] = policies(controller_user);
    let docs = [lease, binding(lease::POLICY_NAME, None), claim, binding(claim::POLICY_NAME, None)];
    docs.iter()
        .map(|d| serde_saphyr::to_string(d).expect("JSON values always serialize"))
        .collect::<Vec<_>>()
        .join("---\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_is_exempt_and_cleanup_only_for_delete() {
        for policy in policies("system:serviceaccount:ops:leasehold") {
            let conditions = &policy["spec"]["matchConditions"];
            let controller = conditions[0]["expression"].as_str().expect("expression");
            assert_eq!(controller, "request.userInfo.username != 'system:serviceaccount:ops:leasehold'");
            let cleanup = conditions[1]["expression"].as_str().expect("expression");
            assert!(
                cleanup.contains("!(request.operation == 'DELETE' || (request.operation == 'UPDATE' && "),
                "{cleanup}"
            );
            for same in ["object.spec == oldObject.spec", "object.metadata.labels == oldObject.metadata.labels"] {
                assert!(cleanup.contains(same), "{cleanup} lacks {same}");
            }
            for user in CLEANUP_USERS {
                assert!(cleanup.contains(&format!("'{user}'")), "{cleanup} lacks {user}");
            }
            assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        }
    }

    #[test]
    fn a_quote_in_the_controller_user_cannot_break_out_of_the_expression() {
        let [lease, _] = policies("x' || true || '");
        let expression = lease["spec"]["matchConditions"][0]["expression"].as_str().expect("expression");
        assert_eq!(expression, "request.userInfo.username != 'x || true || '");
    }

    #[test]
    fn manifests_carry_two_policies_and_their_bindings() {
        let yaml = manifests("system:serviceaccount:ops:leasehold");
        let docs: Vec<&str> = yaml.split("---\n").collect();
        assert_eq!(docs.len(), 4);
        for (doc, kind, name) in [
            (docs[0], "ValidatingAdmissionPolicy", lease::POLICY_NAME),
            (docs[1], "ValidatingAdmissionPolicyBinding", lease::POLICY_NAME),
            (docs[2], "ValidatingAdmissionPolicy", claim::POLICY_NAME),
            (docs[3], "ValidatingAdmissionPolicyBinding", claim::POLICY_NAME),
        ] {
            let value: Value = serde_saphyr::from_str(doc).expect("YAML");
            assert_eq!((value["kind"].as_str(), value["metadata"]["name"].as_str()), (Some(kind), Some(name)));
        }
    }

    #[test]
    fn identities_are_compared_whole() {
        let pod = is_requester("x");
        assert!(pod.contains("x == variables.podName + '_' + variables.podUid"), "{pod}");
        // A user's identity is `<username>/<suffix>`, split at the last slash.
        assert!(pod.contains("x.substring(0, x.lastIndexOf('/')) == request.userInfo.username"), "{pod}");
    }
}
