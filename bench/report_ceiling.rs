//! The report's account of each throughput run's fraction of the CAS ceiling, as the
//! product of two measured factors: what a write costs the apiserver, and how much CPU the
//! apiserver got.

use std::fmt::Write as _;

use crate::record::{Ceiling, Run, Throughput};
use crate::report::{ceiling_fraction, num, shape};

const APISERVER: &str = "kube-apiserver";

/// The two factors of one throughput run against its ceiling.
struct Factors {
    /// Apiserver CPU per Leasehold write: per grant, divided by the writes per grant (ms).
    per_write_ms: f64,
    /// Apiserver CPU per raw CAS write in the ceiling's window (ms).
    per_cas_ms: f64,
    /// The apiserver's CPU in the throughput window, % of one CPU.
    busy: f64,
    /// In the ceiling's window.
    busy_ceiling: f64,
}

impl Factors {
    fn of(t: &Throughput, c: &Ceiling) -> Option<Factors> {
        let per_grant = t.cpu.ms_per(APISERVER, t.cycles).filter(|ms| *ms > 0.0)?;
        (t.writes_per_cycle > 0.0).then_some(())?;
        Some(Factors {
            per_write_ms: per_grant / t.writes_per_cycle,
            per_cas_ms: c.cpu.ms_per(APISERVER, c.writes).filter(|ms| *ms > 0.0)?,
            busy: t.cpu.percent(APISERVER).filter(|p| *p > 0.0)?,
            busy_ceiling: c.cpu.percent(APISERVER).filter(|p| *p > 0.0)?,
        })
    }

    /// A raw CAS's cost as a share of a Leasehold write's.
    fn cost(&self) -> f64 {
        self.per_cas_ms / self.per_write_ms
    }

    /// The apiserver's CPU in the throughput window as a share of its CPU in the ceiling's.
    fn cpu(&self) -> f64 {
        self.busy / self.busy_ceiling
    }
}

/// The table, for each throughput run that has a ceiling with as many clients as locks.
pub fn table(w: &mut String, run: &Run) {
    let rows: Vec<(&Throughput, Factors, f64)> = run
        .throughput
        .iter()
        .filter_map(|t| {
            let c = run.ceiling(t.locks)?;
            Some((t, Factors::of(t, c)?, ceiling_fraction(run, t)?.1))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "\n## Why each throughput run reaches the fraction of the ceiling it does\n\nWhen the apiserver is the bottleneck, a run's fraction of the CAS ceiling is the product of two measured factors. The first is what a write costs the apiserver: the apiserver CPU per grant divided by the writes per grant (so the watch events, reads, refusals and status applies a grant brings are charged to its writes), against the apiserver CPU per raw CAS write in the ceiling's window; the table shows the raw CAS's cost as a share of a Leasehold write's. The second is how much CPU the apiserver got in the throughput window against the ceiling's: the controller and the claimants run on the same machine. Their product equals the measured fraction up to the difference between the windows' lengths.\n\n| locks × clients | apiserver CPU per write, Leasehold / raw CAS (ms) | cost factor | apiserver CPU, throughput / ceiling window (% of one CPU) | CPU factor | product | of the CAS ceiling (measured) |\n|---|--:|--:|--:|--:|--:|--:|"
    );
    for (t, f, measured) in rows {
        let _ = writeln!(
            w,
            "| {} × {}{} | {} / {} | {:.0} % | {:.0} / {:.0} | {:.0} % | {:.0} % | {:.0} % |",
            t.locks,
            t.clients_per_lock,
            shape(t),
            num(f.per_write_ms),
            num(f.per_cas_ms),
            f.cost() * 100.0,
            f.busy,
            f.busy_ceiling,
            f.cpu() * 100.0,
            f.cost() * f.cpu() * 100.0,
            measured * 100.0
        );
    }
}
