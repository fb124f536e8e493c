//! The custom resources (`leasehold.dev/v1alpha1`): `DistributedLock` and `LockClaim`, and
//! the label, annotation, finalizer and field-manager names every component agrees on.
//!
//! The spec is validated by the apiserver itself (OpenAPI bounds plus CEL rules), so a bad
//! lock is refused at `kubectl apply` time with a message that names the field, and the
//! controller never has to guess what an invalid timing means. The status is written only
//! by the controller, by server-side apply.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

pub use crate::crd_force::{
    Approval, Denial, ForceReleaseEntry, ForceReleasePolicy, ForceReleaseRequest, ForceReleaseRequestSpec,
    ForceReleaseRequestStatus, Phase,
};

/// API group of every Leasehold resource and the prefix of its labels and annotations.
pub const GROUP: &str = "leasehold.dev";

/// Label on lock Leases and LockClaims: the name of the lock they belong to.
pub const LABEL_LOCK: &str = "leasehold.dev/lock";
/// Label on lock Leases: their role, [`ROLE_LOCK`].
pub const LABEL_ROLE: &str = "leasehold.dev/role";
/// Value of [`LABEL_ROLE`] on the one Lease per lock that the controller grants.
pub const ROLE_LOCK: &str = "lock";
/// Annotation carrying a fencing token (decimal). On the lock Lease: the highest token
/// issued or reserved for the lock. On a fenced object: the token its writer holds.
pub const ANNOTATION_TOKEN: &str = "leasehold.dev/fencing-token";
/// Annotation on the lock Lease naming the LockClaim of the current holder.
pub const ANNOTATION_CLAIM: &str = "leasehold.dev/claim";
/// Annotation on the lock Lease naming the UID of the LockClaim the current hold was
/// granted on: a claimant answers a grant before confirming it only when it names the
/// claim that claimant made, whose sending it knows.
pub const ANNOTATION_CLAIM_UID: &str = "leasehold.dev/claim-uid";
/// Annotation on the lock Lease recording why the controller last took a hold away.
pub const ANNOTATION_REVOKED: &str = "leasehold.dev/revoked";
/// Annotation on a DistributedLock asking the controller to revoke the current hold.
/// The value is the operator's reason; it must not be empty.
pub const ANNOTATION_FORCE_RELEASE: &str = "leasehold.dev/force-release";
/// Annotation stamped by the admission webhook: who asked for the force release.
pub const ANNOTATION_FORCE_RELEASE_BY: &str = "leasehold.dev/force-release-by";
/// Annotation stamped with a force release: the token of the hold it revokes (the holder's
/// at admission). The controller revokes only a hold with that token, so a request it
/// could not clear never touches a later holder. `none`: nothing was held.
pub const ANNOTATION_FORCE_RELEASE_TARGET: &str = "leasehold.dev/force-release-target";
/// Annotation on the lock Lease: the renew deadline (seconds) the current hold was granted
/// under. With `spec.leaseDurationSeconds` and the two below, the timing both the controller
/// and the holder use for the life of the hold, whatever later edits of the lock say.
pub const ANNOTATION_RENEW_DEADLINE: &str = "leasehold.dev/renew-deadline-seconds";
/// Annotation on the lock Lease: the retry period (seconds) the current hold was granted under.
pub const ANNOTATION_RETRY_PERIOD: &str = "leasehold.dev/retry-period-seconds";
/// Annotation on the lock Lease: the maximum hold (seconds) the current hold was granted
/// under; absent when there is none.
pub const ANNOTATION_MAX_HOLD: &str = "leasehold.dev/max-hold-seconds";
/// Annotation on the lock Lease while a revoked holder may still believe it holds: the
/// revoked token. `holderIdentity` keeps naming the revoked holder until it acknowledges
/// (clears it) or the drain times out; nobody else is granted meanwhile.
pub const ANNOTATION_DRAINING: &str = "leasehold.dev/draining";
/// On a slot Lease granted to a writer: `Write` (every permit is its).
/// Written only by the controller.
pub const ANNOTATION_MODE: &str = "leasehold.dev/mode";
/// On a lock's slot 0 Lease: the lock's permits, when more than one (claimants watch that
/// many slot Leases). Written only by the controller.
pub const ANNOTATION_PERMITS: &str = "leasehold.dev/permits";
/// Annotations on a held lock Lease naming the waiter the controller will grant next: its
/// identity, its LockClaim's name and UID, the token minted for its grant and, for a
/// writer, its mode. Written only by the controller; the holder's release may hand the
/// lock on to exactly that waiter with exactly that token (the guard checks it), so a
/// handoff need not wait for the controller to see the release.
pub const ANNOTATION_NEXT_HOLDER: &str = "leasehold.dev/next-holder";
/// See [`ANNOTATION_NEXT_HOLDER`]: the next waiter's LockClaim name.
pub const ANNOTATION_NEXT_CLAIM: &str = "leasehold.dev/next-claim";
/// See [`ANNOTATION_NEXT_HOLDER`]: the next waiter's LockClaim UID.
pub const ANNOTATION_NEXT_CLAIM_UID: &str = "leasehold.dev/next-claim-uid";
/// See [`ANNOTATION_NEXT_HOLDER`]: the token minted for the next waiter's grant.
pub const ANNOTATION_NEXT_TOKEN: &str = "leasehold.dev/next-token";
/// See [`ANNOTATION_NEXT_HOLDER`]: the next waiter's mode, when it is a writer.
pub const ANNOTATION_NEXT_MODE: &str = "leasehold.dev/next-mode";
/// Finalizer the controller puts on every DistributedLock: on deletion, the current hold is
/// drained and the lock Lease deleted before the lock goes.
pub const FINALIZER: &str = "leasehold.dev/lease";
/// Pod label opting a Pod in to sidecar injection.
pub const LABEL_INJECT: &str = "leasehold.dev/inject";
/// Pod annotation: hold this lock for the Pod's whole life (hold mode).
pub const ANNOTATION_HOLD: &str = "leasehold.dev/hold";
/// Label on any object whose writes are fenced by the named lock.
pub const LABEL_FENCED_BY: &str = "leasehold.dev/fenced-by";
/// Labels on everything the controller creates in app namespaces (lock Leases, the client
/// Role and RoleBinding), so that it can be found and removed:
/// `kubectl get role,rolebinding,lease -A -l app.kubernetes.io/managed-by=leasehold`.
pub const MANAGED_LABELS: [(&str, &str); 2] =
    [("app.kubernetes.io/managed-by", "leasehold"), ("app.kubernetes.io/part-of", "leasehold")];

/// Server-side-apply field manager of the controller.
pub const MANAGER_CONTROLLER: &str = "leasehold-controller";
/// Field manager of the sidecar.
pub const MANAGER_SIDECAR: &str = "leasehold-sidecar";
/// Annotation an approver puts on a ForceReleaseRequest to approve it; the admission
/// webhook turns it into an entry of `spec.approvals` naming the approver, and removes it.
pub const ANNOTATION_APPROVE: &str = "leasehold.dev/approve";
/// Annotation an approver (or the requester) puts on a ForceReleaseRequest to deny it, its
/// value the reason; the admission webhook turns it into `spec.denial`, and removes it.
pub const ANNOTATION_DENY: &str = "leasehold.dev/deny";
/// Field manager of `leasehold run` and the other CLI commands.
pub const MANAGER_CLI: &str = "leasehold-cli";

/// Defaults, shared by the schema and by code that reads an unset field.
pub mod defaults {
    /// Default `spec.leaseDurationSeconds`.
    pub const LEASE_DURATION_SECONDS: i32 = 15;
    /// Default `spec.renewDeadlineSeconds`.
    pub const RENEW_DEADLINE_SECONDS: i32 = 10;
    /// Default `spec.retryPeriodSeconds`.
    pub const RETRY_PERIOD_SECONDS: i32 = 2;
    /// How many waiters `status.waiters` lists; `status.queueLength` counts them all.
    pub const MAX_LISTED_WAITERS: usize = 10;
}

fn default_permits() -> i32 {
    1
}
fn default_lease_duration() -> i32 {
    defaults::LEASE_DURATION_SECONDS
}
fn default_renew_deadline() -> i32 {
    defaults::RENEW_DEADLINE_SECONDS
}
fn default_retry_period() -> i32 {
    defaults::RETRY_PERIOD_SECONDS
}

/// A mutual-exclusion lock granted through a `coordination.k8s.io/v1` Lease of the same
/// name, fair (FIFO) and fenced: every grant carries a strictly increasing token.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "leasehold.dev",
    version = "v1alpha1",
    kind = "DistributedLock",
    namespaced,
    status = "DistributedLockStatus",
    shortname = "dlock",
    category = "leasehold",
    derive = "PartialEq",
    doc = "A fair, fenced distributed lock granted by the Leasehold controller.",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Holder", type_ = "string", json_path = ".status.holder.identity"),
    printcolumn(name = "Holders", type_ = "string", json_path = ".status.heldPermits"),
    printcolumn(name = "Token", type_ = "integer", json_path = ".status.fencingToken"),
    printcolumn(name = "Waiters", type_ = "integer", json_path = ".status.queueLength"),
    printcolumn(name = "Held", type_ = "date", json_path = ".status.holder.acquiredAt"),
    printcolumn(name = "Last-Wait", type_ = "number", json_path = ".status.stats.lastWaitSeconds"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
        .message("metadata.name must be a DNS label: at most 63 lowercase letters, digits and '-', no dots (LockClaim names use dots)")
)]
#[x_kube(validation = Rule::new("self.leaseDurationSeconds > self.renewDeadlineSeconds")
    .message("spec.leaseDurationSeconds must be greater than spec.renewDeadlineSeconds")
    .field_path(".leaseDurationSeconds"))]
#[x_kube(validation = Rule::new("self.renewDeadlineSeconds * 5 > self.retryPeriodSeconds * 6")
    .message("spec.renewDeadlineSeconds must be greater than 1.2 x spec.retryPeriodSeconds")
    .field_path(".renewDeadlineSeconds"))]
#[serde(rename_all = "camelCase")]
pub struct DistributedLockSpec {
    /// How many may hold the lock at once (a semaphore's permits; 1: a mutex). Each
    /// permit is a slot with a Lease of its own; tokens increase across the whole lock.
    /// Lowering it never revokes a hold: holds above the new number run their course, and
    /// nobody is granted until fewer than the new number hold.
    #[serde(default = "default_permits")]
    #[schemars(range(min = 1, max = 64))]
    pub permits: i32,
    /// How long a hold lasts without renewal before the controller may expire it.
    #[serde(default = "default_lease_duration")]
    #[schemars(range(min = 3, max = 3600))]
    pub lease_duration_seconds: i32,
    /// How long a holder keeps trying to renew before it declares the hold lost
    /// (self-fencing). Must be shorter than the lease duration.
    #[serde(default = "default_renew_deadline")]
    #[schemars(range(min = 2, max = 3600))]
    pub renew_deadline_seconds: i32,
    /// How often a holder renews (a waiter refreshes its claim every `max(leaseDuration, 10 s)`).
    #[serde(default = "default_retry_period")]
    #[schemars(range(min = 1, max = 600))]
    pub retry_period_seconds: i32,
    /// `FIFO` grants in claim order; `None` grants to any live claimant.
    #[serde(default)]
    pub fairness: Fairness,
    /// The controller revokes a hold older than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 31_536_000))]
    pub max_hold_seconds: Option<i32>,
    /// ServiceAccounts of this namespace allowed to claim the lock; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub clients: Vec<String>,
    /// How an operator may revoke the current hold (ForceReleaseRequests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_release: Option<ForceReleasePolicy>,
}

impl Default for DistributedLockSpec {
    fn default() -> Self {
        DistributedLockSpec {
            permits: 1,
            lease_duration_seconds: defaults::LEASE_DURATION_SECONDS,
            renew_deadline_seconds: defaults::RENEW_DEADLINE_SECONDS,
            retry_period_seconds: defaults::RETRY_PERIOD_SECONDS,
            fairness: Fairness::default(),
            max_hold_seconds: None,
            clients: Vec::new(),
            force_release: None,
        }
    }
}

/// Grant order.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
pub enum Fairness {
    /// First come, first served, by claim creation order.
    #[default]
    #[serde(rename = "FIFO")]
    Fifo,
    /// No ordering promise (grants still go to a live claimant).
    None,
}

/// How a claimant holds a lock with several permits.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
pub enum ClaimMode {
    /// One permit, shared with other readers (a semaphore's every claimant).
    #[default]
    Read,
    /// Every permit: exclusive.
    Write,
}

impl ClaimMode {
    /// The mode's name, as written in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimMode::Read => "Read",
            ClaimMode::Write => "Write",
        }
    }
}

/// Observed state of a lock, written only by the controller.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DistributedLockStatus {
    /// The current holder (of a lock with more permits, the one on the lowest slot),
    /// absent when the lock is free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed, as `last_force_release` is: both are absent from most locks, and the
    // controller caches every lock; inline, they would take 256 of each cached lock's
    // bytes whether set or not (the schema is the same).
    pub holder: Option<Box<HolderStatus>>,
    /// Every current holder, by slot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<HolderStatus>,
    /// Permits held, of the lock's permits: `n/N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_permits: Option<String>,
    /// The highest fencing token ever issued or reserved for this lock. Never decreases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= oldSelf").message("status.fencingToken must never decrease"))]
    pub fencing_token: Option<i64>,
    /// The first waiters in grant order (bounded; see `queueLength`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiters: Vec<WaiterStatus>,
    /// How many claimants wait.
    #[serde(default)]
    pub queue_length: i32,
    /// Counters and the latest wait and handoff figures.
    #[serde(default)]
    pub stats: LockStats,
    /// The latest forced release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_force_release: Option<Box<ForceRelease>>,
    /// How many approvals a force release of this lock needs, as the controller applies
    /// it (`spec.forceRelease.approvals`, else the controller's default). 0: the
    /// `leasehold.dev/force-release` annotation acts at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_release_approvals: Option<i32>,
    /// The latest force-release happenings, oldest first (bounded): each request, each
    /// approval or denial, and each outcome.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub force_release_history: Vec<ForceReleaseEntry>,
    /// `Held` and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Who holds the lock. Hold age and wait are derived from these timestamps, so a steadily
/// held lock needs no status writes; `renewedAt` and `expiresAt` are as of the last status
/// write (the lock Lease's `renewTime` is the live value).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HolderStatus {
    /// Claimant identity: `<pod>_<pod-uid>` for pods.
    pub identity: String,
    /// The permit slot held: its Lease is `<lock>` for slot 0, `<lock>.<slot>` else.
    #[serde(default)]
    pub slot: i32,
    /// `Write` for a writer (holding every permit); absent for a reader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ClaimMode>,
    /// The holder's Pod, when it runs in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The token granted with this hold.
    pub fencing_token: i64,
    /// When the controller granted the hold.
    pub acquired_at: Time,
    /// The latest renewal the controller had seen when it wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<Time>,
    /// The controller's estimate of expiry, as of `renewedAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// How long this holder queued before the grant.
    pub waited_seconds: f64,
}

/// One queued claimant.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaiterStatus {
    /// Claimant identity.
    pub identity: String,
    /// The claimant's Pod, when it runs in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// `Write` for a writer; absent for a reader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ClaimMode>,
    /// When the claim was made.
    pub since: Time,
}

/// Counters since the DistributedLock was created.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockStats {
    /// Holds granted.
    #[serde(default)]
    pub grants: i64,
    /// Holds given up by their holder.
    #[serde(default)]
    pub releases: i64,
    /// Holds revoked because the holder stopped renewing, its Pod went away, it never
    /// confirmed, or it outlived `maxHoldSeconds`.
    #[serde(default)]
    pub expirations: i64,
    /// Holds revoked by an operator.
    #[serde(default)]
    pub forced_releases: i64,
    /// How long the latest holder waited, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_wait_seconds: Option<f64>,
    /// From the latest release until the next grant, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handoff_milliseconds: Option<i64>,
}

/// An audited forced release.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForceRelease {
    /// The user who asked, as stamped by the admission webhook.
    pub by: String,
    /// The operator's reason.
    pub reason: String,
    /// When the controller carried it out.
    pub at: Time,
    /// The token that was revoked, if the lock was held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_token: Option<i64>,
    /// The ForceReleaseRequest carried out, if it came from one (else the annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Who approved it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved_by: Vec<String>,
}

/// A claimant's announcement that it waits for a lock: one per claimant and lock, named
/// `<lock>.<pod-uid>` for a claimant in a Pod and `<lock>.<suffix>` (`suffix` starting
/// with `u-`) for any other, refreshed while it waits. The controller serves claims in
/// creation order and drops those not refreshed within their TTL.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "leasehold.dev",
    version = "v1alpha1",
    kind = "LockClaim",
    plural = "lockclaims",
    namespaced,
    shortname = "lclaim",
    category = "leasehold",
    derive = "PartialEq",
    doc = "A claimant waiting for a DistributedLock (one per claimant and lock).",
    printcolumn(name = "Lock", type_ = "string", json_path = ".spec.lock"),
    printcolumn(name = "Claimant", type_ = "string", json_path = ".spec.claimant"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.startsWith(self.spec.lock + '.')")
        .message("metadata.name must be <spec.lock>.<pod-uid> or <spec.lock>.u-<suffix>")
)]
#[x_kube(validation = Rule::new("self.lock == oldSelf.lock").message("spec.lock is immutable").field_path(".lock"))]
#[x_kube(validation = Rule::new("self.claimant == oldSelf.claimant")
    .message("spec.claimant is immutable")
    .field_path(".claimant"))]
#[x_kube(validation = Rule::new("has(self.pod) == has(oldSelf.pod) && (!has(self.pod) || self.pod == oldSelf.pod)")
    .message("spec.pod is immutable")
    .field_path(".pod"))]
#[x_kube(validation = Rule::new("self.requestTime == oldSelf.requestTime")
    .message("spec.requestTime is immutable")
    .field_path(".requestTime"))]
#[serde(rename_all = "camelCase")]
pub struct LockClaimSpec {
    /// The DistributedLock claimed (in the claim's namespace).
    #[schemars(length(min = 1, max = 63))]
    pub lock: String,
    /// `Read` (the default): one permit, beside other readers. `Write`: every permit —
    /// nobody else holds meanwhile, and the grant's token is above every token before it.
    /// On a mutex both are the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ClaimMode>,
    /// The claimant identity: `<pod>_<pod-uid>` for a Pod, else `<username>/<suffix>`.
    #[schemars(length(min = 1, max = 512))]
    pub claimant: String,
    /// The claimant's Pod, when it runs in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub pod: Option<String>,
    /// When the claimant claimed, on its own clock: orders claims created within the same
    /// second (clamped into that second).
    pub request_time: MicroTime,
    /// The claimant's latest refresh, on its own clock (the controller judges staleness by
    /// when it sees this change, on its own clock).
    pub renew_time: MicroTime,
    /// How long the claim lives without a refresh before the controller drops it. The
    /// controller caps it at three times the wait the claim shows (`renewTime` after
    /// `requestTime`), but at least `max(3 x leaseDurationSeconds, 30)` and at most
    /// `max(3 x leaseDurationSeconds, 600)`.
    #[schemars(range(min = 1, max = 3600))]
    pub ttl_seconds: i32,
}

fn to_yaml(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> String {
    let body = serde_saphyr::to_string(crd).expect("a CustomResourceDefinition always serializes");
    format!("# Generated by `leasehold crd`; do not edit. `make verify` checks it.\n{body}")
}

/// The DistributedLock CRD as YAML, as committed under `crds/`.
pub fn crd_yaml() -> String {
    to_yaml(&DistributedLock::crd())
}

/// The LockClaim CRD as YAML, as committed under `crds/`.
pub fn lock_claim_crd_yaml() -> String {
    to_yaml(&LockClaim::crd())
}

/// The ForceReleaseRequest CRD as YAML, as committed under `crds/`.
pub fn force_release_request_crd_yaml() -> String {
    to_yaml(&ForceReleaseRequest::crd())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The controller caches every lock in an `Arc` (two counts ahead of the lock): it must
    /// stay within jemalloc's 768-byte size class, where boxing the status's optional parts
    /// brought it from the 1,024-byte class. A field added inline that breaks this costs
    /// 256 bytes per cached lock.
    #[test]
    fn a_cached_lock_fits_the_768_byte_size_class() {
        let in_arc = std::mem::size_of::<DistributedLock>() + 2 * std::mem::size_of::<usize>();
        assert!(in_arc <= 768, "a DistributedLock in its Arc takes {in_arc} bytes");
    }

    /// The committed CRD must be exactly what the code generates.
    #[test]
    fn committed_crd_matches_code() {
        let committed = include_str!("../crds/leasehold.dev_distributedlocks.yaml");
        assert!(committed == crd_yaml(), "crds/leasehold.dev_distributedlocks.yaml is stale: run `make generate`");
    }

    #[test]
    fn committed_lock_claim_crd_matches_code() {
        let committed = include_str!("../crds/leasehold.dev_lockclaims.yaml");
        assert!(committed == lock_claim_crd_yaml(), "crds/leasehold.dev_lockclaims.yaml is stale: run `make generate`");
    }

    #[test]
    fn committed_force_release_request_crd_matches_code() {
        let committed = include_str!("../crds/leasehold.dev_forcereleaserequests.yaml");
        assert!(
            committed == force_release_request_crd_yaml(),
            "crds/leasehold.dev_forcereleaserequests.yaml is stale: run `make generate`"
        );
    }

    #[test]
    fn lock_claim_schema_carries_rules_and_columns() {
        let crd = serde_json::to_string(&LockClaim::crd()).expect("serializes");
        for needle in [
            "self.metadata.name.startsWith(self.spec.lock + '.')",
            "self.lock == oldSelf.lock",
            "self.claimant == oldSelf.claimant",
            "self.requestTime == oldSelf.requestTime",
            "has(self.pod) == has(oldSelf.pod)",
            "\"lclaim\"",
            "\"lockclaims\"",
            ".spec.claimant",
        ] {
            assert!(crd.contains(needle), "LockClaim CRD lacks {needle}");
        }
    }

    #[test]
    fn spec_defaults_fill_missing_fields() {
        let spec: DistributedLockSpec = serde_json::from_str("{}").expect("empty spec parses");
        assert_eq!(spec, DistributedLockSpec::default());
        assert_eq!(spec.fairness, Fairness::Fifo);
    }

    #[test]
    fn schema_carries_rules_and_columns() {
        let crd = serde_json::to_string(&DistributedLock::crd()).expect("serializes");
        for needle in [
            "self.leaseDurationSeconds > self.renewDeadlineSeconds",
            "self.renewDeadlineSeconds * 5 > self.retryPeriodSeconds * 6",
            "self >= oldSelf",
            "\"dlock\"",
            ".status.holder.acquiredAt",
        ] {
            assert!(crd.contains(needle), "CRD lacks {needle}");
        }
    }
}
