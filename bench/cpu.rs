//! CPU time a process spent (user + system: `utime + stime` of `/proc/<pid>/stat`), read
//! before and after each stretch of a measurement with a known number of grants: CPU
//! seconds per 1,000 grants, for the controller and for kube-apiserver.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use procfs::process::Process;
use serde_json::json;
use tokio::task::JoinHandle;

use crate::record::WriteCount;

/// `utime + stime` of `pid`, in seconds.
pub fn seconds(pid: u32) -> anyhow::Result<f64> {
    let stat =
        Process::new(pid as i32).and_then(|p| p.stat()).with_context(|| format!("failed to read /proc/{pid}/stat"))?;
    Ok((stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64)
}

/// The pid of the process named `comm` among `pids`.
pub fn find(pids: &[u32], comm: &str) -> Option<u32> {
    pids.iter().copied().find(|pid| Process::new(*pid as i32).and_then(|p| p.stat()).is_ok_and(|s| s.comm == comm))
}

/// CPU time of some processes over stretches of a measurement, and the grants made in them.
pub struct Tally {
    meter: Meter,
    /// CPU seconds of each of the meter's processes, summed over the stretches.
    used: Vec<f64>,
    grants: usize,
}

impl Tally {
    /// A tally of each `(name, pid)`, empty.
    pub fn new(processes: &[(&str, u32)]) -> Tally {
        Tally { meter: Meter::new(processes), used: vec![0.0; processes.len()], grants: 0 }
    }

    /// Each process's CPU time now, to pass to [`Self::add`] at the end of the stretch.
    pub fn mark(&self) -> anyhow::Result<Vec<f64>> {
        self.meter.processes.iter().map(|(_, pid)| seconds(*pid)).collect()
    }

    /// Adds the CPU time since `mark` and the `grants` made meanwhile.
    pub fn add(&mut self, mark: &[f64], grants: usize) -> anyhow::Result<()> {
        for (((_, pid), used), before) in self.meter.processes.iter().zip(&mut self.used).zip(mark) {
            *used += seconds(*pid)? - before;
        }
        self.grants += grants;
        Ok(())
    }

    /// One row per process: CPU seconds per 1,000 grants.
    pub fn rows(&self, what: &str) -> anyhow::Result<Vec<WriteCount>> {
        anyhow::ensure!(self.grants > 0, "no grants to divide the CPU time of {what} by");
        Ok(self
            .meter
            .processes
            .iter()
            .zip(&self.used)
            .map(|((name, pid), used)| WriteCount {
                what: format!("{name}: CPU seconds per 1,000 grants ({what})"),
                value: used * 1000.0 / self.grants as f64,
                unit: "CPU s/1,000 grants".into(),
                breakdown: format!("utime+stime {used:.2} s over {} grants", self.grants),
                params: json!({
                    "pid": pid,
                    "cpu_s": used,
                    "grants": self.grants,
                    "source": "/proc/<pid>/stat utime+stime, read before and after each stretch",
                    "includes": "the process's background work in those stretches (its own Lease renewals, watches)",
                }),
            })
            .collect())
    }
}

/// Processes whose CPU time is read at both ends of a measuring window, and where to keep
/// a CPU profile of the apiserver over each window, when one is wanted.
#[derive(Clone, Default)]
pub struct Meter {
    processes: Vec<(String, u32)>,
    profiles: Option<(kube::Client, PathBuf)>,
}

/// CPU time each process spent in one window.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Usage {
    /// The window, seconds.
    pub seconds: f64,
    /// CPUs of the machine.
    pub cpus: usize,
    /// (process, CPU seconds in the window).
    pub processes: Vec<(String, f64)>,
    /// The apiserver's CPU in the window by area, from a CPU profile, when one was taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub apiserver: Option<leasehold_harness::profile::Areas>,
}

impl Meter {
    /// A meter of each `(name, pid)`.
    pub fn new(processes: &[(&str, u32)]) -> Meter {
        Meter { processes: processes.iter().map(|(n, p)| ((*n).to_owned(), *p)).collect(), profiles: None }
    }

    /// Each process's CPU time now (a process gone since reads as none).
    pub fn mark(&self) -> Vec<Option<f64>> {
        self.processes.iter().map(|(_, pid)| seconds(*pid).ok()).collect()
    }

    /// The same meter, also taking a CPU profile of the apiserver `admin` talks to over each
    /// window, kept in `dir`.
    pub fn with_profiles(self, admin: &kube::Client, dir: &Path) -> Meter {
        Meter { profiles: Some((admin.clone(), dir.to_owned())), ..self }
    }

    /// Starts the apiserver's profile of the window `label` that begins now and lasts
    /// `window` (whole seconds): a task ending with the profile's file. None when the meter
    /// takes no profiles.
    pub fn profile(&self, label: &str, window: Duration) -> Option<JoinHandle<anyhow::Result<PathBuf>>> {
        let (admin, dir) = self.profiles.clone()?;
        let name: String = label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        let file = dir.join(name + ".pb.gz");
        let seconds = window.as_secs_f64().round().max(1.0) as u64;
        Some(tokio::spawn(async move {
            let profile = leasehold_harness::profile::apiserver_cpu_profile(&admin, seconds).await?;
            std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
            std::fs::write(&file, profile).with_context(|| format!("failed to write {}", file.display()))?;
            Ok(file)
        }))
    }

    /// The CPU time spent between `before` and `after`, marks taken `seconds` apart.
    pub fn usage(&self, before: &[Option<f64>], after: &[Option<f64>], seconds: f64) -> Usage {
        let processes = self
            .processes
            .iter()
            .zip(before.iter().zip(after))
            .filter_map(|((name, _), (b, a))| Some((name.clone(), (*a)? - (*b)?)))
            .collect();
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        Usage { seconds, cpus, processes, apiserver: None }
    }
}

impl Usage {
    /// Process `name`'s CPU seconds in the window, if it was measured.
    pub fn of(&self, name: &str) -> Option<f64> {
        self.processes.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }

    /// Process `name`'s CPU in the window as a percentage of one CPU.
    pub fn percent(&self, name: &str) -> Option<f64> {
        self.of(name).filter(|_| self.seconds > 0.0).map(|s| s * 100.0 / self.seconds)
    }

    /// Process `name`'s CPU milliseconds per one of `done` (grants, writes) in the window.
    pub fn ms_per(&self, name: &str, done: usize) -> Option<f64> {
        self.of(name).filter(|_| done > 0).map(|s| s * 1000.0 / done as f64)
    }
}
