//! The finalizer that makes a lock's deletion safe: a DistributedLock goes only after its
//! current hold was drained (its holder can no longer believe it holds) and its lock Lease
//! deleted, so a lock re-created under the same name can never be granted while the old
//! holder may still act. The Lease keeps its controller owner reference too: if the
//! finalizer is removed by hand, garbage collection still deletes it.

use kube::ResourceExt;
use kube::api::{Api, Patch};
use serde_json::json;

use super::context::{Context, LockKey, merge_patch_params};
use super::error::Error;
use crate::crd::{DistributedLock, FINALIZER};

/// Whether the lock carries our finalizer.
pub fn present(lock: &DistributedLock) -> bool {
    lock.finalizers().iter().any(|f| f == FINALIZER)
}

/// The lock's finalizers with ours added or removed.
pub fn with(lock: &DistributedLock, ours: bool) -> Vec<String> {
    let mut finalizers: Vec<String> = lock.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    if ours {
        finalizers.push(FINALIZER.to_owned());
    }
    finalizers
}

async fn set(ctx: &Context, lock: &DistributedLock, key: &LockKey, ours: bool) -> Result<(), Error> {
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &key.namespace);
    // The finalizer list is replaced whole: only if the lock is unchanged since read.
    let patch = json!({"metadata": {"resourceVersion": lock.resource_version(), "finalizers": with(lock, ours)}});
    api.patch(&key.name, &merge_patch_params(), &Patch::Merge(patch)).await.map(|_| ()).map_err(|source| {
        Error::Finalizer {
            verb: if ours { "add" } else { "remove" },
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            source,
        }
    })
}

/// Adds our finalizer to a lock that lacks it (and is not being deleted).
pub async fn ensure(ctx: &Context, lock: &DistributedLock, key: &LockKey) -> Result<(), Error> {
    if present(lock) || lock.metadata.deletion_timestamp.is_some() { Ok(()) } else { set(ctx, lock, key, true).await }
}

/// The lock Lease is gone (or never was ours): removes our finalizer, letting the lock go.
/// The lock's claims stay: their claimants still wait for a lock of that name, and a lock
/// re-created under it serves them at once (in their order); a claim nobody refreshes is
/// dropped by its TTL once a lock of that name exists, or with its Pod.
pub async fn finish(ctx: &Context, lock: &DistributedLock, key: &LockKey) -> Result<(), Error> {
    if present(lock) {
        set(ctx, lock, key, false).await?;
    }
    tracing::info!(namespace = %key.namespace, lock = %key.name, "lock deleted: its lock Lease is gone");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::DistributedLockSpec;

    #[test]
    fn finalizers_keep_everyone_elses() {
        let mut lock = DistributedLock::new("orders", DistributedLockSpec::default());
        assert!(!present(&lock));
        assert_eq!(with(&lock, true), [FINALIZER]);
        lock.metadata.finalizers = Some(vec!["example.com/keep".into(), FINALIZER.into()]);
        assert!(present(&lock));
        assert_eq!(with(&lock, false), ["example.com/keep"]);
        assert_eq!(with(&lock, true), ["example.com/keep", FINALIZER]);
    }
}
