//! What the bench reads without touching the system under test: the apiserver's own
//! request counters (`apiserver_request_total`, scraped from `/metrics` with the admin
//! token), resident memory of a process (`/proc/<pid>/status`), and the latest state of
//! one object (a watch).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::Serialize;
use tokio::sync::watch;

use crate::record::Memory;

/// Verbs that change stored state (`APPLY` is server-side apply).
const WRITE_VERBS: [&str; 6] = ["POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"];

/// Resources that accept POST but store nothing (reviews), and the TokenRequest
/// subresource: requests, not writes.
const NOT_STORED: [&str; 6] = [
    "selfsubjectreviews",
    "selfsubjectaccessreviews",
    "selfsubjectrulesreviews",
    "subjectaccessreviews",
    "localsubjectaccessreviews",
    "tokenreviews",
];

/// `apiserver_request_total`, keyed by `(verb, resource[/subresource], code)`.
#[derive(Clone, Debug, Default)]
pub struct Requests(BTreeMap<(String, String, String), f64>);

/// Scrapes the apiserver's `/metrics` (the client must be allowed to: the admin is).
pub async fn scrape(client: &kube::Client) -> anyhow::Result<Requests> {
    let request = hyper::Request::get("/metrics").body(Vec::new()).context("failed to build a /metrics request")?;
    let text = client.request_text(request).await.context("failed to scrape the apiserver's /metrics")?;
    let mut counts = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let labels = parse_labels(labels.trim_start_matches("apiserver_request_total"));
        let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
        if !get("dry_run").is_empty() {
            continue;
        }
        let resource = match get("subresource").as_str() {
            "" => get("resource"),
            sub => format!("{}/{sub}", get("resource")),
        };
        *counts.entry((get("verb"), resource, get("code"))).or_insert(0.0) += value;
    }
    Ok(Requests(counts))
}

/// `{a="x",b="y"}` → map. Values are quoted; escaped quotes are honoured.
fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let body = s.trim().trim_start_matches('{').trim_end_matches('}');
    let mut chars = body.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect::<String>().trim_matches(',').to_owned();
        if key.is_empty() || chars.next() != Some('"') {
            break;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.extend(chars.next()),
                '"' => break,
                c => value.push(c),
            }
        }
        out.insert(key, value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    out
}

impl Requests {
    /// Every request in `self - before` (reads, watches and refusals too; reviews and
    /// TokenRequests left out, as for writes), by `VERB resource code`. A WATCH counts when
    /// it ends.
    pub fn since(&self, before: &Requests) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for ((verb, resource, code), value) in &self.0 {
            let delta = value - before.0.get(&(verb.clone(), resource.clone(), code.clone())).copied().unwrap_or(0.0);
            let stored = !NOT_STORED.contains(&resource.as_str()) && !resource.ends_with("/token");
            if delta > 0.0 && stored {
                let resource = if resource.is_empty() { "(no resource)" } else { resource.as_str() };
                *out.entry(format!("{verb} {resource} {code}")).or_insert(0.0) += delta;
            }
        }
        out
    }
}

/// `key n, ...` of `counts`, largest first, each divided by `per`.
pub fn per_kind(counts: &BTreeMap<String, f64>, per: f64) -> String {
    let mut items: Vec<(&String, &f64)> = counts.iter().collect();
    items.sort_by(|a, b| b.1.total_cmp(a.1));
    let parts: Vec<String> = items.iter().map(|(k, v)| format!("{k} {}", round2(**v / per))).collect();
    if parts.is_empty() { "none".to_owned() } else { parts.join(", ") }
}

/// Write requests between two scrapes, by `VERB resource`, split by outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Writes {
    /// Successful writes (2xx) by `VERB resource`.
    pub ok: BTreeMap<String, f64>,
    /// Compare-and-swap conflicts (409) by `VERB resource`.
    pub conflicts: BTreeMap<String, f64>,
    /// Other failed writes by `VERB resource code`.
    pub failed: BTreeMap<String, f64>,
    /// Window length in seconds.
    pub seconds: f64,
}

impl Writes {
    /// The write requests in `after - before` over a window of `seconds`.
    pub fn between(before: &Requests, after: &Requests, seconds: f64) -> Writes {
        let mut w = Writes { seconds, ..Writes::default() };
        for ((verb, resource, code), value) in &after.0 {
            let delta = value - before.0.get(&(verb.clone(), resource.clone(), code.clone())).copied().unwrap_or(0.0);
            let stored = !NOT_STORED.contains(&resource.as_str()) && !resource.ends_with("/token");
            if delta <= 0.0 || !WRITE_VERBS.contains(&verb.as_str()) || !stored {
                continue;
            }
            let key = format!("{verb} {resource}");
            match code.as_str() {
                c if c.starts_with('2') => *w.ok.entry(key).or_insert(0.0) += delta,
                "409" => *w.conflicts.entry(key).or_insert(0.0) += delta,
                c => *w.failed.entry(format!("{key} {c}")).or_insert(0.0) += delta,
            }
        }
        w
    }

    /// Adds the writes of another window (the rounds of one measurement).
    pub fn add(&mut self, other: &Writes) {
        for (mine, theirs) in
            [(&mut self.ok, &other.ok), (&mut self.conflicts, &other.conflicts), (&mut self.failed, &other.failed)]
        {
            for (key, value) in theirs {
                *mine.entry(key.clone()).or_insert(0.0) += value;
            }
        }
        self.seconds += other.seconds;
    }

    /// Successful writes in all.
    pub fn total(&self) -> f64 {
        // An empty f64 sum is -0.0; add 0.0 so that it prints as 0.
        self.ok.values().sum::<f64>() + 0.0
    }

    /// Compare-and-swap conflicts (409) in all.
    pub fn conflicts_total(&self) -> f64 {
        self.conflicts.values().sum::<f64>() + 0.0
    }

    /// These writes less what `background` (a quiet window) would have written in the same
    /// time, per kind, never below zero.
    pub fn less_background(&self, background: &Writes) -> Writes {
        let scale = if background.seconds > 0.0 { self.seconds / background.seconds } else { 0.0 };
        let mut expected = background.clone();
        expected.ok.values_mut().for_each(|v| *v *= scale);
        self.less(&expected)
    }

    /// These writes less `other` (writes of the same window that are not the ones
    /// measured), per kind, never below zero.
    pub fn less(&self, other: &Writes) -> Writes {
        let mut out = self.clone();
        for (key, value) in out.ok.iter_mut() {
            *value = (*value - other.ok.get(key).copied().unwrap_or(0.0)).max(0.0);
        }
        out.ok.retain(|_, v| *v > 0.0);
        out
    }

    /// `VERB resource n, ...`, largest first, each divided by `per`.
    pub fn breakdown(&self, per: f64) -> String {
        per_kind(&self.ok, per)
    }
}

/// Rounds to two decimals.
pub fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// Resident memory of process `pid` now, from `/proc/<pid>/status`, as a record.
pub fn memory(pid: u32, what: &str, params: serde_json::Value) -> anyhow::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("failed to read /proc/{pid}/status ({what})"))?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(Memory {
        what: what.to_owned(),
        rss_kib: field("VmRSS:"),
        peak_kib: field("VmHWM:"),
        anon_kib: field("RssAnon:"),
        file_kib: field("RssFile:"),
        params,
    })
}

/// The latest state of one object, from a watch, with the instant it arrived.
pub struct Latest<K> {
    rx: watch::Receiver<Option<(Instant, K)>>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Latest<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    /// Starts watching object `name` of `api`.
    pub fn start(api: Api<K>, name: &str) -> Latest<K> {
        let (tx, rx) = watch::channel(None);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, config).default_backoff().applied_objects().boxed();
            while let Some(event) = stream.next().await {
                if let Ok(object) = event {
                    tx.send_replace(Some((Instant::now(), object)));
                }
            }
        });
        Latest { rx, task }
    }

    /// The latest state, if any arrived yet.
    pub fn get(&self) -> Option<K> {
        self.rx.borrow().as_ref().map(|(_, k)| k.clone())
    }

    /// Waits until the latest state satisfies `condition`; fails after `timeout` naming `what`.
    pub async fn wait(
        &self,
        what: &str,
        timeout: Duration,
        condition: impl Fn(&K) -> bool,
    ) -> anyhow::Result<(Instant, K)> {
        let mut rx = self.rx.clone();
        let found = tokio::time::timeout(timeout, rx.wait_for(|v| v.as_ref().is_some_and(|(_, k)| condition(k))))
            .await
            .with_context(|| format!("timed out after {timeout:?} waiting for {what}"))?
            .with_context(|| format!("the watch ended while waiting for {what}"))?;
        Ok(found.clone().expect("the condition saw a value"))
    }
}

impl<K> Drop for Latest<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every change (a new resourceVersion) of the objects named `names`, as a watch of `api`
/// delivers it during `window`: when each arrived, per name. Counted on the objects
/// themselves, so nothing else the apiserver does in the window enters the count.
pub async fn changes<K>(api: Api<K>, names: &[String], window: Duration) -> BTreeMap<String, Vec<Instant>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    let mut seen: BTreeMap<String, (Option<String>, Vec<Instant>)> =
        names.iter().map(|n| (n.clone(), (None, Vec::new()))).collect();
    let mut stream = watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
    let _ = tokio::time::timeout(window, async {
        while let Some(Ok(object)) = stream.next().await {
            let Some((version, times)) = object.meta().name.as_ref().and_then(|n| seen.get_mut(n)) else { continue };
            let current = object.meta().resource_version.clone();
            // The watch's first listing shows each object once: a state, not a change.
            if version.is_some() && *version != current {
                times.push(Instant::now());
            }
            *version = current;
        }
    })
    .await;
    seen.into_iter().map(|(name, (_, times))| (name, times)).collect()
}

/// The mean time between consecutive changes over every object in `changes` (`None` with
/// fewer than two changes of any one object).
pub fn mean_interval(changes: &BTreeMap<String, Vec<Instant>>) -> Option<Duration> {
    let (total, n) = changes.values().filter(|t| t.len() >= 2).fold((Duration::ZERO, 0u32), |(total, n), t| {
        (total + (t[t.len() - 1] - t[0]), n + u32::try_from(t.len() - 1).unwrap_or(u32::MAX))
    });
    (n > 0).then(|| total / n)
}

/// How many files this process has open now (sockets included).
pub fn open_files() -> std::io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/fd")?.count())
}

/// Waits until this process has at most `most` files open, checking every 100 ms, for at
/// most `limit`. Returns how long that took, or `None` if they were still open at the end.
/// A process at its limit cannot open its fd directory to count: that counts as open.
pub async fn files_closed(most: usize, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    loop {
        if open_files().is_ok_and(|n| n <= most) {
            return Some(started.elapsed());
        }
        if started.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `claims` LockClaims have been created since `before`, checking the
/// apiserver's counters every second: with thousands of claimants starting at once, the
/// apiserver's priority and fairness turns most of their first requests away and they try
/// again, so their first claims come in over many seconds. Returns how long after
/// `started` the count was reached, or `None` once `limit` has passed since then.
pub async fn claims_created(
    admin: &kube::Client,
    (before, started): (&Requests, Instant),
    claims: usize,
    limit: Duration,
) -> anyhow::Result<Option<Duration>> {
    loop {
        let created = scrape(admin).await?.since(before).get("POST lockclaims 201").copied().unwrap_or(0.0);
        if created >= claims as f64 {
            return Ok(Some(started.elapsed()));
        }
        if started.elapsed() >= limit {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A measuring window over loops already running in `tasks`: waits `warmup`, scrapes the
/// apiserver's counters and reads `meter`'s processes' CPU time at both ends of `window`,
/// then sets `stop` and gives the loops `drain` to end (aborting them after that). Returns
/// the two scrapes, when they were taken, and the CPU time spent between them (with the
/// apiserver's CPU by area when the meter takes profiles: the profile is named `label`).
pub async fn window<T: 'static>(
    admin: &kube::Client,
    meter: &crate::cpu::Meter,
    label: &str,
    (warmup, window): (Duration, Duration),
    stop: &std::sync::atomic::AtomicBool,
    tasks: &mut tokio::task::JoinSet<T>,
    drain: Duration,
) -> anyhow::Result<((Requests, Instant), (Requests, Instant), crate::cpu::Usage)> {
    tokio::time::sleep(warmup).await;
    let before = (scrape(admin).await?, Instant::now());
    let cpu_before = (meter.mark(), Instant::now());
    let profile = meter.profile(label, window);
    tokio::time::sleep(window).await;
    let cpu_after = (meter.mark(), Instant::now());
    let after = (scrape(admin).await?, Instant::now());
    let mut cpu = meter.usage(&cpu_before.0, &cpu_after.0, (cpu_after.1 - cpu_before.1).as_secs_f64());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let drained = tokio::time::timeout(drain, async { while tasks.join_next().await.is_some() {} }).await.is_ok();
    if !drained {
        tasks.abort_all();
    }
    // Read after the window and its drain, so that reading it costs the window nothing.
    if let Some(profile) = profile {
        let file = profile.await.context("the apiserver's profile task")??;
        cpu.apiserver = Some(leasehold_harness::profile::areas(file).await?);
    }
    Ok((before, after, cpu))
}
