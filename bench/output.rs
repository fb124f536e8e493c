//! The run's edges: preparing the builds, the facts a report records (versions, machine,
//! plan), the notes a reader needs, and writing `raw.json`, the plot and `report.md`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;
use serde_json::json;

use crate::plan::Plan;
use crate::record::Run;
use crate::slow::LEASE_MS;
use crate::{report, say, support};

/// Writes raw.json, the plot and report.md; prints the report's path.
pub async fn finish(mut run: Run, out: &Path, logs: &Path, began: Instant, measured: Instant) -> anyhow::Result<bool> {
    run.facts
        .insert("measured run wall time (s)".into(), json!((measured.elapsed().as_secs_f64() * 10.0).round() / 10.0));
    run.facts.insert("loadavg_end".into(), json!(loadavg()));
    notes(&mut run);
    let ratios = report::ratios(&run);
    let verdicts = report::verdicts(&run, &ratios, LEASE_MS);
    // plot.py reads the series from the top level.
    let plot_input = out.join("plot-input.json");
    std::fs::write(&plot_input, serde_json::to_vec(&json!({"series": &run.series, "facts": &run.facts}))?)?;
    let png = out.join("latency.png");
    let plotted = tokio::process::Command::new("bash")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/plot.sh"))
        .arg(&plot_input)
        .arg(&png)
        .status()
        .await
        .map(|s| s.success())
        .unwrap_or(false);
    if !plotted {
        run.failures.push("plot: bench/plot.sh failed (see its output above)".into());
    }
    let _ = std::fs::remove_file(&plot_input);
    let raw = out.join("raw.json");
    let document = json!({ "run": &run, "ratios": &ratios, "targets": &verdicts });
    std::fs::write(&raw, serde_json::to_vec_pretty(&document)?)
        .with_context(|| format!("failed to write {}", raw.display()))?;
    let markdown = report::markdown(&run, &ratios, &verdicts, LEASE_MS, plotted.then_some("latency.png"));
    let report = out.join("report.md");
    std::fs::write(&report, markdown).with_context(|| format!("failed to write {}", report.display()))?;
    say(
        began,
        &format!(
            "report: {} (raw: {}, plot: {}, peer logs: {})",
            report.display(),
            raw.display(),
            png.display(),
            logs.display()
        ),
    );
    // The verdicts on the terminal too, each met or missed and by how much.
    for v in &verdicts {
        let mark = match v.met {
            Some(true) => "MET",
            Some(false) => "MISSED",
            None if v.verdict == "reported" => "REPORTED",
            None => "NOT MEASURED",
        };
        println!("target {mark}: {} — {} — {}", v.target, v.verdict, v.measured);
    }
    for f in &run.failures {
        eprintln!("bench: FAILED: {f}");
    }
    Ok(run.failures.is_empty())
}

/// Runs bench/prepare.sh; returns the bench cache directory it prints.
pub fn prepare(repo: &Path) -> anyhow::Result<PathBuf> {
    let output = std::process::Command::new("bash")
        .arg(repo.join("bench/prepare.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("failed to run bench/prepare.sh")?;
    anyhow::ensure!(output.status.success(), "bench/prepare.sh failed with {}", output.status);
    Ok(PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn command_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim_end().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

/// The fact naming the binary the sidecars run, and its size.
pub const SIDECAR_BINARY_FACT: &str = "leasehold-sidecar binary (the sidecar alone)";

/// Versions, machine facts and the plan.
pub fn facts(run: &mut Run, repo: &Path, plan: &Plan) {
    let f = &mut run.facts;
    f.insert(
        "started_at".into(),
        json!(jiff::Timestamp::now().round(jiff::Unit::Second).map(|t| t.to_string()).unwrap_or_default()),
    );
    f.insert("profile".into(), json!(if plan.quick { "quick" } else { "full" }));
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().next().map(|l| l.split_whitespace().nth(1).unwrap_or("").to_owned()))
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or("unknown".into(), |kib| format!("{:.1} GiB", kib / 1024.0 / 1024.0));
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    f.insert(
        "machine".into(),
        json!({
            "nproc": nproc,
            "cpu": cpu,
            "memory": mem,
            "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
            "loadavg_start": loadavg(),
        }),
    );
    let git = command_line("git", &["-C", &repo.display().to_string(), "describe", "--always", "--dirty"]);
    f.insert(
        "leasehold".into(),
        json!(format!("{} ({git}), profile bench (= release settings)", env!("CARGO_PKG_VERSION"))),
    );
    // A shared work tree: say which uncommitted product changes the measured binary has.
    let dirty =
        command_line("git", &["-C", &repo.display().to_string(), "status", "--porcelain", "--", "src", "Cargo.toml"]);
    let dirty: Vec<&str> = dirty.lines().filter_map(|l| l.get(3..)).collect();
    f.insert(
        "uncommitted product changes built in".into(),
        json!(if dirty.is_empty() { "none".to_owned() } else { dirty.join(", ") }),
    );
    let lock = std::fs::read_to_string(repo.join("Cargo.lock")).unwrap_or_default();
    let crate_version = |name: &str| {
        let marker = format!("name = \"{name}\"\nversion = \"");
        lock.find(&marker)
            .map(|i| lock[i + marker.len()..].split('"').next().unwrap_or("").to_owned())
            .unwrap_or_default()
    };
    let gomod = std::fs::read_to_string(repo.join("e2e/controlplane/go.mod")).unwrap_or_default();
    let module = |name: &str| {
        gomod
            .lines()
            .find_map(|l| l.trim().strip_prefix(name).and_then(|v| v.split_whitespace().next()).map(str::to_owned))
            .unwrap_or_default()
    };
    f.insert(
        "versions".into(),
        json!({
            "kube-apiserver": module("k8s.io/kubernetes "),
            "etcd": module("go.etcd.io/etcd/server/v3 "),
            "kube (Rust)": crate_version("kube"),
            "rustc": command_line("rustc", &["--version"]),
            "go": command_line("go", &["version"]),
        }),
    );
    let binary_size = |bin: &str| {
        let size = std::fs::metadata(bin).map(|m| m.len()).unwrap_or(0);
        json!(format!("{:.2} MiB ({size} bytes), {bin}", size as f64 / 1024.0 / 1024.0))
    };
    f.insert("leasehold binary (controller, CLI, `run`)".into(), binary_size(support::leasehold_bin()));
    f.insert(SIDECAR_BINARY_FACT.into(), binary_size(support::sidecar_bin()));
    f.insert("plan".into(), serde_json::to_value(plan).unwrap_or_default());
}

/// What a reader should know to weigh the numbers.
fn notes(run: &mut Run) {
    run.notes.extend([
        "This machine is shared (2 cores; other builds and tests may run at the same time): compare numbers within this run, as ratios, not across runs. The load average at start and end is in the parameters.".to_owned(),
        "All components run on loopback on one 2-core machine: etcd (--unsafe-no-fsync, as the e2e harness runs it), kube-apiserver, kube-controller-manager, the Leasehold controller, sidecars, the peers and the bench itself compete for the same CPUs.".to_owned(),
        "The Lease guard (ValidatingAdmissionPolicy) and the webhooks are not installed: the harness's default, as in the e2e tests. In a cluster with the chart, every Lease write also pays a CEL evaluation.".to_owned(),
        "Sidecar latency includes a new loopback TCP connection per HTTP request (the bench's client), as a shell `curl` would.".to_owned(),
        "The peers' slow runs (client-go handoff/failover, etcd failover, kube-lease-manager handoff/failover) and Leasehold's crash failover run side by side in one block to fit the 20-minute budget: their numbers are dominated by timers (seconds), which the light concurrent load does not move measurably. Their sample counts are small (see n); p99 of such a series is its max.".to_owned(),
        "Memory: VmRSS = RssAnon + RssFile (+ RssShmem). RssFile is pages of the binary mapped into the process (the kernel maps neighbours of touched pages that are already in the page cache); in a cluster those pages are page cache shared by every container of the same image on a node, so RssAnon is the per-pod cost of a sidecar.".to_owned(),
        "Throughput claimants are in-process `Claimant`s (the API the sidecar wraps), outside any Pod, with one client per lock built like the sidecar's (`leasehold::kube_client`, TCP_NODELAY), each authenticated as a ServiceAccount of its own, as an app's pods are (the ceiling's clients too): 1,000 sidecar processes would not fit this machine. The admin's credentials would put their requests in the apiserver's `exempt` priority level, outside API Priority and Fairness, where no cluster's claimants run. They compete for CPU with the apiserver and the controller. Each waits for its grant as long as the run lasts: with 10 claimants on each of 1,000 locks a turn of the queue takes minutes, and one that gave up would claim again at the back.".to_owned(),
        "Writes are counted from the apiserver's own `apiserver_request_total` (verbs POST/PUT/PATCH/APPLY/DELETE, 2xx, excluding review and TokenRequest calls that store nothing); the background (apiserver and controller election Lease renewals) is measured first with no lock, and subtracted per kind in proportion to each window — except from the writes per uncontended cycle, where every write of another Lease during the cycles (election and identity renewals) is seen on a watch of all Leases and subtracted one by one.".to_owned(),
    ]);
}
