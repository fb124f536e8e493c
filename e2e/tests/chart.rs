//! The Helm chart (`charts/leasehold`) against the real control plane: install, upgrade
//! and uninstall; the controller running with nothing but the chart's RBAC; sidecars of
//! app pods with nothing but what the controller prepares; and the rendered manifests,
//! strictly validated against the pinned release.
//!
//! Each cluster test starts its own control plane (about 3 s): the chart installs
//! cluster-scoped objects — the CRD, webhook configurations, the Lease guard — that would
//! disturb the tests sharing [`leasehold_harness::shared`]. There is no kubelet, so the
//! chart's Deployment never has pods and its webhook Service no endpoints: a test that
//! needs the webhooks answered runs the controller as a local process and points the
//! chart's webhook configurations at it (see `rbac.rs`).

mod check;
mod cluster;
pub mod helm;
mod install;
mod metric_refs;
mod monitoring;
mod package;
mod platform;
mod rbac;
mod render;
mod roles;
