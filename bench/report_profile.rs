//! The report's table of where the apiserver's CPU went inside each ceiling and throughput
//! window, by area, from a CPU profile of each (`LEASEHOLD_BENCH_APISERVER_PROFILE`).

use std::fmt::Write as _;

use leasehold_harness::profile::{AREAS, Areas, MAX_FRAMES, WATCH};

use crate::record::Run;
use crate::report::num;

/// The table, if any window was profiled.
pub fn table(w: &mut String, run: &Run) {
    let rows: Vec<(String, &Areas, usize)> = run
        .ceilings
        .iter()
        .filter_map(|c| Some((c.label(), c.cpu.apiserver.as_ref()?, c.writes)))
        .chain(
            run.throughput
                .iter()
                .filter_map(|t| Some((crate::report::window_label(t), t.cpu.apiserver.as_ref()?, t.cycles))),
        )
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "\n## Where the apiserver's CPU goes (a CPU profile of each window)\n\nkube-apiserver's own CPU profile over each window (`/debug/pprof/profile`, sampled 100 times a second), every sampled stack put in one area by the frames it holds (`leasehold_harness::profile`): the events sent to watchers, the watch cache reading etcd's changes, the storage work of each write (admission, validation, managed fields, decoding and encoding the object, the etcd transaction), etcd's client, Go's garbage collector in the background, and the rest of each request (authentication, authorization, priority and fairness, reading the body, reads, writing the answer over TLS). Shares of the samples. Then the watchers' CPU per grant (throughput) or per write (ceiling), and the share of the samples whose stacks were deeper than the {MAX_FRAMES} frames a Go CPU profile keeps: those are placed by the frames they kept. The profiles are in `apiserver-profiles/`, for `go tool pprof`.\n\n| window | CPU sampled (s) | {} | watchers' CPU per grant or write (ms) | stacks cut |\n|---|--:|{}--:|--:|",
        AREAS.join(" | "),
        "--:|".repeat(AREAS.len())
    );
    for (label, areas, done) in rows {
        let shares: Vec<String> =
            AREAS.iter().map(|a| areas.percent(a).map_or("—".into(), |p| format!("{p:.1} %"))).collect();
        let watch = areas.seconds_of(WATCH).filter(|_| done > 0).map_or("—".into(), |s| num(s * 1000.0 / done as f64));
        let cut = areas.cut_percent().map_or("—".into(), |p| format!("{p:.1} %"));
        let _ = writeln!(w, "| {label} | {} | {} | {watch} | {cut} |", num(areas.sampled_s), shares.join(" | "));
    }
}
