//! What one reconcile reads, each thing once: the claims on the lock with their ages on
//! our clock, each slot's hold clocks and whether its Pod is gone, which waiters may be served,
//! the force-release requests, and the highest token known. Ages are judged here, on the
//! controller's monotonic clock, and kept in its memory; nothing is decided.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use super::context::{ClaimSeen, Context, LockKey, SlotMemory};
use super::decide::Tokens;
use super::error::Error;
use super::plan::{self, HoldClock, Observation, SlotView, Waiting};
use super::status::{Granted, Outcome};
use super::view::Claim;
use super::view::{self, LeaseState};
use super::{claims, clocks, coalesce, confirm, force_requests, pods, recreate};
use crate::crd::DistributedLock;
use crate::lease::clock::Sighting;
use crate::lease::{GrantedTiming, Identity, token};

/// The highest token recorded in status or in our memory.
pub fn known_token(ctx: &Context, key: &LockKey, lock: &DistributedLock) -> i64 {
    lock.status.as_ref().and_then(|s| s.fencing_token).unwrap_or(0).max(ctx.issued(key))
}

/// The tokens known, from every source we trust: status, our memory, and every slot
/// Lease's annotation unless one is above what a controller could have minted. A slot
/// Lease without a readable token may have lost one above status's: it counts as carrying
/// `untokened`, the highest status lets us assume issued. (A token reserved for a next
/// waiter is not issued until a release hands the lock on with it: minting counts it, in
/// the plan, and status does not.)
fn tokens<'a>(known: i64, untokened: i64, leases: impl Iterator<Item = &'a Lease>, wall_ms: i64) -> Tokens {
    let ceiling = token::ceiling(known, wall_ms);
    let mut highest = known;
    for lease in leases {
        match token::of_lease(lease) {
            Some(found) if found > ceiling => return Tokens::Tampered { found, ceiling },
            found => highest = highest.max(found.unwrap_or(untokened)),
        }
    }
    Tokens::Known(highest)
}

/// How many grants holders wrote on `lease` since `memory` last saw or wrote it: the rise
/// of its `leaseTransitions`, which every grant raises by one (the guard holds a handoff
/// to that). Nothing on a first look, or on a Lease re-created since.
fn handoffs_since(memory: &mut SlotMemory, lease: &Lease) -> u32 {
    let now = lease.spec.as_ref().and_then(|s| s.lease_transitions);
    let rise = match (memory.transitions, now) {
        (Some(before), Some(now)) if now > before => u32::try_from(now - before).unwrap_or(0),
        _ => 0,
    };
    memory.transitions = now;
    rise
}

/// The grants releasing holders wrote (handoffs), counted from each slot's rise in
/// transitions (`handed_on`): the current hold of a slot they left held, granted when its
/// `acquireTime` says with no time between the release and the grant (one write), having
/// waited since its claim's request; and how many ended before we looked.
fn handoffs<'a>(
    slots: impl Iterator<Item = (((u32, &'a Lease), &'a LeaseState), &'a u32)>,
    claims: &[Claim],
    wall: Timestamp,
) -> Outcome {
    let mut outcome = Outcome::default();
    for (((slot, _), state), &rise) in slots.filter(|(_, rise)| **rise > 0) {
        let LeaseState::Held(hold) = state else {
            outcome.unseen += rise;
            continue;
        };
        outcome.unseen += rise - 1;
        let acquired = hold.acquire_time.unwrap_or(wall);
        let claim = claims.iter().find(|c| hold.granted_on(c));
        let waited = claim.map_or(0.0, |c| acquired.duration_since(c.requested).as_secs_f64().max(0.0));
        outcome.granted.push(Granted {
            slot,
            identity: hold.identity.id.clone(),
            token: hold.token.unwrap_or_default(),
            acquired,
            waited_seconds: waited,
            handoff_ms: Some(0),
        });
    }
    outcome
}

/// One slot's clocks, judged on our clock and kept in memory: of the hold's renewal and
/// of the hold, or of a drain. The claim its hold was granted on is remembered as served.
struct SlotClocks {
    hold: Option<(Duration, Duration)>,
    drain: Option<Duration>,
}

/// Observes lock `key` whose slot Leases (ours) are `leases`, at `now`.
pub async fn observe<'a>(
    ctx: &Context,
    lock: &'a DistributedLock,
    key: &LockKey,
    leases: &'a [(u32, Lease)],
    now: Instant,
) -> Result<Observation<'a>, Error> {
    let uid = lock.uid().unwrap_or_default();
    let deleting = lock.metadata.deletion_timestamp.is_some();
    let wall = Timestamp::now();
    let spec_terms = GrantedTiming::of_spec(&lock.spec);
    let states: Vec<LeaseState> = leases.iter().map(|(_, l)| view::lease_state(l)).collect();
    let found = claims::of_lock(ctx, key, &spec_terms.timing);

    let (ages, clocks, spent, given_back, refused, misses, confirmed, handed_on) = ctx.with_memory(key, &uid, |m| {
        m.claims.retain(|uid, _| found.iter().any(|c| &c.uid == uid));
        let ages: Vec<(Duration, Duration)> = found
            .iter()
            .map(|c| {
                let seen = m.claims.entry(c.uid.clone()).or_insert_with(|| ClaimSeen {
                    first: now,
                    refresh: None,
                    served: false,
                    given_back: None,
                    refused_at: None,
                });
                (now - Sighting::observe(&mut seen.refresh, c.renew_time.clone(), now), now - seen.first)
            })
            .collect();
        // Memory of slots that are gone goes with them.
        m.slots.retain(|slot, _| leases.iter().any(|(s, _)| s == slot));
        let mut clocks = Vec::with_capacity(leases.len());
        // When our grants seen confirmed for the first time were written.
        let mut confirmed = Vec::new();
        let mut handed_on = Vec::with_capacity(leases.len());
        for ((slot, lease), state) in leases.iter().zip(&states) {
            let memory = m.slot(*slot);
            handed_on.push(handoffs_since(memory, lease));
            if let (LeaseState::Held(h), Some((token, written))) = (state, memory.awaiting)
                && h.confirmed
                && h.token == Some(token)
            {
                confirmed.push(written);
                memory.awaiting = None;
            }
            memory.seen = Some(recreate::seen(lease));
            // A Lease given back still names its claim, which its claimant deletes
            // alongside: a controller that never saw the hold learns it was served here.
            let served = view::served_on(lease, state, &found);
            if let (LeaseState::Held(_), Some(claim)) = (state, served) {
                memory.served = Some(claim.uid.clone());
            }
            clocks.push(match state {
                LeaseState::Held(h) => SlotClocks { hold: Some(clocks::of_hold(memory, h, now)), drain: None },
                LeaseState::Draining(d) => SlotClocks { hold: None, drain: Some(clocks::of_drain(memory, d, now)) },
                LeaseState::Free => SlotClocks { hold: None, drain: None },
            });
            if let Some(seen) = served.and_then(|claim| m.claims.get_mut(&claim.uid)) {
                seen.served = true;
                if matches!(state, LeaseState::Free) {
                    seen.given_back.get_or_insert(now);
                }
            }
        }
        // Every claim a hold was granted on, for as long as it stands: the claimant's
        // delete of it may land after the next grant (a release sends both writes at
        // once; our cache of claims can lag behind our cache of Leases).
        let spent: Vec<String> = m
            .slots
            .values()
            .filter_map(|s| s.served.clone())
            .chain(m.claims.iter().filter(|(_, seen)| seen.served).map(|(uid, _)| uid.clone()))
            .collect();
        // Grants answered: a hold confirmed, or one its claimant released or gave back (a
        // free Lease that still names the claim it was granted on: one the controller
        // revoked or freed names none).
        let answered = leases.iter().zip(&states).filter_map(|((_, lease), state)| match state {
            LeaseState::Held(h) if h.confirmed => h.token,
            LeaseState::Free if crate::claim::edit::claim_uid(lease).is_some() => token::of_lease(lease),
            _ => None,
        });
        if let Some(token) = answered.max() {
            m.misses.answered(token);
        }
        // A hold handed on was released by its holder: the grant before it was answered.
        let after_handoff = states.iter().zip(&handed_on).filter_map(|(state, n)| match state {
            LeaseState::Held(h) if *n > 0 => h.token,
            _ => None,
        });
        if let Some(token) = after_handoff.max() {
            m.misses.answered(token);
        }
        // Counted now, kept until a status write lands (as what a reconcile did is): this
        // reconcile may end before its own writes, and the rise is not seen again.
        let seen =
            handoffs(leases.iter().map(|(slot, lease)| (*slot, lease)).zip(&states).zip(&handed_on), &found, wall);
        if seen != Outcome::default() {
            m.pending = Some(super::status::merge(m.pending.take(), seen));
        }
        let given_back: Vec<(String, Duration)> =
            m.claims.iter().filter_map(|(uid, seen)| Some((uid.clone(), now - seen.given_back?))).collect();
        let refused: Vec<String> = found
            .iter()
            .filter(|c| m.claims.get(&c.uid).and_then(|seen| seen.refused_at.as_ref()) == Some(&c.resource_version))
            .map(|c| c.uid.clone())
            .collect();
        (ages, clocks, spent, given_back, refused, m.misses, confirmed, handed_on)
    });
    let handoffs: u32 = handed_on.iter().sum();
    if handoffs > 0 {
        ctx.metrics.grants.inc_by(u64::from(handoffs));
        ctx.metrics.handoffs.inc_by(u64::from(handoffs));
    }
    let floor = {
        let mut latencies = ctx.confirmations.lock().expect("confirmation times are never poisoned");
        for written in confirmed {
            latencies.record(written, now);
        }
        latencies.floor(now)
    };
    let mut slots = Vec::with_capacity(leases.len());
    for (((slot, lease), state), clock) in leases.iter().zip(&states).zip(clocks) {
        let hold = match (state, clock.hold) {
            (LeaseState::Held(h), Some((unchanged_for, held_for))) => Some(HoldClock {
                unchanged_for,
                held_for,
                pod_gone: match &h.identity.pod {
                    Some(pod) => pods::pod_gone(ctx, &key.namespace, pod).await?,
                    None => false,
                },
            }),
            _ => None,
        };
        slots.push(SlotView { slot: *slot, lease, hold, drain_since_renewal: clock.drain });
    }

    // Whether the waiters at the head may be served: their Pods exist, they are among the
    // lock's clients. Looked at in order until as many as could be granted are found, and
    // for a mutex one more: the waiter its Lease names as next once the head is granted.
    let holders: Vec<&Identity> = states
        .iter()
        .filter_map(|s| match s {
            LeaseState::Held(h) => Some(&h.identity),
            _ => None,
        })
        .collect();
    let permits = plan::permits(lock) as usize;
    let looked_for = permits + usize::from(permits == 1);
    let mut claims = Vec::with_capacity(found.len());
    let mut serveable = 0;
    for (claim, (unchanged_for, seen_for)) in found.into_iter().zip(ages) {
        let candidate = !deleting
            && serveable < looked_for
            && !holders.contains(&&claim.identity)
            && unchanged_for < claim.ttl
            && !spent.contains(&claim.uid);
        let verdict = if candidate {
            let gone = match &claim.identity.pod {
                Some(pod) => pods::pod_gone(ctx, &key.namespace, pod).await?,
                None => false,
            };
            let ok = !gone && pods::client_allowed(ctx, &key.namespace, &lock.spec.clients, &claim).await;
            serveable += usize::from(ok);
            Some(ok)
        } else {
            None
        };
        claims.push(Waiting { claim, unchanged_for, seen_for, serveable: verdict });
    }

    let known = known_token(ctx, key, lock);
    Ok(Observation {
        lock,
        slots,
        claims,
        spent,
        given_back,
        refused,
        requests: if deleting { Vec::new() } else { force_requests::current(ctx, key, &uid) },
        executed: force_requests::executed(ctx, key, lock),
        required: force_requests::required(ctx, lock),
        known,
        tokens: tokens(
            known,
            coalesce::recovery_floor(lock.status.as_ref()),
            leases.iter().map(|(_, l)| l),
            wall.as_millisecond(),
        ),
        confirm_timeout: confirm::window(
            &misses,
            floor,
            ctx.settings.confirm_timeout,
            spec_terms.timing.lease_duration,
        ),
        wall,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::build;
    use crate::crd::{ANNOTATION_TOKEN, DistributedLockSpec};

    #[test]
    fn a_slot_lease_without_a_token_counts_as_carrying_what_status_may_trail() {
        let lock = DistributedLock::new("db", DistributedLockSpec::default());
        let with = |token: i64| build::new_lock_lease(&lock, 0, token);
        let mut stripped = with(900);
        stripped.annotations_mut().remove(ANNOTATION_TOKEN);
        let wall = 1_000_000;
        let ceiling = token::ceiling(500, wall);
        type Row = (&'static str, Vec<Lease>, Tokens);
        let table: Vec<Row> = vec![
            ("no Lease: what we know", vec![], Tokens::Known(500)),
            ("a Lease above what we know", vec![with(900)], Tokens::Known(900)),
            ("a Lease without a token: the floor status allows", vec![stripped.clone()], Tokens::Known(10_500)),
            ("a stripped Lease beside a tokened one", vec![with(20_000), stripped], Tokens::Known(20_000)),
            (
                "a token no controller could have minted",
                vec![with(ceiling + 1)],
                Tokens::Tampered { found: ceiling + 1, ceiling },
            ),
        ];
        for (name, leases, want) in table {
            assert_eq!(tokens(500, 10_500, leases.iter(), wall), want, "{name}");
        }
    }
}
