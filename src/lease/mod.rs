//! Lease primitives shared by the controller, the sidecar and `leasehold run`: claimant
//! identities, fencing-token minting, timing, compare-and-swap writes, and the controller's
//! own leader election. Decisions are pure functions; the I/O is a thin layer around them.

pub mod cas;
pub mod clock;
pub mod election;
pub mod identity;
pub mod timing;
pub mod token;

pub use cas::{CasError, LeaseStore};
pub use identity::Identity;
pub use timing::Timing;
