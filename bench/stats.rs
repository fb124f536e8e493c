//! Summaries of latency samples: n, min, mean, p50/p95/p99 (linear interpolation between
//! order statistics, as numpy's default), max.

use serde::Serialize;

/// The summary of one series of samples.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Smallest.
    pub min: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// The `q`-quantile (0..=1) of sorted samples, interpolating linearly.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let rank = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

impl Summary {
    /// Summarises `samples` (NaN fields when empty).
    pub fn of(samples: &[f64]) -> Summary {
        let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
        sorted.sort_by(f64::total_cmp);
        if sorted.is_empty() {
            let nan = f64::NAN;
            return Summary { n: 0, min: nan, mean: nan, p50: nan, p95: nan, p99: nan, max: nan };
        }
        Summary {
            n: sorted.len(),
            min: sorted[0],
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
            p50: quantile(&sorted, 0.50),
            p95: quantile(&sorted, 0.95),
            p99: quantile(&sorted, 0.99),
            max: sorted[sorted.len() - 1],
        }
    }
}

/// Milliseconds in `d`, to the microsecond.
pub fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Milliseconds from `a` to `b` (negative if `b` came first).
pub fn ms_between(a: std::time::Instant, b: std::time::Instant) -> f64 {
    if b >= a { ms(b - a) } else { -ms(a - b) }
}

/// Milliseconds from wall-clock instant `a` to `b` (negative if `b` is earlier).
pub fn wall_ms(a: jiff::Timestamp, b: jiff::Timestamp) -> f64 {
    b.duration_since(a).as_secs_f64() * 1000.0
}
