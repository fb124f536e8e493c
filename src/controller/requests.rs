//! Where each ForceReleaseRequest of a lock stands, as pure functions over values: the
//! request, the lock's hold, the lock's policy and the time. The reconciler reads the
//! requests from its cache, carries out at most one (through the ordinary Forced
//! revocation), and writes the status and history that follow.
//!
//! A request takes effect only if it was admitted by the webhook (requester, target and
//! expiry stamped), is not denied, has not expired, its target (holder and token) still
//! holds, and enough people other than the requester approved it. Anything else ends it —
//! it never waits for a later holder.

use super::status::stored;
use jiff::Timestamp;

use crate::crd::{Approval, ForceReleaseEntry, ForceReleaseRequestSpec, ForceReleaseRequestStatus, Phase};

/// The lock's hold, as a request's judgement needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HoldView {
    /// Granted to `holder` with `token`.
    Held {
        /// Holder identity.
        holder: String,
        /// Its token.
        token: Option<i64>,
    },
    /// The hold with this token is being revoked (drained).
    Draining(Option<i64>),
    /// Nobody holds it.
    Free,
}

/// What to do with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing: it already has its final outcome.
    Done,
    /// Waiting for approvals; `counted` so far.
    Pending,
    /// Approved, unexpired, its target holds: revoke the hold with this token.
    Execute(i64),
    /// It ends with this outcome and message.
    End(Phase, String),
}

/// The approvals that count: one per person, never the requester's.
pub fn counted(spec: &ForceReleaseRequestSpec) -> Vec<Approval> {
    let mut seen: Vec<Approval> = Vec::new();
    for approval in &spec.approvals {
        if Some(&approval.by) != spec.requester.as_ref() && !seen.iter().any(|a| a.by == approval.by) {
            seen.push(approval.clone());
        }
    }
    seen
}

/// Inputs of [`judge`].
#[derive(Clone, Debug)]
pub struct Judged<'a> {
    /// The request.
    pub spec: &'a ForceReleaseRequestSpec,
    /// Its phase as last written.
    pub phase: Option<Phase>,
    /// The lock's hold now.
    pub hold: &'a HoldView,
    /// Approvals the lock's policy requires.
    pub required: u32,
    /// Whether the lock records this request as carried out (its revocation was written).
    pub executed: bool,
    /// Now.
    pub now: Timestamp,
}

/// Where a request stands.
pub fn judge(i: &Judged) -> Verdict {
    if i.phase.is_some_and(Phase::is_final) {
        return Verdict::Done;
    }
    let spec = i.spec;
    if i.executed {
        let token = spec.target_token.map_or_else(|| "unknown".to_owned(), |t| t.to_string());
        return Verdict::End(Phase::Executed, format!("revoked the hold with token {token}"));
    }
    let (Some(_), Some(holder), Some(token), Some(expires)) =
        (&spec.requester, &spec.target_holder, spec.target_token, &spec.expires_at)
    else {
        return Verdict::End(
            Phase::Denied,
            "not admitted by the Leasehold webhook (no requester, target or expiry stamped): it can never take effect"
                .into(),
        );
    };
    if let Some(denial) = &spec.denial {
        return Verdict::End(Phase::Denied, format!("denied by {}: {}", denial.by, denial.reason));
    }
    let holds = matches!(i.hold, HoldView::Held { holder: h, token: Some(t) } if h == holder && *t == token);
    if !holds {
        let now = match i.hold {
            HoldView::Held { holder: h, token: t } => {
                format!("the lock is now held by {h} with token {}", t.map_or_else(|| "none".into(), |t| t.to_string()))
            }
            HoldView::Draining(Some(t)) if *t == token => {
                format!("the hold with token {token} is already being revoked")
            }
            HoldView::Draining(_) | HoldView::Free => "the lock is no longer held by it".to_owned(),
        };
        return Verdict::End(Phase::Superseded, format!("its target {holder} (token {token}) no longer holds: {now}"));
    }
    let have = counted(spec).len();
    if i.now >= expires.0 {
        return Verdict::End(
            Phase::Expired,
            format!("expired at {} with {have} of {} approvals", expires.0, i.required),
        );
    }
    if have >= i.required as usize { Verdict::Execute(token) } else { Verdict::Pending }
}

/// The status a request gets after `verdict` (`Execute` turned into `Executed` or
/// `Approved` by the caller, as the revocation was or was not written).
pub fn status(
    spec: &ForceReleaseRequestSpec,
    previous: Option<&ForceReleaseRequestStatus>,
    phase: Phase,
    message: String,
    required: u32,
    revoked_token: Option<i64>,
    now: Timestamp,
) -> ForceReleaseRequestStatus {
    let approvals = counted(spec);
    let same_phase = previous.and_then(|p| p.phase) == Some(phase);
    let since = previous.filter(|_| same_phase).and_then(|p| p.last_transition_time.clone());
    ForceReleaseRequestStatus {
        phase: Some(phase),
        message: Some(message),
        last_transition_time: Some(since.unwrap_or_else(|| stored(now))),
        requester: spec.requester.clone(),
        approvals_text: Some(format!("{}/{required}", approvals.len())),
        approvals,
        required_approvals: Some(i32::try_from(required).unwrap_or(i32::MAX)),
        revoked_token: revoked_token.or_else(|| previous.and_then(|p| p.revoked_token)),
    }
}

/// What a status change says happened, as history entries: the request first seen, each
/// new approval, and a new final outcome.
pub fn entries(
    name: &str,
    spec: &ForceReleaseRequestSpec,
    previous: Option<&ForceReleaseRequestStatus>,
    next: &ForceReleaseRequestStatus,
    now: Timestamp,
) -> Vec<ForceReleaseEntry> {
    let entry = |event: &str, by: Option<String>, message: Option<String>| ForceReleaseEntry {
        at: stored(now),
        event: event.to_owned(),
        request: Some(name.to_owned()),
        by,
        message,
    };
    let mut out = Vec::new();
    if previous.and_then(|p| p.phase).is_none() {
        let target = match (&spec.target_holder, spec.target_token) {
            (Some(h), Some(t)) => format!("{h} (token {t})"),
            _ => "no target".to_owned(),
        };
        out.push(entry("Requested", spec.requester.clone(), Some(format!("{target}: {}", spec.reason))));
    }
    let before: &[Approval] = previous.map_or(&[], |p| &p.approvals);
    for approval in &next.approvals {
        if !before.iter().any(|a| a.by == approval.by) {
            out.push(entry("Approved", Some(approval.by.clone()), None));
        }
    }
    if let Some(phase) = next.phase.filter(|p| p.is_final())
        && previous.and_then(|p| p.phase) != Some(phase)
    {
        let by = match phase {
            Phase::Denied => spec.denial.as_ref().map(|d| d.by.clone()),
            Phase::Executed => spec.requester.clone(),
            _ => None,
        };
        out.push(entry(phase.as_str(), by, next.message.clone()));
    }
    out
}

/// `history` with `new` entries appended, keeping the latest `limit`.
pub fn append(history: &[ForceReleaseEntry], new: &[ForceReleaseEntry], limit: usize) -> Vec<ForceReleaseEntry> {
    let all: Vec<ForceReleaseEntry> = history.iter().chain(new).cloned().collect();
    let skip = all.len().saturating_sub(limit);
    all.into_iter().skip(skip).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Denial;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).expect("valid")
    }

    fn approval(by: &str) -> Approval {
        Approval { by: by.into(), at: Time(ts(1)) }
    }

    fn spec(approvals: &[&str]) -> ForceReleaseRequestSpec {
        ForceReleaseRequestSpec {
            lock: "orders".into(),
            reason: "worker frozen".into(),
            target_holder: Some("a_1".into()),
            target_token: Some(7),
            ttl_seconds: 3600,
            requester: Some("alice".into()),
            expires_at: Some(Time(ts(100))),
            approvals: approvals.iter().map(|b| approval(b)).collect(),
            denial: None,
        }
    }

    fn held(holder: &str, token: i64) -> HoldView {
        HoldView::Held { holder: holder.into(), token: Some(token) }
    }

    type Check = Box<dyn Fn(&Verdict) -> bool>;
    /// (what, spec, phase as written, hold, required, executed, now, verdict).
    type Case = (&'static str, ForceReleaseRequestSpec, Option<Phase>, HoldView, u32, bool, i64, Check);

    /// Every way a request can stand: (what, spec, phase as written, hold, required,
    /// executed, now, verdict).
    #[test]
    fn judge_table() {
        let unstamped = ForceReleaseRequestSpec { requester: None, ..spec(&["bob"]) };
        let untargeted = ForceReleaseRequestSpec { target_token: None, ..spec(&["bob"]) };
        let denied = ForceReleaseRequestSpec {
            denial: Some(Denial { by: "carol".into(), at: Time(ts(2)), reason: "not stuck".into() }),
            ..spec(&["bob"])
        };
        let a7 = held("a_1", 7);
        let end = |phase| move |v: &Verdict| matches!(v, Verdict::End(p, _) if *p == phase);
        let cases: Vec<Case> = vec![
            ("no approval: waits", spec(&[]), None, a7.clone(), 1, false, 10, Box::new(|v| *v == Verdict::Pending)),
            (
                "self-approval does not count",
                spec(&["alice"]),
                Some(Phase::Pending),
                a7.clone(),
                1,
                false,
                10,
                Box::new(|v| *v == Verdict::Pending),
            ),
            (
                "a second person's approval executes",
                spec(&["alice", "bob"]),
                Some(Phase::Pending),
                a7.clone(),
                1,
                false,
                10,
                Box::new(|v| *v == Verdict::Execute(7)),
            ),
            (
                "the same approver twice counts once",
                spec(&["bob", "bob"]),
                None,
                a7.clone(),
                2,
                false,
                10,
                Box::new(|v| *v == Verdict::Pending),
            ),
            (
                "two approvers for two",
                spec(&["bob", "carol"]),
                None,
                a7.clone(),
                2,
                false,
                10,
                Box::new(|v| *v == Verdict::Execute(7)),
            ),
            (
                "zero required: executes at once",
                spec(&[]),
                None,
                a7.clone(),
                0,
                false,
                10,
                Box::new(|v| *v == Verdict::Execute(7)),
            ),
            (
                "expired, approved or not",
                spec(&["bob"]),
                Some(Phase::Pending),
                a7.clone(),
                1,
                false,
                100,
                Box::new(end(Phase::Expired)),
            ),
            ("expired unapproved", spec(&[]), None, a7.clone(), 1, false, 500, Box::new(end(Phase::Expired))),
            ("another holder", spec(&["bob"]), None, held("b_2", 8), 1, false, 10, Box::new(end(Phase::Superseded))),
            (
                "same holder, a new hold",
                spec(&["bob"]),
                None,
                held("a_1", 9),
                1,
                false,
                10,
                Box::new(end(Phase::Superseded)),
            ),
            ("free", spec(&["bob"]), None, HoldView::Free, 1, false, 10, Box::new(end(Phase::Superseded))),
            (
                "draining its target, not by it",
                spec(&["bob"]),
                Some(Phase::Approved),
                HoldView::Draining(Some(7)),
                1,
                false,
                10,
                Box::new(end(Phase::Superseded)),
            ),
            (
                "carried out",
                spec(&["bob"]),
                Some(Phase::Approved),
                HoldView::Draining(Some(7)),
                1,
                true,
                10,
                Box::new(end(Phase::Executed)),
            ),
            (
                "carried out, recorded after expiry",
                spec(&["bob"]),
                Some(Phase::Approved),
                HoldView::Free,
                1,
                true,
                500,
                Box::new(end(Phase::Executed)),
            ),
            ("denied", denied, None, a7.clone(), 1, false, 10, Box::new(end(Phase::Denied))),
            (
                "no requester stamped: never acts",
                unstamped,
                None,
                a7.clone(),
                0,
                false,
                10,
                Box::new(end(Phase::Denied)),
            ),
            ("no target stamped: never acts", untargeted, None, a7.clone(), 0, false, 10, Box::new(end(Phase::Denied))),
            (
                "final stays final",
                spec(&["bob"]),
                Some(Phase::Expired),
                a7.clone(),
                1,
                false,
                10,
                Box::new(|v| *v == Verdict::Done),
            ),
            (
                "executed stays executed",
                spec(&["bob"]),
                Some(Phase::Executed),
                a7.clone(),
                1,
                false,
                10,
                Box::new(|v| *v == Verdict::Done),
            ),
        ];
        for (what, spec, phase, hold, required, executed, now, expect) in cases {
            let verdict = judge(&Judged { spec: &spec, phase, hold: &hold, required, executed, now: ts(now) });
            assert!(expect(&verdict), "{what}: {verdict:?}");
        }
    }

    #[test]
    fn messages_name_what_happened() {
        let judged = |hold: &HoldView, now| {
            judge(&Judged { spec: &spec(&[]), phase: None, hold, required: 1, executed: false, now: ts(now) })
        };
        let Verdict::End(_, m) = judged(&held("b_2", 8), 10) else { panic!("ends") };
        assert!(m.contains("a_1") && m.contains("b_2") && m.contains('8'), "{m}");
        let Verdict::End(_, m) = judged(&held("a_1", 7), 200) else { panic!("ends") };
        assert!(m.contains("expired") && m.contains("0 of 1"), "{m}");
    }

    #[test]
    fn status_and_history_follow_the_verdict() {
        let now = ts(20);
        let s = spec(&["alice", "bob"]);
        let pending = status(&s, None, Phase::Pending, "waiting".into(), 2, None, now);
        assert_eq!(pending.approvals.iter().map(|a| a.by.as_str()).collect::<Vec<_>>(), ["bob"], "not the requester's");
        assert_eq!(pending.approvals_text.as_deref(), Some("1/2"));
        let first = entries("r1", &s, None, &pending, now);
        assert_eq!(first.iter().map(|e| e.event.as_str()).collect::<Vec<_>>(), ["Requested", "Approved"]);
        assert_eq!(first[0].by.as_deref(), Some("alice"));
        assert_eq!(first[1].by.as_deref(), Some("bob"));
        // Seen again unchanged: nothing new; the transition time stays.
        let again = status(&s, Some(&pending), Phase::Pending, "waiting".into(), 2, None, ts(30));
        assert_eq!(again.last_transition_time, pending.last_transition_time);
        assert!(entries("r1", &s, Some(&pending), &again, ts(30)).is_empty());
        // Carol approves, and it is carried out.
        let s2 = spec(&["alice", "bob", "carol"]);
        let done = status(&s2, Some(&again), Phase::Executed, "revoked".into(), 2, Some(7), ts(40));
        let last = entries("r1", &s2, Some(&again), &done, ts(40));
        assert_eq!(last.iter().map(|e| e.event.as_str()).collect::<Vec<_>>(), ["Approved", "Executed"]);
        assert_eq!(done.revoked_token, Some(7));
        assert_eq!(done.last_transition_time, Some(Time(ts(40))));
    }

    #[test]
    fn history_is_bounded_and_keeps_the_latest() {
        let e = |i: i64| ForceReleaseEntry {
            at: Time(ts(i)),
            event: "Requested".into(),
            request: None,
            by: None,
            message: None,
        };
        let old: Vec<_> = (0..19).map(e).collect();
        let new: Vec<_> = (19..23).map(e).collect();
        let kept = append(&old, &new, 20);
        assert_eq!(kept.len(), 20);
        assert_eq!(kept.first().map(|x| x.at.clone()), Some(Time(ts(3))));
        assert_eq!(kept.last().map(|x| x.at.clone()), Some(Time(ts(22))));
        assert_eq!(append(&[], &[], 20), vec![]);
    }
}
