//! The waiter a held mutex's Lease names as next ([`crate::lease::next`]): the one a free
//! Lease would be granted to now, recorded with a token minted for its grant, so that the
//! holder's release can hand the lock on in the same write. Only a mutex whose hold runs
//! under the lock's current terms names one; a semaphore's slots, a deleting lock, a
//! draining or free Lease name nobody, and a record that no longer matches the queue is
//! rewritten (with a new token) or removed.

use k8s_openapi::api::coordination::v1::Lease;

use super::{Plan, Waiting, permits};
use crate::controller::decide::Tokens;
use crate::controller::serve;
use crate::controller::view::{self, Claim, LeaseState};
use crate::crd::ClaimMode;
use crate::lease::next::{self, Next};
use crate::lease::{GrantedTiming, granted, token};

/// The waiter slot `slot`'s Lease, as `after` shows it once written, should name as next
/// (`None`: nobody).
pub(super) fn wanted<'w>(
    o: &super::Observation,
    slot: u32,
    after: &Lease,
    serveable: &[&'w Waiting],
) -> Option<&'w Claim> {
    let deleting = o.lock.metadata.deletion_timestamp.is_some();
    // One slot Lease alone: a semaphore shrunk to one permit still has holders on its
    // other slots until they end, and a handoff must not add one beside them.
    if slot != 0 || permits(o.lock) != 1 || o.slots.len() != 1 || deleting {
        return None;
    }
    let LeaseState::Held(hold) = view::lease_state(after) else { return None };
    // A hold runs under the terms its grant recorded, and a handoff keeps them: only a
    // hold under the lock's terms now hands on (a later edit of the lock waits for a
    // grant of the controller's own).
    let current = GrantedTiming::of_spec(&o.lock.spec);
    if hold.token.is_none() || !granted::recorded(after) || granted::of_lease(after, &current) != current {
        return None;
    }
    let candidates: Vec<&Waiting> = serveable
        .iter()
        .copied()
        .filter(|w| hold.claim_uid.as_deref() != Some(w.claim.uid.as_str()) && w.claim.identity != hold.identity)
        .collect();
    let modes: Vec<serve::Mode> = candidates.iter().map(|w| super::slots::mode(w.claim.mode)).collect();
    let served = serve::serve(&[serve::Slot::Free], 1, o.lock.spec.fairness, &modes);
    served.first().map(|s| &candidates[s.waiter].claim)
}

/// The mode annotation a grant to `claim` records.
fn mode_annotation(claim: &Claim) -> Option<String> {
    (claim.mode == ClaimMode::Write).then(|| ClaimMode::Write.as_str().to_owned())
}

/// Whether `have` (as the Lease records it) already names `want` with a usable token.
fn names(have: &Next, want: &Claim, current_token: i64) -> bool {
    have.claim_uid == want.uid
        && have.claim == want.name
        && have.holder == want.identity.id
        && have.mode == mode_annotation(want)
        && have.token > current_token
}

/// Slot `slot`'s write (`written`, or none over `lease`) with the next waiter recorded as
/// [`wanted`] says: unchanged when the Lease already says so, else rewritten with a token
/// for the next grant reserved one above `running` (and in `plan`). One above, not the
/// wall clock: nobody holds it yet, so it stays out of `status.fencingToken` (which fenced
/// writes are judged against), and status covers it within the margin it may trail by.
pub(super) fn record(
    o: &super::Observation,
    slot: u32,
    lease: &Lease,
    written: Option<Box<Lease>>,
    serveable: &[&Waiting],
    running: &mut Tokens,
    plan: &mut Plan,
) -> Option<Box<Lease>> {
    let after = written.as_deref().unwrap_or(lease);
    let want = wanted(o, slot, after, serveable);
    let current_token = token::of_lease(after).unwrap_or(0);
    let settled = match (want, next::of_lease(after)) {
        (None, _) => !next::any_recorded(after),
        (Some(want), Some(have)) => names(&have, want, current_token),
        (Some(_), None) => false,
    };
    if settled {
        return written;
    }
    let next = match want {
        None => None,
        Some(claim) => {
            let Tokens::Known(previous) = *running else { return written };
            let Some(minted) = previous.checked_add(1) else { return written };
            *running = Tokens::Known(minted);
            plan.reserved.push((slot, minted));
            Some(Next {
                holder: claim.identity.id.clone(),
                claim: claim.name.clone(),
                claim_uid: claim.uid.clone(),
                token: minted,
                mode: mode_annotation(claim),
            })
        }
    };
    let mut lease = after.clone();
    next::record(&mut lease, next.as_ref());
    Some(Box::new(lease))
}
