//! ForceReleaseRequests in a reconcile: read from the cache, judged ([`super::requests`]),
//! at most one carried out through the ordinary Forced revocation, then each request's
//! status written (server-side apply, the controller's field manager) with what follows
//! from it: the lock's history entries, an Event, the outcome counted. Also the lock's
//! policy, and the refusal of the one-step annotation when the policy needs approvals.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::context::{Context, LockKey};
use super::error::Error;
use super::events::publish;
use super::force::{self, Target};
use super::requests::{self, HoldView, Judged, Verdict};
use super::status::Outcome;
use super::view::LeaseState;
use crate::crd::{DistributedLock, ForceReleaseEntry, ForceReleaseRequest, MANAGER_CONTROLLER, Phase};
use crate::crd_force::limits::MAX_APPROVALS;
use crate::metrics::OutcomeLabel;

/// How many approvals a force release of `lock` needs: its `spec.forceRelease.approvals`,
/// else the controller's default.
pub fn required(ctx: &Context, lock: &DistributedLock) -> u32 {
    match lock.spec.force_release.as_ref().and_then(|p| p.approvals) {
        Some(n) => u32::try_from(n.clamp(0, MAX_APPROVALS)).unwrap_or(0),
        None => ctx.settings.force_release_approvals,
    }
}

/// The hold as requests are judged against it.
pub fn hold_view(state: &LeaseState) -> HoldView {
    match state {
        LeaseState::Held(h) => HoldView::Held { holder: h.identity.id.clone(), token: h.token },
        LeaseState::Draining(d) => HoldView::Draining(d.revoked),
        LeaseState::Free => HoldView::Free,
    }
}

/// One request and its verdict.
pub struct Judgement {
    /// The request.
    pub request: Arc<ForceReleaseRequest>,
    /// Where it stands.
    pub verdict: Verdict,
}

/// The requests for lock `key`, oldest first, each judged. `executed` names the request
/// the lock records as carried out, and the token it revoked.
pub fn judge(
    ctx: &Context,
    key: &LockKey,
    hold: &HoldView,
    required: u32,
    executed: Option<&(String, Option<i64>)>,
    now: Timestamp,
) -> Vec<Judgement> {
    let mut mine: Vec<Arc<ForceReleaseRequest>> = ctx
        .requests
        .state()
        .into_iter()
        .filter(|r| r.namespace().as_deref() == Some(key.namespace.as_str()) && r.spec.lock == key.name)
        .collect();
    mine.sort_by(|a, b| {
        (a.metadata.creation_timestamp.as_ref().map(|t| t.0), a.name_any())
            .cmp(&(b.metadata.creation_timestamp.as_ref().map(|t| t.0), b.name_any()))
    });
    mine.into_iter()
        .map(|request| {
            let verdict = requests::judge(&Judged {
                spec: &request.spec,
                phase: request.status.as_ref().and_then(|s| s.phase),
                hold,
                required,
                executed: executed
                    .is_some_and(|(name, token)| *name == request.name_any() && *token == request.spec.target_token),
                now,
            });
            Judgement { request, verdict }
        })
        .collect()
}

/// The request to carry out now (the oldest approved one), as a force release.
pub fn to_execute(judgements: &[Judgement]) -> Option<force::Request> {
    judgements.iter().find_map(|j| match j.verdict {
        Verdict::Execute(token) => Some(force::Request {
            reason: j.request.spec.reason.clone(),
            by: j.request.spec.requester.clone().unwrap_or_default(),
            target: Target::Token(token),
            request: Some(j.request.name_any()),
            approved_by: requests::counted(&j.request.spec).into_iter().map(|a| a.by).collect(),
        }),
        _ => None,
    })
}

/// How long until the earliest pending request expires (to mark it then).
pub fn next_expiry(judgements: &[Judgement], now: Timestamp) -> Option<Duration> {
    judgements
        .iter()
        .filter(|j| matches!(j.verdict, Verdict::Pending | Verdict::Execute(_)))
        .filter_map(|j| j.request.spec.expires_at.as_ref())
        .map(|t| Duration::try_from(t.0.duration_since(now)).unwrap_or(Duration::ZERO) + Duration::from_millis(10))
        .min()
}

/// Writes each request's status that changed, after this reconcile's Lease write: an
/// approved request whose revocation was written (`outcome.forced` names it) is
/// `Executed`, another approved one `Approved`. What each write says happened goes into
/// `outcome.history`, an Event and the outcome counter. A failed write is left for the
/// next reconcile (the first error is returned after every other write was tried).
pub async fn record(
    ctx: &Context,
    lock: &DistributedLock,
    key: &LockKey,
    judgements: &[Judgement],
    required: u32,
    outcome: &mut Outcome,
) -> Result<(), Error> {
    let now = Timestamp::now();
    let executed_now = outcome.forced.as_ref().and_then(|f| f.request.clone());
    let mut first_error = None;
    for j in judgements {
        let name = j.request.name_any();
        let (phase, message, revoked) = match &j.verdict {
            Verdict::Done => continue,
            Verdict::Pending => {
                let have = requests::counted(&j.request.spec).len();
                (Phase::Pending, format!("waiting for approvals: {have} of {required}"), None)
            }
            Verdict::Execute(token) if executed_now.as_deref() == Some(name.as_str()) => {
                (Phase::Executed, format!("revoked the hold with token {token}"), Some(*token))
            }
            Verdict::Execute(_) => (Phase::Approved, "approved: the hold is being revoked".to_owned(), None),
            // Carried out in an earlier reconcile (whose write of this status did not land,
            // or came before the lock recorded it): the token revoked is the target's.
            Verdict::End(Phase::Executed, message) => (Phase::Executed, message.clone(), j.request.spec.target_token),
            Verdict::End(phase, message) => (*phase, message.clone(), None),
        };
        let previous = j.request.status.as_ref();
        let next = requests::status(&j.request.spec, previous, phase, message, required, revoked, now);
        if previous == Some(&next) {
            continue;
        }
        let api: Api<ForceReleaseRequest> = Api::namespaced(ctx.client.clone(), &key.namespace);
        let patch = json!({
            "apiVersion": ForceReleaseRequest::api_version(&()),
            "kind": ForceReleaseRequest::kind(&()),
            "status": next,
        });
        if let Err(source) =
            api.patch_status(&name, &PatchParams::apply(MANAGER_CONTROLLER).force(), &Patch::Apply(patch)).await
        {
            warn!(namespace = %key.namespace, request = %name, error = %source, "failed to write a force-release request's status");
            first_error.get_or_insert(Error::Request { namespace: key.namespace.clone(), name, source });
            continue;
        }
        let entries = requests::entries(&name, &j.request.spec, previous, &next, now);
        for entry in &entries {
            announce(ctx, lock, key, entry);
        }
        outcome.history.extend(entries);
        if phase.is_final() {
            let label = OutcomeLabel { outcome: phase.as_str().to_ascii_lowercase() };
            ctx.metrics.force_release_requests.get_or_create(&label).inc();
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// An Event for a history entry (an execution already has its `ForceReleased` Event).
fn announce(ctx: &Context, lock: &DistributedLock, key: &LockKey, entry: &ForceReleaseEntry) {
    let (reason, type_) = match entry.event.as_str() {
        "Requested" => ("ForceReleaseRequested", EventType::Normal),
        "Approved" => ("ForceReleaseApproved", EventType::Normal),
        "Denied" => ("ForceReleaseDenied", EventType::Normal),
        "Expired" => ("ForceReleaseExpired", EventType::Normal),
        "Superseded" => ("ForceReleaseSuperseded", EventType::Normal),
        _ => return,
    };
    let request = entry.request.as_deref().unwrap_or("");
    let by = entry.by.as_deref().map(|b| format!(" by {b}")).unwrap_or_default();
    let details = entry.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default();
    let note = format!("forcereleaserequest {request} {}{by}{details}", entry.event.to_ascii_lowercase());
    info!(namespace = %key.namespace, lock = %key.name, %request, event = %entry.event, "force-release request");
    publish(ctx, lock, type_, reason, note, None);
}

/// Refuses a `leasehold.dev/force-release` annotation on a lock whose policy needs
/// approvals (set while no webhook refused it): cleared without revoking, recorded in the
/// history (kept in memory until the next status write), an Event, counted.
pub async fn refuse_annotation(
    ctx: &Context,
    lock: &DistributedLock,
    key: &LockKey,
    request: &force::Request,
    required: u32,
) -> Result<(), Error> {
    force::clear(ctx, lock, key).await?;
    let message = format!(
        "the lock needs {required} approval(s) for a force release: create a ForceReleaseRequest (`leasehold release --force` does)"
    );
    warn!(namespace = %key.namespace, lock = %key.name, by = %request.by, "force-release annotation refused: approvals needed");
    publish(
        ctx,
        lock,
        EventType::Warning,
        "ForceReleaseRefused",
        format!("{} ({}): {message}", request.by, request.reason),
        None,
    );
    ctx.metrics.force_release_requests.get_or_create(&OutcomeLabel { outcome: "refused".into() }).inc();
    let entry = ForceReleaseEntry {
        at: Time(Timestamp::now()),
        event: "Refused".into(),
        request: None,
        by: Some(request.by.clone()),
        message: Some(message),
    };
    let uid = lock.uid().unwrap_or_default();
    ctx.with_memory(key, &uid, |m| {
        let pending = super::status::merge(m.pending.take(), Outcome { history: vec![entry], ..Outcome::default() });
        m.pending = Some(pending);
    });
    Ok(())
}

/// The request the lock records as carried out, with the token it revoked: from a status
/// not yet written, the status last written, or the cached lock.
pub fn executed(ctx: &Context, key: &LockKey, lock: &DistributedLock) -> Option<(String, Option<i64>)> {
    let uid = lock.uid().unwrap_or_default();
    let of = |f: &crate::crd::ForceRelease| f.request.clone().map(|r| (r, f.revoked_token));
    let remembered = ctx.with_memory(key, &uid, |m| {
        m.pending
            .as_ref()
            .and_then(|p| p.forced.as_ref())
            .or_else(|| m.status.as_ref().and_then(|s| s.last_force_release.as_ref()))
            .and_then(of)
    });
    remembered.or_else(|| lock.status.as_ref()?.last_force_release.as_ref().and_then(of))
}
