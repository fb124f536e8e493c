//! Which holds ended between two status writes, and how. A status write that fails keeps
//! what its reconcile did pending for the next one, and meanwhile a hold may be granted
//! and end: no status ever lists it, yet its end is counted (a release, an expiration, a
//! forced release), its length observed and its holder's release announced.

use jiff::Timestamp;

use super::status::Outcome;
use crate::crd::HolderStatus;
use crate::lease::RevokeReason;

/// A hold that ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Ended {
    /// Its slot.
    pub slot: u32,
    /// Its holder.
    pub identity: String,
    /// Its token.
    pub token: i64,
    /// When it was granted.
    pub acquired: Timestamp,
    /// Why it was taken away; `None`: its holder released it.
    pub revoked: Option<RevokeReason>,
}

/// The holds that ended between a status listing `before` and one listing `after`, given
/// what the reconciles between them did (`outcome`): first those `before` lists and
/// `after` does not, then those granted since that neither lists. Each revocation ended
/// one hold of its slot, taken as the latest (a revocation ends the hold current when it
/// is made, and the order of a merged outcome's revocations against its grants is not
/// kept, so one may be matched to another hold of its slot; the counts stay exact).
pub fn ended(before: &[&HolderStatus], after: &[&HolderStatus], outcome: &Outcome) -> Vec<Ended> {
    let lists = |holders: &[&HolderStatus], identity: &str, token: i64| {
        holders.iter().any(|h| h.identity == identity && h.fencing_token == token)
    };
    let mut ended: Vec<Ended> = before
        .iter()
        .filter(|h| !lists(after, &h.identity, h.fencing_token))
        .map(|h| Ended {
            slot: u32::try_from(h.slot).unwrap_or_default(),
            identity: h.identity.clone(),
            token: h.fencing_token,
            acquired: h.acquired_at.0,
            revoked: None,
        })
        .collect();
    ended.extend(
        outcome
            .granted
            .iter()
            .filter(|g| !lists(after, &g.identity, g.token) && !lists(before, &g.identity, g.token))
            .map(|g| Ended {
                slot: g.slot,
                identity: g.identity.clone(),
                token: g.token,
                acquired: g.acquired,
                revoked: None,
            }),
    );
    let mut revocations = outcome.revoked.clone();
    for hold in ended.iter_mut().rev() {
        if let Some(at) = revocations.iter().rposition(|(slot, _)| *slot == hold.slot) {
            hold.revoked = Some(revocations.remove(at).1);
        }
    }
    ended
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::status::Granted;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("valid")
    }

    fn holder(id: &str, slot: i32, token: i64) -> HolderStatus {
        HolderStatus {
            identity: id.into(),
            slot,
            mode: None,
            pod: None,
            fencing_token: token,
            acquired_at: Time(at(token)),
            renewed_at: None,
            expires_at: None,
            waited_seconds: 0.0,
        }
    }

    fn grant(id: &str, slot: u32, token: i64) -> Granted {
        Granted { slot, identity: id.into(), token, acquired: at(token), waited_seconds: 0.0, handoff_ms: None }
    }

    fn gone(id: &str, slot: u32, token: i64, revoked: Option<RevokeReason>) -> Ended {
        Ended { slot, identity: id.into(), token, acquired: at(token), revoked }
    }

    #[test]
    fn every_hold_that_ended_is_listed_once_with_how_it_ended() {
        use RevokeReason::{Expired, Forced};
        let (a, b, c, d) = (holder("a", 0, 1), holder("b", 0, 2), holder("c", 0, 3), holder("d", 1, 4));
        let outcome = |granted: Vec<Granted>, revoked: Vec<(u32, RevokeReason)>| Outcome {
            granted,
            revoked,
            ..Outcome::default()
        };
        // (case, before, after, outcome, ended)
        type Row<'a> = (&'a str, Vec<&'a HolderStatus>, Vec<&'a HolderStatus>, Outcome, Vec<Ended>);
        let table: Vec<Row> = vec![
            ("nothing changed", vec![&a], vec![&a], Outcome::default(), vec![]),
            (
                "released, then granted on",
                vec![&a],
                vec![&b],
                outcome(vec![grant("b", 0, 2)], vec![]),
                vec![gone("a", 0, 1, None)],
            ),
            (
                "expired, then granted on",
                vec![&a],
                vec![&b],
                outcome(vec![grant("b", 0, 2)], vec![(0, Expired)]),
                vec![gone("a", 0, 1, Some(Expired))],
            ),
            (
                "granted and released between two writes",
                vec![&a],
                vec![&c],
                outcome(vec![grant("b", 0, 2), grant("c", 0, 3)], vec![]),
                vec![gone("a", 0, 1, None), gone("b", 0, 2, None)],
            ),
            (
                "the latest hold of the slot is the one revoked",
                vec![&a],
                vec![&c],
                outcome(vec![grant("b", 0, 2), grant("c", 0, 3)], vec![(0, Forced)]),
                vec![gone("a", 0, 1, None), gone("b", 0, 2, Some(Forced))],
            ),
            (
                "a revocation on another slot ends nothing here",
                vec![&a, &d],
                vec![&b, &d],
                outcome(vec![grant("b", 0, 2)], vec![(1, Expired)]),
                vec![gone("a", 0, 1, None)],
            ),
            (
                "granted and still held: not ended",
                vec![],
                vec![&a, &d],
                outcome(vec![grant("a", 0, 1), grant("d", 1, 4)], vec![]),
                vec![],
            ),
            (
                "revoked, nobody granted",
                vec![&a],
                vec![],
                outcome(vec![], vec![(0, Expired)]),
                vec![gone("a", 0, 1, Some(Expired))],
            ),
        ];
        for (case, before, after, outcome, want) in table {
            assert_eq!(ended(&before, &after, &outcome), want, "{case}");
        }
    }
}
