//! What `leasehold status` shows, as pure functions of the objects it read: the lock, its
//! Lease, its LockClaims, its force-release requests and the owners of the Pods involved.
//! [`LockView`] is also the `-o json` / `-o yaml` shape, documented in
//! docs/guides/cli.md; fields are only ever added to it.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use serde::Serialize;

use crate::controller::queue;
use crate::controller::view::{self as lease_view, LeaseState};
use crate::crd::{ANNOTATION_MODE, ClaimMode, DistributedLock, ForceReleaseRequest, LockClaim, Phase};
use crate::lease::{Identity, Timing};

/// How many force-release happenings the text shows (JSON carries all the status keeps).
const SHOWN_HISTORY: usize = 5;

/// Everything read for one lock.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The lock.
    pub lock: DistributedLock,
    /// Its Lease (slot 0's, for a lock with several permits), if it exists.
    pub lease: Option<Lease>,
    /// The Leases of its other slots, with their slot numbers.
    pub slots: Vec<(u32, Lease)>,
    /// The LockClaims labelled with the lock's name.
    pub claims: Vec<LockClaim>,
    /// The namespace's ForceReleaseRequests (those of other locks are ignored).
    pub requests: Vec<ForceReleaseRequest>,
    /// Pod name → its controller, as `Kind/name` (absent: no owner, or not readable).
    pub owners: BTreeMap<String, String>,
    /// Now, on this machine's clock.
    pub now: Timestamp,
}

/// A claimant, named for people.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Who {
    /// The identity as written into the Lease.
    pub identity: String,
    /// Its Pod, when it runs in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The Pod's controller (`ReplicaSet/web-7d9f`), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The user, for a claimant outside any Pod (`leasehold run` on a workstation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Pod name (and owner), or user and host: what the text shows.
    pub display: String,
}

/// The current holder.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderView {
    /// Who.
    #[serde(flatten)]
    pub who: Who,
    /// The fencing token of the hold (`None`: the Lease's token is unreadable).
    pub token: Option<i64>,
    /// When granted.
    pub acquired_at: Option<Timestamp>,
    /// How long held, as of `now`.
    pub held_seconds: Option<f64>,
    /// Whether the holder has confirmed the grant (renewed at least once).
    pub confirmed: bool,
}

/// The holder of one slot of a lock with several permits.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlotHolderView {
    /// The slot: its Lease is `<lock>` for 0, `<lock>.<slot>` for the others.
    pub slot: u32,
    /// `Held`, `Granted` (not renewed by its holder yet; a grant on a fresh claim is held
    /// by its app already, until the first renewal a retry period later) or `Draining`.
    pub state: String,
    /// `Read` (one permit) or `Write` (every permit).
    pub mode: String,
    /// The holder (while draining, the revoked one).
    #[serde(flatten)]
    pub holder: HolderView,
    /// While draining: the revoked token and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draining: Option<String>,
}

/// One waiter, in grant order.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaiterView {
    /// 1 is served next.
    pub position: usize,
    /// Who.
    #[serde(flatten)]
    pub who: Who,
    /// Its LockClaim.
    pub claim: String,
    /// When it claimed (the apiserver's creation time).
    pub since: Timestamp,
    /// How long it has waited, as of `now`.
    pub waiting_seconds: f64,
}

/// A condition of the lock.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionView {
    /// `Held` or `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    /// Why, in one word (`LeaseConflict`, `Draining`, ...).
    pub reason: String,
    /// Details.
    pub message: String,
    /// When it last changed.
    pub since: Timestamp,
}

/// A force-release happening from the lock's status history.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryView {
    /// When the controller saw it.
    pub at: Timestamp,
    /// `Requested`, `Approved`, `Denied`, `Executed`, ...
    pub event: String,
    /// Who did it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The request, if it came from one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A force-release request that has not reached a final phase.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestView {
    /// The ForceReleaseRequest.
    pub name: String,
    /// `Pending` or `Approved`.
    pub phase: String,
    /// Who asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requester: Option<String>,
    /// Approvals so far of those needed (`1/2`).
    pub approvals: String,
    /// The reason given.
    pub reason: String,
}

/// Everything `leasehold status <namespace>/<lock>` shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockView {
    /// Namespace.
    pub namespace: String,
    /// Lock name.
    pub lock: String,
    /// `Free`, `Held` (renewed by its holder), `Granted` (not renewed yet: held by its app
    /// already when granted on a fresh claim), `Draining` (a revoked
    /// holder may still believe it holds), or `NoLease` (the controller has not made it).
    pub state: String,
    /// The holder; while draining, the revoked holder. For a lock with several permits,
    /// slot 0's (every holder is in `holders`).
    pub holder: Option<HolderView>,
    /// The lock's permits (1: a mutex).
    pub permits: u32,
    /// Every slot's holder, by slot.
    pub holders: Vec<SlotHolderView>,
    /// While draining: the revoked token and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draining: Option<String>,
    /// The highest token ever issued for the lock.
    pub fencing_token: Option<i64>,
    /// Waiters in grant order.
    pub queue: Vec<WaiterView>,
    /// The lock's conditions.
    pub conditions: Vec<ConditionView>,
    /// Grants, releases, expirations, forced releases.
    pub stats: crate::crd::LockStats,
    /// The latest force-release happenings, oldest first.
    pub history: Vec<HistoryView>,
    /// Force-release requests still open.
    pub pending_requests: Vec<RequestView>,
}

/// Names a claimant: its Pod (and the Pod's owner), or its user and host.
pub fn who(identity: &Identity, owners: &BTreeMap<String, String>) -> Who {
    match &identity.pod {
        Some(pod) => {
            let owner = owners.get(&pod.name).cloned();
            let display = match &owner {
                Some(owner) => format!("pod {} ({owner})", pod.name),
                None => format!("pod {}", pod.name),
            };
            Who { identity: identity.id.clone(), pod: Some(pod.name.clone()), owner, user: None, display }
        }
        None => {
            // `<username>/u-<host>-<8 hex>`: the user, and the host the suffix was made on.
            let (user, suffix) =
                identity.id.rsplit_once('/').map_or((None, identity.id.as_str()), |(u, s)| (Some(u), s));
            let host = suffix.strip_prefix("u-").and_then(|s| s.rsplit_once('-')).map(|(host, _)| host);
            let display = match (user, host) {
                (Some(user), Some(host)) => format!("{user} on {host}"),
                _ => identity.id.clone(),
            };
            Who { identity: identity.id.clone(), pod: None, owner: None, user: user.map(str::to_owned), display }
        }
    }
}

fn seconds_between(earlier: Timestamp, now: Timestamp) -> f64 {
    // A clock behind the apiserver's must not show negative ages.
    now.duration_since(earlier).as_secs_f64().max(0.0)
}

/// The view of one lock.
pub fn lock_view(o: &Observed) -> LockView {
    let status = o.lock.status.clone().unwrap_or_default();
    let holder_of = |identity: &Identity, token, acquired: Option<Timestamp>, confirmed| HolderView {
        who: who(identity, &o.owners),
        token,
        acquired_at: acquired,
        held_seconds: acquired.map(|t| seconds_between(t, o.now)),
        confirmed,
    };
    let slot_state = |lease: &Lease| match lease_view::lease_state(lease) {
        LeaseState::Free => ("Free", None, None),
        LeaseState::Held(h) => {
            let state = if h.confirmed { "Held" } else { "Granted" };
            (state, Some(holder_of(&h.identity, h.token, h.acquire_time, h.confirmed)), None)
        }
        LeaseState::Draining(d) => {
            let acquired = lease.spec.as_ref().and_then(|s| s.acquire_time.as_ref()).map(|t| t.0);
            let holder = d.holder.as_ref().map(|i| holder_of(i, d.revoked, acquired, true));
            let token = d.revoked.map_or_else(|| "unreadable".to_owned(), |t| t.to_string());
            let why = d.reason.map_or_else(String::new, |r| format!(": {r}"));
            ("Draining", holder, Some(format!("token {token} revoked{why}")))
        }
    };
    let (mut state, holder, draining) = o.lease.as_ref().map_or(("NoLease", None, None), slot_state);
    let leases = o.lease.iter().map(|l| (0, l)).chain(o.slots.iter().map(|(slot, l)| (*slot, l)));
    let holders: Vec<SlotHolderView> = leases
        .filter_map(|(slot, lease)| {
            let (state, holder, draining) = slot_state(lease);
            let write = lease.annotations().get(ANNOTATION_MODE).is_some_and(|m| m == ClaimMode::Write.as_str());
            let mode = if write { ClaimMode::Write } else { ClaimMode::Read };
            Some(SlotHolderView {
                slot,
                state: state.to_owned(),
                mode: mode.as_str().to_owned(),
                holder: holder?,
                draining,
            })
        })
        .collect();
    let permits = u32::try_from(o.lock.spec.permits).unwrap_or(1).max(1);
    if permits > 1 {
        // The lock is held while any slot is.
        let states = ["Held", "Granted", "Draining"];
        state = states.into_iter().find(|s| holders.iter().any(|h| h.state == *s)).unwrap_or(state);
    }
    let name = o.lock.name_any();
    // The queue as the controller serves it: well-formed claims on this lock, in claim
    // order, the holders' own claims left out.
    let mut claims: Vec<_> =
        o.claims.iter().filter_map(|c| lease_view::claim(c, &name, &Timing::of(&o.lock.spec))).collect();
    queue::order(&mut claims);
    let holder_ids: Vec<&str> = holders.iter().map(|h| h.holder.who.identity.as_str()).collect();
    let queue = claims
        .iter()
        .filter(|c| !holder_ids.contains(&c.identity.id.as_str()))
        .enumerate()
        .map(|(i, c)| WaiterView {
            position: i + 1,
            who: who(&c.identity, &o.owners),
            claim: c.name.clone(),
            since: c.created,
            waiting_seconds: seconds_between(c.created, o.now),
        })
        .collect();
    let conditions = status
        .conditions
        .iter()
        .map(|c| ConditionView {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            since: c.last_transition_time.0,
        })
        .collect();
    let history = status
        .force_release_history
        .iter()
        .map(|e| HistoryView {
            at: e.at.0,
            event: e.event.clone(),
            by: e.by.clone(),
            request: e.request.clone(),
            message: e.message.clone(),
        })
        .collect();
    let mut requests: Vec<&ForceReleaseRequest> = o
        .requests
        .iter()
        .filter(|r| r.spec.lock == name && !r.status.as_ref().and_then(|s| s.phase).is_some_and(Phase::is_final))
        .collect();
    requests.sort_by_key(|r| (r.metadata.creation_timestamp.clone().map(|t| t.0), r.name_any()));
    let pending_requests = requests
        .iter()
        .map(|r| {
            let s = r.status.clone().unwrap_or_default();
            RequestView {
                name: r.name_any(),
                phase: s.phase.map_or("Pending", Phase::as_str).to_owned(),
                requester: r.spec.requester.clone(),
                approvals: s.approvals_text.unwrap_or_else(|| format!("{}/?", r.spec.approvals.len())),
                reason: r.spec.reason.clone(),
            }
        })
        .collect();
    LockView {
        namespace: o.lock.namespace().unwrap_or_default(),
        lock: name,
        state: state.to_owned(),
        holder,
        permits,
        holders,
        draining,
        fencing_token: status.fencing_token,
        queue,
        conditions,
        stats: status.stats,
        history,
        pending_requests,
    }
}

/// A duration as people read it: `42s`, `3m12s`, `2h5m`, `3d4h`.
pub fn age(seconds: f64) -> String {
    let s = Duration::from_secs_f64(seconds.max(0.0)).as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// The text of `leasehold status <namespace>/<lock>`.
pub fn lock_text(v: &LockView) -> String {
    let mut out = format!("Lock:      {}/{}\nState:     {}\n", v.namespace, v.lock, v.state);
    if v.permits > 1 {
        holders_text(&mut out, v);
    } else {
        holder_text(&mut out, v);
    }
    let highest = v.fencing_token.map_or_else(|| "-".to_owned(), |t| t.to_string());
    out.push_str(&format!("Highest token issued: {highest}\n"));
    out.push_str(&format!("\nQueue ({} waiting):\n", v.queue.len()));
    let rows = v
        .queue
        .iter()
        .map(|w| [w.position.to_string(), w.who.display.clone(), age(w.waiting_seconds), w.who.identity.clone()]);
    out.push_str(&indent(&table(["#", "WAITER", "WAITING", "IDENTITY"], rows)));
    out.push_str("\nConditions:\n");
    let rows = v
        .conditions
        .iter()
        .map(|c| [c.type_.clone(), c.status.clone(), c.reason.clone(), c.since.to_string(), c.message.clone()]);
    out.push_str(&indent(&table(["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"], rows)));
    let s = &v.stats;
    out.push_str(&format!(
        "\nStats: {} grants, {} releases, {} expirations, {} forced releases",
        s.grants, s.releases, s.expirations, s.forced_releases
    ));
    if let Some(wait) = s.last_wait_seconds {
        out.push_str(&format!("; last wait {}", age(wait)));
    }
    if let Some(ms) = s.last_handoff_milliseconds {
        out.push_str(&format!("; last handoff {ms}ms"));
    }
    out.push('\n');
    let shown = &v.history[v.history.len().saturating_sub(SHOWN_HISTORY)..];
    out.push_str(&format!("\nRecent force-release history ({} of {}):\n", shown.len(), v.history.len()));
    let rows = shown.iter().map(|h| {
        let dash = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".to_owned());
        [h.at.to_string(), h.event.clone(), dash(&h.by), dash(&h.request), dash(&h.message)]
    });
    out.push_str(&indent(&table(["AT", "EVENT", "BY", "REQUEST", "MESSAGE"], rows)));
    out.push_str(&format!("\nPending force-release requests ({}):\n", v.pending_requests.len()));
    let rows = v.pending_requests.iter().map(|r| {
        [
            r.name.clone(),
            r.phase.clone(),
            r.requester.clone().unwrap_or_else(|| "-".to_owned()),
            r.approvals.clone(),
            r.reason.clone(),
        ]
    });
    out.push_str(&indent(&table(["NAME", "PHASE", "REQUESTER", "APPROVALS", "REASON"], rows)));
    out
}

/// The holder of a mutex, and its drain.
fn holder_text(out: &mut String, v: &LockView) {
    match &v.holder {
        Some(h) => {
            out.push_str(&format!("Holder:    {}\n", h.who.display));
            out.push_str(&format!("Identity:  {}\n", h.who.identity));
            let token = h.token.map_or_else(|| "unreadable".to_owned(), |t| t.to_string());
            out.push_str(&format!("Token:     {token}\n"));
            let held = h.held_seconds.map_or_else(|| "-".to_owned(), age);
            let note = if h.confirmed { "" } else { " (granted, not renewed yet)" };
            out.push_str(&format!("Held for:  {held}{note}\n"));
        }
        None => out.push_str("Holder:    -\n"),
    }
    if let Some(d) = &v.draining {
        out.push_str(&format!("Draining:  {d}\n"));
    }
}

/// The holders of a lock with several permits, one line per slot held.
fn holders_text(out: &mut String, v: &LockView) {
    out.push_str(&format!("Permits:   {}/{} held\n", v.holders.len(), v.permits));
    let rows = v.holders.iter().map(|h| {
        let token = h.holder.token.map_or_else(|| "unreadable".to_owned(), |t| t.to_string());
        let held = h.holder.held_seconds.map_or_else(|| "-".to_owned(), age);
        let state = match &h.draining {
            Some(d) => format!("{} ({d})", h.state),
            None => h.state.clone(),
        };
        [h.slot.to_string(), h.holder.who.display.clone(), h.mode.clone(), token, held, state]
    });
    out.push_str("Holders:\n");
    out.push_str(&indent(&table(["SLOT", "HOLDER", "MODE", "TOKEN", "HELD", "STATE"], rows)));
}

/// One line of `leasehold status <namespace>` / `-A`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockRow {
    /// Namespace.
    pub namespace: String,
    /// Lock name.
    pub lock: String,
    /// The holder (pod, else identity) as of the lock's status, `None` when free.
    pub holder: Option<String>,
    /// The holder's token.
    pub token: Option<i64>,
    /// How long held, as of `now`.
    pub held_seconds: Option<f64>,
    /// How many wait.
    pub waiters: i32,
    /// The `Ready` condition's reason (`LeaseOwned`, `LeaseConflict`, ...).
    pub ready: Option<String>,
}

/// The row of one lock, from its status alone.
pub fn lock_row(lock: &DistributedLock, now: Timestamp) -> LockRow {
    let status = lock.status.clone().unwrap_or_default();
    let holder = status.holder.as_ref();
    LockRow {
        namespace: lock.namespace().unwrap_or_default(),
        lock: lock.name_any(),
        holder: holder.map(|h| h.pod.clone().unwrap_or_else(|| h.identity.clone())),
        token: holder.map(|h| h.fencing_token),
        held_seconds: holder.map(|h| seconds_between(h.acquired_at.0, now)),
        waiters: status.queue_length,
        ready: status.conditions.iter().find(|c| c.type_ == "Ready").map(|c| c.reason.clone()),
    }
}

/// The table of several locks, sorted by namespace and name.
pub fn rows_text(rows: &[LockRow]) -> String {
    let mut sorted: Vec<&LockRow> = rows.iter().collect();
    sorted.sort_by(|a, b| (&a.namespace, &a.lock).cmp(&(&b.namespace, &b.lock)));
    let dash = || "-".to_owned();
    let cells = sorted.iter().map(|r| {
        [
            r.namespace.clone(),
            r.lock.clone(),
            r.holder.clone().unwrap_or_else(dash),
            r.token.map_or_else(dash, |t| t.to_string()),
            r.held_seconds.map_or_else(dash, age),
            r.waiters.to_string(),
            r.ready.clone().unwrap_or_else(dash),
        ]
    });
    table(["NAMESPACE", "LOCK", "HOLDER", "TOKEN", "HELD", "WAITERS", "READY"], cells)
}

/// Left-aligned columns two spaces apart; `(none)` under a header with no rows.
fn table<const N: usize>(header: [&str; N], rows: impl Iterator<Item = [String; N]>) -> String {
    let rows: Vec<[String; N]> = std::iter::once(header.map(str::to_owned)).chain(rows).collect();
    if rows.len() == 1 {
        return "(none)\n".to_owned();
    }
    crate::cli::columns::columns(&rows)
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
