//! Refused fenced writes made visible: a `StaleWriteRefused` Event on the lock the token
//! is for, recorded off the admission path.
//!
//! The admission answer never waits for the Event. A refusal is handed to a bounded queue
//! and a separate task records it; when the queue is full (the apiserver slow or the
//! Events refused), the Event is dropped and counted in
//! `leasehold_webhook_refusal_events_dropped_total` — the refusal itself is still counted
//! and logged.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::mpsc;
use tracing::warn;

use crate::crd::DistributedLock;
use crate::metrics::WebhookMetrics;

/// The Event reason.
pub const REASON: &str = "StaleWriteRefused";
/// Refusals waiting to be recorded, at most.
pub const QUEUE: usize = 128;
/// How long recording one Event may take before it is given up.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// A write the fence refused, about an existing lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleWrite {
    /// The namespace of the lock and the object.
    pub namespace: String,
    /// The lock's name.
    pub lock: String,
    /// The lock's UID, when known.
    pub lock_uid: Option<String>,
    /// The operation: `CREATE`, `UPDATE` or `DELETE`.
    pub operation: &'static str,
    /// The object written, as `<group/resource> <name>`.
    pub object: String,
    /// Who wrote it.
    pub user: String,
    /// The token presented (or recorded on the object, for a deletion), as given.
    pub presented: Option<String>,
    /// The lock's current token.
    pub current: i64,
}

/// The Event note of a refusal.
pub fn note(write: &StaleWrite) -> String {
    format!(
        "{} of {} by {} refused: it carries token {}, the lock's current token is {}",
        write.operation,
        write.object,
        write.user,
        write.presented.as_deref().unwrap_or("none"),
        write.current
    )
}

/// Hands refusals to the recording task without waiting.
#[derive(Clone)]
pub struct Reporter {
    queue: mpsc::Sender<StaleWrite>,
    metrics: Arc<WebhookMetrics>,
}

impl Reporter {
    /// Queues `write` for an Event; drops and counts it if the queue is full.
    pub fn report(&self, write: StaleWrite) {
        if self.queue.try_send(write).is_err() {
            self.metrics.refusal_events_dropped.inc();
        }
    }
}

/// A reporter and the queue [`record`] empties.
pub fn queue(metrics: Arc<WebhookMetrics>) -> (Reporter, mpsc::Receiver<StaleWrite>) {
    let (queue, receiver) = mpsc::channel(QUEUE);
    (Reporter { queue, metrics }, receiver)
}

/// The DistributedLock a refusal is about.
fn lock_reference(write: &StaleWrite) -> ObjectReference {
    ObjectReference {
        api_version: Some(DistributedLock::api_version(&()).into_owned()),
        kind: Some(DistributedLock::kind(&()).into_owned()),
        namespace: Some(write.namespace.clone()),
        name: Some(write.lock.clone()),
        uid: write.lock_uid.clone(),
        ..ObjectReference::default()
    }
}

/// Records an Event for each queued refusal, one at a time, until the reporters are gone.
pub async fn record(recorder: Recorder, mut refusals: mpsc::Receiver<StaleWrite>, metrics: Arc<WebhookMetrics>) {
    while let Some(write) = refusals.recv().await {
        let event = Event {
            type_: EventType::Warning,
            reason: REASON.into(),
            note: Some(note(&write)),
            action: "Refuse".into(),
            secondary: None,
        };
        let lock = format!("{}/{}", write.namespace, write.lock);
        match tokio::time::timeout(PUBLISH_TIMEOUT, recorder.publish(&event, &lock_reference(&write))).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                metrics.refusal_events_dropped.inc();
                warn!(%lock, %error, "failed to record a StaleWriteRefused event");
            }
            Err(_) => {
                metrics.refusal_events_dropped.inc();
                warn!(%lock, "recording a StaleWriteRefused event timed out");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write() -> StaleWrite {
        StaleWrite {
            namespace: "shop".into(),
            lock: "orders".into(),
            lock_uid: Some("u".into()),
            operation: "UPDATE",
            object: "configmaps inventory".into(),
            user: "system:serviceaccount:shop:a".into(),
            presented: Some("6".into()),
            current: 7,
        }
    }

    #[test]
    fn the_note_names_the_object_the_user_and_both_tokens() {
        let note = note(&write());
        for needle in ["UPDATE", "configmaps inventory", "system:serviceaccount:shop:a", "token 6", "token is 7"] {
            assert!(note.contains(needle), "{note} lacks {needle}");
        }
        let missing = super::note(&StaleWrite { presented: None, ..write() });
        assert!(missing.contains("token none"), "{missing}");
    }

    #[test]
    fn the_event_is_about_the_lock() {
        let reference = lock_reference(&write());
        assert_eq!(reference.kind.as_deref(), Some("DistributedLock"));
        assert_eq!(reference.api_version.as_deref(), Some("leasehold.dev/v1alpha1"));
        assert_eq!((reference.namespace.as_deref(), reference.name.as_deref()), (Some("shop"), Some("orders")));
        assert_eq!(reference.uid.as_deref(), Some("u"));
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        let metrics = Arc::new(WebhookMetrics::unregistered());
        let (reporter, _receiver) = queue(metrics.clone());
        for _ in 0..QUEUE + 3 {
            reporter.report(write());
        }
        assert_eq!(metrics.refusal_events_dropped.get(), 3);
    }
}
