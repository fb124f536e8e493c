//! How a claimant reacts to the state of the lock Lease it watches, as one pure function:
//! [`next`]. The acquisition loop and the renewal task feed it every state they see and do
//! what it says; the writes, the timers and the logging stay with them.
//!
//! While waiting, only a fresh grant naming us — above every token we were ever handed,
//! and not yet confirmed by anyone — is taken. One granted on the claim we made within a
//! retry period is answered at once: the send of that claim counts as the hold's first
//! renewal (the controller saw the claim after it was sent, granted after it saw it, and
//! judges a grant to a claim it saw less than a lease duration ago like a hold renewed when
//! it saw it). Any other fresh grant is confirmed by compare-and-swap before it is
//! answered. A grant naming us that is older, already confirmed, or granted on a claim that
//! is not the one we hold now, is a leftover (of a hold we lost, or of an earlier process with our
//! identity): it is never reported held, but given back, and only once the earlier process
//! can no longer believe it holds. The one exception is a confirmation of our own whose
//! answer never came (the request timed out or its connection broke) and which landed
//! after all: the Lease shows the very renewTime we wrote. That hold is ours, its renew
//! deadline counted from when we sent the write; it is taken if that deadline is still
//! ahead, and given back at once otherwise (nobody else was ever told of it). A Lease
//! naming us with a token whose give-back we saw land is a view from before that write (a
//! watch that has not caught up): nothing to do. While holding, anything but the Lease
//! still granting our hold with our token means the hold is lost.

use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;

use super::edit::{self, LostReason};
use crate::lease::{GrantedTiming, Identity, granted};

/// Where the claimant stands on the lock.
#[derive(Clone, Debug)]
pub enum Ours<'a> {
    /// Waiting for a grant.
    Waiting(Waiting<'a>),
    /// Holding a confirmed grant.
    Holding {
        /// Our identity.
        identity: &'a Identity,
        /// The token of our hold.
        token: i64,
    },
}

/// What a waiting claimant knows besides the Lease.
#[derive(Clone, Debug)]
pub struct Waiting<'a> {
    /// Our identity.
    pub identity: &'a Identity,
    /// The highest token this claimant was ever handed for the lock (0: none): a grant at
    /// or below it is a leftover, never a new hold.
    pub floor: i64,
    /// The highest token of a hold we gave back, the write seen landing (0: none): a Lease
    /// naming us with it, or a lower one, is a view from before that write (a watch that
    /// has not caught up), with nothing to do.
    pub returned: i64,
    /// The latest grant whose confirmation the apiserver refused (it did not land).
    pub unconfirmed: Option<i64>,
    /// Our confirmations that got no answer: each may have landed, or may yet.
    pub unanswered: &'a [Unanswered],
    /// The UID of the claim we hold now, if known.
    pub claim: Option<&'a str>,
    /// When the create of that claim was sent, if we made it.
    pub claim_sent: Option<Instant>,
    /// The token this slot's Lease carried when we first saw it in this acquisition (0: it
    /// had none, or did not exist): a grant above it was made while we watched.
    pub first_seen: i64,
    /// A grant slipped by before we could confirm it, and took our claim with it.
    pub missed_grant: bool,
    /// When this claimant was made: an earlier process with our identity renewed its hold
    /// last before then.
    pub born: Instant,
    /// The lock's terms now, for a Lease that does not record its own.
    pub terms: &'a GrantedTiming,
    /// The time now.
    pub now: Instant,
}

/// A confirmation we sent that got no answer (no reply in time, or the connection broke):
/// it may have landed, or may still land.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unanswered {
    /// The grant it confirmed.
    pub token: i64,
    /// The renewTime it wrote, in microseconds (the Lease's precision): a Lease showing
    /// exactly this on that grant carries our write, nobody else's.
    pub renew_micros: i64,
    /// When it was sent: a hold it confirmed is valid until one renew deadline after.
    pub sent: Instant,
}

/// What to do about a state of the lock Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reaction {
    /// Waiting, and the Lease does not exist, or shows a hold of ours whose give-back we
    /// saw land (a view from before it): keep waiting.
    Wait,
    /// Waiting, and the Lease grants us nothing (free, held by someone else, or draining):
    /// keep waiting, after acknowledging the drain of our grant with token `acknowledge`
    /// (one never confirmed, so never reported held) and claiming again if a grant was
    /// missed.
    NotGranted {
        /// The never-confirmed grant of ours the Lease drains: clear its holder.
        acknowledge: Option<i64>,
        /// Claim again now rather than at the next refresh.
        claim_again: bool,
    },
    /// Waiting, and granted a fresh hold with `token`: confirm it by compare-and-swap.
    Confirm {
        /// The grant's token.
        token: i64,
    },
    /// Waiting, and a confirmation of ours that got no answer landed, its renew deadline
    /// still ahead: the hold with `token` is ours, valid from `sent`.
    Adopt {
        /// The grant's token.
        token: i64,
        /// When the confirmation that landed was sent.
        sent: Instant,
    },
    /// Waiting, and granted a fresh hold with `token` on the claim we sent at `sent`,
    /// within a retry period of it: hold at once, as if renewed at `sent` (the renew
    /// deadline and the max hold count from there); the first renewal confirms it.
    Answer {
        /// The grant's token.
        token: i64,
        /// When our claim was sent.
        sent: Instant,
    },
    /// Waiting, and the Lease names a leftover hold with `token` that an earlier process
    /// may have told its app it holds until `at`: look at the Lease again then.
    GiveBackAt {
        /// The leftover's token.
        token: i64,
        /// That earlier process's renew deadline at the latest.
        at: Instant,
    },
    /// Waiting, and the Lease names a leftover hold with `token` nobody can still believe
    /// they hold: clear its holder, so that the controller grants afresh with a higher token.
    GiveBack {
        /// The leftover's token.
        token: i64,
    },
    /// Holding, and the Lease still grants our hold: keep renewing.
    Renew,
    /// Holding, and the hold is lost (revoked, drained, granted again, released, or the
    /// Lease gone): tell the owner at once; acknowledge once it lets go.
    LetGo(LostReason),
}

/// The claimant's reaction to `state` (`None`: the Lease does not exist), standing as `ours`.
pub fn next(state: Option<&Lease>, ours: &Ours<'_>) -> Reaction {
    match ours {
        Ours::Holding { identity, token } => match edit::still_ours(state, identity, *token) {
            Ok(()) => Reaction::Renew,
            Err(reason) => Reaction::LetGo(reason),
        },
        Ours::Waiting(waiting) => match state {
            None => Reaction::Wait,
            Some(lease) => while_waiting(lease, waiting),
        },
    }
}

fn while_waiting(lease: &Lease, w: &Waiting<'_>) -> Reaction {
    let Some(token) = edit::granted_token(lease, w.identity) else {
        let acknowledge = w.unconfirmed.filter(|t| edit::given_back(lease, w.identity, *t).is_some());
        return Reaction::NotGranted { acknowledge, claim_again: w.missed_grant };
    };
    if token <= w.returned {
        return Reaction::Wait;
    }
    if token > w.floor && !edit::is_confirmed(lease) {
        match edit::claim_uid(lease) {
            // A grant that does not say which claim it serves: confirm before answering.
            None => return Reaction::Confirm { token },
            Some(uid) if Some(uid) == w.claim => {
                let retry = granted::of_lease(lease, w.terms).timing.retry_period;
                return match w.claim_sent {
                    Some(sent) if w.now < sent + retry => Reaction::Answer { token, sent },
                    _ => Reaction::Confirm { token },
                };
            }
            // Granted on another claim in our name (one the controller's cache still
            // showed, of an earlier acquisition or an earlier process). Made while we
            // watched, it cannot have been answered by an earlier process, gone before we
            // were made, nor by an earlier acquisition, which withdrew unanswered: confirm
            // it before answering. Found already made, an earlier process may have
            // answered it before confirming: a leftover, like a confirmed one.
            Some(_) if token > w.first_seen => return Reaction::Confirm { token },
            Some(_) => {}
        }
    }
    let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0.as_microsecond());
    if let Some(ours) = w.unanswered.iter().find(|u| u.token == token && Some(u.renew_micros) == renewed) {
        let valid_until = ours.sent + granted::of_lease(lease, w.terms).timing.renew_deadline;
        return if valid_until > w.now {
            Reaction::Adopt { token, sent: ours.sent }
        } else {
            Reaction::GiveBack { token }
        };
    }
    // A hold of our own was handed to us and ended before we queued (at or below the
    // floor). Above it, the hold is an earlier process's (confirmed, or granted on a claim
    // of its own that it may have answered): it may have told its app that it holds until
    // its renew deadline, which runs out at the latest one renew deadline after we were
    // made.
    if token > w.floor {
        let told_until = w.born + granted::of_lease(lease, w.terms).timing.renew_deadline;
        if told_until > w.now {
            return Reaction::GiveBackAt { token, at: told_until };
        }
    }
    Reaction::GiveBack { token }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    use super::*;
    use crate::crd::{
        ANNOTATION_CLAIM_UID, ANNOTATION_DRAINING, ANNOTATION_RENEW_DEADLINE, ANNOTATION_REVOKED, ANNOTATION_TOKEN,
        LABEL_LOCK, LABEL_ROLE, ROLE_LOCK,
    };
    use crate::lease::Timing;

    const UID: &str = "0b8f3a1e-5d2c-4c55-9a57-2f3c1e7b9d10";

    /// A lock Lease: `holder`, `token`, and what else is on it.
    #[derive(Clone, Copy, Default)]
    struct Shape<'a> {
        holder: Option<&'a str>,
        token: Option<i64>,
        /// `renewTime != acquireTime`.
        confirmed: bool,
        revoked: Option<&'a str>,
        draining: Option<i64>,
        /// The renew deadline recorded at the grant, in seconds.
        renew_deadline: Option<u64>,
        /// Labelled as the lock Lease (a squatter is not).
        unlabelled: bool,
        /// The UID of the claim the grant was made on.
        claim_uid: Option<&'a str>,
    }

    fn lease(s: Shape<'_>) -> Lease {
        let mut annotations = BTreeMap::new();
        let mut put = |key: &str, value: Option<String>| {
            if let Some(v) = value {
                annotations.insert(key.to_owned(), v);
            }
        };
        put(ANNOTATION_TOKEN, s.token.map(|t| t.to_string()));
        put(ANNOTATION_REVOKED, s.revoked.map(str::to_owned));
        put(ANNOTATION_DRAINING, s.draining.map(|t| t.to_string()));
        put(ANNOTATION_RENEW_DEADLINE, s.renew_deadline.map(|d| d.to_string()));
        put(ANNOTATION_CLAIM_UID, s.claim_uid.map(str::to_owned));
        let acquired = jiff::Timestamp::from_second(1_700_000_000).expect("valid");
        let renewed = if s.confirmed {
            acquired.checked_add(jiff::SignedDuration::from_secs(1)).expect("valid")
        } else {
            acquired
        };
        let labels = [(LABEL_LOCK.into(), "orders".into()), (LABEL_ROLE.into(), ROLE_LOCK.into())].into();
        Lease {
            metadata: ObjectMeta {
                name: Some("orders".into()),
                labels: (!s.unlabelled).then_some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: s.holder.map(str::to_owned),
                lease_duration_seconds: Some(15),
                acquire_time: Some(MicroTime(acquired)),
                renew_time: Some(MicroTime(renewed)),
                ..LeaseSpec::default()
            }),
        }
    }

    fn terms() -> GrantedTiming {
        let timing = Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        };
        GrantedTiming { timing, max_hold: None }
    }

    #[test]
    fn while_waiting() {
        let me = Identity::for_pod("w-0", UID);
        let mine = Some(me.id.as_str());
        let terms = terms();
        let born = Instant::now();
        // Ten seconds after we were made: an earlier process's hold granted with a 10 s
        // renew deadline is past it, one granted with 20 s is not.
        let now = born + Duration::from_secs(10);
        // Our claim "c1", sent a second ago (within the 2 s retry period).
        let sent = now - Duration::from_secs(1);
        let waiting = |floor, unconfirmed, missed_grant| Waiting {
            identity: &me,
            floor,
            returned: 0,
            unconfirmed,
            unanswered: &[],
            missed_grant,
            claim: Some("c1"),
            claim_sent: Some(sent),
            // The grants below were there when we first looked.
            first_seen: 100,
            born,
            terms: &terms,
            now,
        };
        let on = |claim_uid, token| Shape {
            claim_uid: Some(claim_uid),
            holder: mine,
            token: Some(token),
            ..Shape::default()
        };
        let granted = |token| Shape { holder: mine, token: Some(token), ..Shape::default() };
        let not_granted = |acknowledge, claim_again| Reaction::NotGranted { acknowledge, claim_again };
        // (what the Lease shows, what we know, the reaction)
        let cases: Vec<(&str, Option<Shape<'_>>, Waiting<'_>, Reaction)> = vec![
            ("the Lease is gone", None, waiting(0, None, false), Reaction::Wait),
            ("the Lease is gone after a missed grant", None, waiting(0, Some(3), true), Reaction::Wait),
            (
                "free",
                Some(Shape { token: Some(3), ..Shape::default() }),
                waiting(0, None, false),
                not_granted(None, false),
            ),
            (
                "free after a missed grant: claim again",
                Some(Shape { token: Some(3), ..Shape::default() }),
                waiting(0, Some(3), true),
                not_granted(None, true),
            ),
            (
                "someone else holds",
                Some(Shape { holder: Some("other"), token: Some(4), ..Shape::default() }),
                waiting(0, None, false),
                not_granted(None, false),
            ),
            (
                "our unconfirmed grant drained: acknowledge",
                Some(Shape { draining: Some(3), revoked: Some("Unconfirmed"), ..granted(4) }),
                waiting(0, Some(3), true),
                not_granted(Some(3), true),
            ),
            (
                "a drain of another grant of ours: nothing to acknowledge",
                Some(Shape { draining: Some(2), revoked: Some("Expired"), ..granted(4) }),
                waiting(0, Some(3), false),
                not_granted(None, false),
            ),
            (
                "a drain naming us with nothing unconfirmed: no grant",
                Some(Shape { draining: Some(3), revoked: Some("Forced"), ..granted(4) }),
                waiting(0, None, false),
                not_granted(None, false),
            ),
            (
                "a squatter's Lease naming us grants nothing",
                Some(Shape { unlabelled: true, ..granted(5) }),
                waiting(0, None, false),
                not_granted(None, false),
            ),
            ("granted: confirm", Some(granted(5)), waiting(0, None, false), Reaction::Confirm { token: 5 }),
            (
                "granted above the floor: confirm",
                Some(granted(5)),
                waiting(4, None, false),
                Reaction::Confirm { token: 5 },
            ),
            (
                "granted again after a refused confirmation: confirm",
                Some(granted(6)),
                waiting(0, Some(5), true),
                Reaction::Confirm { token: 6 },
            ),
            (
                "granted on our claim within a retry period of sending it: hold at once",
                Some(on("c1", 5)),
                waiting(0, None, false),
                Reaction::Answer { token: 5, sent },
            ),
            (
                "granted on our claim sent longer ago than a retry period: confirm",
                Some(on("c1", 5)),
                Waiting { claim_sent: Some(now - Duration::from_secs(3)), ..waiting(0, None, false) },
                Reaction::Confirm { token: 5 },
            ),
            (
                "granted on our claim, its sending unknown: confirm",
                Some(on("c1", 5)),
                Waiting { claim_sent: None, ..waiting(0, None, false) },
                Reaction::Confirm { token: 5 },
            ),
            (
                "granted on our claim at the floor (a hold we lost): give back",
                Some(on("c1", 4)),
                waiting(4, None, false),
                Reaction::GiveBack { token: 4 },
            ),
            (
                "granted on another claim in our name, past an earlier process's renew deadline: give back",
                Some(on("c0", 5)),
                waiting(0, None, false),
                Reaction::GiveBack { token: 5 },
            ),
            (
                "granted on another claim in our name that an earlier process may have answered: give back at its deadline",
                Some(Shape { renew_deadline: Some(20), ..on("c0", 5) }),
                waiting(0, None, false),
                Reaction::GiveBackAt { token: 5, at: born + Duration::from_secs(20) },
            ),
            (
                "granted on another claim in our name while we watched: confirm",
                Some(on("c0", 5)),
                Waiting { first_seen: 4, ..waiting(0, None, false) },
                Reaction::Confirm { token: 5 },
            ),
            (
                "granted on another claim in our name, the Lease first seen without a token: confirm",
                Some(on("c0", 5)),
                Waiting { first_seen: 0, ..waiting(0, None, false) },
                Reaction::Confirm { token: 5 },
            ),
            (
                "granted on a claim while ours is unknown: a leftover",
                Some(on("c1", 5)),
                Waiting { claim: None, ..waiting(0, None, false) },
                Reaction::GiveBack { token: 5 },
            ),
            (
                "a token at the floor (a hold we lost): give back",
                Some(granted(4)),
                waiting(4, None, false),
                Reaction::GiveBack { token: 4 },
            ),
            (
                "our own hold at the floor, its give-back seen landing: a view from before it",
                Some(Shape { confirmed: true, ..granted(4) }),
                Waiting { returned: 4, ..waiting(4, None, false) },
                Reaction::Wait,
            ),
            (
                "an older hold of ours, below a give-back seen landing: a view from before it",
                Some(granted(3)),
                Waiting { returned: 4, ..waiting(4, None, false) },
                Reaction::Wait,
            ),
            (
                "a hold at the floor whose give-back was never seen landing: give back",
                Some(granted(4)),
                Waiting { returned: 3, ..waiting(4, None, false) },
                Reaction::GiveBack { token: 4 },
            ),
            (
                "a fresh grant above a give-back seen landing: answered as any",
                Some(on("c1", 5)),
                Waiting { returned: 4, ..waiting(4, None, false) },
                Reaction::Answer { token: 5, sent },
            ),
            (
                "a token below the floor: give back",
                Some(Shape { confirmed: true, renew_deadline: Some(20), ..granted(3) }),
                waiting(4, None, false),
                Reaction::GiveBack { token: 3 },
            ),
            (
                "confirmed by an earlier process, past its renew deadline: give back",
                Some(Shape { confirmed: true, renew_deadline: Some(10), ..granted(5) }),
                waiting(0, None, false),
                Reaction::GiveBack { token: 5 },
            ),
            (
                "confirmed by an earlier process, past the lock's renew deadline: give back",
                Some(Shape { confirmed: true, ..granted(5) }),
                waiting(0, None, false),
                Reaction::GiveBack { token: 5 },
            ),
            (
                "confirmed by an earlier process that may still be told held: give back at its deadline",
                Some(Shape { confirmed: true, renew_deadline: Some(20), ..granted(5) }),
                waiting(0, None, false),
                Reaction::GiveBackAt { token: 5, at: born + Duration::from_secs(20) },
            ),
        ];
        for (name, shape, waiting, expected) in cases {
            let state = shape.map(lease);
            assert_eq!(next(state.as_ref(), &Ours::Waiting(waiting)), expected, "{name}");
        }
    }

    #[test]
    fn after_a_confirmation_that_got_no_answer() {
        let me = Identity::for_pod("w-0", UID);
        let mine = Some(me.id.as_str());
        let terms = terms();
        let born = Instant::now();
        let now = born + Duration::from_secs(10);
        // `Shape::confirmed` writes renewTime one second after acquireTime.
        let landed = 1_700_000_001_000_000;
        let sent_ago = |secs| now - Duration::from_secs(secs);
        let ours = |token, renew_micros, sent| Unanswered { token, renew_micros, sent };
        let granted = |token, confirmed, renew_deadline| Shape {
            holder: mine,
            token: Some(token),
            confirmed,
            renew_deadline,
            ..Shape::default()
        };
        // (what the Lease shows, our unanswered confirmations, the reaction)
        let cases: Vec<(&str, Shape<'_>, Vec<Unanswered>, Reaction)> = vec![
            (
                "it landed, sent 2 s ago under a 10 s renew deadline: the hold is ours from its send",
                granted(5, true, Some(10)),
                vec![ours(5, landed, sent_ago(2))],
                Reaction::Adopt { token: 5, sent: sent_ago(2) },
            ),
            (
                "it landed, under the lock's renew deadline when the Lease records none",
                granted(5, true, None),
                vec![ours(5, landed, sent_ago(9))],
                Reaction::Adopt { token: 5, sent: sent_ago(9) },
            ),
            (
                "it landed, past its renew deadline: give back at once",
                granted(5, true, Some(10)),
                vec![ours(5, landed, sent_ago(10))],
                Reaction::GiveBack { token: 5 },
            ),
            (
                "the second of two landed",
                granted(5, true, Some(10)),
                vec![ours(5, landed - 7, sent_ago(6)), ours(5, landed, sent_ago(1))],
                Reaction::Adopt { token: 5, sent: sent_ago(1) },
            ),
            (
                "it has not landed: confirm again",
                granted(5, false, Some(10)),
                vec![ours(5, landed, sent_ago(2))],
                Reaction::Confirm { token: 5 },
            ),
            (
                "another write confirmed the grant: a leftover, given back after its renew deadline",
                granted(5, true, Some(20)),
                vec![ours(5, landed + 1, sent_ago(2))],
                Reaction::GiveBackAt { token: 5, at: born + Duration::from_secs(20) },
            ),
            (
                "the same renewTime on another grant is not our write",
                granted(6, true, Some(20)),
                vec![ours(5, landed, sent_ago(2))],
                Reaction::GiveBackAt { token: 6, at: born + Duration::from_secs(20) },
            ),
            (
                "the grant moved on to someone else",
                Shape { holder: Some("other"), ..granted(6, true, Some(10)) },
                vec![ours(5, landed, sent_ago(2))],
                Reaction::NotGranted { acknowledge: None, claim_again: false },
            ),
        ];
        for (name, shape, unanswered, expected) in cases {
            let waiting = Waiting {
                identity: &me,
                floor: 4,
                returned: 0,
                unconfirmed: None,
                unanswered: &unanswered,
                missed_grant: false,
                claim: None,
                claim_sent: None,
                first_seen: 0,
                born,
                terms: &terms,
                now,
            };
            assert_eq!(next(Some(&lease(shape)), &Ours::Waiting(waiting)), expected, "{name}");
        }
    }

    #[test]
    fn while_holding() {
        let me = Identity::for_pod("w-0", UID);
        let mine = Some(me.id.as_str());
        let held = |token| Shape { holder: mine, token: Some(token), confirmed: true, ..Shape::default() };
        let revoked = |why: &str| Reaction::LetGo(LostReason::Revoked(why.to_owned()));
        // (what the Lease shows, the reaction of the holder of token 7)
        let cases: Vec<(&str, Option<Shape<'_>>, Reaction)> = vec![
            ("still ours: renew", Some(held(7)), Reaction::Renew),
            ("not yet renewed by us, still ours: renew", Some(Shape { confirmed: false, ..held(7) }), Reaction::Renew),
            ("the Lease is gone", None, Reaction::LetGo(LostReason::LeaseDeleted)),
            (
                "revoked and drained",
                Some(Shape { draining: Some(7), revoked: Some("Expired"), ..held(8) }),
                revoked("Expired"),
            ),
            (
                "drained even with our token",
                Some(Shape { draining: Some(6), revoked: Some("Forced"), ..held(7) }),
                revoked("Forced"),
            ),
            (
                "drain acknowledged, free",
                Some(Shape { holder: None, revoked: Some("MaxHold"), ..held(8) }),
                revoked("MaxHold"),
            ),
            ("someone else holds", Some(Shape { holder: Some("other"), ..held(8) }), revoked("now held by other")),
            ("released", Some(Shape { holder: None, ..held(7) }), revoked("released")),
            ("granted to us again, a newer hold", Some(held(8)), revoked(&format!("now held by {}", me.id))),
            ("a token below what we hold", Some(held(6)), revoked(&format!("now held by {}", me.id))),
            ("no token", Some(Shape { token: None, ..held(7) }), revoked(&format!("now held by {}", me.id))),
            (
                "a squatter's Lease naming us",
                Some(Shape { unlabelled: true, ..held(7) }),
                revoked(&format!("now held by {}", me.id)),
            ),
        ];
        for (name, shape, expected) in cases {
            let state = shape.map(lease);
            assert_eq!(next(state.as_ref(), &Ours::Holding { identity: &me, token: 7 }), expected, "{name}");
        }
    }
}
