//! Leasehold: a Kubernetes operator that makes the cluster a safe distributed-lock service.
//!
//! A `DistributedLock` is granted through a `coordination.k8s.io/v1` Lease by the
//! [`controller`], fairly (FIFO) and with a strictly increasing fencing token per grant.
//! Claimants — the [`sidecar`] in app pods, `leasehold run`, or any program using the
//! [`claim`] API — confirm each grant by compare-and-swap, renew it, and self-fence at
//! their renew deadline. The design and its invariants: `docs/design.md`.
//!
//! Modules:
//! - [`crd`]: the DistributedLock resource and the shared label/annotation names;
//!   [`crd_force`]: ForceReleaseRequests and the per-lock force-release policy;
//! - [`lease`]: identities, token minting, timing, CAS Lease access, leader election;
//! - [`claim`]: the claimant API (claim, wait, confirm, renew, release);
//! - [`controller`]: the arbiter;
//! - [`sidecar`]: the local lock API in app pods; [`run`]: `leasehold run`;
//! - [`webhook`]: admission (sidecar injection, fenced objects, force release);
//! - [`metrics`], [`telemetry`], [`admin`]: observability and the admin HTTP server.
//! - [`boottime`]: `CLOCK_BOOTTIME` (counts suspensions) for the holder side's deadlines;
//!   [`names`], [`duration`]: lock names and durations, checked one way everywhere.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod boottime;
pub mod check;
pub mod claim;
pub mod cli;
pub mod controller;
pub mod crd;
pub mod crd_docs;
pub mod crd_force;
pub mod duration;
pub mod kube_client;
#[cfg(test)]
mod layering;
pub mod lease;
pub mod metrics;
#[cfg(test)]
mod metrics_doc;
pub mod names;
pub mod run;
pub mod sidecar;
pub mod supervise;
pub mod telemetry;
pub mod webhook;
