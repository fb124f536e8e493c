//! Reading and writing a lock's Lease: the cache, our own last write while the cache lags
//! behind it, or the apiserver — and every write a compare-and-swap remembered.

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::context::{Context, LockKey};
use super::error::Error;
use crate::lease::LeaseStore;

/// Which Lease to decide from, given the cached one and our remembered last write
/// (with the resourceVersion it replaced): our write while the cache still shows exactly
/// the version it replaced; else the cache. `None`: read the apiserver — the cache has
/// none, and an empty cache is never answered from memory (the Lease may have been deleted
/// since our write, and must then be re-created).
pub fn choose(cached: Option<Lease>, written: Option<(Option<String>, Lease)>) -> Option<Lease> {
    let cached = cached?;
    match written {
        Some((replaced, ours)) if replaced.is_some() && cached.resource_version() == replaced => Some(ours),
        _ => Some(cached),
    }
}

/// Whether our remembered write can be forgotten: the cache shows it (its very
/// resourceVersion). From then on [`choose`] would never pick it — the cache never goes
/// back to the version our write replaced (watch events arrive in order, and a re-list
/// reads the latest) — so keeping it would only keep a second copy of the cached Lease.
pub fn caught_up(cached: Option<&Lease>, written: &(Option<String>, Lease)) -> bool {
    let ours = written.1.resource_version();
    ours.is_some() && cached.is_some_and(|c| c.resource_version() == ours)
}

/// Slot `slot`'s Lease as best known (see [`choose`]); a direct read when `fresh` is
/// asked.
pub async fn current(
    ctx: &Context,
    uid: &str,
    key: &LockKey,
    slot: u32,
    store: &LeaseStore,
    fresh: bool,
) -> Result<Option<Lease>, Error> {
    let name = crate::lease::slot::lease_name(&key.name, slot);
    if fresh {
        return Ok(store.get(&name).await?);
    }
    match cached(ctx, uid, key, slot) {
        Some(lease) => Ok(Some(lease)),
        None => Ok(store.get(&name).await?),
    }
}

/// Slot `slot`'s Lease as the cache (or our write it has not caught up with) shows it,
/// without asking the apiserver.
pub fn cached(ctx: &Context, uid: &str, key: &LockKey, slot: u32) -> Option<Lease> {
    let name = crate::lease::slot::lease_name(&key.name, slot);
    let cached = ctx.leases.get(&ObjectRef::new(&name).within(&key.namespace)).map(|l| (*l).clone());
    let written = ctx.with_memory(key, uid, |m| {
        let s = m.slots.get_mut(&slot)?;
        if s.written.as_deref().is_some_and(|w| caught_up(cached.as_ref(), w)) {
            s.written = None;
        }
        s.written.as_deref().cloned()
    });
    choose(cached, written)
}

/// Writes `desired` over `current` (slot `slot`'s Lease) by CAS (or creates it) and
/// remembers the result.
pub async fn write(
    ctx: &Context,
    key: &LockKey,
    uid: &str,
    slot: u32,
    store: &LeaseStore,
    current: Option<&Lease>,
    desired: &Lease,
) -> Result<Lease, Error> {
    let mut written = match current {
        None => store.create(desired).await?,
        Some(_) => store.replace(desired).await?,
    };
    // Remembered (twice) until the next write: without the field managers the answer
    // carries, as the cache keeps it.
    super::trim::forget_field_managers(&mut written);
    let replaced = current.and_then(|c| c.resource_version());
    ctx.with_memory(key, uid, |m| {
        let s = m.slot(slot);
        s.seen = Some(super::recreate::seen(&written));
        s.transitions = written.spec.as_ref().and_then(|spec| spec.lease_transitions);
        s.written = Some(Box::new((replaced, written.clone())));
    });
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn at(rv: &str, holder: &str) -> Lease {
        Lease {
            metadata: ObjectMeta { resource_version: Some(rv.into()), ..ObjectMeta::default() },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: Some(holder.into()),
                ..Default::default()
            }),
        }
    }

    fn holder(lease: Option<Lease>) -> Option<String> {
        lease.and_then(|l| l.spec).and_then(|s| s.holder_identity)
    }

    #[test]
    fn choose_table() {
        let ours = |replaced: Option<&str>| Some((replaced.map(str::to_owned), at("6", "ours")));
        // The cache still shows what our write replaced: our write.
        assert_eq!(holder(choose(Some(at("5", "cache")), ours(Some("5")))), Some("ours".into()));
        // The cache moved on (our write, or a later one): the cache.
        assert_eq!(holder(choose(Some(at("7", "cache")), ours(Some("5")))), Some("cache".into()));
        assert_eq!(holder(choose(Some(at("5", "cache")), None)), Some("cache".into()));
        // We created it and the cache shows another: the cache.
        assert_eq!(holder(choose(Some(at("9", "cache")), ours(None))), Some("cache".into()));
        // An empty cache is never answered from memory, whatever we wrote last: deleted
        // twice with no write of ours in between, the Lease must still be re-created.
        assert_eq!(holder(choose(None, ours(None))), None);
        assert_eq!(holder(choose(None, ours(Some("5")))), None);
        assert_eq!(holder(choose(None, None)), None);
    }

    #[test]
    fn caught_up_table() {
        let ours = (Some("5".to_owned()), at("6", "ours"));
        // The cache shows our write: forgotten.
        assert!(caught_up(Some(&at("6", "ours")), &ours));
        // The cache still shows what our write replaced, or another version: kept.
        assert!(!caught_up(Some(&at("5", "cache")), &ours));
        assert!(!caught_up(Some(&at("7", "cache")), &ours));
        // No cached Lease: kept (whatever the memory says, the apiserver is read).
        assert!(!caught_up(None, &ours));
        // A write whose answer carried no resourceVersion matches nothing: kept.
        let unversioned = (Some("5".to_owned()), Lease::default());
        assert!(!caught_up(Some(&Lease::default()), &unversioned));
        // Whenever it is forgotten, the cache is what would have been chosen anyway.
        let cached = at("6", "cache");
        assert!(caught_up(Some(&cached), &ours));
        assert_eq!(holder(choose(Some(cached), Some(ours))), Some("cache".into()));
    }
}
