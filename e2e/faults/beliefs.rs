//! Beliefs: when each app believed it held a lock, computed from what it was told.
//!
//! A belief of app A in token T starts when A receives the grant (an acquire answer, a
//! hold-mode app finding a new token, a `leasehold run` command's first write) and ends at
//! the earliest of:
//! - the promise running out: receipt + `remainingMs` of the latest answer that said held
//!   (a view answer saying held extends the belief from its receipt; an answer without a
//!   time limit — a hold file whose only documented check is that it exists — lasts until
//!   the app reads otherwise);
//! - A letting go (its release call);
//! - A learning the hold is gone: a `lost` event, a `released` event it did not ask for,
//!   its event stream closing, a view or hold file saying not held;
//! - A stopping.
//!
//! An answer that arrives after the deadline it carries (its sender was paused after
//! writing it) starts no belief: the app is told, on receipt, that the hold has run out.
//!
//! What happens to A's sidecar does not end A's belief: a killed, frozen or cut-off
//! sidecar ends it only through what A learns (a closed stream counts). A `leasehold run`
//! command believes from its first write to its last.

use std::collections::BTreeMap;
use std::time::Instant;

use super::history::{Entry, Learned, Op};

/// How a belief ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Its promise ran out (receipt + `remainingMs`), or the last act of a command.
    Lapsed,
    /// The app released.
    Released,
    /// The app learned it is lost.
    Learned(Learned),
    /// A view or hold file said not held.
    ToldNotHeld,
    /// A newer grant replaced it.
    Replaced,
    /// The app stopped, or the history ended.
    Stopped,
}

/// A belief of `client` that it held `lock` with `token`, over `[start, end]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Belief {
    /// The app.
    pub client: String,
    /// The lock.
    pub lock: String,
    /// The token.
    pub token: i64,
    /// Grant receipt (or first held answer, or first act).
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
    /// How it ended.
    pub ended: Ended,
}

/// An open belief: `until` is `None` while no time limit applies.
#[derive(Clone, Copy)]
struct Open {
    start: Instant,
    until: Option<Instant>,
}

/// Every belief in `entries` (sorted by time), per lock, in order of start.
pub fn beliefs(entries: &[Entry]) -> BTreeMap<String, Vec<Belief>> {
    let mut open: BTreeMap<(String, String), BTreeMap<i64, Open>> = BTreeMap::new();
    let mut done: BTreeMap<String, Vec<Belief>> = BTreeMap::new();
    let close = |done: &mut BTreeMap<String, Vec<Belief>>,
                 (client, lock): &(String, String),
                 token,
                 o: Open,
                 at,
                 how| {
        // An answer that arrived after its own deadline (its sender was paused, or it was
        // held up on the way, after the answer was written) promised nothing: no belief.
        // A single act (`until == start`) is a belief of an instant.
        if o.until.is_some_and(|until| until < o.start) {
            return;
        }
        // A belief whose promise ran out before `at` ended then, not at `at`.
        let (end, ended) = match o.until {
            Some(until) if until < at => (until, Ended::Lapsed),
            _ => (at, how),
        };
        let belief =
            Belief { client: client.clone(), lock: lock.clone(), token, start: o.start, end: end.max(o.start), ended };
        done.entry(lock.clone()).or_default().push(belief);
    };
    let last = entries.iter().map(|e| e.at).max();
    for e in entries {
        let key = (e.client.clone(), e.lock.clone());
        let mine = open.entry(key.clone()).or_default();
        match &e.op {
            Op::Granted { token, until } | Op::Held { token, until } => {
                if matches!(e.op, Op::Granted { .. }) {
                    for (t, o) in std::mem::take(mine) {
                        if t == *token {
                            mine.insert(t, o);
                        } else {
                            close(&mut done, &key, t, o, e.at, Ended::Replaced);
                        }
                    }
                }
                match mine.remove(token) {
                    // Still believing: the answer extends the belief from its receipt.
                    Some(o) if o.until.is_none_or(|u| u >= e.at) => {
                        let until = match (o.until, until) {
                            (Some(a), Some(b)) => Some(a.max(*b)),
                            _ => None,
                        };
                        mine.insert(*token, Open { start: o.start, until });
                    }
                    // Told "held" after the belief had lapsed: a new stretch of belief.
                    lapsed => {
                        if let Some(o) = lapsed {
                            close(&mut done, &key, *token, o, e.at, Ended::Lapsed);
                        }
                        mine.insert(*token, Open { start: e.at, until: *until });
                    }
                }
            }
            Op::Act { token } => match mine.remove(token) {
                Some(o) => {
                    mine.insert(*token, Open { start: o.start, until: Some(o.until.map_or(e.at, |u| u.max(e.at))) });
                }
                None => {
                    mine.insert(*token, Open { start: e.at, until: Some(e.at) });
                }
            },
            Op::NotHeld | Op::Stopped => {
                let how = if matches!(e.op, Op::Stopped) { Ended::Stopped } else { Ended::ToldNotHeld };
                for (t, o) in std::mem::take(mine) {
                    close(&mut done, &key, t, o, e.at, how);
                }
            }
            Op::Lost { token, how } => {
                if let Some(o) = mine.remove(token) {
                    close(&mut done, &key, *token, o, e.at, Ended::Learned(*how));
                }
            }
            Op::Release { token } => {
                if let Some(o) = mine.remove(token) {
                    close(&mut done, &key, *token, o, e.at, Ended::Released);
                }
            }
            Op::Write { .. } | Op::Adversary { .. } | Op::TokenRefused => {}
        }
    }
    // What is still open at the end of the history runs to its promise, or, without a
    // time limit, ends with the history.
    for (key, tokens) in open {
        for (t, o) in tokens {
            match o.until {
                Some(until) => close(&mut done, &key, t, o, until, Ended::Lapsed),
                None => close(&mut done, &key, t, o, last.unwrap_or(o.start), Ended::Stopped),
            }
        }
    }
    for list in done.values_mut() {
        list.sort_by_key(|b| (b.start, b.end));
    }
    done
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn t(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn e(base: Instant, ms: u64, client: &str, op: Op) -> Entry {
        Entry { at: t(base, ms), client: client.into(), lock: "l".into(), op }
    }

    /// (app, token, start ms, end ms, how it ended).
    type Span = (String, i64, u128, u128, Ended);

    fn spans(base: Instant, entries: &[Entry]) -> Vec<Span> {
        beliefs(entries)
            .remove("l")
            .unwrap_or_default()
            .into_iter()
            .map(|b| (b.client, b.token, (b.start - base).as_millis(), (b.end - base).as_millis(), b.ended))
            .collect()
    }

    #[test]
    fn belief_table() {
        let b = Instant::now();
        let granted = |ms, token, until| e(b, ms, "a", Op::Granted { token, until: Some(t(b, until)) });
        let row = |token, start, end, ended| ("a".to_owned(), token, start, end, ended);
        let cases: Vec<(&str, Vec<Entry>, Vec<Span>)> = vec![
            (
                "a grant alone lasts until receipt + remainingMs",
                vec![granted(0, 1, 4000)],
                vec![row(1, 0, 4000, Ended::Lapsed)],
            ),
            (
                "a killed sidecar whose app never learns: the belief runs to receipt + remainingMs",
                vec![granted(0, 1, 4000), e(b, 9000, "a", Op::Stopped)],
                vec![row(1, 0, 4000, Ended::Lapsed)],
            ),
            (
                "a held view extends it from its receipt",
                vec![granted(0, 1, 4000), e(b, 3000, "a", Op::Held { token: 1, until: Some(t(b, 7000)) })],
                vec![row(1, 0, 7000, Ended::Lapsed)],
            ),
            (
                "a view saying not held ends it",
                vec![granted(0, 1, 4000), e(b, 1500, "a", Op::NotHeld)],
                vec![row(1, 0, 1500, Ended::ToldNotHeld)],
            ),
            (
                "a closing event stream ends it",
                vec![granted(0, 1, 4000), e(b, 1200, "a", Op::Lost { token: 1, how: Learned::StreamClosed })],
                vec![row(1, 0, 1200, Ended::Learned(Learned::StreamClosed))],
            ),
            (
                "a release call ends it",
                vec![granted(0, 1, 4000), e(b, 800, "a", Op::Release { token: 1 })],
                vec![row(1, 0, 800, Ended::Released)],
            ),
            (
                "a lost event for another token changes nothing",
                vec![granted(0, 2, 4000), e(b, 800, "a", Op::Lost { token: 1, how: Learned::LostEvent })],
                vec![row(2, 0, 4000, Ended::Lapsed)],
            ),
            (
                "held after lapsing: a second stretch",
                vec![granted(0, 1, 1000), e(b, 2000, "a", Op::Held { token: 1, until: Some(t(b, 3000)) })],
                vec![row(1, 0, 1000, Ended::Lapsed), row(1, 2000, 3000, Ended::Lapsed)],
            ),
            (
                "a hold file without a time limit holds until read otherwise",
                vec![
                    e(b, 0, "a", Op::Granted { token: 1, until: None }),
                    e(b, 100, "a", Op::Held { token: 1, until: None }),
                    e(b, 60_000, "a", Op::NotHeld),
                ],
                vec![row(1, 0, 60_000, Ended::ToldNotHeld)],
            ),
            (
                "a command believes from its first write to its last",
                vec![e(b, 100, "a", Op::Act { token: 1 }), e(b, 900, "a", Op::Act { token: 1 })],
                vec![row(1, 100, 900, Ended::Lapsed)],
            ),
            (
                "an answer received after its deadline is no belief",
                vec![granted(5000, 1, 4000), e(b, 5000, "a", Op::Release { token: 1 })],
                vec![],
            ),
            (
                "an answer received after its deadline ends nothing else",
                vec![granted(0, 1, 4000), e(b, 3000, "a", Op::Held { token: 1, until: Some(t(b, 2000)) })],
                vec![row(1, 0, 4000, Ended::Lapsed)],
            ),
            (
                "a single act is a belief of an instant",
                vec![e(b, 700, "a", Op::Act { token: 1 })],
                vec![row(1, 700, 700, Ended::Lapsed)],
            ),
            (
                "a new grant replaces an old belief",
                vec![granted(0, 1, 4000), granted(1000, 2, 5000)],
                vec![row(1, 0, 1000, Ended::Replaced), row(2, 1000, 5000, Ended::Lapsed)],
            ),
        ];
        for (name, entries, expected) in cases {
            assert_eq!(spans(b, &entries), expected, "{name}");
        }
    }
}
