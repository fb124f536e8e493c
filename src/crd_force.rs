//! The `ForceReleaseRequest` resource (`leasehold.dev/v1alpha1`): an operator's request to
//! revoke a lock's current hold, approved by other people before the controller acts on it,
//! and the per-lock policy saying how many approvals it needs.
//!
//! The request is its own object (not a subresource of the lock) so that it has its own
//! RBAC (`create` for requesters, the `approve` verb on `forcereleaserequests/approval`
//! for approvers), its own lifetime and outcome, and is listed by `kubectl get frr`.
//!
//! Who asked, which hold it targets, when it expires, and every approval and denial are
//! written by the admission webhook from the request's `userInfo` — never taken from the
//! client. They live in `spec` because the apiserver drops `status` on create and ignores
//! it on updates of the main resource, so admission cannot stamp it; the CEL rules below
//! make each of them immutable (approvals append-only) once stamped. `status` is written
//! by the controller only.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Defaults and bounds of force-release requests.
pub mod limits {
    /// Default `spec.ttlSeconds`: an hour to gather approvals.
    pub const TTL_SECONDS: i32 = 3600;
    /// The most approvals a lock's policy may require.
    pub const MAX_APPROVALS: i32 = 5;
    /// How many entries `status.forceReleaseHistory` of a lock keeps.
    pub const HISTORY: usize = 20;
}

fn default_ttl() -> i32 {
    limits::TTL_SECONDS
}

/// A request to revoke the current hold of a DistributedLock (in the request's namespace),
/// carried out by the controller once approved by enough people other than the requester,
/// while unexpired and while its target still holds.
// Several printer columns share a type: clippy reads each as a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "leasehold.dev",
    version = "v1alpha1",
    kind = "ForceReleaseRequest",
    plural = "forcereleaserequests",
    namespaced,
    status = "ForceReleaseRequestStatus",
    shortname = "frr",
    category = "leasehold",
    derive = "PartialEq",
    doc = "A request to revoke a DistributedLock's current hold, approved by a second person.",
    printcolumn(name = "Lock", type_ = "string", json_path = ".spec.lock"),
    printcolumn(name = "Holder", type_ = "string", json_path = ".spec.targetHolder"),
    printcolumn(name = "Token", type_ = "integer", json_path = ".spec.targetToken"),
    printcolumn(name = "Requester", type_ = "string", json_path = ".spec.requester"),
    printcolumn(name = "Approvals", type_ = "string", json_path = ".status.approvalsText"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Expires", type_ = "date", json_path = ".spec.expiresAt"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("self.lock == oldSelf.lock").message("spec.lock is immutable").field_path(".lock"))]
#[x_kube(validation = Rule::new("self.reason == oldSelf.reason").message("spec.reason is immutable").field_path(".reason"))]
#[x_kube(validation = Rule::new("self.ttlSeconds == oldSelf.ttlSeconds")
    .message("spec.ttlSeconds is immutable")
    .field_path(".ttlSeconds"))]
#[x_kube(validation = Rule::new("has(self.requester) == has(oldSelf.requester) && (!has(self.requester) || self.requester == oldSelf.requester)")
    .message("spec.requester is stamped at admission and immutable")
    .field_path(".requester"))]
#[x_kube(validation = Rule::new("has(self.targetHolder) == has(oldSelf.targetHolder) && (!has(self.targetHolder) || self.targetHolder == oldSelf.targetHolder)")
    .message("spec.targetHolder is immutable")
    .field_path(".targetHolder"))]
#[x_kube(validation = Rule::new("has(self.targetToken) == has(oldSelf.targetToken) && (!has(self.targetToken) || self.targetToken == oldSelf.targetToken)")
    .message("spec.targetToken is immutable")
    .field_path(".targetToken"))]
#[x_kube(validation = Rule::new("has(self.expiresAt) == has(oldSelf.expiresAt) && (!has(self.expiresAt) || self.expiresAt == oldSelf.expiresAt)")
    .message("spec.expiresAt is stamped at admission and immutable")
    .field_path(".expiresAt"))]
#[x_kube(validation = Rule::new("!has(oldSelf.approvals) || (has(self.approvals) && oldSelf.approvals.all(a, a in self.approvals))")
    .message("spec.approvals only grows")
    .field_path(".approvals"))]
#[x_kube(validation = Rule::new("!has(oldSelf.denial) || (has(self.denial) && self.denial == oldSelf.denial)")
    .message("spec.denial is immutable once set")
    .field_path(".denial"))]
#[serde(rename_all = "camelCase")]
pub struct ForceReleaseRequestSpec {
    /// The DistributedLock whose hold to revoke (in the request's namespace).
    #[schemars(length(min = 1, max = 63))]
    pub lock: String,
    /// Why the hold must be revoked (recorded with the outcome).
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(validation = Rule::new("self.matches('\\\\S')").message("spec.reason must not be blank"))]
    pub reason: String,
    /// The holder identity the request is about. Stamped at admission with the current
    /// holder when omitted; refused when given and not the current holder. The request
    /// never revokes anyone else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub target_holder: Option<String>,
    /// The fencing token of the hold the request is about. Stamped at admission like
    /// `targetHolder`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub target_token: Option<i64>,
    /// How long after its creation the request can take effect.
    #[serde(default = "default_ttl")]
    #[schemars(range(min = 5, max = 604_800))]
    pub ttl_seconds: i32,
    /// Who asked: stamped by the admission webhook from the request's user, whatever the
    /// client wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub requester: Option<String>,
    /// After this the request can no longer take effect: stamped by the admission webhook
    /// (creation + `ttlSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// Approvals, appended only by the admission webhook when an approver (holding the
    /// `approve` verb on `forcereleaserequests/approval`, and not the requester) annotates
    /// the request with `leasehold.dev/approve`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub approvals: Vec<Approval>,
    /// A denial, written only by the admission webhook when an approver or the requester
    /// annotates the request with `leasehold.dev/deny: <reason>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denial: Option<Denial>,
}

/// One approval.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    /// The approver's user name, from the approving request's user.
    #[schemars(length(min = 1, max = 512))]
    pub by: String,
    /// When the apiserver admitted the approval.
    pub at: Time,
}

/// A denial.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Denial {
    /// Who denied.
    #[schemars(length(min = 1, max = 512))]
    pub by: String,
    /// When.
    pub at: Time,
    /// Why.
    #[schemars(length(max = 1024))]
    pub reason: String,
}

/// Where a request stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, schemars::JsonSchema)]
pub enum Phase {
    /// Waiting for approvals.
    Pending,
    /// Approved enough: the controller is revoking the target.
    Approved,
    /// The target hold was revoked (final).
    Executed,
    /// Denied, or not admitted by the webhook (final).
    Denied,
    /// Expired before it could take effect (final).
    Expired,
    /// Its target no longer holds (released, expired or revoked otherwise) (final).
    Superseded,
}

impl Phase {
    /// Whether nothing more happens to a request in this phase.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Executed | Phase::Denied | Phase::Expired | Phase::Superseded)
    }

    /// The name, as in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Approved => "Approved",
            Phase::Executed => "Executed",
            Phase::Denied => "Denied",
            Phase::Expired => "Expired",
            Phase::Superseded => "Superseded",
        }
    }
}

/// The outcome of a request, written only by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForceReleaseRequestStatus {
    /// `Pending`, `Approved`, then one of `Executed`, `Denied`, `Expired`, `Superseded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// What happened, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the phase last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Who asked (from `spec.requester`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester: Option<String>,
    /// The approvals the controller counted (by people other than the requester).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<Approval>,
    /// How many approvals the lock's policy required when last looked at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_approvals: Option<i32>,
    /// `<counted>/<required>`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals_text: Option<String>,
    /// The token revoked, once executed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_token: Option<i64>,
}

/// A lock's force-release policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForceReleasePolicy {
    /// How many people other than the requester must approve a ForceReleaseRequest. 0: a
    /// request acts at once, and so does the `leasehold.dev/force-release` annotation
    /// (one-step break glass). Unset: the controller's `--force-release-approvals` (the
    /// chart's `forceRelease.approvals`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 5))]
    pub approvals: Option<i32>,
}

/// One happening in a lock's force-release history.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForceReleaseEntry {
    /// When the controller saw it.
    pub at: Time,
    /// `Requested`, `Approved`, `Denied`, `Executed`, `Expired`, `Superseded`, or
    /// `Refused` (an annotation while the policy needs approvals).
    pub event: String,
    /// The ForceReleaseRequest, if it came from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Who did it: the requester, approver or denier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
