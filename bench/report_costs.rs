//! The report's tables of what each request costs the apiserver, and of how much of each
//! throughput run's apiserver CPU per grant those costs explain.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::record::{RequestCost, Run};
use crate::report::num;

/// The status write's kind, as `apiserver_request_total` names it.
const STATUS_APPLY: &str = "APPLY distributedlocks/status 200";
/// A raw Lease CAS's kind.
const LEASE_CAS: &str = "PUT leases 200";

/// Both tables, if the costs were measured.
pub fn tables(w: &mut String, run: &Run) {
    let costs = &run.request_costs;
    let Some(first) = costs.first() else { return };
    let cas = costs.iter().find(|c| c.key == LEASE_CAS).map(|c| c.apiserver_ms);
    let _ = writeln!(
        w,
        "\n## What each request costs the apiserver\n\nOne client sends each kind back to back ({} of each, in interleaved rounds after an untimed one), in a namespace no controller reconciles and no client watches; the CPU time of kube-apiserver and etcd (`utime + stime` of `/proc/<pid>/stat`) over each batch, divided by its requests.\n\n| request | what was sent | apiserver CPU per request (ms) | ÷ a lock Lease CAS | etcd CPU per request (ms) | round trip p50 / p99 (ms) |\n|---|---|--:|--:|--:|--:|",
        first.requests
    );
    for c in costs {
        let relative = cas.filter(|v| *v > 0.0).map_or("—".into(), |v| format!("{:.1}×", c.apiserver_ms / v));
        let _ = writeln!(
            w,
            "| {} | {} | {} | {relative} | {} | {} / {} |",
            c.key,
            c.what,
            num(c.apiserver_ms),
            num(c.etcd_ms),
            num(c.wall_ms.p50),
            num(c.wall_ms.p99)
        );
    }
    if run.throughput.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "\nEach throughput run's requests per grant (the requests table above) at these costs, against the apiserver CPU per grant measured in its window. What they leave is the rest of the apiserver's work under load: watch events sent to the controller and the claimants, requests of kinds not measured here (refusals, conflicts, Events, other reads), and garbage collection at a higher allocation rate.\n\n| throughput | at the measured costs (ms per grant) | of which lock status applies | measured (ms per grant) | explained |\n|---|--:|--:|--:|--:|"
    );
    for t in &run.throughput {
        let (explained, status) = at_costs(&t.request_counts, costs);
        let measured = t.cpu.ms_per("kube-apiserver", t.cycles);
        let share = measured.filter(|m| *m > 0.0).map_or("—".into(), |m| format!("{:.0} %", explained * 100.0 / m));
        let _ = writeln!(
            w,
            "| {} × {}{} | {} | {} | {} | {share} |",
            t.locks,
            t.clients_per_lock,
            crate::report::shape(t),
            num(explained),
            num(status),
            measured.map_or("—".into(), num)
        );
    }
}

/// The apiserver CPU, ms per grant, of the requests per grant `counts` of the kinds
/// measured, and of those of its status applies.
fn at_costs(counts: &BTreeMap<String, f64>, costs: &[RequestCost]) -> (f64, f64) {
    let cost = |key: &str| costs.iter().find(|c| c.key == key).map(|c| c.apiserver_ms);
    let explained = counts.iter().filter_map(|(key, per_grant)| Some(per_grant * cost(key)?)).sum();
    let status = counts.get(STATUS_APPLY).copied().unwrap_or_default() * cost(STATUS_APPLY).unwrap_or_default();
    (explained, status)
}
