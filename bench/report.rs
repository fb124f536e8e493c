//! The report: the ratios, the performance targets evaluated (met, or missed by how much),
//! and `report.md` rendered from a [`Run`].

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use crate::record::{Run, Series};

/// A ratio of two series at p50 and p99.
#[derive(Clone, Debug, Serialize)]
pub struct Ratio {
    /// `A ÷ B` in words.
    pub what: String,
    /// At the median.
    pub p50: f64,
    /// At the 99th percentile.
    pub p99: f64,
    /// Numerator and denominator keys.
    pub of: (String, String),
}

/// One performance target, evaluated.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// The target in words.
    pub target: String,
    /// What was measured, in words with the number.
    pub measured: String,
    /// `met`, `missed by ...`, or `not measured`.
    pub verdict: String,
    /// Met.
    pub met: Option<bool>,
}

fn ratio(run: &Run, what: &str, a: &str, b: &str) -> Option<Ratio> {
    let (x, y) = (run.series(a)?, run.series(b)?);
    Some(Ratio {
        what: what.into(),
        p50: x.summary.p50 / y.summary.p50,
        p99: x.summary.p99 / y.summary.p99,
        of: (a.into(), b.into()),
    })
}

/// The ratios: Leasehold handoff ÷ etcd lock handoff; client-go handoff ÷ Leasehold handoff;
/// Leasehold acquire ÷ raw Lease CAS (kube-rs, and client-go's for reference).
pub fn ratios(run: &Run) -> Vec<Ratio> {
    [
        ratio(run, "Leasehold handoff ÷ etcd lock handoff", "leasehold.handoff", "peer.etcd.handoff"),
        ratio(run, "client-go handoff ÷ Leasehold handoff", "peer.clientgo.handoff", "leasehold.handoff"),
        ratio(run, "Leasehold acquire ÷ raw Lease CAS (kube-rs)", "leasehold.acquire", "floor.lease_cas.kube"),
        ratio(run, "Leasehold acquire ÷ raw Lease CAS (client-go)", "leasehold.acquire", "floor.lease_cas.clientgo"),
        ratio(
            run,
            "Leasehold acquire ÷ raw Lease CAS (plain keep-alive HTTPS)",
            "leasehold.acquire",
            "floor.lease_cas.plain",
        ),
        fastest_floor(run).and_then(|floor| {
            ratio(run, "Leasehold acquire ÷ raw Lease CAS (the faster floor, by p50)", "leasehold.acquire", floor)
        }),
        ratio(run, "kube-lease-manager handoff ÷ Leasehold handoff", "peer.klm.handoff", "leasehold.handoff"),
        ratio(run, "Leasehold Lease-level handoff ÷ etcd lock handoff", "leasehold.lease.handoff", "peer.etcd.handoff"),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The raw-CAS floor the acquire is held against: of kube-rs (the product's own client)
/// and a plain keep-alive HTTPS client, the faster at the median.
pub fn fastest_floor(run: &Run) -> Option<&'static str> {
    ["floor.lease_cas.kube", "floor.lease_cas.plain"]
        .into_iter()
        .filter_map(|key| run.series(key).map(|s| (key, s.summary.p50)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(key, _)| key)
}

/// A "lower is better" target: `value ≤ limit`.
fn at_most(target: &str, measured: String, value: Option<f64>, limit: f64, unit: &str) -> Verdict {
    match value {
        None => Verdict { target: target.into(), measured, verdict: "not measured".into(), met: None },
        Some(v) if v <= limit => Verdict { target: target.into(), measured, verdict: "met".into(), met: Some(true) },
        Some(v) => Verdict {
            target: target.into(),
            measured,
            verdict: if limit > 0.0 {
                format!("missed by {} {unit} ({:.2}× the limit)", num(v - limit), v / limit)
            } else {
                format!("missed by {} {unit}", num(v))
            },
            met: Some(false),
        },
    }
}

/// The performance targets.
pub fn verdicts(run: &Run, ratios: &[Ratio], lease_ms: f64) -> Vec<Verdict> {
    let find = |a: &str, b: &str| ratios.iter().find(|r| r.of.0 == a && r.of.1 == b);
    let summary = |key: &str| run.series(key).map(|s| s.summary.clone());
    let mut out = Vec::new();

    let r = find("leasehold.handoff", "peer.etcd.handoff");
    out.push(at_most(
        "Handoff p99 ≤ 5× the etcd lock's",
        r.map_or("—".into(), |r| {
            format!(
                "{:.2}× (Leasehold p99 {} ms, etcd p99 {} ms)",
                r.p99,
                p99(run, "leasehold.handoff"),
                p99(run, "peer.etcd.handoff")
            )
        }),
        r.map(|r| r.p99),
        5.0,
        "×",
    ));
    let r = find("peer.clientgo.handoff", "leasehold.handoff");
    out.push(match r {
        None => Verdict {
            target: "Handoff p99 ≥ 50× faster than client-go's default".into(),
            measured: "—".into(),
            verdict: "not measured".into(),
            met: None,
        },
        Some(r) => {
            let measured = format!(
                "{:.1}× faster (client-go p99 {} ms, Leasehold p99 {} ms)",
                r.p99,
                p99(run, "peer.clientgo.handoff"),
                p99(run, "leasehold.handoff")
            );
            let met = r.p99 >= 50.0;
            Verdict {
                target: "Handoff p99 ≥ 50× faster than client-go's default".into(),
                measured,
                verdict: if met {
                    "met".into()
                } else {
                    format!("missed: {:.1}× short of 50× ({:.2}× of the goal)", 50.0 - r.p99, r.p99 / 50.0)
                },
                met: Some(met),
            }
        }
    });
    let floor = fastest_floor(run).unwrap_or("floor.lease_cas.kube");
    let r = find("leasehold.acquire", floor);
    out.push(at_most(
        "Uncontended acquire p50 ≤ 3× one raw Lease CAS",
        r.map_or("—".into(), |r| {
            format!(
                "{:.2}× (acquire p50 {} ms, faster CAS floor p50 {} ms: {})",
                r.p50,
                p50(run, "leasehold.acquire"),
                p50(run, floor),
                run.series(floor).map_or("—", |s| s.title.as_str())
            )
        }),
        r.map(|r| r.p50),
        3.0,
        "×",
    ));
    let crash = summary("leasehold.crash_failover");
    out.push(at_most(
        &format!("Crash failover ≤ leaseDuration + 0.5 s (= {} ms), every sample", num(lease_ms + 500.0)),
        crash.as_ref().map_or("—".into(), |s| {
            format!("max {} ms, p99 {} ms, p50 {} ms (n={})", num(s.max), num(s.p99), num(s.p50), s.n)
        }),
        crash.as_ref().map(|s| s.max),
        lease_ms + 500.0,
        "ms",
    ));
    // A real pod's deletion stops its containers (the app first, then the sidecar, which
    // gives the hold back once the app has let go): that is the path the target is for.
    let pod = summary("leasehold.node.pod_delete.failover");
    out.push(at_most(
        "Pod-deletion failover ≤ 1 s, every sample (real pod on the node)",
        pod.as_ref().map_or("—".into(), |s| {
            format!("max {} ms, p99 {} ms, p50 {} ms (n={})", num(s.max), num(s.p99), num(s.p50), s.n)
        }),
        pod.as_ref().map(|s| s.max),
        1000.0,
        "ms",
    ));
    // A Pod object deleted while its processes run on (no kubelet): the controller cannot
    // know when the holder learned, so the next grant waits out the hold's lease.
    let orphan = summary("leasehold.pod_delete_failover");
    out.push(at_most(
        &format!(
            "Pod object deleted, its processes still running: failover ≤ leaseDuration + 0.5 s (= {} ms), every sample",
            num(lease_ms + 500.0)
        ),
        orphan.as_ref().map_or("—".into(), |s| {
            format!("max {} ms, p99 {} ms, p50 {} ms (n={})", num(s.max), num(s.p99), num(s.p50), s.n)
        }),
        orphan.as_ref().map(|s| s.max),
        lease_ms + 500.0,
        "ms",
    ));
    let app = summary("leasehold.app_crash_failover");
    out.push(at_most(
        "App crash failover p99 ≤ 100 ms (session-bound hold: app process SIGKILL → next acquire returned)",
        app.as_ref().map_or("—".into(), |s| {
            format!("p99 {} ms, p50 {} ms, max {} ms (n={})", num(s.p99), num(s.p50), num(s.max), s.n)
        }),
        app.as_ref().map(|s| s.p99),
        100.0,
        "ms",
    ));
    let cycle = run.writes.iter().find(|w| w.unit == "writes/cycle");
    out.push(at_most(
        "≤ 6 apiserver writes per uncontended cycle",
        cycle.map_or("—".into(), |w| format!("{:.2} ({})", w.value, w.breakdown)),
        cycle.map(|w| w.value),
        6.0,
        "writes",
    ));
    let idle = run.writes.iter().find(|w| w.unit == "objects changed");
    let rate = run.writes.iter().find(|w| w.unit == "writes/min");
    out.push(at_most(
        "No writes for idle locks",
        idle.map_or("—".into(), |w| {
            format!(
                "{} objects written in {:.0} s ({}); apiserver counters: {} writes/min net of background",
                w.value,
                w.params["window_s"].as_f64().unwrap_or(0.0),
                w.breakdown,
                rate.map_or("—".into(), |r| format!("{:.1}", r.value))
            )
        }),
        idle.map(|w| w.value),
        0.0,
        "objects",
    ));
    let mib = |k: u64| k as f64 / 1024.0;
    let sidecar = run.memory.iter().filter(|m| m.what.starts_with("sidecar")).max_by_key(|m| m.rss_kib);
    out.push(at_most(
        "Sidecar ≤ 10 MiB resident",
        sidecar.map_or("—".into(), |m| {
            format!(
                "max VmRSS {:.1} MiB ({}): RssAnon {:.1} MiB, RssFile {:.1} MiB (pages of the {} binary)",
                mib(m.rss_kib),
                m.what,
                mib(m.anon_kib),
                mib(m.file_kib),
                fact(run, crate::output::SIDECAR_BINARY_FACT).split(" (").next().unwrap_or("")
            )
        }),
        sidecar.map(|m| mib(m.rss_kib)),
        10.0,
        "MiB",
    ));
    let controller = run.memory.iter().find(|m| m.what == "controller, 10000 locks");
    out.push(at_most(
        "Controller ≤ 64 MiB with 10,000 locks",
        controller.map_or("—".into(), |m| {
            format!(
                "VmRSS {:.1} MiB (RssAnon {:.1} MiB, RssFile {:.1} MiB)",
                mib(m.rss_kib),
                mib(m.anon_kib),
                mib(m.file_kib)
            )
        }),
        controller.map(|m| mib(m.rss_kib)),
        64.0,
        "MiB",
    ));
    out
}

fn p50(run: &Run, key: &str) -> String {
    run.series(key).map_or("—".into(), |s| num(s.summary.p50))
}

fn p99(run: &Run, key: &str) -> String {
    run.series(key).map_or("—".into(), |s| num(s.summary.p99))
}

/// A number with precision that suits its size.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        "—".into()
    } else if v.abs() < 10.0 {
        format!("{v:.2}")
    } else if v.abs() < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

fn lease_ms_of(series: &Series, default: f64) -> f64 {
    let p = &series.params;
    p.get("lease_duration_ms").or_else(|| p.get("ttl_ms")).and_then(Value::as_f64).unwrap_or(default)
}

fn fact(run: &Run, key: &str) -> String {
    match run.facts.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "—".into(),
    }
}

/// A value in words: strings bare, objects as `key: value; ...`.
fn flat(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(map) => map.iter().map(|(k, v)| format!("{k}: {}", flat(v))).collect::<Vec<_>>().join("; "),
        Value::Array(items) => items.iter().map(flat).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// `report.md`.
pub fn markdown(run: &Run, ratios: &[Ratio], verdicts: &[Verdict], lease_ms: f64, plot: Option<&str>) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "# Leasehold benchmark — {}\n", fact(run, "started_at"));
    if run.facts.get("profile").and_then(Value::as_str) == Some("quick") {
        let _ = writeln!(
            w,
            "> **QUICK profile** (`LEASEHOLD_BENCH_QUICK=1`): tiny sample counts, a smoke test of the driver — not a benchmark.\n"
        );
    }
    let _ = writeln!(
        w,
        "One run, one machine, one control plane: Leasehold, the floors and the peers measured side by side \
         (`make bench`, driver `bench/main.rs`). Latencies in milliseconds; p-values interpolate between order \
         statistics, so with n < 100 the p99 is close to the max. Targets are goals, evaluated here, never asserted.\n"
    );

    let _ = writeln!(w, "## Parameters\n\n| parameter | value |\n|---|---|");
    for (k, v) in &run.facts {
        if k == "scale_rates" {
            continue;
        }
        let _ = writeln!(w, "| {k} | {} |", flat(v).replace('|', "\\|"));
    }

    let _ = writeln!(
        w,
        "\n## Latency (ms)\n\n| measurement | subject | n | p50 | p95 | p99 | max |\n|---|---|--:|--:|--:|--:|--:|"
    );
    for s in &run.series {
        let m = &s.summary;
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} |",
            s.title,
            s.subject,
            m.n,
            num(m.p50),
            num(m.p95),
            num(m.p99),
            num(m.max)
        );
    }

    let _ = writeln!(w, "\n## Ratios\n\n| ratio | at p50 | at p99 |\n|---|--:|--:|");
    for r in ratios {
        let _ = writeln!(w, "| {} | {:.2}× | {:.2}× |", r.what, r.p50, r.p99);
    }

    let _ = writeln!(
        w,
        "\n## Failover relative to the lease duration\n\n| failover | lease duration (ms) | p50 − lease | p99 − lease | max − lease | p50 ÷ lease |\n|---|--:|--:|--:|--:|--:|"
    );
    for s in run.series.iter().filter(|s| s.key.ends_with("crash_failover") || s.key.ends_with(".failover")) {
        let lease = lease_ms_of(s, lease_ms);
        let m = &s.summary;
        let _ = writeln!(
            w,
            "| {} [{}] | {} | {} | {} | {} | {:.2} |",
            s.title,
            s.subject,
            num(lease),
            num(m.p50 - lease),
            num(m.p99 - lease),
            num(m.max - lease),
            m.p50 / lease
        );
    }

    let _ = writeln!(w, "\n## Targets\n\n| target | measured | verdict |\n|---|---|---|");
    for v in verdicts {
        let mark = match v.met {
            Some(true) => "✅ ",
            Some(false) => "❌ ",
            None => "",
        };
        let _ = writeln!(w, "| {} | {} | {mark}{} |", v.target, v.measured.replace('|', "\\|"), v.verdict);
    }

    let _ = writeln!(
        w,
        "\n## Throughput (in-process claimants, contending)\n\n| locks × clients | cycles/s | cycles | window (s) | acquire wait p50 / p99 (ms) | errors | writes/cycle | 409s/cycle | writes by kind per cycle |\n|---|--:|--:|--:|--:|--:|--:|--:|---|"
    );
    for t in &run.throughput {
        let _ = writeln!(
            w,
            "| {} × {}{} | {:.1} | {} | {:.1} | {} / {} | {} | {:.2} | {:.2} | {} |",
            t.locks,
            t.clients_per_lock,
            shape(t),
            t.per_second,
            t.cycles,
            t.seconds,
            num(t.acquire_ms.p50),
            num(t.acquire_ms.p99),
            t.errors,
            t.writes_per_cycle,
            t.conflicts_per_cycle,
            t.breakdown
        );
    }

    for t in run.throughput.iter().filter(|t| !t.error_kinds.is_empty()) {
        let _ = writeln!(
            w,
            "\nFailed acquisitions with {} × {}{}: {}",
            t.locks,
            t.clients_per_lock,
            shape(t),
            t.error_kinds.join("; ")
        );
    }

    let _ = writeln!(
        w,
        "\n## Apiserver writes (from `apiserver_request_total`, background subtracted)\n\n| what | value | by kind | window |\n|---|--:|---|---|"
    );
    for c in &run.writes {
        let _ = writeln!(
            w,
            "| {} | {:.2} {} | {} | {} |",
            c.what,
            c.value,
            c.unit,
            c.breakdown,
            c.params.to_string().replace('|', "\\|")
        );
    }

    if !run.cpu.is_empty() {
        let _ = writeln!(w, "\n## CPU per 1,000 grants\n\n| what | CPU s per 1,000 grants | measured |\n|---|--:|---|");
        for c in &run.cpu {
            let _ = writeln!(w, "| {} | {:.2} | {} |", c.what, c.value, c.breakdown);
        }
    }

    let _ = writeln!(
        w,
        "\n## Resident memory\n\nVmRSS = RssAnon (the process's own heap and stacks) + RssFile (mapped pages of the binary, shareable between processes of one image) + RssShmem.\n\n| process | VmRSS (MiB) | RssAnon (MiB) | RssFile (MiB) | VmHWM (MiB) | when |\n|---|--:|--:|--:|--:|---|"
    );
    for m in &run.memory {
        let _ = writeln!(
            w,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
            m.what,
            m.rss_kib as f64 / 1024.0,
            m.anon_kib as f64 / 1024.0,
            m.file_kib as f64 / 1024.0,
            m.peak_kib as f64 / 1024.0,
            m.params.to_string().replace('|', "\\|")
        );
    }

    let _ = writeln!(
        w,
        "\n## Phases\n\n| phase | wall time (s) | load average at start (1, 5, 15 min) | at end |\n|---|--:|---|---|"
    );
    for p in &run.phases {
        let _ = writeln!(w, "| {} | {:.1} | {} | {} |", p.name, p.seconds, p.load_start, p.load_end);
    }

    let _ = writeln!(w, "\n## How each series was taken\n");
    for s in &run.series {
        let _ =
            writeln!(w, "- **{}** (`{}`, {}): `{}`", s.title, s.key, s.subject, s.params.to_string().replace('`', "'"));
    }

    if !run.notes.is_empty() || !run.failures.is_empty() {
        let _ = writeln!(w, "\n## Notes\n");
        for f in &run.failures {
            let _ = writeln!(w, "- **FAILED:** {f}");
        }
        for n in &run.notes {
            let _ = writeln!(w, "- {n}");
        }
    }
    if let Some(plot) = plot {
        let _ = writeln!(w, "\n## Latency distributions\n\n![latency distributions]({plot})");
    }
    md
}

/// A throughput row's locks, when they are not mutexes: " (10 permits)", " (10 permits,
/// 3 writing)".
fn shape(t: &crate::record::Throughput) -> String {
    match (t.permits, t.writers_per_lock) {
        (1, 0) => String::new(),
        (p, 0) => format!(" ({p} permits)"),
        (p, w) => format!(" ({p} permits, {w} writing)"),
    }
}
