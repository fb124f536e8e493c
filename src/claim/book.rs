//! Which acquisition owns a claimant's claim on each lock, and which claim object it is.
//!
//! A claim's name depends only on the claimant and the lock, so successive acquisitions of
//! one lock reuse it — and an earlier acquisition sometimes withdraws late: an abandoned
//! one from a spawned task, a lost hold when its owner lets go. Were that late delete to
//! land after the next acquisition claimed, the newer claim would vanish and its owner
//! would wait for a grant that cannot come until its next refresh (seen under apiserver
//! restarts as waiters silent for ten seconds). So every acquisition takes a ticket, claim
//! writes for one lock are serialized, and a withdrawal deletes only while its ticket is
//! still the newest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::OwnedMutexGuard;

/// One acquisition's right to the claim on a lock; newer tickets supersede older ones.
pub(crate) type Ticket = u64;

#[derive(Default)]
struct Entry {
    newest: Ticket,
    gate: Arc<tokio::sync::Mutex<()>>,
    /// UID of the claim we last created or refreshed: a withdrawal deletes only that one.
    uid: Option<String>,
    /// When the create of that claim was sent, when we made it: a grant on it comes later.
    sent: Option<Instant>,
}

/// Tickets and write gates, per lock.
#[derive(Clone, Default)]
pub(crate) struct ClaimBook {
    entries: Arc<Mutex<HashMap<String, Entry>>>,
}

impl ClaimBook {
    fn with<T>(&self, lock: &str, f: impl FnOnce(&mut Entry) -> T) -> T {
        let mut entries = self.entries.lock().expect("claim book is never poisoned");
        f(entries.entry(lock.to_owned()).or_default())
    }

    /// A new acquisition of `lock` starts: every earlier ticket is superseded at once.
    pub(crate) fn ticket(&self, lock: &str) -> Ticket {
        self.with(lock, |e| {
            e.newest += 1;
            e.newest
        })
    }

    /// Waits for the right to write `lock`'s claim.
    pub(crate) async fn write(&self, lock: &str) -> OwnedMutexGuard<()> {
        self.with(lock, |e| e.gate.clone()).lock_owned().await
    }

    /// Records the UID of our claim on `lock` (call while holding [`ClaimBook::write`]).
    pub(crate) fn set_uid(&self, lock: &str, uid: Option<String>) {
        self.with(lock, |e| {
            if e.uid != uid {
                e.sent = None;
            }
            e.uid = uid;
        });
    }

    /// Records the claim on `lock` we just created, and when its create was sent (call
    /// while holding [`ClaimBook::write`]).
    pub(crate) fn created(&self, lock: &str, uid: Option<String>, sent: Instant) {
        self.with(lock, |e| {
            e.sent = uid.is_some().then_some(sent);
            e.uid = uid;
        });
    }

    /// Our claim on `lock` and when its create was sent, if we made it and know both.
    pub(crate) fn claim(&self, lock: &str) -> Option<(String, Instant)> {
        self.with(lock, |e| Some((e.uid.clone()?, e.sent?)))
    }

    /// The UID of our claim on `lock`, if known.
    pub(crate) fn uid(&self, lock: &str) -> Option<String> {
        self.with(lock, |e| e.uid.clone())
    }

    /// The right to withdraw `lock`'s claim for `ticket`; `None` once a newer acquisition
    /// owns the claim.
    pub(crate) async fn withdrawal(&self, lock: &str, ticket: Ticket) -> Option<OwnedMutexGuard<()>> {
        let guard = self.write(lock).await;
        (self.with(lock, |e| e.newest) == ticket).then_some(guard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_superseded_ticket_cannot_withdraw() {
        let book = ClaimBook::default();
        let first = book.ticket("orders");
        let second = book.ticket("orders");
        assert!(book.withdrawal("orders", first).await.is_none(), "the older acquisition's withdrawal is refused");
        assert!(book.withdrawal("orders", second).await.is_some(), "the newest acquisition may withdraw");
        let other = book.ticket("billing");
        assert!(book.withdrawal("billing", other).await.is_some(), "tickets are per lock");
    }

    #[tokio::test]
    async fn writes_to_one_lock_wait_for_each_other() {
        let book = ClaimBook::default();
        let held = book.write("orders").await;
        let ticket = book.ticket("orders");
        let waiting = tokio::spawn({
            let book = book.clone();
            async move { book.withdrawal("orders", ticket).await.is_some() }
        });
        // Let it run until it blocks (the test runtime is single-threaded: deterministic).
        tokio::task::yield_now().await;
        // Another lock is not held up by it.
        drop(book.write("billing").await);
        assert!(!waiting.is_finished(), "a withdrawal waits while a claim write is under way");
        drop(held);
        assert!(waiting.await.expect("task"), "and proceeds once it is done");
    }
}
