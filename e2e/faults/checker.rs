//! The history checker: the fencing invariants, asserted over what clients did and what
//! the resources applied.
//!
//! 1. Tokens per lock strictly increase in grant order.
//! 2. No write with a lower token is applied after one with a higher token (per fenced
//!    resource, in the resource's own commit order).
//! 3. At most one client believes it holds a lock at any instant, beyond the margin
//!    (`leaseDuration - renewDeadline`). A client's belief starts when the sidecar says
//!    "acquired", lasts until the deadline the sidecar gave it (extended only by a view
//!    that says "held"), and ends earlier when it releases, hears "lost", sees "not held",
//!    or dies.
//! 4. Every fault is followed by a new grant on each affected lock within
//!    `leaseDuration + 2 s` of the moment recovery can start.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::history::{Entry, Fault, Op, Resource, ms};

/// Parameters of the checks.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Tolerated overlap of beliefs.
    pub margin: Duration,
    /// A fault must be followed by a grant within this.
    pub recovery: Duration,
}

/// What a resource applied, in its commit order: (writer, token) per lock.
pub type Applied = BTreeMap<(String, Resource), Vec<(String, i64)>>;

/// What the lock Leases recorded: per lock, every grant (holder identity, token) in the
/// order the Lease went through them; and each client's identity.
#[derive(Debug, Default)]
pub struct Grants {
    /// Grants per lock, in Lease order.
    pub by_lock: BTreeMap<String, Vec<(String, i64)>>,
    /// Client name → holder identity.
    pub identities: HashMap<String, String>,
    /// Per lock, when the grant watch re-listed (and may have missed grants).
    pub relists: BTreeMap<String, Vec<Instant>>,
}

/// Grants made while a watch was down are missing from its record: a client's grant near a
/// re-list cannot be checked against it.
const RELIST_BLIND_SPOT: Duration = Duration::from_secs(10);

/// The outcome of a check.
#[derive(Debug, Default)]
pub struct Report {
    /// Faults by kind.
    pub faults: BTreeMap<&'static str, usize>,
    /// Grants seen.
    pub grants: usize,
    /// Fenced writes applied.
    pub writes_applied: usize,
    /// Fenced writes rejected.
    pub writes_rejected: usize,
    /// Of those, zombie writes (sent on purpose with a possibly lost token) rejected.
    pub stale_rejected: usize,
    /// Writes to the unfenced resource applied with a token lower than one applied before.
    pub unfenced_stale_applied: usize,
    /// Writes to the unfenced resource applied in all.
    pub unfenced_applied: usize,
    /// Worst time from a fault to the next grant.
    pub worst_recovery: Duration,
    /// Every violation found.
    pub violations: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: usize = self.faults.values().sum();
        writeln!(f, "faults injected: {total}")?;
        for (kind, n) in &self.faults {
            writeln!(f, "  {kind:<28} {n}")?;
        }
        writeln!(f, "grants: {}", self.grants)?;
        writeln!(f, "fenced writes applied: {}", self.writes_applied)?;
        writeln!(
            f,
            "fenced writes rejected: {} (of which zombie writes with a lost token: {})",
            self.writes_rejected, self.stale_rejected
        )?;
        writeln!(f, "worst recovery (fault to next grant): {} ms", ms(self.worst_recovery))?;
        writeln!(
            f,
            "contrast, unfenced resource: {} of {} applied writes were stale (a lower token after a higher one)",
            self.unfenced_stale_applied, self.unfenced_applied
        )?;
        writeln!(f, "violations: {}", self.violations.len())?;
        for v in self.violations.iter().take(20) {
            writeln!(f, "  - {v}")?;
        }
        Ok(())
    }
}

/// A client's belief that it holds `token`, over `[start, end]`.
#[derive(Clone, Debug)]
struct Belief {
    client: String,
    token: i64,
    start: Instant,
    end: Instant,
}

/// The belief intervals of every client, per lock.
fn beliefs(entries: &[Entry]) -> HashMap<String, Vec<Belief>> {
    let mut open: HashMap<(String, String), Belief> = HashMap::new();
    let mut done: HashMap<String, Vec<Belief>> = HashMap::new();
    let close = |done: &mut HashMap<String, Vec<Belief>>, lock: &str, mut b: Belief, at: Instant| {
        b.end = b.end.min(at).max(b.start);
        done.entry(lock.to_owned()).or_default().push(b);
    };
    for e in entries {
        let key = (e.client.clone(), e.lock.clone());
        match &e.op {
            Op::Acquired { token, deadline } => {
                if let Some(previous) = open.remove(&key) {
                    close(&mut done, &e.lock, previous, e.at);
                }
                open.insert(key, Belief { client: e.client.clone(), token: *token, start: e.at, end: *deadline });
            }
            Op::View { token, held: true, deadline: Some(deadline) } => match open.remove(&key) {
                Some(mut b) if b.token == *token && e.at <= b.end => {
                    b.end = b.end.max(*deadline);
                    open.insert(key, b);
                }
                // Told "held" again after the belief had lapsed: a new stretch of belief.
                other => {
                    if let Some(b) = other {
                        close(&mut done, &e.lock, b, e.at);
                    }
                    open.insert(key, Belief { client: e.client.clone(), token: *token, start: e.at, end: *deadline });
                }
            },
            Op::View { held: false, .. } | Op::Lost { .. } | Op::Release { .. } | Op::Died => {
                if let Some(b) = open.remove(&key) {
                    close(&mut done, &e.lock, b, e.at);
                }
            }
            Op::View { .. } | Op::Write { .. } => {}
        }
    }
    // Beliefs still open at the end of the run end a little after it (a broken sidecar
    // may promise a hold for a year; the overlap it causes is plain well before that).
    let last = entries.iter().map(|e| e.at).max();
    for ((_, lock), b) in open {
        let end = last.map_or(b.end, |l| b.end.min(l + Duration::from_secs(10)));
        close(&mut done, &lock, b, end);
    }
    done
}

/// Checks a history. `grants` is what the lock Leases went through, `applied` what each
/// resource applied, in commit order.
pub fn check(entries: &[Entry], faults: &[Fault], grants: &Grants, applied: &Applied, bounds: Bounds) -> Report {
    let mut report = Report::default();
    for f in faults {
        *report.faults.entry(f.kind).or_default() += 1;
    }

    // 1. Tokens per lock strictly increase in grant order (the Lease's own history), and
    //    every token a client was told it holds was granted to that client.
    for (lock, list) in &grants.by_lock {
        for pair in list.windows(2) {
            let ((a, ta), (b, tb)) = (&pair[0], &pair[1]);
            if tb <= ta {
                report
                    .violations
                    .push(format!("lock {lock}: token {tb} granted to {b} after token {ta} granted to {a}"));
            }
        }
    }
    for e in entries {
        if let Op::Acquired { token, .. } = e.op {
            report.grants += 1;
            let Some(identity) = grants.identities.get(&e.client) else { continue };
            let granted =
                grants.by_lock.get(&e.lock).is_some_and(|l| l.iter().any(|(h, t)| h == identity && *t == token));
            let blind = grants.relists.get(&e.lock).is_some_and(|r| {
                r.iter().any(|at| {
                    at.saturating_duration_since(e.at).max(e.at.saturating_duration_since(*at)) < RELIST_BLIND_SPOT
                })
            });
            if !granted && !blind {
                report.violations.push(format!(
                    "lock {}: {} was told it holds token {token}, never granted to it",
                    e.lock, e.client
                ));
            }
        }
        if let Op::Write { resource, applied: ok, stale, .. } = e.op
            && resource != Resource::Unfenced
        {
            if ok {
                report.writes_applied += 1;
            } else {
                report.writes_rejected += 1;
                report.stale_rejected += usize::from(stale);
            }
        }
    }

    // 2. Applied writes never go back in token, per fenced resource.
    for ((lock, resource), writes) in applied {
        let mut highest: Option<(i64, &str)> = None;
        let mut stale = 0;
        for (writer, token) in writes {
            if let Some((h, by)) = highest
                && *token < h
            {
                if *resource == Resource::Unfenced {
                    stale += 1;
                } else {
                    report.violations.push(format!(
                        "lock {lock}: {resource:?} applied token {token} from {writer} after token {h} from {by}"
                    ));
                }
            }
            if highest.is_none_or(|(h, _)| *token > h) {
                highest = Some((*token, writer));
            }
        }
        if *resource == Resource::Unfenced {
            report.unfenced_stale_applied += stale;
            report.unfenced_applied += writes.len();
        }
    }

    // 3. Beliefs do not overlap beyond the margin.
    for (lock, list) in beliefs(entries) {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if a.client == b.client && a.token == b.token {
                    continue;
                }
                let overlap = a.end.min(b.end).saturating_duration_since(a.start.max(b.start));
                if overlap > bounds.margin {
                    report.violations.push(format!(
                        "lock {lock}: {} (token {}) and {} (token {}) both believed they held for {} ms",
                        a.client,
                        a.token,
                        b.client,
                        b.token,
                        ms(overlap)
                    ));
                }
            }
        }
    }

    // 4. Every fault is followed by a grant in time.
    let base = faults.iter().map(|f| f.start).min();
    for f in faults {
        for lock in &f.locks {
            let next = entries
                .iter()
                .filter(|e| &e.lock == lock && e.at > f.end && matches!(e.op, Op::Acquired { .. }))
                .map(|e| e.at)
                .min();
            match next {
                Some(at) => {
                    let took = at - f.end;
                    report.worst_recovery = report.worst_recovery.max(took);
                    if took > bounds.recovery {
                        report.violations.push(format!(
                            "lock {lock}: {} (at +{} ms, lasting {} ms) took {} ms to the next grant",
                            f.kind,
                            ms(f.start - base.unwrap_or(f.start)),
                            ms(f.end - f.start),
                            ms(took)
                        ));
                    }
                }
                None => report.violations.push(format!("lock {lock}: no grant after {}", f.kind)),
            }
        }
    }
    report
}

/// The entries of `lock` around `fault`, for diagnosing a violation.
pub fn around(entries: &[Entry], lock: &str, fault: &Fault, base: Instant) -> String {
    let from = fault.start.checked_sub(Duration::from_secs(2)).unwrap_or(fault.start);
    let to = fault.end + Duration::from_secs(12);
    entries
        .iter()
        .filter(|e| e.lock == lock && e.at >= from && e.at <= to)
        .map(|e| format!("    +{:>8} ms {:<16} {:?}", ms(e.at.saturating_duration_since(base)), e.client, e.op))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn entry(base: Instant, t: u64, client: &str, op: Op) -> Entry {
        Entry { at: at(base, t), client: client.into(), lock: "l".into(), op }
    }

    const BOUNDS: Bounds = Bounds { margin: Duration::from_millis(500), recovery: Duration::from_secs(6) };

    fn clean(base: Instant) -> Vec<Entry> {
        vec![
            entry(base, 0, "a", Op::Acquired { token: 1, deadline: at(base, 2000) }),
            entry(base, 100, "a", Op::Write { resource: Resource::Postgres, token: 1, applied: true, stale: false }),
            entry(base, 1500, "a", Op::View { token: 1, held: true, deadline: Some(at(base, 3500)) }),
            entry(base, 1600, "a", Op::Release { token: 1 }),
            entry(base, 1700, "b", Op::Acquired { token: 2, deadline: at(base, 3700) }),
            entry(base, 1800, "a", Op::Write { resource: Resource::Postgres, token: 1, applied: false, stale: true }),
            entry(base, 2000, "b", Op::Release { token: 2 }),
        ]
    }

    #[test]
    fn a_clean_history_has_no_violations() {
        let base = Instant::now();
        let applied: Applied = [(("l".into(), Resource::Postgres), vec![("a".into(), 1)])].into();
        let faults = [Fault { kind: "holder-sigkill", locks: vec!["l".into()], start: base, end: at(base, 50) }];
        let report = check(&clean(base), &faults, &grants(), &applied, BOUNDS);
        assert!(report.violations.is_empty(), "{report}");
        assert_eq!((report.grants, report.writes_applied, report.stale_rejected), (2, 1, 1));
        assert_eq!(report.worst_recovery, Duration::from_millis(1650));
    }

    fn grants() -> Grants {
        Grants {
            by_lock: [("l".to_owned(), vec![("id-a".to_owned(), 1), ("id-b".to_owned(), 2)])].into(),
            identities: [("a", "id-a"), ("b", "id-b"), ("c", "id-c")].map(|(c, i)| (c.to_owned(), i.to_owned())).into(),
            relists: BTreeMap::new(),
        }
    }

    #[test]
    fn a_reused_or_lower_token_is_a_violation() {
        let base = Instant::now();
        let mut g = grants();
        g.by_lock.get_mut("l").expect("l").push(("id-c".into(), 2));
        let report = check(&clean(base), &[], &g, &Applied::new(), BOUNDS);
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("token 2 granted to id-c after token 2"));
        // A client told it holds a token the Lease never gave it.
        let mut entries = clean(base);
        entries.push(entry(base, 3000, "c", Op::Acquired { token: 3, deadline: at(base, 5000) }));
        let report = check(&entries, &[], &grants(), &Applied::new(), BOUNDS);
        assert!(report.violations.iter().any(|v| v.contains("never granted")), "{report}");
    }

    #[test]
    fn overlapping_beliefs_are_a_violation() {
        let base = Instant::now();
        let entries = vec![
            entry(base, 0, "a", Op::Acquired { token: 1, deadline: at(base, 2000) }),
            entry(base, 1000, "b", Op::Acquired { token: 2, deadline: at(base, 3000) }),
        ];
        let report = check(&entries, &[], &Grants::default(), &Applied::new(), BOUNDS);
        assert_eq!(report.violations.len(), 1, "{report}");
        // A frozen sidecar that answers "held" after thawing (a broken one) is caught too.
        let entries = vec![
            entry(base, 0, "a", Op::Acquired { token: 1, deadline: at(base, 2000) }),
            entry(base, 4500, "b", Op::Acquired { token: 2, deadline: at(base, 6500) }),
            entry(base, 5000, "a", Op::View { token: 1, held: true, deadline: Some(at(base, 8000)) }),
        ];
        let report = check(&entries, &[], &Grants::default(), &Applied::new(), BOUNDS);
        assert_eq!(report.violations.len(), 1, "{report}");
        // A lost event ends the belief; an overlap within the margin is tolerated.
        let entries = vec![
            entry(base, 0, "a", Op::Acquired { token: 1, deadline: at(base, 2000) }),
            entry(base, 900, "b", Op::Acquired { token: 2, deadline: at(base, 3000) }),
            entry(base, 1200, "a", Op::Lost { token: 1 }),
        ];
        assert!(check(&entries, &[], &Grants::default(), &Applied::new(), BOUNDS).violations.is_empty());
    }

    #[test]
    fn applied_regressions_are_violations_except_on_the_unfenced_contrast() {
        let writes = vec![("a".to_owned(), 5), ("b".to_owned(), 7), ("a".to_owned(), 5), ("c".to_owned(), 8)];
        let applied: Applied =
            [(("l".into(), Resource::Postgres), writes.clone()), (("l".into(), Resource::Unfenced), writes)].into();
        let report = check(&[], &[], &Grants::default(), &applied, BOUNDS);
        assert_eq!(report.violations.len(), 1, "{report}");
        assert_eq!((report.unfenced_stale_applied, report.unfenced_applied), (1, 4));
    }

    #[test]
    fn a_fault_without_timely_recovery_is_a_violation() {
        let base = Instant::now();
        let entries = vec![entry(base, 8000, "a", Op::Acquired { token: 1, deadline: at(base, 9000) })];
        let faults = [
            Fault { kind: "etcd-restart", locks: vec!["l".into()], start: base, end: at(base, 1000) },
            Fault { kind: "holder-sigkill", locks: vec!["m".into()], start: base, end: base },
        ];
        let report = check(&entries, &faults, &Grants::default(), &Applied::new(), BOUNDS);
        assert_eq!(report.violations.len(), 2, "{report}");
    }
}
