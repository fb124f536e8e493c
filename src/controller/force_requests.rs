//! What a reconcile reads about force releases: the lock's requests as they stand, the
//! lock's policy (how many approvals a force release needs) and which request the lock
//! records as carried out. Requests are judged in the plan ([`super::plan`]).

use std::collections::HashMap;
use std::sync::Arc;

use kube::ResourceExt;

use super::context::{AppliedStatus, Context, LockKey};
use crate::crd::{DistributedLock, ForceReleaseRequest, ForceReleaseRequestStatus};
use crate::crd_force::limits::MAX_APPROVALS;

/// The ForceReleaseRequests of lock `key` (UID `uid`), oldest first: from the cache, each
/// with the status this term last wrote to it if the cache does not show that yet.
pub fn current(ctx: &Context, key: &LockKey, uid: &str) -> Vec<Arc<ForceReleaseRequest>> {
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
    ctx.with_memory(key, uid, |m| overlay(mine, &mut m.requests))
}

/// `cached` requests with the statuses `written` by this term laid over them. Only the
/// controller writes a request's status, so within a term what it wrote last is the
/// latest: a cached status that differs is one the cache has not caught up from. A
/// remembered status is forgotten once the cache shows it, or once the request is gone.
pub fn overlay(
    cached: Vec<Arc<ForceReleaseRequest>>,
    written: &mut HashMap<String, ForceReleaseRequestStatus>,
) -> Vec<Arc<ForceReleaseRequest>> {
    written.retain(|uid, status| {
        cached.iter().any(|r| r.uid().as_deref() == Some(uid.as_str()) && r.status.as_ref() != Some(status))
    });
    cached
        .into_iter()
        .map(|request| match request.uid().and_then(|uid| written.get(&uid)) {
            Some(status) => {
                let mut newer = (*request).clone();
                newer.status = Some(status.clone());
                Arc::new(newer)
            }
            None => request,
        })
        .collect()
}

/// How many approvals a force release of `lock` needs: its `spec.forceRelease.approvals`,
/// else the controller's default.
pub fn required(ctx: &Context, lock: &DistributedLock) -> u32 {
    match lock.spec.force_release.as_ref().and_then(|p| p.approvals) {
        Some(n) => u32::try_from(n.clamp(0, MAX_APPROVALS)).unwrap_or(0),
        None => ctx.settings.force_release_approvals,
    }
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
            .or_else(|| m.status.as_ref().and_then(AppliedStatus::status).and_then(|s| s.last_force_release.as_deref()))
            .and_then(of)
    });
    remembered.or_else(|| lock.status.as_ref()?.last_force_release.as_deref().and_then(of))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{ForceReleaseRequestSpec, Phase};

    fn request(uid: &str, phase: Option<Phase>) -> Arc<ForceReleaseRequest> {
        let spec = ForceReleaseRequestSpec {
            lock: "orders".into(),
            reason: "frozen".into(),
            target_holder: Some("pod/a".into()),
            target_token: Some(7),
            ttl_seconds: 600,
            requester: Some("alice".into()),
            expires_at: None,
            approvals: vec![],
            denial: None,
        };
        let mut r = ForceReleaseRequest::new("r1", spec);
        r.metadata.uid = Some(uid.into());
        r.status = phase.map(status);
        Arc::new(r)
    }

    fn status(phase: Phase) -> ForceReleaseRequestStatus {
        ForceReleaseRequestStatus { phase: Some(phase), ..ForceReleaseRequestStatus::default() }
    }

    fn phases(requests: &[Arc<ForceReleaseRequest>]) -> Vec<Option<Phase>> {
        requests.iter().map(|r| r.status.as_ref().and_then(|s| s.phase)).collect()
    }

    #[test]
    fn a_status_written_is_read_in_place_of_a_lagging_cache_until_the_cache_shows_it() {
        struct Case {
            name: &'static str,
            cached: Vec<Arc<ForceReleaseRequest>>,
            written: Vec<(&'static str, Phase)>,
            read: Vec<Option<Phase>>,
            remembered: Vec<&'static str>,
        }
        let cases = [
            Case {
                name: "the cache still shows the status before the write",
                cached: vec![request("u1", Some(Phase::Pending))],
                written: vec![("u1", Phase::Executed)],
                read: vec![Some(Phase::Executed)],
                remembered: vec!["u1"],
            },
            Case {
                name: "the cache shows no status yet",
                cached: vec![request("u1", None)],
                written: vec![("u1", Phase::Pending)],
                read: vec![Some(Phase::Pending)],
                remembered: vec!["u1"],
            },
            Case {
                name: "the cache has caught up: its status is read, the memory forgotten",
                cached: vec![request("u1", Some(Phase::Executed))],
                written: vec![("u1", Phase::Executed)],
                read: vec![Some(Phase::Executed)],
                remembered: vec![],
            },
            Case {
                name: "the request is gone: forgotten",
                cached: vec![],
                written: vec![("u1", Phase::Executed)],
                read: vec![],
                remembered: vec![],
            },
            Case {
                name: "a request re-created under the same name is not the one written",
                cached: vec![request("u2", Some(Phase::Pending))],
                written: vec![("u1", Phase::Executed)],
                read: vec![Some(Phase::Pending)],
                remembered: vec![],
            },
            Case {
                name: "nothing written: the cache as it is",
                cached: vec![request("u1", Some(Phase::Pending)), request("u2", None)],
                written: vec![],
                read: vec![Some(Phase::Pending), None],
                remembered: vec![],
            },
        ];
        for case in cases {
            let mut written: HashMap<String, ForceReleaseRequestStatus> =
                case.written.iter().map(|(uid, phase)| ((*uid).to_owned(), status(*phase))).collect();
            let read = overlay(case.cached, &mut written);
            assert_eq!(phases(&read), case.read, "{}", case.name);
            let mut left: Vec<&str> = written.keys().map(String::as_str).collect();
            left.sort_unstable();
            assert_eq!(left, case.remembered, "{}", case.name);
        }
    }

    #[test]
    fn an_end_written_but_not_yet_cached_is_judged_done_so_it_is_not_written_again() {
        let mut written = HashMap::from([("u1".to_owned(), status(Phase::Executed))]);
        let read = overlay(vec![request("u1", Some(Phase::Pending))], &mut written);
        let verdict = crate::controller::requests::judge(&crate::controller::requests::Judged {
            spec: &read[0].spec,
            phase: read[0].status.as_ref().and_then(|s| s.phase),
            hold: &crate::controller::requests::HoldView::Free,
            required: 1,
            executed: true,
            now: jiff::Timestamp::UNIX_EPOCH,
        });
        assert_eq!(verdict, crate::controller::requests::Verdict::Done);
    }
}
