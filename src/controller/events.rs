//! The Events the controller records on a DistributedLock (documented in
//! docs/metrics.md): one reason per kind of happening, so that `kubectl describe` and
//! alerting tell a forced release from an expiry from a Pod going away.

use std::time::{Duration, Instant};

use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::context::Context;
use crate::crd::DistributedLock;
use crate::lease::RevokeReason;
use crate::lease::identity::PodRef;

/// Every Event reason the controller records (its admission webhooks included).
pub const EVENT_REASONS: [&str; 21] = [
    "Granted",
    "Released",
    "Expired",
    "Unconfirmed",
    "PodGone",
    "MaxHold",
    "ForceReleased",
    "LockDeleted",
    "LeaseDeleted",
    "Drained",
    "ForceReleaseSkipped",
    "ForceReleaseRequested",
    "ForceReleaseApproved",
    "ForceReleaseDenied",
    "ForceReleaseExpired",
    "ForceReleaseSuperseded",
    "ForceReleaseRefused",
    "LeaseConflict",
    "TokenExhausted",
    "TokenTampered",
    crate::webhook::refusals::REASON,
];

/// Events recorded at most once per [`ROUTINE_EVENT_INTERVAL`] per lock.
pub const ROUTINE_EVENTS: [&str; 2] = ["Granted", "Released"];
/// See [`ROUTINE_EVENTS`].
pub const ROUTINE_EVENT_INTERVAL: Duration = Duration::from_secs(60);

/// The Event reason of a revocation, and what it means.
pub fn revocation(reason: &RevokeReason) -> (&'static str, &'static str) {
    match reason {
        RevokeReason::Expired => ("Expired", "no renewal seen for the lease duration"),
        RevokeReason::Unconfirmed => ("Unconfirmed", "the grant was not confirmed"),
        RevokeReason::PodGone => ("PodGone", "its Pod is gone"),
        RevokeReason::MaxHold => ("MaxHold", "held for maxHoldSeconds"),
        RevokeReason::Forced => ("ForceReleased", "forced"),
        RevokeReason::LockDeleted => ("LockDeleted", "the lock is being deleted"),
    }
}

/// Emits an Event on the lock (related to the Pod, if any) without delaying the reconcile.
pub fn publish(
    ctx: &Context,
    lock: &DistributedLock,
    type_: EventType,
    reason: &str,
    note: String,
    pod: Option<&PodRef>,
) {
    // Routine events of a busy lock would cost two apiserver writes per handoff: record at
    // most one Granted and one Released per lock per interval (the latest is in status).
    if ROUTINE_EVENTS.contains(&reason) {
        let key = (lock.namespace().unwrap_or_default(), lock.name_any(), reason.to_owned());
        let mut last = ctx.routine_events.lock().expect("event memory is never poisoned");
        let now = Instant::now();
        if last.get(&key).is_some_and(|at| now.duration_since(*at) < ROUTINE_EVENT_INTERVAL) {
            return;
        }
        last.insert(key, now);
    }
    let recorder = ctx.recorder.clone();
    let reference = lock.object_ref(&());
    let secondary = pod.map(|p| k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(p.name.clone()),
        namespace: lock.namespace(),
        uid: Some(p.uid.clone()),
        ..Default::default()
    });
    let event = Event { type_, reason: reason.to_owned(), note: Some(note), action: reason.to_owned(), secondary };
    tokio::spawn(async move {
        if let Err(error) = recorder.publish(&event, &reference).await {
            warn!(%error, "failed to publish event");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_revocation_has_its_own_reason() {
        let reasons = [
            RevokeReason::Expired,
            RevokeReason::Unconfirmed,
            RevokeReason::PodGone,
            RevokeReason::MaxHold,
            RevokeReason::Forced,
            RevokeReason::LockDeleted,
        ]
        .map(|r| revocation(&r).0);
        for reason in reasons {
            assert!(EVENT_REASONS.contains(&reason), "{reason}");
            assert_eq!(reasons.iter().filter(|r| **r == reason).count(), 1, "{reason} is used once");
        }
    }
}
