//! Lease primitives shared by the controller, the sidecar and `leasehold run`: claimant
//! identities, fencing-token minting, timing, compare-and-swap writes, and the controller's
//! own leader election. Decisions are pure functions; the I/O is a thin layer around them.

pub mod cas;
pub mod clock;
pub mod election;
pub mod granted;
pub mod identity;
pub mod next;
pub mod retry;
pub mod revoke;
pub mod slot;
pub mod timing;
pub mod token;
pub mod unmanaged;

pub use cas::{CasError, CasStore, LeaseStore, Precondition};

use std::time::Duration;

use kube::runtime::utils::ResetTimerBackoff;
use kube::runtime::watcher::ExponentialBackoff;

/// Backoff of every watch Leasehold keeps: quick first retries, because a lock service
/// must see grants and releases soon after the apiserver is back (kube's default grows to
/// 30 s and stays high for two minutes); capped at 2 s and jittered, so that many sidecars
/// reconnecting after an apiserver restart spread out; reset after 30 s of health.
pub fn watch_backoff() -> ResetTimerBackoff<ExponentialBackoff> {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(ExponentialBackoff::from(builder), Duration::from_secs(30))
}
pub use granted::GrantedTiming;
pub use identity::Identity;
pub use revoke::RevokeReason;
pub use timing::Timing;
