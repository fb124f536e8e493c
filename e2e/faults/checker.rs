//! The history checker. Each check is asserted over what the apps were told and did
//! ([`super::beliefs`]), what the lock Leases went through, and what the resources
//! applied:
//!
//! 1. **Tokens.** Per lock, grant tokens strictly increase in the Lease's order, and every
//!    token an app was told it holds was granted to that app's identity.
//! 2. **One believer.** No two apps believe they hold a lock at the same instant — zero
//!    overlap tolerated. The report gives the smallest gap between one app's belief ending
//!    and the next app's grant receipt (per lock, and over the run).
//! 3. **Fenced resources.** Per fenced resource, applied tokens never decrease in commit
//!    order. The webhook-fenced ConfigMap never applies a write sent after the lock Lease
//!    showed a higher token. A write applied while another app believed it held is
//!    counted, and is a violation when its writer believed too. Zombie writes (sent on
//!    purpose after the writer's belief ended) are counted with what became of them; the
//!    unfenced contrast counts the stale writes it applied.
//! 4. **Adversaries.** Every write no holder may make, attempted with a worker pod's own
//!    credentials, is refused; an accepted one is a violation.
//! 5. **Prompt loss.** Once the apiserver refuses an app's pod's token (its Pod was
//!    deleted), the app is not told "held" later than [`Bounds::notify`] after that.
//! 6. **Recovery.** After each fault, the lock is granted again (an app receives a grant,
//!    or the Lease shows one) within the bound of its kind ([`recovery_bound`]), counted
//!    from the later of the fault's recovery point and the end of the beliefs held across
//!    it — unless another fault on the lock came first; one still in progress when it
//!    began moves the start to that fault's end and its bound to the longer of the two.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::beliefs::{Belief, beliefs};
use super::history::{Entry, Fault, Op, Resource, ms, signed_ms};
use super::record::LeaseHistory;

/// Parameters of the checks.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Scheduling and watch-delivery slack added to every recovery bound.
    pub slack: Duration,
    /// The controllers' election lease: how long a new leader may take to take over.
    pub election: Duration,
    /// How soon after the apiserver begins refusing its pod's token an app must stop being
    /// told "held".
    pub notify: Duration,
}

/// A write a resource applied, in its commit order.
#[derive(Clone, Debug, PartialEq)]
pub struct AppliedWrite {
    /// The writer.
    pub writer: String,
    /// The token it carried.
    pub token: i64,
}

/// What each resource applied, in commit order, per (lock, resource).
pub type Applied = BTreeMap<(String, Resource), Vec<AppliedWrite>>;

/// Everything the checker reads.
pub struct Inputs<'a> {
    /// The history, in time order.
    pub entries: &'a [Entry],
    /// The faults.
    pub faults: &'a [Fault],
    /// What the lock Leases went through.
    pub leases: &'a LeaseHistory,
    /// App → claimant identity.
    pub identities: &'a HashMap<String, String>,
    /// Locks with several permits → how many (a lock not listed is a mutex).
    pub permits: &'a HashMap<String, usize>,
    /// Apps that take their holds in write mode (every permit, alone).
    pub writers: &'a HashSet<String>,
    /// What the resources applied.
    pub applied: &'a Applied,
    /// Bounds.
    pub bounds: Bounds,
}

/// How a fault's recovery is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// The hold ends by expiry or self-fencing; or the fault leaves the hold alone.
    Expiry,
    /// The hold is revoked while its app may still believe: the next grant waits for the
    /// app to let go or for a lease duration after the last renewal.
    Drain,
    /// The hold is released.
    Handoff,
    /// Every lock: an outage or pause of the apiserver, etcd or the controllers, or a
    /// controller clock fault; a new leadership term may start its expiry clocks afresh.
    Outage,
    /// A write that must be refused: nothing to recover from.
    Refused,
}

/// The class of a fault kind.
pub fn class(kind: &str) -> Class {
    match kind {
        "force-release" | "max-hold" | "pod-force-deleted" | "lease-deleted" | "lease-deleted-twice" => Class::Drain,
        "holder-sigterm" | "holder-pod-deleted" | "app-sigkill" => Class::Handoff,
        "leader-killed"
        | "leader-sigstop"
        | "controllers-down"
        | "pod-deleted-controllers-down"
        | "apiserver-restart"
        | "etcd-restart"
        | "lock-recreated"
        | "controller-clock-forward"
        | "controller-clock-backward"
        | "controller-clock-frozen" => Class::Outage,
        k if k.starts_with("adv-") => Class::Refused,
        _ => Class::Expiry,
    }
}

/// The recovery bound of a fault kind whose holds were granted under lease duration
/// `lease`: `lease + slack`; for outages, counted from their end, also the election lease
/// (a new leader may have to wait it out, and starts its expiry clocks at first sight) and
/// the watches' longest backoff (2 s) before they list again; `None` for refused writes.
pub fn recovery_bound(kind: &str, lease: Duration, b: &Bounds) -> Option<Duration> {
    match class(kind) {
        Class::Expiry | Class::Drain | Class::Handoff => Some(lease + b.slack),
        Class::Outage => Some(lease + b.election + WATCH_BACKOFF + b.slack),
        Class::Refused => None,
    }
}

/// The longest backoff of the product's watches.
const WATCH_BACKOFF: Duration = Duration::from_secs(2);

/// The outcome of a check.
#[derive(Debug, Default)]
pub struct Report {
    /// Faults by kind.
    pub faults: BTreeMap<&'static str, usize>,
    /// Grants received by apps.
    pub grants: usize,
    /// Fenced writes applied / rejected, per resource.
    pub fenced: BTreeMap<Resource, (usize, usize)>,
    /// Zombie writes to fenced resources: sent, applied, rejected.
    pub zombies: (usize, usize, usize),
    /// Fenced writes applied while another app believed it held (zombie ones included).
    pub applied_during_other: usize,
    /// Unfenced contrast: stale writes applied, writes applied.
    pub unfenced: (usize, usize),
    /// ConfigMap versions stored although the client saw the write fail (timed out but landed).
    pub landed_after_failure: usize,
    /// Adversarial writes: per kind, refused and accepted, and one answer.
    pub adversaries: BTreeMap<&'static str, (usize, usize, String)>,
    /// Worst recovery per kind, with its bound.
    pub recovery: BTreeMap<&'static str, (Duration, Option<Duration>)>,
    /// Recoveries not judged: the run ended first; another fault on the lock came first.
    pub unjudged: (usize, usize),
    /// Smallest gap from one app's belief ending to another's grant receipt, per lock.
    pub gaps: BTreeMap<String, i128>,
    /// The smallest gap overall, described.
    pub smallest_gap: Option<(i128, String)>,
    /// Every violation found.
    pub violations: Vec<String>,
    /// Violations per check, with the first few of each per lock.
    pub by_check: BTreeMap<&'static str, (usize, Vec<String>)>,
    /// Where to look: (lock, from, to, violation) for the first violations with a window.
    pub windows: Vec<(String, Instant, Instant, String)>,
    /// Fenced writes applied while another app believed it held, per resource.
    pub applied_during_other_by: BTreeMap<Resource, usize>,
    /// Locks with several permits: the most apps believing at once, and how many
    /// beliefs were in write mode.
    pub permits: BTreeMap<String, (usize, usize)>,
}

impl Report {
    /// Records a violation of `check`.
    fn violate(&mut self, check: &'static str, text: String) {
        let entry = self.by_check.entry(check).or_default();
        entry.0 += 1;
        // The first two of each check for each lock.
        let lock = text.split(':').next().unwrap_or_default().to_owned();
        if entry.1.iter().filter(|v| v.starts_with(&format!("{lock}:"))).count() < 2 {
            entry.1.push(text.clone());
        }
        self.violations.push(text);
    }

    /// Records a violation of `check` with the window of `lock`'s history that shows it.
    fn violate_in(&mut self, check: &'static str, text: String, lock: &str, from: Instant, to: Instant) {
        let shown = self.windows.iter().filter(|(l, ..)| l == lock).count();
        if shown < 2 && !self.windows.iter().any(|(l, f, t, _)| l == lock && *f <= to && from <= *t) {
            self.windows.push((lock.to_owned(), from, to, text.clone()));
        }
        self.violate(check, text);
    }

    /// Worst recovery over every kind.
    pub fn worst_recovery(&self) -> Duration {
        self.recovery.values().map(|(d, _)| *d).max().unwrap_or_default()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: usize = self.faults.values().sum();
        writeln!(f, "faults injected: {total}")?;
        for (kind, n) in &self.faults {
            let recovery = match self.recovery.get(kind) {
                Some((worst, Some(bound))) => format!("worst recovery {} ms (bound {} ms)", ms(*worst), ms(*bound)),
                Some((worst, None)) => format!("worst recovery {} ms", ms(*worst)),
                None => String::new(),
            };
            writeln!(f, "  {kind:<26} {n:>5}  {recovery}")?;
        }
        writeln!(f, "grants received by apps: {}", self.grants)?;
        for (resource, (applied, rejected)) in &self.fenced {
            writeln!(f, "fenced writes to {resource:?}: {applied} applied, {rejected} rejected")?;
        }
        let (sent, applied, rejected) = self.zombies;
        writeln!(
            f,
            "zombie writes (sent after the writer's belief ended): {sent} sent, {applied} applied, {rejected} rejected"
        )?;
        writeln!(
            f,
            "fenced writes applied while another app believed it held: {} {:?}",
            self.applied_during_other, self.applied_during_other_by
        )?;
        writeln!(f, "ConfigMap writes that landed although their client saw them fail: {}", self.landed_after_failure)?;
        writeln!(
            f,
            "contrast, unfenced resource: {} of {} applied writes were stale (a lower token after a higher one)",
            self.unfenced.0, self.unfenced.1
        )?;
        for (kind, (refused, accepted, answer)) in &self.adversaries {
            writeln!(f, "adversary {kind}: {refused} refused, {accepted} accepted; e.g. {answer}")?;
        }
        writeln!(
            f,
            "worst recovery (fault to next grant): {} ms; not judged: {} (run ended), {} (another fault on the lock came first)",
            ms(self.worst_recovery()),
            self.unjudged.0,
            self.unjudged.1
        )?;
        for (lock, (most, writes)) in &self.permits {
            writeln!(f, "lock {lock}: at most {most} apps believed at once; {writes} beliefs in write mode")?;
        }
        match &self.smallest_gap {
            Some((gap, what)) => writeln!(f, "smallest belief-to-grant gap: {gap} ms ({what})")?,
            None => writeln!(f, "smallest belief-to-grant gap: none (no handover)")?,
        }
        for (lock, gap) in &self.gaps {
            writeln!(f, "  {lock:<12} {gap} ms")?;
        }
        writeln!(f, "violations: {}", self.violations.len())?;
        for (check, (n, first)) in &self.by_check {
            writeln!(f, "  {check}: {n}")?;
            for v in first {
                writeln!(f, "    - {v}")?;
            }
        }
        Ok(())
    }
}

/// Grants made while the Lease watch was down are missing from its record: a grant
/// near a re-list cannot be checked against it.
const RELIST_BLIND_SPOT: Duration = Duration::from_secs(10);

/// Checks a history.
pub fn check(i: &Inputs) -> Report {
    let mut report = Report::default();
    let base = i.entries.iter().map(|e| e.at).chain(i.faults.iter().map(|f| f.start)).min();
    let at = |t: Instant| base.map_or(0, |b| signed_ms(b, t));
    for f in i.faults {
        *report.faults.entry(f.kind).or_default() += 1;
    }
    let beliefs = beliefs(i.entries);
    tokens(i, &mut report);
    one_believer(i, &beliefs, &at, &mut report);
    permits(i, &beliefs, &at, &mut report);
    fenced(i, &beliefs, &at, &mut report);
    adversaries(i, &mut report);
    prompt_loss(i, &at, &mut report);
    recovery(i, &beliefs, &at, &mut report);
    report
}

/// 1. Tokens strictly increase per lock Lease (per slot, for a lock with several permits);
///    every token told was granted to its app.
fn tokens(i: &Inputs, report: &mut Report) {
    for lock in i.leases.states.keys() {
        for pair in i.leases.lease_grants(lock).windows(2) {
            let ((a, ta, _), (b, tb, _)) = (&pair[0], &pair[1]);
            if tb <= ta {
                report.violate(
                    "tokens",
                    format!("lock {lock}: token {tb} granted to {b} after token {ta} granted to {a}"),
                );
            }
        }
    }
    for e in i.entries {
        let Op::Granted { token, .. } = e.op else { continue };
        report.grants += 1;
        let Some(identity) = i.identities.get(&e.client) else { continue };
        if !i.leases.states.contains_key(&e.lock) {
            continue;
        }
        let granted = i.leases.grants(&e.lock).iter().any(|(h, t, _)| h == identity && *t == token);
        if !granted && !i.leases.relisted_near(e.at, RELIST_BLIND_SPOT) {
            report.violate(
                "tokens",
                format!("lock {}: {} was told it holds token {token}, never granted to it", e.lock, e.client),
            );
        }
    }
}

/// Whether two beliefs are one hold: the same app, or apps of one pod (one claimant
/// identity) believing the same token.
fn same_hold(i: &Inputs, a: &str, a_token: i64, b: &str, b_token: i64) -> bool {
    a == b || (a_token == b_token && i.identities.get(a).is_some_and(|id| i.identities.get(b) == Some(id)))
}

/// 2. No two apps believe at once; the smallest gap between beliefs.
fn one_believer(
    i: &Inputs,
    beliefs: &BTreeMap<String, Vec<Belief>>,
    at: &dyn Fn(Instant) -> i128,
    report: &mut Report,
) {
    for (lock, list) in beliefs.iter().filter(|(lock, _)| !i.permits.contains_key(*lock)) {
        let mut smallest: Option<i128> = None;
        for (n, b) in list.iter().enumerate() {
            // Every earlier belief of another app: b's grant must come after it ended.
            for a in list[..n].iter().filter(|a| !same_hold(i, &a.client, a.token, &b.client, b.token)) {
                let gap = signed_ms(a.end, b.start);
                let exact_overlap = b.start < a.end;
                if exact_overlap {
                    let overlap = a.end.min(b.end) - b.start;
                    let window = (
                        a.start.max(b.start.checked_sub(Duration::from_secs(3)).unwrap_or(b.start)),
                        b.start + Duration::from_secs(3),
                    );
                    report.violate_in("one believer", format!(
                        "lock {lock}: {} (token {}, believed +{}..+{} ms, ended by {:?}) and {} (token {}, granted at +{} ms) both believed they held for {} ms",
                        a.client,
                        a.token,
                        at(a.start),
                        at(a.end),
                        a.ended,
                        b.client,
                        b.token,
                        at(b.start),
                        overlap.as_millis().max(1)
                    ), lock, window.0, window.1);
                }
                // The gap that matters is to the belief that ended last before b.
                if smallest.is_none_or(|s| gap < s) {
                    smallest = Some(gap);
                }
                if report.smallest_gap.as_ref().is_none_or(|(s, _)| gap < *s) {
                    report.smallest_gap = Some((
                        gap,
                        format!(
                            "lock {lock}: {} (token {}) believed until +{} ms, {} (token {}) granted at +{} ms",
                            a.client,
                            a.token,
                            at(a.end),
                            b.client,
                            b.token,
                            at(b.start)
                        ),
                    ));
                }
            }
        }
        if let Some(gap) = smallest {
            report.gaps.insert(lock.clone(), gap);
        }
    }
}

/// 2b. Locks with several permits: never more apps believe at once than the lock has
///     permits, and nobody believes beside an app holding in write mode.
fn permits(i: &Inputs, beliefs: &BTreeMap<String, Vec<Belief>>, at: &dyn Fn(Instant) -> i128, report: &mut Report) {
    for (lock, list) in beliefs {
        let Some(&permits) = i.permits.get(lock) else { continue };
        let seen = report.permits.entry(lock.clone()).or_default();
        seen.1 = list.iter().filter(|b| i.writers.contains(&b.client)).count();
        for (n, b) in list.iter().enumerate() {
            // The beliefs b's start falls in (the most at once is reached at some start).
            let during: Vec<&Belief> = list[..n]
                .iter()
                .filter(|a| !same_hold(i, &a.client, a.token, &b.client, b.token) && b.start < a.end)
                .collect();
            let window =
                (b.start.checked_sub(Duration::from_secs(3)).unwrap_or(b.start), b.start + Duration::from_secs(3));
            // Apps of one pod believing one token are one hold.
            let mut at_once: Vec<&Belief> = vec![b];
            for a in &during {
                if !at_once.iter().any(|x| same_hold(i, &x.client, x.token, &a.client, a.token)) {
                    at_once.push(a);
                }
            }
            let most = &mut report.permits.get_mut(lock).expect("entered above").0;
            *most = (*most).max(at_once.len());
            if at_once.len() > permits {
                let who: Vec<String> = at_once.iter().map(|a| format!("{} (token {})", a.client, a.token)).collect();
                report.violate_in(
                    "permits",
                    format!(
                        "lock {lock}: {} apps believed they held at +{} ms, with {permits} permits: {}",
                        at_once.len(),
                        at(b.start),
                        who.join(", ")
                    ),
                    lock,
                    window.0,
                    window.1,
                );
            }
            let writer = |x: &Belief| i.writers.contains(&x.client);
            if let Some(a) = during.iter().find(|a| writer(a) || writer(b)) {
                let (w, other) = if writer(a) { (*a, b) } else { (b, *a) };
                report.violate_in(
                    "writer alone",
                    format!(
                        "lock {lock}: {} (token {}) believed it held beside writer {} (token {}) at +{} ms",
                        other.client,
                        other.token,
                        w.client,
                        w.token,
                        at(b.start)
                    ),
                    lock,
                    window.0,
                    window.1,
                );
            }
        }
    }
}

/// 3. Fenced resources: order, the webhook's fresh check, writes under another's belief,
///    zombies, and the unfenced contrast.
fn fenced(i: &Inputs, beliefs: &BTreeMap<String, Vec<Belief>>, at: &dyn Fn(Instant) -> i128, report: &mut Report) {
    for ((lock, resource), writes) in i.applied {
        let mut highest: Option<(i64, &str)> = None;
        let mut stale = 0;
        for w in writes {
            if let Some((h, by)) = highest
                && w.token < h
            {
                if *resource == Resource::Unfenced {
                    stale += 1;
                } else {
                    report.violate(
                        "fenced order",
                        format!(
                            "lock {lock}: {resource:?} applied token {} from {} after token {h} from {by}",
                            w.token, w.writer
                        ),
                    );
                }
            }
            if highest.is_none_or(|(h, _)| w.token > h) {
                highest = Some((w.token, &w.writer));
            }
        }
        if *resource == Resource::Unfenced {
            report.unfenced.0 += stale;
            report.unfenced.1 += writes.len();
        }
    }
    let none = Vec::new();
    for e in i.entries {
        let Op::Write { resource, token, applied, believed, sent } = e.op else { continue };
        if resource == Resource::Unfenced {
            continue;
        }
        let counts = report.fenced.entry(resource).or_default();
        if applied {
            counts.0 += 1;
        } else {
            counts.1 += 1;
        }
        if !believed {
            report.zombies.0 += 1;
            if applied {
                report.zombies.1 += 1;
            } else {
                report.zombies.2 += 1;
            }
        }
        if !applied {
            continue;
        }
        if resource == Resource::ConfigMap
            && let Some(raised) = i.leases.superseded(&e.lock, token)
            && raised < sent
        {
            report.violate("fenced ConfigMap superseded", format!(
                "lock {}: the fenced ConfigMap applied {}'s write with token {token} sent at +{} ms, after the lock Lease showed a higher token (+{} ms)",
                e.lock,
                e.client,
                at(sent),
                at(raised)
            ));
        }
        let list = beliefs.get(&e.lock).unwrap_or(&none);
        let other =
            list.iter().find(|b| !same_hold(i, &b.client, b.token, &e.client, token) && b.start < sent && sent < b.end);
        if let Some(other) = other {
            report.applied_during_other += 1;
            *report.applied_during_other_by.entry(resource).or_default() += 1;
            if believed {
                report.violate("applied during another's belief", format!(
                    "lock {}: {resource:?} applied {}'s write (token {token}) sent at +{} ms while {} believed it held token {}",
                    e.lock,
                    e.client,
                    at(sent),
                    other.client,
                    other.token
                ));
            }
        }
    }
}

/// 4. Adversarial writes are refused.
fn adversaries(i: &Inputs, report: &mut Report) {
    for e in i.entries {
        let Op::Adversary { kind, accepted, answer } = &e.op else { continue };
        let entry = report.adversaries.entry(kind).or_insert_with(|| (0, 0, answer.clone()));
        if *accepted {
            entry.1 += 1;
            entry.2.clone_from(answer);
            report.violate(
                "adversary accepted",
                format!("lock {}: {kind} by {} was accepted: {answer}", e.lock, e.client),
            );
        } else {
            entry.0 += 1;
        }
    }
}

/// 5. An app whose pod's token is refused is not told "held" for long afterwards: its
///    sidecar's next renewal (at most a retry period away) is refused, which means lost.
fn prompt_loss(i: &Inputs, at: &dyn Fn(Instant) -> i128, report: &mut Report) {
    for refused in i.entries.iter().filter(|e| matches!(e.op, Op::TokenRefused)) {
        let deadline = refused.at + i.bounds.notify;
        let told = i.entries.iter().find(|e| {
            e.client == refused.client
                && e.lock == refused.lock
                && e.at > deadline
                && matches!(e.op, Op::Granted { .. } | Op::Held { .. })
        });
        if let Some(e) = told {
            let token = match e.op {
                Op::Granted { token, .. } | Op::Held { token, .. } => token,
                _ => 0,
            };
            report.violate(
                "told held after its token was refused",
                format!(
                    "lock {}: {} was told it holds token {token} at +{} ms, {} ms after the apiserver began refusing its pod's token (its sidecar must report the hold lost within {} ms)",
                    e.lock,
                    e.client,
                    at(e.at),
                    ms(e.at - refused.at),
                    ms(i.bounds.notify)
                ),
            );
        }
    }
}

/// 6. Every fault is followed by a grant within its bound.
fn recovery(i: &Inputs, beliefs: &BTreeMap<String, Vec<Belief>>, at: &dyn Fn(Instant) -> i128, report: &mut Report) {
    let end_of_history = i.entries.iter().map(|e| e.at).max();
    let none = Vec::new();
    for f in i.faults {
        let bound = recovery_bound(f.kind, f.lease, &i.bounds);
        for lock in &f.locks {
            let list = beliefs.get(lock).unwrap_or(&none);
            let r = f.recover_from;
            // The beliefs held across the recovery point, and the first grant after it.
            let held_until = list.iter().filter(|b| b.start <= r && b.end >= r).map(|b| b.end).max();
            let idle_from = held_until.map_or(r, |e| e.max(r));
            // The next grant: an app receiving one, or the Lease showing one (a command
            // under `leasehold run` shows its grant only with its first write).
            let leased = i.leases.grants(lock).into_iter().map(|(_, _, seen)| seen);
            let next = list.iter().map(|b| b.start).chain(leased).filter(|s| *s > r).min();
            // Another fault on this lock before that grant delays it for reasons of its own.
            let until = next.unwrap_or(idle_from + bound.unwrap_or_default());
            let interrupted = i.faults.iter().any(|g| {
                class(g.kind) != Class::Refused
                    && g.start > f.start
                    && g.start <= until
                    && g.locks.contains(lock)
                    && !std::ptr::eq(g, f)
            });
            if interrupted && bound.is_some() {
                report.unjudged.1 += 1;
                continue;
            }
            // A fault on this lock still in progress when this one began (an outage not
            // yet over, a controller's clock still stopped) holds the recovery up for
            // reasons of its own: counted from the later of the two ends, with the longer
            // of the two bounds.
            let (idle_from, bound) = i
                .faults
                .iter()
                .filter(|g| {
                    class(g.kind) != Class::Refused
                        && g.start <= f.start
                        && g.recover_from > f.start
                        && g.locks.contains(lock)
                        && !std::ptr::eq(*g, f)
                })
                .fold((idle_from, bound), |(from, b), g| {
                    (from.max(g.recover_from), b.zip(recovery_bound(g.kind, g.lease, &i.bounds)).map(|(x, y)| x.max(y)))
                });
            let took = match next {
                Some(s) => s.saturating_duration_since(idle_from),
                None => {
                    let waited = end_of_history.map_or(Duration::ZERO, |e| e.saturating_duration_since(idle_from));
                    match bound {
                        Some(b) if waited > b => {
                            report.violate(
                                "recovery",
                                format!(
                                    "lock {lock}: no grant within {} ms after {} (at +{} ms)",
                                    ms(b),
                                    f.kind,
                                    at(f.start)
                                ),
                            );
                        }
                        Some(_) => report.unjudged.0 += 1,
                        None => {}
                    }
                    continue;
                }
            };
            let worst = report.recovery.entry(f.kind).or_insert((Duration::ZERO, bound));
            worst.0 = worst.0.max(took);
            if let Some(b) = bound
                && took > b
            {
                report.violate_in(
                    "recovery",
                    format!(
                        "lock {lock}: {} (at +{} ms, recovery from +{} ms) took {} ms to the next grant (bound {} ms)",
                        f.kind,
                        at(f.start),
                        at(idle_from),
                        ms(took),
                        ms(b)
                    ),
                    lock,
                    f.start,
                    idle_from + took + Duration::from_secs(1),
                );
            }
        }
    }
}

/// The entries of `lock` from `from` to `to`, for diagnosing a violation.
pub fn window(entries: &[Entry], lock: &str, from: Instant, to: Instant, base: Instant) -> String {
    entries
        .iter()
        .filter(|e| e.lock == lock && e.at >= from && e.at <= to)
        .filter(|e| !matches!(e.op, Op::Write { applied: true, believed: true, .. }))
        .map(|e| format!("    +{:>8} ms {:<22} {:?}", signed_ms(base, e.at), e.client, e.op))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Learned;
    use crate::record::LeaseState;

    const BOUNDS: Bounds =
        Bounds { slack: Duration::from_secs(2), election: Duration::from_secs(3), notify: Duration::from_secs(2) };
    const LEASE: Duration = Duration::from_secs(5);

    fn t(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn e(base: Instant, ms: u64, client: &str, op: Op) -> Entry {
        Entry { at: t(base, ms), client: client.into(), lock: "l".into(), op }
    }

    fn granted(base: Instant, ms: u64, client: &str, token: i64, remaining: u64) -> Entry {
        e(base, ms, client, Op::Granted { token, until: Some(t(base, ms + remaining)) })
    }

    fn write(
        base: Instant,
        ms: u64,
        client: &str,
        resource: Resource,
        token: i64,
        applied: bool,
        believed: bool,
    ) -> Entry {
        e(base, ms, client, Op::Write { resource, token, applied, believed, sent: t(base, ms.saturating_sub(5)) })
    }

    /// A Lease history granting `grants` (holder identity, token) in order.
    fn leases(base: Instant, grants: &[(&str, i64)]) -> LeaseHistory {
        let states = grants
            .iter()
            .enumerate()
            .map(|(n, (h, token))| LeaseState {
                seen: base + Duration::from_millis(n as u64),
                exists: true,
                holder: Some((*h).to_owned()),
                token: Some(*token),
                draining: None,
                revoked: None,
            })
            .collect();
        LeaseHistory { states: [("l".to_owned(), states)].into(), relists: Vec::new() }
    }

    fn identities() -> HashMap<String, String> {
        [("a", "id-a"), ("b", "id-b"), ("c", "id-c")].map(|(c, i)| (c.to_owned(), i.to_owned())).into()
    }

    fn run(entries: &[Entry], faults: &[Fault], leases: &LeaseHistory, applied: &Applied) -> Report {
        let identities = identities();
        let (permits, writers) = (HashMap::new(), HashSet::new());
        let inputs = Inputs {
            entries,
            faults,
            leases,
            identities: &identities,
            permits: &permits,
            writers: &writers,
            applied,
            bounds: BOUNDS,
        };
        check(&inputs)
    }

    /// The checker on lock `l` with `permits` permits and `writers` in write mode.
    fn run_permits(entries: &[Entry], permits: usize, writers: &[&str]) -> Report {
        let identities = identities();
        let permits = HashMap::from([("l".to_owned(), permits)]);
        let writers = writers.iter().map(|w| (*w).to_owned()).collect();
        let leases = LeaseHistory::default();
        let inputs = Inputs {
            entries,
            faults: &[],
            leases: &leases,
            identities: &identities,
            permits: &permits,
            writers: &writers,
            applied: &Applied::new(),
            bounds: BOUNDS,
        };
        check(&inputs)
    }

    #[test]
    fn permits_are_never_exceeded_and_a_writer_is_alone() {
        let base = Instant::now();
        let overlaps = |r: &Report, what: &str| r.violations.iter().filter(|v| v.contains(what)).count();
        // (name, history, permits, writers, too many at once, beside a writer).
        type Case<'a> = (&'a str, Vec<Entry>, usize, &'a [&'a str], usize, usize);
        let cases: Vec<Case> = vec![
            (
                "two readers on two permits",
                vec![granted(base, 0, "a", 1, 4000), granted(base, 100, "b", 2, 4000)],
                2,
                &[],
                0,
                0,
            ),
            (
                "three at once on two permits",
                vec![
                    granted(base, 0, "a", 1, 4000),
                    granted(base, 100, "b", 2, 4000),
                    granted(base, 3999, "c", 3, 4000),
                ],
                2,
                &[],
                1,
                0,
            ),
            (
                "the third once the first let go",
                vec![
                    granted(base, 0, "a", 1, 4000),
                    granted(base, 100, "b", 2, 4000),
                    e(base, 2000, "a", Op::Release { token: 1 }),
                    granted(base, 2000, "c", 3, 4000),
                ],
                2,
                &[],
                0,
                0,
            ),
            (
                "a writer granted while a reader believes",
                vec![granted(base, 0, "a", 1, 4000), granted(base, 3999, "b", 2, 4000)],
                2,
                &["b"],
                0,
                1,
            ),
            (
                "a reader granted while the writer believes",
                vec![granted(base, 0, "a", 1, 4000), granted(base, 1000, "b", 2, 4000)],
                2,
                &["a"],
                0,
                1,
            ),
            (
                "a writer after the readers let go",
                vec![
                    granted(base, 0, "a", 1, 4000),
                    granted(base, 10, "c", 2, 4000),
                    e(base, 500, "a", Op::Release { token: 1 }),
                    e(base, 600, "c", Op::NotHeld),
                    granted(base, 600, "b", 3, 4000),
                    e(base, 900, "b", Op::Release { token: 3 }),
                    granted(base, 900, "a", 4, 4000),
                ],
                2,
                &["b"],
                0,
                0,
            ),
        ];
        for (name, entries, permits, writers, too_many, beside_writer) in cases {
            let report = run_permits(&entries, permits, writers);
            assert_eq!(overlaps(&report, "apps believed they held at"), too_many, "{name}:\n{report}");
            assert_eq!(overlaps(&report, "beside writer"), beside_writer, "{name}:\n{report}");
            assert_eq!(
                overlaps(&report, "both believed they held"),
                0,
                "{name}: one believer is for mutexes:\n{report}"
            );
        }
    }

    fn fault(base: Instant, kind: &'static str, start: u64, recover: u64) -> Fault {
        Fault {
            kind,
            locks: vec!["l".into()],
            start: t(base, start),
            recover_from: t(base, recover),
            lease: LEASE,
            victim: None,
            note: String::new(),
        }
    }

    /// `a` holds token 1, writes, releases; `b` is granted token 2 after; `a` then sends a
    /// zombie write that is rejected.
    fn clean(base: Instant) -> Vec<Entry> {
        vec![
            granted(base, 0, "a", 1, 4000),
            write(base, 100, "a", Resource::Postgres, 1, true, true),
            e(base, 1500, "a", Op::Held { token: 1, until: Some(t(base, 5500)) }),
            e(base, 1600, "a", Op::Release { token: 1 }),
            granted(base, 1700, "b", 2, 4000),
            write(base, 1800, "a", Resource::Postgres, 1, false, false),
            e(base, 2000, "b", Op::Release { token: 2 }),
        ]
    }

    fn violations(report: &Report) -> Vec<&str> {
        report.violations.iter().map(String::as_str).collect()
    }

    #[test]
    fn a_clean_history_has_no_violations() {
        let base = Instant::now();
        let applied: Applied =
            [(("l".into(), Resource::Postgres), vec![AppliedWrite { writer: "a".into(), token: 1 }])].into();
        let faults = [fault(base, "holder-sigkill", 0, 50)];
        let report = run(&clean(base), &faults, &leases(base, &[("id-a", 1), ("id-b", 2)]), &applied);
        assert!(report.violations.is_empty(), "{report}");
        assert_eq!((report.grants, report.fenced[&Resource::Postgres], report.zombies), (2, (1, 1), (1, 0, 1)));
        assert_eq!(report.smallest_gap.as_ref().map(|(g, _)| *g), Some(100));
        // Recovery counts from the end of a's belief (its release at 1600) to b's grant.
        assert_eq!(report.worst_recovery(), Duration::from_millis(100));
    }

    #[test]
    fn belief_overlaps_are_violations_to_the_millisecond() {
        let base = Instant::now();
        let none = LeaseHistory::default();
        let cases: Vec<(&str, Vec<Entry>, usize)> = vec![
            ("an overlap of 1 ms", vec![granted(base, 0, "a", 1, 2000), granted(base, 1999, "b", 2, 2000)], 1),
            (
                "a grant at the very end of the promise",
                vec![granted(base, 0, "a", 1, 2000), granted(base, 2000, "b", 2, 2000)],
                0,
            ),
            (
                "a killed sidecar whose app never learns: it believes until receipt + remainingMs",
                vec![granted(base, 0, "a", 1, 4000), granted(base, 3000, "b", 2, 4000)],
                1,
            ),
            (
                "the same, granted after the promise ran out",
                vec![granted(base, 0, "a", 1, 4000), granted(base, 4100, "b", 2, 4000)],
                0,
            ),
            (
                "an earlier grant's answer held up past its own deadline is no belief",
                vec![
                    granted(base, 0, "a", 2, 4000),
                    e(base, 3000, "b", Op::Granted { token: 1, until: Some(t(base, 1000)) }),
                    e(base, 3000, "b", Op::Release { token: 1 }),
                ],
                0,
            ),
            (
                "the same, but the app acts on it",
                vec![
                    granted(base, 0, "a", 2, 4000),
                    e(base, 3000, "b", Op::Granted { token: 1, until: Some(t(base, 1000)) }),
                    e(base, 3001, "b", Op::Act { token: 1 }),
                ],
                1,
            ),
            (
                "a closing event stream ends the belief",
                vec![
                    granted(base, 0, "a", 1, 4000),
                    e(base, 1000, "a", Op::Lost { token: 1, how: Learned::StreamClosed }),
                    granted(base, 1500, "b", 2, 4000),
                ],
                0,
            ),
            (
                "a held view extends the belief from its receipt",
                vec![
                    granted(base, 0, "a", 1, 2000),
                    e(base, 1500, "a", Op::Held { token: 1, until: Some(t(base, 3500)) }),
                    granted(base, 3000, "b", 2, 2000),
                ],
                1,
            ),
            (
                "a view saying not held ends it",
                vec![granted(base, 0, "a", 1, 4000), e(base, 900, "a", Op::NotHeld), granted(base, 1000, "b", 2, 2000)],
                0,
            ),
            (
                "a hold file trusted until it is gone",
                vec![
                    e(base, 0, "a", Op::Granted { token: 1, until: None }),
                    e(base, 9000, "a", Op::Held { token: 1, until: None }),
                    granted(base, 6000, "b", 2, 2000),
                    e(base, 9100, "a", Op::NotHeld),
                ],
                1,
            ),
            (
                "a command writing after the next grant",
                vec![
                    e(base, 0, "a", Op::Act { token: 1 }),
                    granted(base, 5000, "b", 2, 4000),
                    e(base, 5200, "a", Op::Act { token: 1 }),
                ],
                1,
            ),
        ];
        for (name, entries, expected) in cases {
            let report = run(&entries, &[], &none, &Applied::new());
            let overlaps = report.violations.iter().filter(|v| v.contains("both believed they held")).count();
            assert_eq!(overlaps, expected, "{name}:\n{report}");
        }
    }

    #[test]
    fn token_order_and_unknown_grants() {
        let base = Instant::now();
        let report = run(&clean(base), &[], &leases(base, &[("id-a", 1), ("id-b", 2), ("id-c", 2)]), &Applied::new());
        assert_eq!(violations(&report), ["lock l: token 2 granted to id-c after token 2 granted to id-b"]);
        let mut entries = clean(base);
        entries.push(granted(base, 3000, "c", 3, 2000));
        let report = run(&entries, &[], &leases(base, &[("id-a", 1), ("id-b", 2)]), &Applied::new());
        assert_eq!(violations(&report), ["lock l: c was told it holds token 3, never granted to it"]);
    }

    #[test]
    fn fenced_resources() {
        let base = Instant::now();
        let w = |writer: &str, token| AppliedWrite { writer: writer.into(), token };
        let order = vec![w("a", 5), w("b", 7), w("a", 5), w("c", 8)];
        let applied: Applied =
            [(("l".into(), Resource::ConfigMap), order.clone()), (("l".into(), Resource::Unfenced), order)].into();
        let report = run(&[], &[], &LeaseHistory::default(), &applied);
        assert_eq!(violations(&report), ["lock l: ConfigMap applied token 5 from a after token 7 from b"]);
        assert_eq!(report.unfenced, (1, 4));

        // The webhook applied a write sent after the Lease showed a higher token.
        let mut raised = leases(base, &[("id-a", 1)]);
        raised.states.get_mut("l").expect("l").push(LeaseState {
            seen: t(base, 1000),
            exists: true,
            holder: Some("id-a".into()),
            token: Some(2),
            draining: Some("1".into()),
            revoked: Some("Forced".into()),
        });
        let entries = vec![
            granted(base, 0, "a", 1, 4000),
            write(base, 900, "a", Resource::ConfigMap, 1, true, true),
            write(base, 1200, "a", Resource::ConfigMap, 1, true, true),
            write(base, 1300, "a", Resource::ConfigMap, 1, false, true),
        ];
        let report = run(&entries, &[], &raised, &Applied::new());
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("after the lock Lease showed a higher token"), "{report}");

        // Writes applied while another app believed: a violation when the writer believed
        // too (the overlap is reported as well), counted when it was a zombie.
        let entries = vec![
            granted(base, 0, "a", 1, 1000),
            granted(base, 2000, "b", 2, 2000),
            write(base, 2500, "a", Resource::Postgres, 1, true, false),
        ];
        let report = run(&entries, &[], &LeaseHistory::default(), &Applied::new());
        assert!(report.violations.is_empty(), "{report}");
        assert_eq!((report.applied_during_other, report.zombies), (1, (1, 1, 0)));
        let entries = vec![
            granted(base, 0, "a", 1, 3000),
            granted(base, 2000, "b", 2, 2000),
            write(base, 2500, "a", Resource::Postgres, 1, true, true),
        ];
        let report = run(&entries, &[], &LeaseHistory::default(), &Applied::new());
        assert!(report.violations.iter().any(|v| v.contains("while b believed it held token 2")), "{report}");
    }

    #[test]
    fn accepted_adversaries_are_violations() {
        let base = Instant::now();
        let adversary = |accepted| {
            e(base, 0, "a", Op::Adversary { kind: "adv-lease-delete", accepted, answer: "403 Forbidden".into() })
        };
        let report = run(&[adversary(false), adversary(true)], &[], &LeaseHistory::default(), &Applied::new());
        assert_eq!(violations(&report), ["lock l: adv-lease-delete by a was accepted: 403 Forbidden"]);
        assert_eq!(report.adversaries["adv-lease-delete"].0, 1);
    }

    #[test]
    fn told_held_long_after_the_token_was_refused() {
        let base = Instant::now();
        let held = |ms| e(base, ms, "a", Op::Held { token: 1, until: Some(t(base, ms + 3000)) });
        let entries =
            vec![granted(base, 0, "a", 1, 4000), e(base, 1000, "a", Op::TokenRefused), held(2000), held(3600)];
        let report = run(&entries[..3], &[], &LeaseHistory::default(), &Applied::new());
        assert!(report.violations.is_empty(), "{report}");
        let report = run(&entries, &[], &LeaseHistory::default(), &Applied::new());
        assert_eq!(
            violations(&report),
            [
                "lock l: a was told it holds token 1 at +3600 ms, 2600 ms after the apiserver began refusing its pod's token (its sidecar must report the hold lost within 2000 ms)"
            ]
        );
    }

    #[test]
    fn every_kind_has_its_class() {
        for kind in crate::global::GLOBAL {
            assert_eq!(class(kind), Class::Outage, "{kind}");
        }
        let layout = crate::world::Layout::full(1, 3);
        for kind in crate::inject::local_kinds(&layout) {
            assert_ne!(class(kind), Class::Outage, "{kind}");
            assert_eq!(class(kind) == Class::Refused, kind.starts_with("adv-"), "{kind}");
        }
    }

    #[test]
    fn recovery_bounds_per_kind() {
        let base = Instant::now();
        // a's belief lapses at 4000; b is granted at 9500: 5500 ms idle.
        let entries = vec![granted(base, 0, "a", 1, 4000), granted(base, 9500, "b", 2, 1000)];
        let judge = |kind, recover| {
            run(&entries, &[fault(base, kind, 1000, recover)], &LeaseHistory::default(), &Applied::new())
        };
        // Expiry: lease 5 s + slack 2 s.
        assert!(judge("holder-sigkill", 1000).violations.is_empty());
        // An outage counted from its end, with the election lease and a watch backoff on top.
        assert!(judge("apiserver-restart", 1000).violations.is_empty());
        assert_eq!(recovery_bound("apiserver-restart", LEASE, &BOUNDS), Some(Duration::from_secs(12)));
        assert_eq!(judge("holder-sigkill", 1000).worst_recovery(), Duration::from_millis(5500));
        let late = vec![granted(base, 0, "a", 1, 4000), granted(base, 11_500, "b", 2, 1000)];
        let report =
            run(&late, &[fault(base, "holder-sigkill", 1000, 1000)], &LeaseHistory::default(), &Applied::new());
        assert!(
            report.violations.iter().any(|v| v.contains("took 7500 ms to the next grant (bound 7000 ms)")),
            "{report}"
        );
        let report = run(&late, &[fault(base, "leader-killed", 1000, 1000)], &LeaseHistory::default(), &Applied::new());
        assert!(report.violations.is_empty(), "{report}");
        // A grant the Lease shows before any app reports one counts (a command under
        // `leasehold run` reports its grant only with its first write).
        let mut shown = leases(base, &[]);
        shown.states.get_mut("l").expect("l").push(LeaseState {
            seen: t(base, 8000),
            exists: true,
            holder: Some("id-c".into()),
            token: Some(3),
            draining: None,
            revoked: None,
        });
        let report = run(&late, &[fault(base, "holder-sigkill", 1000, 1000)], &shown, &Applied::new());
        assert_eq!(report.worst_recovery(), Duration::from_millis(4000), "{report}");
        // A fault that began while an outage on every lock was still in progress: 7.5 s
        // after the lease deletion's drain, but within the outage's bound from its end (the
        // outage itself is not judged: another fault on the lock came after it).
        let faults = [fault(base, "lease-deleted", 1000, 1000), fault(base, "controller-clock-frozen", 900, 4000)];
        let report = run(&late, &faults, &LeaseHistory::default(), &Applied::new());
        assert!(report.violations.is_empty(), "{report}");
        assert_eq!(report.unjudged.1, 1, "{report}");
        assert_eq!(report.recovery.get("lease-deleted").map(|r| r.0), Some(Duration::from_millis(7500)), "{report}");
        // Without the outage, the same history breaks the drain's bound.
        let report = run(&late, &faults[..1], &LeaseHistory::default(), &Applied::new());
        assert!(report.violations.iter().any(|v| v.contains("took 7500 ms")), "{report}");
        // Refused writes have no recovery to judge.
        assert_eq!(recovery_bound("adv-lease-delete", LEASE, &BOUNDS), None);
        // No grant at all, long after: a violation.
        let report = run(
            &[granted(base, 0, "a", 1, 1000), e(base, 20_000, "c", Op::Stopped)],
            &[fault(base, "holder-sigkill", 1000, 1000)],
            &LeaseHistory::default(),
            &Applied::new(),
        );
        assert!(
            report.violations.iter().any(|v| v.contains("no grant within 7000 ms after holder-sigkill")),
            "{report}"
        );
    }
}
