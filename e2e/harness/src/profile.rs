//! Where kube-apiserver's CPU goes: a CPU profile taken from its `/debug/pprof/profile`
//! endpoint, read back with `go tool pprof -traces` (the Go toolchain that builds the
//! control plane), and every sampled stack put in one area by the frames it holds.

use std::path::PathBuf;

use anyhow::{Context as _, ensure};
use futures::AsyncReadExt as _;
use serde::Serialize;

/// The areas, in the order the report shows them. A stack belongs to the first whose rule
/// it meets, so the shares of one profile add up to 100 %.
pub const AREAS: [&str; 6] = [
    "watch: events sent to watchers",
    "watch cache: changes read from etcd",
    "writes: storage work",
    "etcd client",
    "Go GC, background",
    "rest of each request",
];

/// The area a watcher's events are sent in: what each watch costs.
pub const WATCH: &str = AREAS[0];

/// Go's CPU profiles keep at most this many frames of a stack, the innermost: a deeper
/// stack loses its outermost frames (the goroutine's start, the request's handler).
pub const MAX_FRAMES: usize = 64;

/// Frames of a write's storage work: the finisher's goroutine that runs it, the generic
/// and custom-resource stores, etcd's transactions and managed fields. A stack cut at
/// [`MAX_FRAMES`] keeps the innermost of them, so each is matched, not only the outermost.
const STORAGE: [&str; 11] = [
    "finisher.finishRequest",
    "registry.(*Store).Update",
    "registry.(*Store).Create",
    "registry.(*Store).Delete",
    "customresource.(*REST)",
    "customresource.(*StatusREST)",
    "etcd3.(*store).GuaranteedUpdate",
    "etcd3.(*store).Create",
    "etcd3.(*store).conditionalDelete",
    "managedfields",
    "structured-merge-diff",
];

/// The area of a sampled stack, by the frames it holds (innermost first, as pprof prints
/// them). Watches first: a watcher's goroutine serves its events and nothing else. Then a
/// write's storage work (admission, validation, managed fields, decoding and encoding the
/// object, the etcd transaction), which the apiserver runs on a goroutine of its own. What
/// is left of a request (authentication, authorization, priority and fairness, reading
/// the body, reads from the watch cache, writing the answer over TLS) runs on the
/// connection's goroutines.
pub fn area(frames: &[&str]) -> &'static str {
    let has = |needle: &str| frames.iter().any(|f| f.contains(needle));
    if has("WatchServer).HandleHTTP") || has("cacher.(*cacheWatcher)") || has("Cacher).dispatchEvent") {
        return AREAS[0];
    }
    if has("etcd3.(*watchChan)") || has("cacher.(*watchCache)") || has("Cacher).processEvent") {
        return AREAS[1];
    }
    if STORAGE.iter().any(|f| has(f)) {
        return AREAS[2];
    }
    if has("google.golang.org/grpc") || has("go.etcd.io/etcd/client") {
        return AREAS[3];
    }
    if has("runtime.gcBgMarkWorker") || has("runtime.bgsweep") || has("runtime.bgscavenge") {
        return AREAS[4];
    }
    AREAS[5]
}

/// The samples of `go tool pprof -traces` output: each stack's CPU seconds and its frames,
/// innermost first. Blocks are separated by a line of dashes with a `+`; a block's first
/// line carries the value before the innermost frame.
pub fn traces(text: &str) -> anyhow::Result<Vec<(f64, Vec<&str>)>> {
    let mut samples = Vec::new();
    for block in text.split('\n').collect::<Vec<_>>().split(|l| l.starts_with("---") && l.contains('+')).skip(1) {
        let mut lines = block.iter().filter(|l| !l.trim().is_empty());
        let Some(first) = lines.next() else { continue };
        let mut words = first.split_whitespace();
        let (Some(value), Some(frame)) = (words.next(), words.next()) else {
            anyhow::bail!("a pprof trace that does not start with a value and a frame: {first:?}");
        };
        let frames = std::iter::once(frame).chain(lines.map(|l| l.trim())).collect();
        samples.push((seconds(value)?, frames));
    }
    Ok(samples)
}

/// `10ms`, `1.20s`, `250us`, `2.50mins` as seconds.
fn seconds(value: &str) -> anyhow::Result<f64> {
    let split = value.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().with_context(|| format!("{value:?} is not a pprof duration"))?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "mins" => 60.0,
        "hrs" => 3600.0,
        _ => anyhow::bail!("{value:?} is not a pprof duration (unit {unit:?})"),
    };
    Ok(number * scale)
}

/// One window's profile, by area.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Areas {
    /// The profile as taken (gzipped protobuf), for `go tool pprof`.
    pub file: PathBuf,
    /// CPU seconds sampled.
    pub sampled_s: f64,
    /// CPU seconds by area, in the order of [`AREAS`].
    pub seconds: Vec<(String, f64)>,
    /// CPU seconds of stacks cut at [`MAX_FRAMES`]: placed by the frames they kept.
    pub cut_s: f64,
}

impl Areas {
    /// Samples `(seconds, frames)` summed by area.
    pub fn of(file: PathBuf, samples: &[(f64, Vec<&str>)]) -> Areas {
        let seconds = AREAS
            .iter()
            .map(|a| ((*a).to_owned(), samples.iter().filter(|(_, f)| area(f) == *a).fold(0.0, |t, (s, _)| t + s)))
            .collect();
        let cut_s = samples.iter().filter(|(_, f)| f.len() >= MAX_FRAMES).fold(0.0, |t, (s, _)| t + s);
        Areas { file, sampled_s: samples.iter().fold(0.0, |t, (s, _)| t + s), seconds, cut_s }
    }

    /// Area `name`'s CPU seconds.
    pub fn seconds_of(&self, name: &str) -> Option<f64> {
        self.seconds.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }

    /// Area `name`'s share of the samples, percent.
    pub fn percent(&self, name: &str) -> Option<f64> {
        self.seconds_of(name).filter(|_| self.sampled_s > 0.0).map(|s| s * 100.0 / self.sampled_s)
    }

    /// The share of the samples whose stacks were cut at [`MAX_FRAMES`], percent.
    pub fn cut_percent(&self) -> Option<f64> {
        (self.sampled_s > 0.0).then(|| self.cut_s * 100.0 / self.sampled_s)
    }
}

/// A CPU profile of the kube-apiserver `client` talks to, sampled for `seconds` from its
/// `/debug/pprof/profile` endpoint (the client needs the right to `get` that path): the
/// gzipped protobuf `go tool pprof` reads. It returns once the apiserver has sampled.
pub async fn apiserver_cpu_profile(client: &kube::Client, seconds: u64) -> anyhow::Result<Vec<u8>> {
    let request = http::Request::get(format!("/debug/pprof/profile?seconds={seconds}"))
        .body(Vec::new())
        .context("a profile request")?;
    let mut body = client.request_stream(request).await.context("failed to ask kube-apiserver for a CPU profile")?;
    let mut profile = Vec::new();
    body.read_to_end(&mut profile).await.context("failed to read kube-apiserver's CPU profile")?;
    Ok(profile)
}

/// The profile in `file`, by area: `go tool pprof -traces` reads it.
pub async fn areas(file: PathBuf) -> anyhow::Result<Areas> {
    let out = tokio::process::Command::new("go")
        .args(["tool", "pprof", "-traces"])
        .arg(&file)
        .output()
        .await
        .context("failed to run go tool pprof")?;
    ensure!(
        out.status.success(),
        "go tool pprof -traces {} failed: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let samples = traces(&text).with_context(|| format!("reading go tool pprof -traces {}", file.display()))?;
    ensure!(!samples.is_empty(), "the CPU profile {} holds no samples", file.display());
    Ok(Areas::of(file, &samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACES: &str = "File: kube-apiserver
Type: cpu
Duration: 15.02s, Total samples = 18.96s (126.20%)
-----------+-------------------------------------------------------
      10ms   runtime.memmove
             k8s.io/apimachinery/pkg/util/managedfields/internal.(*FieldManager).Update
             k8s.io/apiserver/pkg/endpoints/handlers.UpdateResource.func1.5
             k8s.io/apiserver/pkg/endpoints/handlers/finisher.finishRequest.func1
-----------+-------------------------------------------------------
     1.20s   crypto/tls.(*Conn).write
             k8s.io/apiserver/pkg/endpoints/handlers.(*WatchServer).HandleHTTP
-----------+-------------------------------------------------------
      30ms   runtime.scanObject
             runtime.gcBgMarkWorker
-----------+-------------------------------------------------------
      20ms   encoding/json.(*decodeState).object
             k8s.io/apiserver/pkg/server.director.ServeHTTP
-----------+-------------------------------------------------------
";

    #[test]
    fn traces_read_each_block_value_and_frames() {
        let samples = traces(TRACES).unwrap();
        assert_eq!(samples.len(), 4);
        assert!((samples[0].0 - 0.010).abs() < 1e-12);
        assert_eq!(samples[0].1.len(), 4);
        assert_eq!(samples[0].1[0], "runtime.memmove");
        assert!((samples[1].0 - 1.2).abs() < 1e-12);
    }

    #[test]
    fn each_stack_falls_in_the_area_its_frames_name() {
        let samples = traces(TRACES).unwrap();
        let got: Vec<&str> = samples.iter().map(|(_, f)| area(f)).collect();
        assert_eq!(got, [AREAS[2], AREAS[0], AREAS[4], AREAS[5]]);
    }

    #[test]
    fn storage_work_is_known_by_its_innermost_frames_too() {
        // Stacks cut at the profile's depth lose the finisher's goroutine start; the frames
        // they keep still say what they were doing.
        let table = [
            ("k8s.io/apiserver/pkg/endpoints/handlers/finisher.finishRequest.func1", AREAS[2]),
            ("k8s.io/apiserver/pkg/registry/generic/registry.(*Store).Update", AREAS[2]),
            ("k8s.io/apiextensions-apiserver/pkg/registry/customresource.(*StatusREST).Update", AREAS[2]),
            ("k8s.io/apiserver/pkg/storage/etcd3.(*store).conditionalDelete", AREAS[2]),
            ("sigs.k8s.io/structured-merge-diff/v6/typed.handleAtom", AREAS[2]),
            ("k8s.io/apiserver/pkg/storage/etcd3.(*watchChan).serialProcessEvents", AREAS[1]),
            ("k8s.io/apiserver/pkg/storage/cacher.(*cacheWatcher).processInterval", AREAS[0]),
            ("google.golang.org/grpc/internal/transport.(*http2Client).reader", AREAS[3]),
            ("k8s.io/apiserver/pkg/endpoints/filters.withAuthentication.func1", AREAS[5]),
        ];
        for (frame, want) in table {
            assert_eq!(area(&["runtime.mallocgc", frame]), want, "{frame}");
        }
        // A watcher's goroutine encodes objects too: it is the watch's, not a write's.
        let watch = [
            "encoding/json.(*encodeState).marshal",
            "k8s.io/apiserver/pkg/endpoints/handlers.(*WatchServer).HandleHTTP",
        ];
        assert_eq!(area(&watch), WATCH);
    }

    #[test]
    fn shares_add_up_to_the_samples() {
        let samples = traces(TRACES).unwrap();
        let areas = Areas::of(PathBuf::from("p.pb.gz"), &samples);
        assert!((areas.sampled_s - 1.26).abs() < 1e-9);
        let total: f64 = AREAS.iter().filter_map(|a| areas.percent(a)).sum();
        assert!((total - 100.0).abs() < 1e-9, "{total}");
        assert!((areas.percent(WATCH).unwrap() - 1.2 / 1.26 * 100.0).abs() < 1e-9);
        // An area without samples reads a plain zero (an empty float sum is -0.0).
        assert!(areas.percent(AREAS[3]).unwrap().is_sign_positive());
        assert_eq!(areas.cut_percent(), Some(0.0));
    }

    #[test]
    fn stacks_as_deep_as_the_profile_keeps_are_counted_as_cut() {
        let deep: Vec<&str> =
            std::iter::repeat_n("sigs.k8s.io/structured-merge-diff/v6/typed.handleAtom", MAX_FRAMES).collect();
        let areas = Areas::of(PathBuf::from("p.pb.gz"), &[(0.03, deep), (0.01, vec!["runtime.memmove"])]);
        assert!((areas.cut_percent().unwrap() - 75.0).abs() < 1e-9);
        assert!((areas.percent(AREAS[2]).unwrap() - 75.0).abs() < 1e-9);
    }

    #[test]
    fn a_value_without_a_known_unit_is_refused() {
        assert!(seconds("10ms").is_ok());
        assert!(seconds("2.50mins").is_ok());
        let err = seconds("10parsecs").unwrap_err().to_string();
        assert!(err.contains("10parsecs"), "{err}");
        assert!(traces("-----------+----\n   frame-without-value\n").is_err());
    }
}
