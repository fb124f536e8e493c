//! Leasehold the way its users run it, on a real node (`leasehold_harness::node`): the
//! image `make image` built, `helm install` of the chart with default values, sidecars
//! injected into real pods by the webhook behind its Service, apps acquiring through
//! `localhost:7070` with their pod's own projected token, holders killed and deleted.
//!
//! The node starts once for this test binary (about 10 s) and the chart is installed once
//! ([`support::installed`]); each test works in its own namespace. A node that cannot
//! start fails every test with its reason.

use leasehold_e2e_support as e2e_support;

mod examples;
mod failover;
mod install;
mod pods;
mod quickstart;
mod support;
