//! The peer programs (bench/peers): where `bench/prepare.sh` built them, and running one
//! to its single JSON result.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Deserialize;
use serde_json::Value;

use crate::record::{Panel, Series};

/// The built peer programs.
#[derive(Clone, Debug)]
pub struct Bins {
    /// Go: client-go leader election, etcd concurrency, floors.
    pub peers: PathBuf,
    /// Rust: kube-lease-manager.
    pub rust_peer: PathBuf,
}

impl Bins {
    /// The programs in `dir` (as `bench/prepare.sh` leaves them); fails if one is missing.
    pub fn in_dir(dir: &Path) -> anyhow::Result<Bins> {
        let bins = Bins { peers: dir.join("peers"), rust_peer: dir.join("rust-peer") };
        for bin in [&bins.peers, &bins.rust_peer] {
            if !bin.is_file() {
                bail!("peer program {} is missing: run bench/prepare.sh", bin.display());
            }
        }
        Ok(bins)
    }
}

/// Where and how the peer programs run: against this run's control plane and etcd.
pub struct Peers {
    /// The programs.
    pub bins: Bins,
    /// The admin kubeconfig.
    pub kubeconfig: String,
    /// A namespace of their own.
    pub namespace: String,
    /// The apiserver's etcd.
    pub etcd: String,
    /// Where their stderr goes, one file per run.
    pub logs: PathBuf,
}

impl Peers {
    /// Runs `peers <sub>` (or `rust-peer <sub>` for `handoff`/`failover`) with `samples`
    /// and `extra` flags; stderr to `logs/<log>.log`.
    pub async fn run(&self, sub: &str, samples: usize, extra: &[&str], log: &str) -> anyhow::Result<Output> {
        let mut args = vec![sub.to_owned(), "--samples".to_owned(), samples.to_string()];
        if sub.starts_with("etcd") {
            args.extend(["--endpoints".to_owned(), self.etcd.clone()]);
        } else {
            args.extend(["--kubeconfig", &self.kubeconfig, "--namespace", &self.namespace].map(str::to_owned));
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let bin = if matches!(sub, "handoff" | "failover") { &self.bins.rust_peer } else { &self.bins.peers };
        // Each run is bounded by its own sample count; this only stops a hung one.
        run(bin, &args, &self.logs.join(format!("{log}.log")), Duration::from_secs(900)).await
    }
}

/// What a peer program prints: one JSON object.
#[derive(Clone, Debug, Deserialize)]
pub struct Output {
    /// `<library>@<version>`.
    pub peer: String,
    /// `handoff`, `failover`, `put` or `lease-cas`.
    pub scenario: String,
    /// Samples, ms.
    pub samples_ms: Vec<f64>,
    /// Timings and choices in force.
    pub params: Value,
}

impl Output {
    /// As a series with `key`, `title` and plot `panel`.
    pub fn series(mut self, key: &str, title: &str, panel: Panel) -> Series {
        if let Some(params) = self.params.as_object_mut() {
            params.insert("scenario".into(), Value::String(self.scenario));
        }
        Series::new(key, title, &self.peer, panel, self.samples_ms, self.params)
    }
}

/// Runs `bin args...` (stderr to `log`), up to `timeout`; parses its JSON result.
async fn run(bin: &Path, args: &[String], log: &Path, timeout: Duration) -> anyhow::Result<Output> {
    let what = format!("{} {}", bin.file_name().unwrap_or_default().to_string_lossy(), args.join(" "));
    let stderr = std::fs::File::create(log).with_context(|| format!("failed to create {}", log.display()))?;
    let child = tokio::process::Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("failed to start {what}"))?;
    let output = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .with_context(|| format!("{what} did not finish within {timeout:?} (log: {})", log.display()))?
        .with_context(|| format!("failed to wait for {what}"))?;
    if !output.status.success() {
        bail!("{what} failed with {} (log: {})", output.status, log.display());
    }
    serde_json::from_slice(&output.stdout).with_context(|| format!("{what} printed no JSON result"))
}
