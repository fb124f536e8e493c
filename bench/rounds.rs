//! Series measured in rounds: every round takes a slice of each series' samples, one after
//! the other in an order that rotates between rounds, so that every series sees the same
//! load over the run (not all of one series, then all of the next). The rounds' samples are
//! then joined, series by series.

use serde_json::json;

use crate::record::{Run, Series};

/// The samples of round `round` (of `rounds`) out of `total`: equal slices, the first
/// rounds taking one more when `total` does not divide evenly.
pub fn share(total: usize, rounds: usize, round: usize) -> usize {
    let rounds = rounds.max(1);
    total / rounds + usize::from(round < total % rounds)
}

/// The order of `n` series in round `round`: a rotation by the round's number.
pub fn order(n: usize, round: usize) -> Vec<usize> {
    (0..n).map(|i| (i + round) % n.max(1)).collect()
}

/// Joins the rounds' records: the samples of each series key concatenated in round order
/// (its parameters from the first round, with the number of rounds and the total count),
/// everything else kept as recorded.
pub fn join(rounds: Vec<Run>) -> Run {
    let count = rounds.len();
    let mut out = Run::default();
    let mut series: Vec<Series> = Vec::new();
    for mut round in rounds {
        for s in std::mem::take(&mut round.series) {
            match series.iter_mut().find(|t| t.key == s.key) {
                Some(t) => t.samples_ms.extend(s.samples_ms),
                None => series.push(s),
            }
        }
        out.merge(round);
    }
    for s in series {
        let mut params = s.params.clone();
        if let Some(p) = params.as_object_mut() {
            p.insert("samples".into(), json!(s.samples_ms.len()));
            p.insert("rounds".into(), json!(count));
            p.insert("interleaved".into(), json!("each round takes a share of every series, in a rotating order"));
        }
        out.series.push(Series::new(&s.key, &s.title, &s.subject, s.panel, s.samples_ms, params));
    }
    out
}
