//! Ages judged on the controller's own monotonic clock, from its memory of what it saw:
//! never from another machine's wall clock, and never longer than the truth — a fresh
//! leadership term (or a restart) starts every clock at its first sighting.

use std::time::{Duration, Instant};

use super::context::SlotMemory;
use super::view::{LeaseDrain, LeaseHold};
use crate::lease::clock::Sighting;

/// How long the granted hold `hold` has gone without a renewal we saw, and how old it is.
pub fn of_hold(memory: &mut SlotMemory, hold: &LeaseHold, now: Instant) -> (Duration, Duration) {
    let renewal = (hold.identity.id.clone(), hold.token, hold.renew_time.clone());
    let unchanged = now - Sighting::observe(&mut memory.holder, renewal, now);
    let age = now - Sighting::observe(&mut memory.hold, (hold.identity.id.clone(), hold.token), now);
    (unchanged, age)
}

/// How long since the last renewal seen before the revocation that `drain` drains.
pub fn of_drain(memory: &mut SlotMemory, drain: &LeaseDrain, now: Instant) -> Duration {
    now - Sighting::observe(&mut memory.drain, drain.revoked, now)
}

/// Records, before the revocation is written, that the drain of `revoked` counts from the
/// last renewal seen, `last_renewal` (renewals after the revocation do not count: a
/// revocation that raced one fails its compare-and-swap and is decided again).
pub fn drain_started(memory: &mut SlotMemory, revoked: Option<i64>, last_renewal: Instant) {
    memory.drain = Some(Sighting { key: revoked, since: last_renewal });
}

/// Records a grant we made, once its write returned: the hold's age counts from then.
pub fn granted(memory: &mut SlotMemory, holder: &str, token: i64, written_at: Instant) {
    memory.hold = Some(Sighting { key: (holder.to_owned(), Some(token)), since: written_at });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Identity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    const S: Duration = Duration::from_secs(1);

    fn hold(token: i64, renewed_s: i64) -> LeaseHold {
        LeaseHold {
            mode: crate::crd::ClaimMode::Read,
            identity: Identity::parse("w"),
            token: Some(token),
            acquire_time: None,
            renew_time: Some(MicroTime(jiff::Timestamp::from_second(renewed_s).expect("valid"))),
            confirmed: true,
            claim: None,
            claim_uid: None,
        }
    }

    #[test]
    fn a_hold_ages_from_our_grant_and_renewals_restart_only_the_renewal_clock() {
        let t0 = Instant::now();
        let mut m = SlotMemory::default();
        granted(&mut m, "w", 7, t0);
        assert_eq!(of_hold(&mut m, &hold(7, 1), t0 + 2 * S), (Duration::ZERO, 2 * S));
        assert_eq!(of_hold(&mut m, &hold(7, 1), t0 + 5 * S), (3 * S, 5 * S));
        assert_eq!(of_hold(&mut m, &hold(7, 2), t0 + 6 * S), (Duration::ZERO, 6 * S), "a renewal");
        // Another hold (a new token) is a new hold.
        assert_eq!(of_hold(&mut m, &hold(8, 2), t0 + 7 * S), (Duration::ZERO, Duration::ZERO));
    }

    #[test]
    fn a_fresh_term_starts_every_clock_at_first_sighting() {
        let t0 = Instant::now();
        let mut m = SlotMemory::default();
        assert_eq!(of_hold(&mut m, &hold(7, 1), t0), (Duration::ZERO, Duration::ZERO));
        let drain = LeaseDrain {
            holder: Some(Identity::parse("w")),
            revoked: Some(7),
            reason: None,
            mode: crate::crd::ClaimMode::Read,
        };
        assert_eq!(of_drain(&mut m, &drain, t0 + S), Duration::ZERO);
        assert_eq!(of_drain(&mut m, &drain, t0 + 4 * S), 3 * S);
    }

    #[test]
    fn a_drain_counts_from_the_last_renewal_seen_before_the_revocation() {
        let t0 = Instant::now();
        let mut m = SlotMemory::default();
        // The last renewal was seen at t0; revoked 4 s later.
        let (unchanged, _) = of_hold(&mut m, &hold(7, 1), t0 + 4 * S);
        assert_eq!(unchanged, Duration::ZERO, "first sighting");
        drain_started(&mut m, Some(7), t0);
        let drain = LeaseDrain {
            holder: Some(Identity::parse("w")),
            revoked: Some(7),
            reason: None,
            mode: crate::crd::ClaimMode::Read,
        };
        assert_eq!(of_drain(&mut m, &drain, t0 + 10 * S), 10 * S);
        // A drain of another token is another drain.
        let other = LeaseDrain { revoked: Some(9), ..drain };
        assert_eq!(of_drain(&mut m, &other, t0 + 11 * S), Duration::ZERO);
    }
}
