//! The report: the ratios, the performance targets evaluated (met, or missed by how much),
//! and `report.md` rendered from a [`Run`].

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use crate::record::{Run, Series};
use crate::stats::Summary;

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
    /// `met`, `missed by ...`, `reported` (a number with no limit), or `not measured`.
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
        faster_floor_ratio(run),
        ratio(run, "kube-lease-manager handoff ÷ Leasehold handoff", "peer.klm.handoff", "leasehold.handoff"),
        ratio(run, "Leasehold Lease-level handoff ÷ etcd lock handoff", "leasehold.lease.handoff", "peer.etcd.handoff"),
        ratio(
            run,
            "Leasehold Lease-level handoff in the release ÷ etcd lock handoff",
            "leasehold.lease.handoff_in_release",
            "peer.etcd.handoff",
        ),
        over_faster_floor(
            run,
            "LockClaim create and Lease CAS sent together ÷ raw Lease CAS (the faster floor at each percentile)",
            "floor.claim_and_cas",
        ),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The raw-CAS floors the acquire is held against: kube-rs (the product's own client) and
/// a plain keep-alive HTTPS client.
const FLOORS: [&str; 2] = ["floor.lease_cas.kube", "floor.lease_cas.plain"];

/// The key [`faster_floor_ratio`] is filed under as its denominator.
const FASTER_FLOOR: &str = "floor.lease_cas.faster";

/// Of [`FLOORS`], the faster at the percentile `at` picks, and that percentile.
pub fn faster_floor(run: &Run, at: fn(&crate::stats::Summary) -> f64) -> Option<(&'static str, f64)> {
    FLOORS
        .into_iter()
        .filter_map(|key| run.series(key).map(|s| (key, at(&s.summary))))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// Leasehold acquire ÷ the faster raw-CAS floor at each percentile: a floor whose tail is
/// noisy does not flatter the acquire's p99.
fn faster_floor_ratio(run: &Run) -> Option<Ratio> {
    let what = "Leasehold acquire ÷ raw Lease CAS (the faster floor at each percentile)";
    over_faster_floor(run, what, "leasehold.acquire")
}

/// Series `key` ÷ the faster raw-CAS floor at each percentile.
fn over_faster_floor(run: &Run, what: &str, key: &str) -> Option<Ratio> {
    let series = &run.series(key)?.summary;
    let (_, p50) = faster_floor(run, |s| s.p50)?;
    let (_, p99) = faster_floor(run, |s| s.p99)?;
    Some(Ratio {
        what: what.into(),
        p50: series.p50 / p50,
        p99: series.p99 / p99,
        of: (key.into(), FASTER_FLOOR.into()),
    })
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

/// A failover target every sample must meet: the slowest one is `≤ limit` ms.
fn every_sample_at_most(target: &str, summary: Option<Summary>, limit: f64) -> Verdict {
    at_most(
        target,
        summary.as_ref().map_or("—".into(), |s| {
            format!("max {} ms, p99 {} ms, p50 {} ms (n={})", num(s.max), num(s.p99), num(s.p50), s.n)
        }),
        summary.as_ref().map(|s| s.max),
        limit,
        "ms",
    )
}

/// The performance targets.
pub fn verdicts(run: &Run, ratios: &[Ratio], lease_ms: f64) -> Vec<Verdict> {
    let find = |a: &str, b: &str| ratios.iter().find(|r| r.of.0 == a && r.of.1 == b);
    let summary = |key: &str| run.series(key).map(|s| s.summary.clone());
    let mut out = Vec::new();

    let r = find("leasehold.handoff", "peer.etcd.handoff");
    out.push(at_most(
        &format!("Handoff p99 ≤ {HANDOFF_VS_ETCD:.0}× the etcd lock's"),
        r.map_or("—".into(), |r| {
            format!(
                "{:.2}× (Leasehold p99 {} ms, etcd p99 {} ms)",
                r.p99,
                p99(run, "leasehold.handoff"),
                p99(run, "peer.etcd.handoff")
            )
        }),
        r.map(|r| r.p99),
        HANDOFF_VS_ETCD,
        "×",
    ));
    let r = find("peer.clientgo.handoff", "leasehold.handoff");
    let goal = HANDOFF_VS_CLIENTGO;
    let target = format!("Handoff p99 ≥ {goal:.0}× faster than client-go's default");
    out.push(match r {
        None => Verdict { target: target.clone(), measured: "—".into(), verdict: "not measured".into(), met: None },
        Some(r) => {
            let measured = format!(
                "{:.1}× faster (client-go p99 {} ms, Leasehold p99 {} ms)",
                r.p99,
                p99(run, "peer.clientgo.handoff"),
                p99(run, "leasehold.handoff")
            );
            let met = r.p99 >= goal;
            Verdict {
                target,
                measured,
                verdict: if met {
                    "met".into()
                } else {
                    format!("missed: {:.1}× short of {goal:.0}× ({:.2}× of the goal)", goal - r.p99, r.p99 / goal)
                },
                met: Some(met),
            }
        }
    });
    let r = find("leasehold.acquire", FASTER_FLOOR);
    for (percentile, at, value) in [
        ("p50", (|s| s.p50) as fn(&crate::stats::Summary) -> f64, r.map(|r| r.p50)),
        ("p99", |s| s.p99, r.map(|r| r.p99)),
    ] {
        let acquire = run.series("leasehold.acquire").map(|s| at(&s.summary));
        let measured = match (value, acquire, faster_floor(run, at)) {
            (Some(ratio), Some(acquire), Some((floor, floor_value))) => format!(
                "{ratio:.2}× (acquire {percentile} {} ms, faster CAS floor {percentile} {} ms: {})",
                num(acquire),
                num(floor_value),
                run.series(floor).map_or("—", |s| s.title.as_str())
            ),
            _ => "—".into(),
        };
        out.push(at_most(
            &format!("Uncontended acquire {percentile} ≤ 3× one raw Lease CAS"),
            measured,
            value,
            3.0,
            "×",
        ));
    }
    out.push(every_sample_at_most(
        &format!("Crash failover ≤ leaseDuration + 0.5 s (= {} ms), every sample", num(lease_ms + 500.0)),
        summary("leasehold.crash_failover"),
        lease_ms + 500.0,
    ));
    // A real pod's deletion stops its containers (the app first, then the sidecar, which
    // gives the hold back once the app has let go): that is the path the target is for.
    // With a plain hold the kubelet reports the app's end only once the whole pod has
    // stopped, so the sidecar, stopped after the app, can only wait out what it told it.
    out.push(every_sample_at_most(
        "Pod-deletion failover ≤ 1 s, every sample (real pod on the node)",
        summary("leasehold.node.pod_delete.failover"),
        1000.0,
    ));
    // The same deletion with a session-bound hold: the app's exit closes its session, and
    // that is proof enough that it let go.
    out.push(every_sample_at_most(
        "Pod-deletion failover ≤ 1 s, every sample, session-bound hold (real pod on the node)",
        summary("leasehold.node.pod_delete_session.failover"),
        1000.0,
    ));
    // A Pod object deleted while its processes run on (no kubelet): the controller cannot
    // know when the holder learned, so the next grant waits out the hold's lease.
    out.push(every_sample_at_most(
        &format!(
            "Pod object deleted, its processes still running: failover ≤ leaseDuration + 0.5 s (= {} ms), every sample",
            num(lease_ms + 500.0)
        ),
        summary("leasehold.pod_delete_failover"),
        lease_ms + 500.0,
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
    out.push(held_writes(run));
    out.push(reported(
        "Writes per grant under contention",
        run.throughput
            .iter()
            .map(|t| format!("{} × {}{}: {:.2}", t.locks, t.clients_per_lock, shape(t), t.writes_per_cycle))
            .collect::<Vec<_>>()
            .join("; "),
    ));
    out.extend(throughput_vs_ceiling(run));
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
    out.push(at_most(
        "Sidecar ≤ 6 MiB resident (stretch)",
        sidecar.map_or("—".into(), |m| format!("max VmRSS {:.1} MiB ({})", mib(m.rss_kib), m.what)),
        sidecar.map(|m| mib(m.rss_kib)),
        6.0,
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
    out.push(controller_at_scale(run));
    out.push(reported(
        "Controller CPU: CPU seconds per 1,000 grants, controller and apiserver",
        run.cpu
            .iter()
            .map(|c| {
                let process = c.what.split(':').next().unwrap_or(&c.what);
                format!("{process} {:.2} s ({})", c.value, c.breakdown)
            })
            .collect::<Vec<_>>()
            .join("; "),
    ));
    out
}

/// Handoff p99 at most this many times the etcd lock's.
const HANDOFF_VS_ETCD: f64 = 3.0;
/// Handoff p99 at least this many times faster than client-go leader election's.
const HANDOFF_VS_CLIENTGO: f64 = 100.0;
/// Leasehold's apiserver writes per second at least this fraction of the raw ceiling.
const CEILING_FRACTION: f64 = 0.7;
/// The scale at which the controller's memory has a second target, and that target.
const LARGE_SCALE: (usize, f64) = (100_000, 400.0);

/// `1 lock`, `10 locks`.
fn count(n: usize, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

/// `100000` as `100,000`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// A target with no limit: the number is reported, never judged.
fn reported(target: &str, measured: String) -> Verdict {
    let verdict = if measured.is_empty() { "not measured" } else { "reported" };
    let measured = if measured.is_empty() { "—".into() } else { measured };
    Verdict { target: target.into(), measured, verdict: verdict.into(), met: None }
}

/// At most one apiserver write per retry period for each held lock: the renewal, and
/// nothing else while nobody waits.
/// Judged by the held Leases' own changes (the retry period over the mean time between two
/// writes of one Lease); the apiserver's counters, which count whole renewals in or out
/// of a window and carry the background's noise, are shown beside it.
fn held_writes(run: &Run) -> Verdict {
    let held = run.writes.iter().find(|w| w.unit == "writes/lock/min");
    let retry = held.and_then(|w| w.params["retry_period_s"].as_f64());
    let between = held.and_then(|w| w.params["mean_s_between_writes_of_one_lease"].as_f64());
    let per_period = retry.zip(between).map(|(retry, between)| retry / between);
    at_most(
        "≤ 1 apiserver write per retry period per held lock",
        match (held, retry, between, per_period) {
            (Some(w), Some(retry), Some(between), Some(p)) => format!(
                "{p:.3} per {retry} s retry period (one write of a held Lease every {between:.2} s on average, {} changes seen; apiserver counters: {:.1} writes/lock/min: {})",
                w.params["lease_changes"], w.value, w.breakdown
            ),
            _ => "—".into(),
        },
        per_period,
        1.0,
        "writes",
    )
}

/// Leasehold's apiserver writes per second (`cycles/s × writes per grant`) with `locks`
/// mutexes, and that as a fraction of the raw CAS ceiling with as many clients.
pub fn ceiling_fraction(run: &Run, t: &crate::record::Throughput) -> Option<(f64, f64)> {
    let ceiling = run.ceiling(t.locks)?;
    let writes = t.per_second * t.writes_per_cycle;
    Some((writes, writes / ceiling.per_second))
}

/// One verdict per mutex lock count that has both a throughput run and a ceiling.
fn throughput_vs_ceiling(run: &Run) -> Vec<Verdict> {
    let rows: Vec<Verdict> = run
        .throughput
        .iter()
        .filter(|t| t.permits == 1 && t.writers_per_lock == 0)
        .filter_map(|t| {
            let ceiling = run.ceiling(t.locks)?;
            let (writes, fraction) = ceiling_fraction(run, t)?;
            let target = format!(
                "Throughput, {} × {} claimants: apiserver writes/s ≥ {:.0} % of its raw CAS ceiling from {}",
                count(t.locks, "lock"),
                t.clients_per_lock,
                CEILING_FRACTION * 100.0,
                count(ceiling.clients, "client")
            );
            let measured = format!(
                "{:.0} % ({:.1} cycles/s × {:.2} writes per grant = {} writes/s; ceiling {} CAS/s)",
                fraction * 100.0,
                t.per_second,
                t.writes_per_cycle,
                num(writes),
                num(ceiling.per_second)
            );
            let met = fraction >= CEILING_FRACTION;
            let verdict = if met {
                "met".into()
            } else {
                format!(
                    "missed by {:.0} points ({:.2}× of the goal)",
                    (CEILING_FRACTION - fraction) * 100.0,
                    fraction / CEILING_FRACTION
                )
            };
            Some(Verdict { target, measured, verdict, met: Some(met) })
        })
        .collect();
    if rows.is_empty() {
        let target = format!("Throughput: writes/s ≥ {:.0} % of the apiserver's CAS ceiling", CEILING_FRACTION * 100.0);
        return vec![Verdict { target, measured: "—".into(), verdict: "not measured".into(), met: None }];
    }
    rows
}

/// The controller with 100,000 locks, reconciled and then idle: the larger of the two
/// readings (the target holds in both states), and how long reconciling them took.
fn controller_at_scale(run: &Run) -> Verdict {
    let (locks, limit) = LARGE_SCALE;
    let target = format!("Controller ≤ {limit:.0} MiB with {} locks reconciled and idle", thousands(locks));
    let reconciled = run.memory.iter().find(|m| m.what == format!("controller, {locks} locks"));
    let Some(reconciled) = reconciled else {
        return Verdict {
            target,
            measured: "—".into(),
            verdict: format!("not measured (run with LEASEHOLD_BENCH_SCALE_COUNTS={locks}, e.g. `make bench-scale`)"),
            met: None,
        };
    };
    let idle = run.memory.iter().find(|m| m.what == format!("controller, {locks} idle locks, end of the quiet window"));
    let mib = |k: u64| k as f64 / 1024.0;
    let largest = idle.map_or(reconciled.rss_kib, |i| i.rss_kib.max(reconciled.rss_kib));
    let seconds = |key: &str| reconciled.params[key].as_f64().map_or("—".into(), |s| format!("{s:.0} s"));
    // Earlier steps of the scale phase created the first locks; this step's time counts
    // from the creation of its own first lock.
    let before: f64 = run.facts.get("scale_rates").and_then(Value::as_array).map_or(0.0, |steps| {
        steps
            .iter()
            .filter(|s| s["locks"].as_u64().is_some_and(|n| n < locks as u64))
            .filter_map(|s| s["reconciled_s"].as_f64())
            .sum()
    });
    let measured = format!(
        "VmRSS {:.1} MiB reconciled, {} idle; all {} reconciled {} after this step's creates began (created in {}; earlier steps {before:.0} s more)",
        mib(reconciled.rss_kib),
        idle.map_or("—".into(), |i| format!("{:.1} MiB", mib(i.rss_kib))),
        thousands(locks),
        seconds("all_reconciled_in_s"),
        seconds("created_in_s"),
    );
    at_most(&target, measured, Some(mib(largest)), limit, "MiB")
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
        "\n## Throughput (in-process claimants, contending)\n\nA cycle is one grant (acquire returned, then release): writes/cycle and 409s/cycle are per grant. Apiserver writes/s = cycles/s × writes per grant, and the column after it that as a fraction of the apiserver's raw CAS ceiling with as many clients (the next table). Each claimant is a ServiceAccount's, as an app's pods are, so the apiserver's priority and fairness applies to it. The window starts after the warm-up, not before as many claims have been created as there are claimants (the column after it: when that was, from the claimants' start), and not before every claimant has been granted once since (a turn of every queue: the next column, from then): it measures the steady state, not the first herd. The last column counts the cycles of a window as long that starts without waiting for the turn, where reports before this one started theirs.\n\n| locks × clients | cycles/s | cycles | window (s) | every claimant claimed after (s) | each granted once more after (s) | acquire wait p50 / p99 (ms) | release p50 / p99 (ms) | errors | writes/cycle (per grant) | 409s/cycle (per grant) | writes by kind per cycle | apiserver writes/s | of the CAS ceiling | cycles/s without waiting for the turn |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|"
    );
    for t in &run.throughput {
        let (writes, fraction) = ceiling_fraction(run, t)
            .map_or((num(t.per_second * t.writes_per_cycle), "—".into()), |(w, f)| {
                (num(w), format!("{:.0} %", f * 100.0))
            });
        let _ = writeln!(
            w,
            "| {} × {}{} | {:.1} | {} | {:.1} | {} | {} | {} / {} | {} / {} | {} | {:.2} | {:.2} | {} | {writes} | {fraction} | {:.1} |",
            t.locks,
            t.clients_per_lock,
            shape(t),
            t.per_second,
            t.cycles,
            t.seconds,
            t.all_claimed_s.map_or_else(|| "not within 180 s".to_owned(), |s| format!("{s:.1}")),
            t.turned_s.map_or_else(|| "not within 300 s".to_owned(), |s| format!("{s:.1}")),
            num(t.acquire_ms.p50),
            num(t.acquire_ms.p99),
            num(t.release_ms.p50),
            num(t.release_ms.p99),
            t.errors,
            t.writes_per_cycle,
            t.conflicts_per_cycle,
            t.breakdown,
            t.first_per_second
        );
    }

    if run.throughput.iter().any(|t| !t.requests.is_empty()) {
        let _ = writeln!(
            w,
            "\nEvery request the apiserver answered in the same windows, per grant, by verb, resource and answer (reads, watches, 404s and 409s too; the background is not removed; a WATCH counts when it ends):\n\n| locks × clients | requests per grant | by kind per grant |\n|---|--:|---|"
        );
        for t in run.throughput.iter().filter(|t| !t.requests.is_empty()) {
            let _ = writeln!(
                w,
                "| {} × {}{} | {:.2} | {} |",
                t.locks,
                t.clients_per_lock,
                shape(t),
                t.requests_per_cycle,
                t.requests
            );
        }
    }

    if !run.ceilings.is_empty() {
        let _ = writeln!(
            w,
            "\n## Apiserver write ceiling (raw Lease CAS, beside the throughput)\n\nAs many clients as the throughput run with as many locks (one per lock), each built like the product's and authenticated as a ServiceAccount of its own (as the claimants are), each looping read-modify-replace on a Lease of its own (none shared) as fast as answers come, for the same warm-up and window. Some ceilings are measured again with each Lease watched by as many watches as a lock has claimants in the throughput run (a field selector on its name, as a claimant watches its lock's Lease), so that every write is sent to that many watchers, and again with each watch also selecting a label that names it, which every write moves to the next watch (\"by holder label\": each write is sent to the watch it leaves and the one it enters, as a lock's changes would be if each claimant were sent only those of holds in its own name): the last column is that ceiling as a fraction of the one without watchers.\n\n| clients (one Lease each) | watchers per Lease | CAS writes/s | writes | window (s) | replace p50 / p99 (ms) | 409s | errors | apiserver writes/s (counters, background removed) | by kind per second | changes received per write | of the ceiling without watchers |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|"
        );
        for c in &run.ceilings {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {:.1} | {} / {} | {} | {}{} | {} | {} | {} | {} |",
                c.clients,
                match c.selection {
                    crate::ceiling::Selection::Holder => format!("{} by holder label", c.watchers_per_lease),
                    crate::ceiling::Selection::Name => c.watchers_per_lease.to_string(),
                },
                num(c.per_second),
                c.writes,
                c.seconds,
                num(c.cas_ms.p50),
                num(c.cas_ms.p99),
                c.conflicts,
                c.errors,
                c.first_error.as_ref().map_or(String::new(), |e| format!(" (e.g. {})", e.replace('|', "\\|"))),
                num(c.apiserver_writes_per_second),
                c.breakdown,
                num(c.watch_events_per_write),
                match (c.watchers_per_lease, run.ceiling(c.clients)) {
                    (0, _) | (_, None) => "—".to_owned(),
                    (_, Some(bare)) => format!("{:.0} %", c.per_second * 100.0 / bare.per_second),
                }
            );
        }
    }

    cpu_table(w, run);
    crate::report_profile::table(w, run);
    crate::report_ceiling::table(w, run);
    crate::report_costs::tables(w, run);

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

/// Where the CPU went in each ceiling and throughput window.
fn cpu_table(w: &mut String, run: &Run) {
    let Some(cpus) = run.ceilings.iter().map(|c| c.cpu.cpus).chain(run.throughput.iter().map(|t| t.cpu.cpus)).next()
    else {
        return;
    };
    let _ = writeln!(
        w,
        "\n## Where the CPU goes (ceiling and throughput windows)\n\nEach process's CPU time (`utime + stime` of `/proc/<pid>/stat`) in the measuring window, as a percentage of one CPU: this machine has {cpus}, so {} % is all of it. \"bench\" is this process: the throughput run's claimants or the ceiling's clients. \"rest\" is what none of these used: idle, the kernel, the controller-manager, the idle sidecars. The last column is the apiserver's CPU time per grant (throughput) or per successful CAS write (ceiling).\n\n| window | kube-apiserver | etcd | controller | bench | rest | apiserver CPU per grant or write (ms) |\n|---|--:|--:|--:|--:|--:|--:|",
        cpus * 100
    );
    let rows = run
        .ceilings
        .iter()
        .map(|c| (c.label(), &c.cpu, c.writes))
        .chain(run.throughput.iter().map(|t| (window_label(t), &t.cpu, t.cycles)));
    for (what, cpu, done) in rows {
        let pct = |name: &str| cpu.percent(name).map_or("—".into(), |p| format!("{p:.0} %"));
        let used: f64 = cpu.processes.iter().map(|(_, s)| s).sum::<f64>() * 100.0 / cpu.seconds;
        let per = cpu.ms_per("kube-apiserver", done).map_or("—".into(), num);
        let _ = writeln!(
            w,
            "| {what} | {} | {} | {} | {} | {:.0} % | {per} |",
            pct("kube-apiserver"),
            pct("etcd"),
            pct("controller"),
            pct("bench (claimants or clients)"),
            (cpus * 100) as f64 - used
        );
    }
}

/// How the report names a throughput run's window: "throughput, 100 × 10 (10 permits)".
pub fn window_label(t: &crate::record::Throughput) -> String {
    format!("throughput, {} × {}{}", t.locks, t.clients_per_lock, shape(t))
}

/// A throughput row's locks, when they are not mutexes: " (10 permits)", " (10 permits,
/// 3 writing)".
pub fn shape(t: &crate::record::Throughput) -> String {
    match (t.permits, t.writers_per_lock) {
        (1, 0) => String::new(),
        (p, 0) => format!(" ({p} permits)"),
        (p, w) => format!(" ({p} permits, {w} writing)"),
    }
}
