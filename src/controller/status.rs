//! The status that follows from what the controller observed and did, as a pure function.
//! The reconciler applies it only when it differs from the last one written, and nothing
//! in it changes with the clock alone: ages are derived from timestamps by readers.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::view::{Claim, LeaseDrain, LeaseHold};
use crate::crd::{
    ClaimMode, DistributedLockStatus, ForceRelease, ForceReleaseEntry, HolderStatus, WaiterStatus,
    defaults::MAX_LISTED_WAITERS,
};
use crate::crd_force::limits::HISTORY;
use crate::lease::RevokeReason;
use crate::lease::Timing;

/// `t` as the apiserver stores a `Time`: whole seconds. A status built from it reads back
/// from the cache exactly as written, so the status last applied can be recognised in the
/// cache (and shared with it, not kept as a copy) and is not written again for a change of
/// precision alone.
pub fn stored(t: Timestamp) -> Time {
    Time(t.round(jiff::TimestampRound::new().smallest(jiff::Unit::Second).mode(jiff::RoundMode::Floor)).unwrap_or(t))
}

/// A grant made in this reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct Granted {
    /// The slot granted.
    pub slot: u32,
    /// The new holder's identity.
    pub identity: String,
    /// Its token.
    pub token: i64,
    /// When it was granted (the Lease's `acquireTime`).
    pub acquired: Timestamp,
    /// How long the new holder waited, seconds.
    pub waited_seconds: f64,
    /// From the lock becoming free to this grant, ms (`None` if unknown).
    pub handoff_ms: Option<i64>,
}

/// What this reconcile did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Grants, in slot order.
    pub granted: Vec<Granted>,
    /// Revocations, by slot.
    pub revoked: Vec<(u32, RevokeReason)>,
    /// A forced release carried out.
    pub forced: Option<ForceRelease>,
    /// Force-release happenings to add to the lock's history.
    pub history: Vec<ForceReleaseEntry>,
    /// Grants holders wrote in their releases (handoffs) whose holds ended before we saw
    /// them: each was granted once and released once.
    pub unseen: u32,
    /// The highest token reserved for a next waiter's grant (a release may hand the lock
    /// on with it before status shows it): status must cover it within the margin it may
    /// trail by.
    pub reserved: Option<i64>,
}

/// What two reconciles did, as one: a pending outcome (its status write failed) followed
/// by a new one. Nothing done is dropped; a newer force release wins.
pub fn merge(pending: Option<Outcome>, new: Outcome) -> Outcome {
    let Some(pending) = pending else { return new };
    Outcome {
        granted: pending.granted.into_iter().chain(new.granted).collect(),
        revoked: pending.revoked.into_iter().chain(new.revoked).collect(),
        forced: new.forced.or(pending.forced),
        history: pending.history.into_iter().chain(new.history).collect(),
        unseen: pending.unseen.saturating_add(new.unseen),
        reserved: pending.reserved.max(new.reserved),
    }
}

/// A hold after a reconcile's writes, with its slot and the timing it was granted under.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotHold {
    /// The slot.
    pub slot: u32,
    /// The hold.
    pub hold: LeaseHold,
    /// The timing it was granted under.
    pub timing: Timing,
}

/// Inputs of [`desired`].
pub struct Inputs<'a> {
    /// The status as last written.
    pub previous: &'a DistributedLockStatus,
    /// The DistributedLock's generation.
    pub generation: Option<i64>,
    /// Now (wall clock), for condition transitions only.
    pub now: Timestamp,
    /// The holds on the slot Leases after this reconcile's writes, slot order.
    pub holds: &'a [SlotHold],
    /// The lock's permits.
    pub permits: u32,
    /// The highest token issued or reserved.
    pub token: i64,
    /// Live waiters in grant order.
    pub waiters: &'a [&'a Claim],
    /// What was done.
    pub outcome: &'a Outcome,
    /// The drains under way, by slot.
    pub draining: &'a [(u32, LeaseDrain)],
    /// Whether the lock can be granted, and if not why.
    pub ready: &'a Ready,
    /// How many approvals a force release needs.
    pub approvals: i32,
}

/// Whether the lock can be granted (the `Ready` condition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ready {
    /// The lock Lease is ours and tokens can be minted.
    Yes,
    /// A Lease with the lock's name is not ours (the message says whose).
    LeaseConflict(String),
    /// Every token has been issued.
    TokenExhausted(String),
    /// The lock Lease records a token no controller could have minted.
    TokenTampered(String),
}

impl Ready {
    /// `(status, reason, message)` of the condition.
    fn condition(&self) -> (bool, &'static str, String) {
        match self {
            Ready::Yes => (true, "LeaseOwned", "the lock Lease is owned by this lock".into()),
            Ready::LeaseConflict(why) => (false, "LeaseConflict", why.clone()),
            Ready::TokenExhausted(why) => (false, "TokenExhausted", why.clone()),
            Ready::TokenTampered(why) => (false, "TokenTampered", why.clone()),
        }
    }
}

fn condition(
    previous: &[Condition],
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    now: Timestamp,
    generation: Option<i64>,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let last = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| stored(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        last_transition_time: last,
        observed_generation: generation,
    }
}

fn holder_status(h: &SlotHold, previous: Option<&HolderStatus>, granted: Option<&Granted>) -> HolderStatus {
    let (hold, timing) = (&h.hold, &h.timing);
    let token = hold.token.unwrap_or_default();
    let slot = i32::try_from(h.slot).unwrap_or(i32::MAX);
    if let Some(p) = previous.filter(|p| p.identity == hold.identity.id && p.fencing_token == token && p.slot == slot) {
        return p.clone();
    }
    let acquired = hold.acquire_time.unwrap_or(Timestamp::UNIX_EPOCH);
    let renewed = hold.renew_time.as_ref().map_or(acquired, |t| t.0);
    let lease = SignedDuration::try_from(timing.lease_duration).unwrap_or(SignedDuration::ZERO);
    HolderStatus {
        identity: hold.identity.id.clone(),
        slot,
        mode: (hold.mode == ClaimMode::Write).then_some(ClaimMode::Write),
        pod: hold.identity.pod.as_ref().map(|p| p.name.clone()),
        fencing_token: token,
        acquired_at: stored(acquired),
        renewed_at: Some(stored(renewed)),
        expires_at: renewed.checked_add(lease).ok().map(stored),
        waited_seconds: granted.map_or(0.0, |g| g.waited_seconds),
    }
}

/// The holders a status lists: `holders`, or its one `holder` if written before there
/// were several.
pub fn listed(status: &DistributedLockStatus) -> Vec<&HolderStatus> {
    if status.holders.is_empty() {
        status.holder.as_deref().into_iter().collect()
    } else {
        status.holders.iter().collect()
    }
}

fn drain_message(d: &LeaseDrain) -> String {
    let token = d.revoked.map_or_else(|| "unknown".to_owned(), |t| t.to_string());
    let reason = d.reason.as_deref().unwrap_or("revoked");
    match &d.holder {
        Some(holder) => format!(
            "token {token} revoked ({reason}): waiting for {holder} to let go, at most one lease duration after its last renewal"
        ),
        None => format!("token {token} revoked ({reason}) and acknowledged by its holder"),
    }
}

/// The status to write.
pub fn desired(i: &Inputs) -> DistributedLockStatus {
    let previous = i.previous;
    let before = listed(previous);
    let holders: Vec<HolderStatus> = i
        .holds
        .iter()
        .map(|h| {
            let token = h.hold.token.unwrap_or_default();
            let earlier = before.iter().copied().find(|p| p.identity == h.hold.identity.id && p.fencing_token == token);
            let granted = i.outcome.granted.iter().rev().find(|g| g.slot == h.slot && g.token == token);
            holder_status(h, earlier, granted)
        })
        .collect();
    let mut stats = previous.stats.clone();
    // Every hold that is gone ended once: revoked (by its slot's revocation) or released.
    let after: Vec<&HolderStatus> = holders.iter().collect();
    for gone in super::ended::ended(&before, &after, i.outcome) {
        match gone.revoked {
            None => stats.releases += 1,
            Some(RevokeReason::Forced) => stats.forced_releases += 1,
            Some(_) => stats.expirations += 1,
        }
    }
    let unseen = i64::from(i.outcome.unseen);
    stats.grants += unseen;
    stats.releases += unseen;
    if let Some(g) = i.outcome.granted.last() {
        stats.grants += i.outcome.granted.len() as i64;
        stats.last_wait_seconds = Some((g.waited_seconds * 1000.0).round() / 1000.0);
        stats.last_handoff_milliseconds = g.handoff_ms;
    }
    let (ok, reason, message) = i.ready.condition();
    let ready = condition(&previous.conditions, "Ready", ok, reason, message, i.now, i.generation);
    let (ok, reason, message) = match (holders.as_slice(), i.draining.first()) {
        ([h], _) => (true, "Held", format!("held by {} with token {}", h.identity, h.fencing_token)),
        ([_, ..], _) => (true, "Held", format!("{} of {} permits held", holders.len(), i.permits)),
        ([], Some((_, d))) => (false, "Draining", drain_message(d)),
        ([], None) => (false, "Free", "nobody holds the lock".to_owned()),
    };
    let held = condition(&previous.conditions, "Held", ok, reason, message, i.now, i.generation);
    DistributedLockStatus {
        holder: holders.first().cloned().map(Box::new),
        held_permits: Some(format!("{}/{}", holders.len(), i.permits)),
        holders,
        fencing_token: Some(previous.fencing_token.unwrap_or(0).max(i.token)).filter(|t| *t > 0),
        waiters: i
            .waiters
            .iter()
            .take(MAX_LISTED_WAITERS)
            .map(|c| WaiterStatus {
                identity: c.identity.id.clone(),
                pod: c.identity.pod.as_ref().map(|p| p.name.clone()),
                mode: (c.mode == ClaimMode::Write).then_some(ClaimMode::Write),
                since: stored(c.requested),
            })
            .collect(),
        queue_length: i32::try_from(i.waiters.len()).unwrap_or(i32::MAX),
        stats,
        last_force_release: i.outcome.forced.clone().map(Box::new).or_else(|| previous.last_force_release.clone()),
        force_release_approvals: Some(i.approvals),
        force_release_history: super::requests::append(&previous.force_release_history, &i.outcome.history, HISTORY),
        conditions: vec![ready, held],
        observed_generation: i.generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Identity;
    use std::time::Duration;

    const UID: &str = "0b8f3a1e-5d2c-4c55-9a57-2f3c1e7b9d10";

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("valid")
    }

    fn hold(pod: &str, token: i64) -> LeaseHold {
        LeaseHold {
            mode: crate::crd::ClaimMode::Read,
            identity: Identity::for_pod(pod, UID),
            token: Some(token),
            acquire_time: Some(ts(100)),
            renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(ts(101))),
            confirmed: true,
            claim: None,
            claim_uid: None,
        }
    }

    fn waiter(pod: &str, since: i64) -> Claim {
        Claim {
            mode: crate::crd::ClaimMode::Read,
            name: format!("lock.{pod}"),
            uid: pod.into(),
            resource_version: "1".into(),
            identity: Identity::for_pod(pod, UID),
            created: ts(since),
            requested: ts(since),
            renew_time: None,
            ttl: Duration::from_secs(45),
        }
    }

    /// What a reconcile that granted `pod` `token` after a wait of `waited` s did.
    fn granted_to(pod: &str, token: i64, waited: f64) -> Outcome {
        let identity = Identity::for_pod(pod, UID).id;
        let grant =
            Granted { slot: 0, identity, token, acquired: ts(100), waited_seconds: waited, handoff_ms: Some(3) };
        Outcome { granted: vec![grant], ..Outcome::default() }
    }

    fn timing() -> Timing {
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    fn run(
        previous: &DistributedLockStatus,
        hold: Option<&LeaseHold>,
        token: i64,
        waiters: &[&Claim],
        outcome: &Outcome,
    ) -> DistributedLockStatus {
        let holds: Vec<SlotHold> =
            hold.map(|h| SlotHold { slot: 0, hold: h.clone(), timing: timing() }).into_iter().collect();
        desired(&Inputs {
            previous,
            generation: Some(1),
            now: ts(200),
            holds: &holds,
            permits: 1,
            token,
            waiters,
            outcome,
            draining: &[],
            ready: &Ready::Yes,
            approvals: 0,
        })
    }

    #[test]
    fn grant_then_release_then_grant() {
        let b = waiter("b", 95);
        let s1 = run(&DistributedLockStatus::default(), Some(&hold("a", 7)), 7, &[&b], &granted_to("a", 7, 10.0));
        let h = s1.holder.as_ref().expect("held");
        assert_eq!((h.pod.as_deref(), h.fencing_token, h.waited_seconds), (Some("a"), 7, 10.0));
        assert_eq!(h.expires_at, Some(Time(ts(116))));
        assert_eq!((s1.fencing_token, s1.queue_length, s1.stats.grants, s1.stats.releases), (Some(7), 1, 1, 0));
        assert_eq!(s1.waiters[0].since, Time(ts(95)));
        assert_eq!(s1.conditions[1].status, "True");

        // Nothing new observed: identical status, so nothing is written.
        assert_eq!(run(&s1, Some(&hold("a", 7)), 7, &[&b], &Outcome::default()), s1);

        // a released, b granted.
        let s2 = run(&s1, Some(&hold("b", 8)), 8, &[], &granted_to("b", 8, 10.0));
        assert_eq!((s2.stats.grants, s2.stats.releases, s2.stats.expirations), (2, 1, 0));
        assert_eq!((s2.queue_length, s2.fencing_token), (0, Some(8)));

        // b expired, nobody waits: free, token raised.
        let expired = Outcome { revoked: vec![(0, RevokeReason::Expired)], ..Outcome::default() };
        let s3 = run(&s2, None, 9, &[], &expired);
        assert_eq!((s3.holder.clone(), s3.stats.expirations, s3.fencing_token), (None, 1, Some(9)));
        assert_eq!(s3.conditions[1].status, "False");
    }

    #[test]
    fn token_never_decreases_and_transition_times_stick() {
        let previous = run(&DistributedLockStatus::default(), None, 50, &[], &Outcome::default());
        let later = desired(&Inputs {
            previous: &previous,
            generation: Some(1),
            now: ts(999),
            holds: &[],
            permits: 1,
            token: 10,
            waiters: &[],
            outcome: &Outcome::default(),
            draining: &[],
            ready: &Ready::Yes,
            approvals: 0,
        });
        assert_eq!(later.fencing_token, Some(50));
        assert_eq!(later, previous, "an unchanged lock must produce an identical status");
    }

    #[test]
    fn a_drain_counts_once_and_says_so_until_it_ends() {
        let s1 = run(&DistributedLockStatus::default(), Some(&hold("a", 7)), 7, &[], &granted_to("a", 7, 1.0));
        // Forced: the hold is revoked and drained; status names no holder.
        let forced = Outcome { revoked: vec![(0, RevokeReason::Forced)], ..Outcome::default() };
        let drain = LeaseDrain {
            holder: Some(Identity::for_pod("a", UID)),
            revoked: Some(7),
            reason: Some("Forced".into()),
            mode: ClaimMode::Read,
        };
        let with = |previous: &DistributedLockStatus, token, outcome: &Outcome, draining: &[(u32, LeaseDrain)]| {
            desired(&Inputs {
                previous,
                generation: Some(1),
                now: ts(300),
                holds: &[],
                permits: 1,
                token,
                waiters: &[],
                outcome,
                draining,
                ready: &Ready::Yes,
                approvals: 0,
            })
        };
        let drains = [(0, drain)];
        let s2 = with(&s1, 8, &forced, &drains);
        assert_eq!(
            (s2.holder.clone(), s2.stats.forced_releases, s2.stats.releases, s2.fencing_token),
            (None, 1, 0, Some(8))
        );
        let held = &s2.conditions[1];
        assert_eq!((held.status.as_str(), held.reason.as_str()), ("False", "Draining"));
        assert!(held.message.contains("token 7 revoked (Forced)") && held.message.contains("a_"), "{}", held.message);
        // Nothing new: identical. The drain ends: free, counted nowhere again.
        assert_eq!(with(&s2, 8, &Outcome::default(), &drains), s2);
        let s3 = with(&s2, 8, &Outcome::default(), &[]);
        assert_eq!((s3.stats.forced_releases, s3.stats.releases, s3.stats.expirations), (1, 0, 0));
        assert_eq!(s3.conditions[1].reason, "Free");
    }

    #[test]
    fn stored_times_are_whole_seconds_rounded_down() {
        let at = |s: i64, nanos: i64| ts(s) + SignedDuration::from_nanos(nanos);
        let table = [
            ("a whole second", at(100, 0), ts(100)),
            ("just after", at(100, 1), ts(100)),
            ("just before the next", at(100, 999_999_999), ts(100)),
            ("before the epoch", at(-1, 500_000_000), ts(-1)),
        ];
        for (case, t, want) in table {
            assert_eq!(stored(t), Time(want), "{case}");
        }
    }

    #[test]
    fn a_status_reads_back_from_the_apiserver_exactly_as_written() {
        // Every clock below the second: the apiserver keeps a Time to the second, and the
        // status last applied must equal the cached lock's to be recognised there.
        let at = |s: i64| ts(s) + SignedDuration::from_nanos(123_456_789);
        let mut a = hold("a", 7);
        a.acquire_time = Some(at(100));
        a.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(at(101)));
        let mut b = waiter("b", 0);
        b.requested = at(95);
        let drain = LeaseDrain { holder: None, revoked: Some(6), reason: None, mode: ClaimMode::Read };
        let granted = granted_to("a", 7, 0.123_456);
        let holds = [SlotHold { slot: 0, hold: a, timing: timing() }];
        let draining = [(0, drain)];
        type Case<'a> = (&'a str, &'a [SlotHold], &'a [&'a Claim], &'a Outcome, &'a [(u32, LeaseDrain)]);
        let table: [Case; 3] = [
            ("held, one waiting", &holds, &[&b], &granted, &[]),
            ("free", &[], &[], &Outcome::default(), &[]),
            ("draining", &[], &[&b], &Outcome::default(), &draining),
        ];
        for (case, holds, waiters, outcome, draining) in table {
            let status = desired(&Inputs {
                previous: &DistributedLockStatus::default(),
                generation: Some(1),
                now: at(200),
                holds,
                permits: 1,
                token: 7,
                waiters,
                outcome,
                draining,
                ready: &Ready::Yes,
                approvals: 0,
            });
            let json = serde_json::to_value(&status).expect("serialises");
            let read: DistributedLockStatus = serde_json::from_value(json).expect("deserialises");
            assert_eq!(read, status, "{case}");
        }
    }

    #[test]
    fn ready_says_why_nothing_can_be_granted() {
        for (ready, reason) in [
            (Ready::Yes, "LeaseOwned"),
            (Ready::LeaseConflict("Lease orders is controlled by Deployment x".into()), "LeaseConflict"),
            (Ready::TokenExhausted("no token left".into()), "TokenExhausted"),
            (Ready::TokenTampered("token 9223372036854775807".into()), "TokenTampered"),
        ] {
            let s = desired(&Inputs {
                previous: &DistributedLockStatus::default(),
                generation: Some(1),
                now: ts(1),
                holds: &[],
                permits: 1,
                token: 1,
                waiters: &[],
                outcome: &Outcome::default(),
                draining: &[],
                ready: &ready,
                approvals: 0,
            });
            assert_eq!(s.conditions[0].reason, reason);
            assert_eq!(s.conditions[0].status, if ready == Ready::Yes { "True" } else { "False" });
        }
    }

    #[test]
    fn a_pending_outcome_is_merged_not_lost() {
        let grant = |w| granted_to("a", 7, w);
        let expired = Outcome { revoked: vec![(0, RevokeReason::Expired)], ..Outcome::default() };
        assert_eq!(merge(None, grant(1.0)), grant(1.0));
        let merged = merge(Some(expired.clone()), grant(2.0));
        assert_eq!(
            (merged.revoked, merged.granted.iter().map(|g| g.waited_seconds).collect::<Vec<_>>()),
            (vec![(0, RevokeReason::Expired)], vec![2.0])
        );
        // A status write that failed after a revocation: the next reconcile (which did
        // nothing new) still counts it as an expiration, once.
        let s1 = run(&DistributedLockStatus::default(), Some(&hold("a", 7)), 7, &[], &granted_to("a", 7, 1.0));
        let after = run(&s1, None, 8, &[], &merge(Some(expired), Outcome::default()));
        assert_eq!((after.stats.expirations, after.stats.releases), (1, 0));
    }

    #[test]
    fn holds_granted_and_ended_between_two_writes_are_counted() {
        let (b, c) = (waiter("b", 95), waiter("c", 96));
        let s1 = run(&DistributedLockStatus::default(), Some(&hold("a", 7)), 7, &[&b, &c], &granted_to("a", 7, 1.0));
        // The next writes failed, and the one that lands carries three reconciles: a
        // released, b granted and released, c granted, then revoked (expired), d granted.
        let pending = merge(
            Some(merge(Some(granted_to("b", 8, 2.0)), granted_to("c", 9, 3.0))),
            Outcome { revoked: vec![(0, RevokeReason::Expired)], ..granted_to("d", 10, 4.0) },
        );
        let s2 = run(&s1, Some(&hold("d", 10)), 10, &[&b], &pending);
        let stats = &s2.stats;
        assert_eq!((stats.grants, stats.releases, stats.expirations, stats.forced_releases), (4, 2, 1, 0));
        let h = s2.holder.as_ref().expect("held");
        assert_eq!((h.fencing_token, h.waited_seconds, stats.last_wait_seconds), (10, 4.0, Some(4.0)));
    }

    #[test]
    fn waiter_list_is_bounded() {
        let claims: Vec<Claim> = (0..25).map(|i| waiter(&format!("w{i}"), i)).collect();
        let refs: Vec<&Claim> = claims.iter().collect();
        let s = run(&DistributedLockStatus::default(), None, 1, &refs, &Outcome::default());
        assert_eq!((s.waiters.len(), s.queue_length), (MAX_LISTED_WAITERS, 25));
    }
}
