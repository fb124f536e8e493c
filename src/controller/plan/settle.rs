//! What force releases become in a plan: the one-step annotation refused, carried out or
//! found stale; each ForceReleaseRequest judged, the oldest approved one carried out
//! through the ordinary Forced revocation, and the status each request gets.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;

use super::Observation;
use crate::controller::force::{self, Target};
use crate::controller::requests::{self, HoldView, Judged, Verdict};
use crate::controller::status::stored;
use crate::controller::view::LeaseState;
use crate::crd::{
    DistributedLock, ForceRelease, ForceReleaseEntry, ForceReleaseRequest, ForceReleaseRequestStatus, Phase,
};

/// One request and its verdict.
#[derive(Clone, Debug)]
pub struct Judgement {
    /// The request.
    pub request: Arc<ForceReleaseRequest>,
    /// Where it stands.
    pub verdict: Verdict,
}

/// A request's status to write, and what the write says happened.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestUpdate {
    /// The request's name.
    pub name: String,
    /// Its UID (what was written is remembered by it).
    pub uid: String,
    /// Its new status.
    pub status: ForceReleaseRequestStatus,
    /// History entries for the lock, once the write lands.
    pub entries: Vec<ForceReleaseEntry>,
    /// Its final phase, when this write ends it (counted once it lands).
    pub ended: Option<Phase>,
}

/// The lock's requests, each judged against the hold it targets (`hold` of its target
/// token).
pub fn judge(o: &Observation, hold: impl Fn(Option<i64>) -> HoldView) -> Vec<Judgement> {
    o.requests
        .iter()
        .map(|request| {
            let view = hold(request.spec.target_token);
            let verdict = requests::judge(&Judged {
                spec: &request.spec,
                phase: request.status.as_ref().and_then(|s| s.phase),
                hold: &view,
                required: o.required,
                executed: o
                    .executed
                    .as_ref()
                    .is_some_and(|(name, token)| *name == request.name_any() && *token == request.spec.target_token),
                now: o.wall,
            });
            Judgement { request: request.clone(), verdict }
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

/// The status of each request that changes: an approved request whose revocation this
/// plan writes (`executed_now` names it) is `Executed`, another approved one `Approved`.
pub fn updates(
    judgements: &[Judgement],
    required: u32,
    executed_now: Option<&str>,
    now: Timestamp,
) -> Vec<RequestUpdate> {
    let mut out = Vec::new();
    for j in judgements {
        let name = j.request.name_any();
        let (phase, message, revoked) = match &j.verdict {
            Verdict::Done => continue,
            Verdict::Pending => {
                let have = requests::counted(&j.request.spec).len();
                (Phase::Pending, format!("waiting for approvals: {have} of {required}"), None)
            }
            Verdict::Execute(token) if executed_now == Some(name.as_str()) => {
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
        let entries = requests::entries(&name, &j.request.spec, previous, &next, now);
        let uid = j.request.uid().unwrap_or_default();
        out.push(RequestUpdate { name, uid, status: next, entries, ended: phase.is_final().then_some(phase) });
    }
    out
}

/// The refusal of a one-step annotation on a lock whose policy needs approvals.
pub fn refusal(request: &force::Request, required: u32, now: Timestamp) -> super::First {
    let message = format!(
        "the lock needs {required} approval(s) for a force release: create a ForceReleaseRequest (`leasehold release --force` does)"
    );
    let entry = ForceReleaseEntry {
        at: stored(now),
        event: "Refused".into(),
        request: None,
        by: Some(request.by.clone()),
        message: Some(message.clone()),
    };
    super::First::Refuse(Box::new(super::Refusal { request: request.clone(), message, entry }))
}

/// What a force release comes to after this plan's write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settled {
    /// The force release to record on the lock.
    pub forced: Option<ForceRelease>,
    /// Clear the annotation.
    pub clear: bool,
    /// It revoked nothing, and why.
    pub skipped: Option<String>,
}

/// Settles a force release: carried out (its target revoked by this plan, or being
/// drained already) or stale (its target is not the holder) — recorded, and an annotation
/// cleared. One whose target still holds stays for the next reconcile.
pub fn settle(
    lock: &DistributedLock,
    request: Option<force::Request>,
    held: Option<i64>,
    before: &LeaseState,
    revoked_now: bool,
    now: Timestamp,
) -> Settled {
    let Some(request) = request else { return Settled::default() };
    let target = match request.target {
        Target::Token(t) => Some(t),
        _ => None,
    };
    if request.request.is_some() {
        // A ForceReleaseRequest: nothing to clear; its own status records the outcome.
        let forced = revoked_now.then_some(ForceRelease {
            by: request.by,
            reason: request.reason,
            at: stored(now),
            revoked_token: target,
            request: request.request,
            approved_by: request.approved_by,
        });
        return Settled { forced, ..Settled::default() };
    }
    if !revoked_now && force::targets(&request, held) {
        return Settled::default();
    }
    let draining_target = matches!(before, LeaseState::Draining(d) if d.revoked.is_some() && d.revoked == target);
    // Carried out earlier, its clearing failed: recorded then; clear it now.
    let recorded = lock.status.as_ref().and_then(|s| s.last_force_release.as_ref()).is_some_and(|r| {
        r.by == request.by && r.reason == request.reason && r.revoked_token.is_some() && r.revoked_token == target
    });
    if recorded && !revoked_now {
        return Settled { clear: true, ..Settled::default() };
    }
    let revoked_token = (revoked_now || draining_target).then_some(target).flatten();
    let skipped = revoked_token.is_none().then(|| {
        let what = target.map_or_else(|| "nothing was held".to_owned(), |t| format!("token {t} no longer holds"));
        format!("force release by {} ({}) revoked nothing: {what}", request.by, request.reason)
    });
    Settled {
        forced: Some(ForceRelease {
            by: request.by,
            reason: request.reason,
            at: stored(now),
            revoked_token,
            request: None,
            approved_by: Vec::new(),
        }),
        clear: true,
        skipped,
    }
}
