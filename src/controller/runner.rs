//! Runs reconciles as their locks fall due. Every event that may change a lock's decision
//! names the lock it concerns (its own, its Leases', its claims', its force-release
//! requests', a holder Pod's); [`super::dispatch`] decides which lock runs next, and a
//! lock whose event came in starts at once. A watch event is all a waiter's grant waits
//! for, so nothing between the event and its reconcile waits on a timer; only a requeue
//! does. A lock whose memory holds a write its caches do not show yet goes first.
//! Reconciles run in this task, at most `limit` at once, none before the lock cache has
//! its first list.

use std::pin::pin;
use std::sync::Arc;
use std::time::Instant;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug};

use super::context::{Context, LockKey};
use super::dispatch::{Dispatch, Recheck};
use super::reconcile::{error_policy, reconcile};
use crate::crd::DistributedLock;

/// Reconciles locks as `triggers` name them, and every cached lock on each item of
/// `regained`, until `stop`; then takes no more triggers and lets the running reconciles
/// finish.
pub async fn run(
    triggers: impl Stream<Item = LockKey>,
    regained: impl Stream<Item = ()>,
    ctx: Arc<Context>,
    limit: usize,
    stop: CancellationToken,
) {
    let locks = ctx.locks.clone();
    let mut due = Dispatch::<LockKey>::new(limit);
    let mut running = FuturesUnordered::new();
    let mut triggers = pin!(triggers.fuse());
    let mut regained = pin!(regained.fuse());
    // A reconcile judges a lock from the caches; before the first list of locks there is
    // nothing to judge from. Its triggers wait in the queue meanwhile.
    let mut cached = pin!(locks.wait_until_ready());
    let (mut ready, mut stopping) = (false, false);
    loop {
        if ready && !stopping {
            let now = Instant::now();
            while let Some(key) = due.start(now) {
                match locks.get(&ObjectRef::<DistributedLock>::new(&key.name).within(&key.namespace)) {
                    Some(lock) => running.push(reconcile_one(key, lock, ctx.clone())),
                    // An event of a lock already gone (its Leases', claims' last ones).
                    None => {
                        debug!(namespace = %key.namespace, lock = %key.name, "not cached: not reconciled");
                        due.finished(key, None, false);
                    }
                }
            }
        }
        if stopping && running.is_empty() {
            return;
        }
        let wake = due.next_due().filter(|_| ready && !stopping);
        tokio::select! {
            () = stop.cancelled(), if !stopping => stopping = true,
            // The writer is dropped only with its stream, which this loop owns.
            _ = &mut cached, if !ready => {
                debug!("lock cache listed: reconciles start");
                ready = true;
            }
            Some(key) = triggers.next(), if !stopping => {
                debug!(namespace = %key.namespace, lock = %key.name, "lock due");
                let settling = ctx.awaits_cache(&key);
                due.trigger(key, settling);
            }
            Some((key, recheck)) = running.next(), if !running.is_empty() => {
                let settling = ctx.awaits_cache(&key);
                due.finished(key, recheck.map(|after| Instant::now() + after), settling);
            }
            Some(()) = regained.next(), if !stopping => {
                debug!(locks = locks.len(), "leadership regained: every lock due");
                for lock in locks.state() {
                    due.trigger(LockKey::of(&lock), false);
                }
            }
            () = sleep_until(wake), if wake.is_some() => {}
            else => return,
        }
    }
}

/// One reconcile of `lock`, its failure passed to the error policy: when to look again.
async fn reconcile_one(key: LockKey, lock: Arc<DistributedLock>, ctx: Arc<Context>) -> (LockKey, Recheck) {
    let span = tracing::info_span!("reconcile", namespace = %key.namespace, lock = %key.name);
    let recheck = match reconcile(lock.clone(), ctx.clone()).instrument(span).await {
        Ok(recheck) => recheck,
        Err(error) => error_policy(lock, &error, ctx),
    };
    (key, recheck)
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
