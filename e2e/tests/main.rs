//! End-to-end tests against a real kube-apiserver and etcd (see `e2e/harness`). One test
//! binary, one control plane; every test works in its own namespace with its own
//! Leasehold processes. [`metrics`] scrapes their admin ports.

mod admission;
mod chart;
mod claim_life;
mod claim_reads;
mod cli;
mod clients;
mod confirm;
mod controller;
mod controlplane;
mod demo;
mod drain;
mod examples;
mod lease;
mod metrics;
mod relist;
mod semaphore;
mod sidecar;
mod sidecar_api;
mod sidecar_hold;
mod sidecar_owner;
mod sidecar_run;
mod terms;

use leasehold_e2e_support as support;
