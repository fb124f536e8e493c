//! What one reconcile reads, each thing once: the claims on the lock with their ages on
//! our clock, the hold's clocks and whether its Pod is gone, which waiters may be served,
//! the force-release requests, and the highest token known. Ages are judged here, on the
//! controller's monotonic clock, and kept in its memory; nothing is decided.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use super::context::{Context, LockKey};
use super::decide::Tokens;
use super::error::Error;
use super::plan::{HoldClock, Observation, Waiting};
use super::view::{self, LeaseState};
use super::{claims, clocks, force_requests, pods};
use crate::crd::{DistributedLock, ForceReleaseRequest};
use crate::lease::clock::Sighting;
use crate::lease::{GrantedTiming, token};

/// How many waiters one reconcile may grant: the lock's permits.
const PERMITS: usize = 1;

/// The highest token recorded in status or in our memory.
pub fn known_token(ctx: &Context, key: &LockKey, lock: &DistributedLock) -> i64 {
    lock.status.as_ref().and_then(|s| s.fencing_token).unwrap_or(0).max(ctx.issued(key))
}

/// The tokens known, from every source we trust: status, our memory, and the Lease's
/// annotation unless it is above what a controller could have minted.
fn tokens(known: i64, lease: &Lease, wall_ms: i64) -> Tokens {
    match token::of_lease(lease) {
        Some(found) if found > token::ceiling(known, wall_ms) => {
            Tokens::Tampered { found, ceiling: token::ceiling(known, wall_ms) }
        }
        found => Tokens::Known(known.max(found.unwrap_or(0))),
    }
}

/// The lock's ForceReleaseRequests from the cache, oldest first.
fn requests(ctx: &Context, key: &LockKey) -> Vec<Arc<ForceReleaseRequest>> {
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
    mine
}

/// Observes lock `key` whose Lease (ours) is `lease`, at `now`.
pub async fn observe<'a>(
    ctx: &Context,
    lock: &'a DistributedLock,
    key: &LockKey,
    lease: &'a Lease,
    now: Instant,
) -> Result<Observation<'a>, Error> {
    let uid = lock.uid().unwrap_or_default();
    let deleting = lock.metadata.deletion_timestamp.is_some();
    let wall = Timestamp::now();
    let spec_terms = GrantedTiming::of_spec(&lock.spec);
    let state = view::lease_state(lease);
    let found = claims::of_lock(ctx, key, &spec_terms.timing);

    // Ages on our clock: of every claim's refresh, of the hold's renewal and of the hold,
    // or of a drain. The claim a hold was granted on is remembered as served.
    let (ages, clock, drain_since_renewal, spent) = ctx.with_memory(key, &uid, |m| {
        m.seen = Some(lease.clone());
        m.claims.retain(|uid, _| found.iter().any(|c| &c.uid == uid));
        let ages: Vec<Duration> = found
            .iter()
            .map(|c| now - Sighting::observe_in(&mut m.claims, &c.uid, c.renew_time.clone(), now))
            .collect();
        let (clock, drain) = match &state {
            LeaseState::Held(h) => {
                if let Some(claim) =
                    found.iter().find(|c| Some(&c.name) == h.claim.as_ref() && c.identity == h.identity)
                {
                    m.served = Some(claim.uid.clone());
                }
                (Some(clocks::of_hold(m, h, now)), None)
            }
            LeaseState::Draining(d) => (None, Some(clocks::of_drain(m, d, now))),
            LeaseState::Free => (None, None),
        };
        (ages, clock, drain, m.served.clone())
    });
    let hold = match (&state, clock) {
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

    // Whether the waiters at the head may be served: their Pods exist, they are among the
    // lock's clients. Looked at in order until as many as could be granted are found.
    let holder = match &state {
        LeaseState::Held(h) => Some(&h.identity),
        _ => None,
    };
    let mut claims = Vec::with_capacity(found.len());
    let mut serveable = 0;
    for (claim, unchanged_for) in found.into_iter().zip(ages) {
        let candidate = !deleting
            && serveable < PERMITS
            && Some(&claim.identity) != holder
            && unchanged_for < claim.ttl
            && spent.as_deref() != Some(claim.uid.as_str());
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
        claims.push(Waiting { claim, unchanged_for, serveable: verdict });
    }

    let known = known_token(ctx, key, lock);
    Ok(Observation {
        lock,
        lease,
        claims,
        spent,
        hold,
        drain_since_renewal,
        requests: if deleting { Vec::new() } else { requests(ctx, key) },
        executed: force_requests::executed(ctx, key, lock),
        required: force_requests::required(ctx, lock),
        known,
        tokens: tokens(known, lease, wall.as_millisecond()),
        confirm_timeout: ctx.settings.confirm_timeout,
        wall,
    })
}
