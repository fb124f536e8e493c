//! The claimant side of the protocol, as a small Rust API: claim a lock, wait for the
//! controller's grant, confirm it by compare-and-swap, renew with self-fencing, release.
//! The sidecar and `leasehold run` are thin shells around it.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> anyhow::Result<()> {
//! use leasehold::{claim::Claimant, lease::Identity};
//! let claimant = Claimant::new(client, "default", Identity::for_process(), "my-app");
//! let hold = claimant.acquire("orders", std::time::Duration::from_secs(30)).await?;
//! println!("holding with fencing token {}", hold.token());
//! hold.release().await;
//! # Ok(()) }
//! ```

mod book;
pub mod edit;
mod hold;
mod liveness;
pub mod react;
mod renewer;
mod watch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;
use tracing::{debug, info, warn};

pub use edit::LostReason;
pub use hold::{Hold, HoldEvent, HoldStatus, ReleaseOutcome};
pub use react::{Ours, Reaction, Unanswered};
pub use watch::{LeaseWatches, SlotWatches, lease_states};

use crate::crd::{ClaimMode, DistributedLock, LockClaim};
use crate::lease::{
    CasError, CasStore, GrantedTiming, Identity, LeaseStore, Precondition, Timing, granted, retry, slot,
};
use crate::metrics::ClientMetrics;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

/// The shortest wait for a grant: a wait of 0 (a try-lock) still gives the controller this
/// long to see the claim and grant, and the claimant to confirm — one round trip each,
/// never an instant fail. The sidecar API's `waitSeconds: 0` and `leasehold run --try`.
pub const MIN_WAIT: Duration = Duration::from_secs(1);

/// Why an acquisition failed.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    /// No DistributedLock of that name.
    #[error("lock {namespace}/{lock} does not exist")]
    UnknownLock {
        /// Namespace.
        namespace: String,
        /// Lock name.
        lock: String,
    },
    /// Not granted within the wait.
    #[error("lock {namespace}/{lock} was not granted within {waited:?}")]
    Timeout {
        /// Namespace.
        namespace: String,
        /// Lock name.
        lock: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The apiserver refused us (RBAC or admission).
    #[error("not allowed to claim lock {namespace}/{lock}: {message}")]
    Forbidden {
        /// Namespace.
        namespace: String,
        /// Lock name.
        lock: String,
        /// The apiserver's message.
        message: String,
    },
    /// Reading the DistributedLock failed.
    #[error("failed to read lock {namespace}/{lock}: {source}")]
    ReadLock {
        /// Namespace.
        namespace: String,
        /// Lock name.
        lock: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Reading the DistributedLock got no answer in time.
    #[error("failed to read lock {namespace}/{lock}: no answer within {after:?}")]
    ReadTimeout {
        /// Namespace.
        namespace: String,
        /// Lock name.
        lock: String,
        /// The limit.
        after: Duration,
    },
    /// A Lease operation failed.
    #[error(transparent)]
    Lease(#[from] CasError),
}

impl AcquireError {
    /// Whether trying again may succeed: the apiserver was busy (429), failing (5xx) or
    /// did not answer. A refusal (403, 404, a conflict) is an answer, not a passing state.
    pub fn is_transient(&self) -> bool {
        match self {
            AcquireError::ReadTimeout { .. } => true,
            AcquireError::ReadLock { source, .. } => retry::may_pass(source),
            AcquireError::Lease(e) => e.is_transient(),
            _ => false,
        }
    }

    /// Whether the apiserver answered 429: busy, to be asked again after longer pauses.
    pub fn is_busy(&self) -> bool {
        match self {
            AcquireError::ReadLock { source, .. } => retry::is_busy(source),
            AcquireError::Lease(e) => e.is_busy(),
            _ => false,
        }
    }

    /// A short label for metrics and API error codes.
    pub fn category(&self) -> &'static str {
        match self {
            AcquireError::UnknownLock { .. } => "unknown_lock",
            AcquireError::Timeout { .. } => "timeout",
            AcquireError::Forbidden { .. } => "forbidden",
            AcquireError::ReadLock { .. } | AcquireError::ReadTimeout { .. } => "api",
            AcquireError::Lease(e) => e.category(),
        }
    }
}

/// The holds a claimant has had on one lock.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Retired {
    /// The highest token this claimant has ever been handed. A grant is accepted only with
    /// a higher token, so a hold once lost is never reported held again even if the lock
    /// Lease still names us with it.
    pub handed: i64,
    /// The highest token whose hold we gave back and saw the write land: a Lease naming us
    /// with it (or a lower one) is a view from before that write.
    pub returned: i64,
}

/// One claimant identity in one namespace.
#[derive(Clone)]
pub struct Claimant {
    /// Lock Leases.
    pub(crate) store: LeaseStore,
    /// Our LockClaims.
    claim_store: CasStore<LockClaim>,
    /// DistributedLocks, read for their terms.
    locks: CasStore<DistributedLock>,
    /// Per lock, the terms its spec gave when last read or last recorded on our grant: an
    /// acquisition starts from them rather than read the lock again (see `acquire_in`).
    known_terms: Arc<Mutex<HashMap<String, GrantedTiming>>>,
    pub(crate) identity: Identity,
    pub(crate) metrics: Arc<ClientMetrics>,
    /// Per lock, the tokens of the holds this claimant has had.
    pub(crate) retired: Arc<Mutex<HashMap<String, Retired>>>,
    /// The lock Leases' watches, shared by acquisitions and holds.
    watches: LeaseWatches,
    /// Which acquisition owns the claim on each lock.
    claims: book::ClaimBook,
    /// When this claimant was made: every hold an earlier process with our identity
    /// confirmed was last renewed before it.
    born: Instant,
}

impl Claimant {
    /// A claimant with `identity` in `namespace`, writing with field manager `manager`.
    pub fn new(client: kube::Client, namespace: &str, identity: Identity, manager: &'static str) -> Claimant {
        Claimant {
            store: LeaseStore::new(client.clone(), namespace, manager),
            claim_store: CasStore::new(client.clone(), namespace, manager),
            watches: LeaseWatches::new(kube::Api::namespaced(client.clone(), namespace)),
            locks: CasStore::new(client, namespace, manager),
            known_terms: Arc::default(),
            identity,
            metrics: ClientMetrics::unregistered(),
            retired: Arc::default(),
            claims: book::ClaimBook::default(),
            born: Instant::now(),
        }
    }

    /// Records metrics into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<ClientMetrics>) -> Claimant {
        self.metrics = metrics;
        self
    }

    /// The identity claims are made under.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        self.store.namespace()
    }

    /// Reads a lock's timing; fails with [`AcquireError::UnknownLock`] if it does not exist.
    pub async fn timing(&self, lock: &str) -> Result<Timing, AcquireError> {
        self.terms(lock).await.map(|t| t.timing)
    }

    /// Reads the terms a lock's spec gives a new hold (timing and max hold); fails with
    /// [`AcquireError::UnknownLock`] if it does not exist.
    pub async fn terms(&self, lock: &str) -> Result<GrantedTiming, AcquireError> {
        let (namespace, name) = (self.namespace().to_owned(), lock.to_owned());
        match self.locks.get(lock).await {
            Ok(Some(dl)) => {
                let terms = GrantedTiming::of_spec(&dl.spec);
                self.remember_terms(lock, terms);
                Ok(terms)
            }
            Ok(None) => Err(AcquireError::UnknownLock { namespace, lock: name }),
            Err(e @ CasError::Forbidden { .. }) => {
                Err(AcquireError::Forbidden { namespace, lock: name, message: e.to_string() })
            }
            Err(CasError::Timeout { after, .. }) => Err(AcquireError::ReadTimeout { namespace, lock: name, after }),
            Err(CasError::Api { source, .. }) => Err(AcquireError::ReadLock { namespace, lock: name, source }),
            Err(e) => Err(e.into()),
        }
    }

    /// The terms last read from `lock`'s spec or recorded on our last grant of it.
    fn known_terms(&self, lock: &str) -> Option<GrantedTiming> {
        self.known_terms.lock().expect("known terms are never poisoned").get(lock).copied()
    }

    fn remember_terms(&self, lock: &str, terms: GrantedTiming) {
        self.known_terms.lock().expect("known terms are never poisoned").insert(lock.to_owned(), terms);
    }

    /// Claims `lock`, waits up to `wait` for the grant and confirms it. Dropping the
    /// returned future withdraws the claim.
    ///
    /// A lock with several permits is granted on any of its slot Leases: the claimant
    /// watches slot 0 (the Lease named like the lock) and, once slot 0 says how many
    /// permits the lock has, every other slot Lease too.
    pub async fn acquire(&self, lock: &str, wait: Duration) -> Result<Hold, AcquireError> {
        self.acquire_in(lock, wait, ClaimMode::Read).await
    }

    /// [`Claimant::acquire`] in `mode`: `Read` holds one permit beside other readers,
    /// `Write` every permit (on a mutex they are the same).
    pub async fn acquire_in(&self, lock: &str, wait: Duration, mode: ClaimMode) -> Result<Hold, AcquireError> {
        let started = Instant::now();
        let ticket = self.claims.ticket(lock);
        let mut guard = Withdraw { claimant: self.clone(), lock: lock.to_owned(), ticket, armed: true };
        // Read the lock, claim, and read the lock Lease's watch at once: the round trips in
        // the time of one. The watch is this claimant's shared one (started now, or running
        // since an earlier acquisition): it shows every change from its latest state on,
        // and a grant on this claim can only be made after it is sent, so none slips by.
        let deadline = tokio::time::Instant::from_std(started + wait);
        let mut watches = SlotWatches::new(self.watches.clone(), lock);
        let (polled, mut polls) = futures::channel::mpsc::unbounded::<(u32, Option<Lease>)>();
        // Every try of the first claim carries this request time: a try that got no answer
        // but landed is known for ours by it.
        let asked = (Timestamp::now(), Instant::now());
        // The lock's terms as an earlier acquisition learned them, if any: reading them
        // again costs the apiserver a read per acquisition (a fifth of a grant's cost on a
        // contended lock). They decide nothing about a hold whose Lease records its own
        // terms, which every grant does; they only pace the claim's refreshes. Before a
        // Lease that does not record them is judged, or a missing lock Lease is waited
        // for (the lock may be gone), the lock is read afresh (below).
        let known = self.known_terms(lock);
        let mut fresh = known.is_none();
        let mut life = liveness::WatchLife::default();
        let setup = {
            let setup = async {
                tokio::join!(
                    async {
                        match known {
                            Some(terms) => Ok(terms),
                            None => self.retrying(lock, deadline, || self.terms(lock)).await,
                        }
                    },
                    self.retrying(lock, deadline, || self.claim_anew(lock, mode, asked))
                )
            };
            tokio::pin!(setup);
            loop {
                tokio::select! {
                    done = &mut setup => break Some(done),
                    // Kept, in order, for after the setup.
                    Some(state) = watches.next() => {
                        life.shown(state.0);
                        let _ = polled.unbounded_send(state);
                    }
                    _ = tokio::time::sleep_until(deadline) => break None,
                }
            }
        };
        // Out of time during setup: withdraw only now that the setup is dropped — a claim
        // write under way holds the claim book's gate, which the withdrawal waits for.
        let Some((read, claimed)) = setup else {
            guard.armed = false;
            self.withdraw(lock, ticket).await;
            return Err(AcquireError::Timeout { namespace: self.namespace().into(), lock: lock.into(), waited: wait });
        };
        let mut terms = match read {
            Ok(t) => t,
            Err(e) => {
                guard.armed = false;
                if claimed.is_ok() {
                    self.withdraw(lock, ticket).await;
                }
                return Err(e);
            }
        };
        // The claim as created: its first refresh replaces it without reading it first.
        let claimed = claimed?;
        // Besides the watches, a slot's Lease is read at a claim refresh when its watch
        // showed no change since the last one (`liveness`).
        let refresh = terms.timing.claim_ttl() / 3;
        // The first claim was made before the timing was known: refresh it (with its real
        // lifetime) before its provisional one can run out.
        let mut next_refresh = tokio::time::Instant::now() + refresh.min(DEFAULT_CLAIM_TTL / 3);
        let mut refreshing = Refreshing { last: Some(claimed), failing: retry::pauses(refresh) };
        let retired =
            self.retired.lock().expect("retired map is never poisoned").get(lock).copied().unwrap_or_default();
        let mut missed_grant = false;
        // When to read a slot's Lease again: once an earlier process's hold may be given
        // back, or soon after a confirmation got no answer (the watch may be down too).
        let mut look_again: Option<(tokio::time::Instant, u32)> = None;
        // The latest grant whose confirmation the apiserver refused (it did not land).
        let mut unconfirmed: Option<i64> = None;
        // Confirmations that got no answer: they may have landed.
        let mut unanswered: Vec<Unanswered> = Vec::new();
        // Per slot, the token its Lease carried when we first saw it (0: none).
        let mut first_seen: HashMap<u32, i64> = HashMap::new();
        loop {
            let (slot, state) = tokio::select! {
                biased;
                _ = tokio::time::sleep_until(deadline) => {
                    guard.armed = false;
                    self.withdraw(lock, ticket).await;
                    return Err(AcquireError::Timeout { namespace: self.namespace().into(), lock: lock.into(), waited: wait });
                }
                _ = tokio::time::sleep_until(look_again.map_or(deadline, |(at, _)| at)), if look_again.is_some() => {
                    let slot = look_again.take().map_or(0, |(_, slot)| slot);
                    if let Ok(Some(lease)) = self.store.get(&slot::lease_name(lock, slot)).await {
                        let _ = polled.unbounded_send((slot, Some(lease)));
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(next_refresh) => {
                    let kept;
                    (next_refresh, kept) = self.keep_claim(lock, &terms.timing, mode, &mut refreshing).await?;
                    // An apiserver that turned the refresh away would turn the reads away too.
                    if !kept {
                        continue;
                    }
                    for slot in (0..watches.watched()).filter(|slot| life.must_read(*slot)) {
                        if let Ok(Some(lease)) = self.store.get(&slot::lease_name(lock, slot)).await {
                            let _ = polled.unbounded_send((slot, Some(lease)));
                        }
                    }
                    continue;
                }
                Some(state) = polls.next() => state,
                Some(state) = watches.next() => {
                    life.shown(state.0);
                    state
                }
            };
            if let (0, Some(lease)) = (slot, &state) {
                watches.watch_up_to(edit::permits(lease));
            }
            if must_read_terms(fresh, slot, state.as_ref()) {
                match self.retrying(lock, deadline, || self.terms(lock)).await {
                    Ok(read) => (terms, fresh) = (read, true),
                    Err(e) => {
                        guard.armed = false;
                        self.withdraw(lock, ticket).await;
                        return Err(e);
                    }
                }
            }
            let first = *first_seen
                .entry(slot)
                .or_insert_with(|| state.as_ref().and_then(crate::lease::token::of_lease).unwrap_or(0));
            let claim = self.claims.claim(lock);
            let ours = Ours::Waiting(react::Waiting {
                identity: &self.identity,
                floor: retired.handed,
                returned: retired.returned,
                unconfirmed,
                unanswered: &unanswered,
                missed_grant,
                claim: claim.as_ref().map(|(uid, _)| uid.as_str()),
                claim_sent: claim.as_ref().map(|(_, sent)| *sent),
                first_seen: first,
                born: self.born,
                terms: &terms,
                now: Instant::now(),
            });
            let reaction = react::next(state.as_ref(), &ours);
            // No Lease (Reaction::Wait): nothing to do until it is created.
            let Some(lease) = state else { continue };
            let token = match reaction {
                Reaction::Confirm { token } => token,
                // A confirmation that got no answer landed, its hold still valid.
                Reaction::Adopt { token, sent } => {
                    info!(lock, token, "a confirmation that got no answer had landed: the hold is ours");
                    let granted = hold::Granted { slot, token, lease, sent };
                    return Ok(self.held(lock, ticket, &mut guard, started, granted, terms, (polls, watches)));
                }
                Reaction::Answer { token, sent } => {
                    let granted = hold::Granted { slot, token, lease, sent };
                    return Ok(self.held(lock, ticket, &mut guard, started, granted, terms, (polls, watches)));
                }
                Reaction::NotGranted { acknowledge, claim_again } => {
                    // A grant whose confirmation was refused (its Lease was replaced or
                    // deleted under it) was never reported held: if the controller now
                    // drains it, acknowledge at once rather than let the lock wait out a
                    // lease duration for nothing.
                    if let Some(token) = acknowledge {
                        debug!(lock, token, "acknowledging the drain of a grant never confirmed");
                        if let Err(e) = self.store.replace(&edit::released(&lease)).await {
                            debug!(lock, error = %e, "failed to acknowledge the drain of an unconfirmed grant");
                        }
                    }
                    // A grant we could not confirm was taken back, and our claim with it:
                    // claim again now rather than at the next refresh.
                    if claim_again {
                        missed_grant = false;
                        (next_refresh, _) = self.keep_claim(lock, &terms.timing, mode, &mut refreshing).await?;
                    }
                    continue;
                }
                // A leftover hold naming us (of a lost hold, or of an earlier process with
                // our identity) is never reported held: it is given back so the controller
                // grants afresh, with a higher token — once nobody can still believe they
                // hold it.
                Reaction::GiveBackAt { token, at } => {
                    debug!(lock, token, "an earlier process's hold: giving it back after its renew deadline");
                    look_again = Some((tokio::time::Instant::from_std(at), slot));
                    continue;
                }
                Reaction::GiveBack { token } => {
                    debug!(lock, token, "giving back a leftover hold");
                    if let Err(e) = self.store.replace(&edit::released(&lease)).await {
                        debug!(lock, error = %e, "failed to give back a leftover hold");
                    }
                    // Our own confirmation, landed too late to use: the controller grants
                    // afresh, and our claim must be there for it.
                    if unanswered.iter().any(|u| u.token == token) {
                        unanswered.clear();
                        missed_grant = true;
                    }
                    continue;
                }
                // Reactions of a holder: never given while waiting.
                Reaction::Wait | Reaction::Renew | Reaction::LetGo(_) => continue,
            };
            let sent = Instant::now();
            let confirmation = edit::renewed(&lease, Timestamp::now());
            match self.store.replace(&confirmation).await {
                Ok(confirmed) => {
                    let granted = hold::Granted { slot, token, lease: confirmed, sent };
                    return Ok(self.held(lock, ticket, &mut guard, started, granted, terms, (polls, watches)));
                }
                // The grant moved on before we confirmed it (or the Lease is being
                // re-created): that grant is not ours; keep waiting.
                Err(CasError::Conflict { .. } | CasError::NotFound { .. }) => {
                    debug!(lock, token, "grant changed before confirmation");
                    missed_grant = true;
                    unconfirmed = Some(token);
                }
                // No answer, or a busy or failing apiserver: the write may have landed, or
                // may yet. Read the Lease again shortly; what it shows decides.
                Err(e) if e.is_transient() => {
                    warn!(lock, token, error = %e, "no answer to our confirmation; reading the lock again");
                    self.metrics.apiserver_retries.inc();
                    let renewed = confirmation.spec.as_ref().and_then(|s| s.renew_time.as_ref());
                    if let Some(renewed) = renewed {
                        unanswered.push(Unanswered { token, renew_micros: renewed.0.as_microsecond(), sent });
                    }
                    look_again = Some((tokio::time::Instant::now() + UNANSWERED_PAUSE, slot));
                }
                Err(e) => return Err(self.refused(lock, e)),
            }
        }
    }

    /// The hold an acquisition ends with: `granted`, renewed from here on, fed the rest of
    /// its slot's states (later ones, and those the refresh read).
    #[allow(clippy::too_many_arguments)]
    fn held(
        &self,
        lock: &str,
        ticket: book::Ticket,
        guard: &mut Withdraw,
        started: Instant,
        granted: hold::Granted,
        terms: GrantedTiming,
        (polls, watches): (futures::channel::mpsc::UnboundedReceiver<(u32, Option<Lease>)>, SlotWatches),
    ) -> Hold {
        guard.armed = false;
        self.metrics.acquire_seconds.observe(started.elapsed().as_secs_f64());
        if granted::recorded(&granted.lease) {
            self.remember_terms(lock, granted::of_lease(&granted.lease, &terms));
        }
        let (slot, token) = (granted.slot, granted.token);
        info!(namespace = %self.namespace(), lock, slot, token, identity = %self.identity, "acquired");
        let later = polls.filter_map(move |(s, state)| futures::future::ready((s == slot).then_some(state)));
        // A read may have found the grant before the watch showed it: the watch's states
        // from before the grant (a lower token) say nothing about this hold.
        let watched = watches.into_slot(slot).skip_while(move |state| {
            let before = state.as_ref().and_then(crate::lease::token::of_lease).is_some_and(|t| t < token);
            futures::future::ready(before)
        });
        let states = futures::stream::select(later, watched).boxed();
        Hold::start(self.clone(), lock, ticket, terms, granted, states)
    }

    /// Refreshes (or re-creates) our claim on `lock` with the lifetime its wait so far
    /// gives it ([`Timing::claim_lifetime`]); returns when to do so next (a third of that
    /// lifetime on), and whether it did. A busy or unreachable apiserver
    /// costs a refresh, not the acquisition: it is tried again after the next of the
    /// failing pauses, which grow while refreshes keep failing and start again from the
    /// first once one succeeds. The claim outlives three refresh periods, so a few growing
    /// pauses keep its place.
    async fn keep_claim(
        &self,
        lock: &str,
        timing: &Timing,
        mode: ClaimMode,
        refreshing: &mut Refreshing,
    ) -> Result<(tokio::time::Instant, bool), AcquireError> {
        match self.ensure_claim(lock, timing, mode, &mut refreshing.last).await {
            Ok(lifetime) => {
                let refresh = lifetime / 3;
                refreshing.failing = retry::pauses(refresh);
                Ok((tokio::time::Instant::now() + refresh, true))
            }
            Err(e) if e.is_transient() => {
                // Not refreshed: the claim lives on by the lifetime its last write gave it.
                let lifetime = refreshing.last.as_ref().map(|c| edit::allowed_lifetime(&c.spec, timing));
                let refresh = lifetime.unwrap_or_else(|| timing.claim_ttl()) / 3;
                let pause = refreshing.failing.next().unwrap_or(refresh).min(refresh);
                info!(lock, error = %e, ?pause, "failed to refresh our claim; trying again");
                self.metrics.apiserver_retries.inc();
                Ok((tokio::time::Instant::now() + pause, false))
            }
            Err(e) => Err(e),
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or the next try would start past
    /// `deadline` (the caller's wait): a busy or briefly unreachable apiserver costs time,
    /// not the acquisition.
    async fn retrying<T, F, Fut>(
        &self,
        lock: &str,
        deadline: tokio::time::Instant,
        attempt: F,
    ) -> Result<T, AcquireError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, AcquireError>>,
    {
        retry::within(deadline, attempt, AcquireError::is_transient, AcquireError::is_busy, |e, pause| {
            info!(lock, error = %e, ?pause, "the apiserver did not answer as it should; trying again");
            self.metrics.apiserver_retries.inc();
        })
        .await
    }

    /// An acquisition's first claim on `lock`, made before the lock's timing is read: it
    /// lives [`DEFAULT_CLAIM_TTL`] until refreshed. It queues at the back. A claim left over
    /// from an earlier acquisition (its delete failed: the apiserver was unreachable) is
    /// replaced, never reused: reused, it would keep its old place at the head of the
    /// queue, and a claimant that acquires again and again would never let the others in.
    /// A claim this acquisition made by an earlier try, whose answer never came, is ours:
    /// it is kept (replaced, it would cost two writes and its place in the queue). `asked`
    /// is when the acquisition asked (its claims' request time) and sent its first try.
    /// Returns the claim as the apiserver holds it.
    async fn claim_anew(
        &self,
        lock: &str,
        mode: ClaimMode,
        asked: (Timestamp, Instant),
    ) -> Result<LockClaim, AcquireError> {
        let ttl = i32::try_from(DEFAULT_CLAIM_TTL.as_secs()).unwrap_or(i32::MAX);
        let name = self.identity.claim_name(lock);
        let _writing = self.claims.write(lock).await;
        for _ in 0..3 {
            let mut claim = edit::with_mode(edit::lock_claim(lock, &self.identity, ttl, Timestamp::now()), mode);
            claim.spec.request_time = MicroTime(asked.0);
            let sent = Instant::now();
            match self.claim_store.create(&claim).await {
                Ok(created) => {
                    debug!(lock, claim = %name, "claimed");
                    self.claims.created(lock, created.metadata.uid.clone(), sent);
                    return Ok(created);
                }
                Err(CasError::AlreadyExists { .. }) => {
                    let existing = self.claim_store.get(&name).await.map_err(|e| self.refused(lock, e))?;
                    if let Some(ours) = existing.filter(|c| edit::is_claim_of_this_acquisition(c, &claim)) {
                        // Which try landed is not known: the first was sent earliest.
                        info!(lock, claim = %name, "a claim that got no answer had landed: it is ours, kept");
                        self.claims.created(lock, ours.metadata.uid.clone(), asked.1);
                        return Ok(ours);
                    }
                    debug!(lock, claim = %name, "replacing a leftover claim");
                    self.claim_store.delete(&name, None).await.map_err(|e| self.refused(lock, e))?;
                }
                Err(e) => return Err(self.refused(lock, e)),
            }
        }
        Err(CasError::AlreadyExists { kind: "lockclaim".into(), namespace: self.namespace().into(), name }.into())
    }

    /// Refreshes our claim on `lock` (compare-and-swap) with the lifetime its wait gives it
    /// under `timing`, or creates it again if it is gone (the controller dropped it, or a
    /// grant we could not confirm took it along) or is not ours (squatted: replaced), with
    /// a new claim's lifetime; returns the lifetime it now has. `last` is the claim as our
    /// last write of it (its create included) returned: replaced without reading it first
    /// (a waiting claim is refreshed again and again, and with thousands waiting the reads
    /// were half of what they asked of the apiserver); refused because it changed, it is
    /// read again; because it is gone, it is created again without a read.
    async fn ensure_claim(
        &self,
        lock: &str,
        timing: &Timing,
        mode: ClaimMode,
        last: &mut Option<LockClaim>,
    ) -> Result<Duration, AcquireError> {
        let name = self.identity.claim_name(lock);
        let _writing = self.claims.write(lock).await;
        // A claim deleted between our create and our refresh (the controller dropping it
        // as stale) is created again: a claimant that believes it waits must have a claim.
        // A replace answered "not found" says so without a read.
        let mut gone = false;
        for _ in 0..3 {
            let existing = match last.take() {
                Some(claim) => Some(claim),
                None if gone => None,
                None => self.claim_store.get(&name).await.map_err(|e| self.refused(lock, e))?,
            };
            let mut created = None;
            let written = match existing {
                None => {
                    if gone {
                        info!(lock, claim = %name, "our claim was gone: claiming again, at the back of the queue");
                    }
                    let ttl = i32::try_from(timing.claim_ttl().as_secs()).unwrap_or(i32::MAX);
                    let claim = edit::with_mode(edit::lock_claim(lock, &self.identity, ttl, Timestamp::now()), mode);
                    created = Some(Instant::now());
                    self.claim_store.create(&claim).await
                }
                Some(claim) if !edit::is_our_claim(&claim, lock, &self.identity) => {
                    warn!(lock, claim = %name, claimant = %claim.spec.claimant, "replacing a claim made in our name by someone else");
                    let uid = claim.metadata.uid.clone().unwrap_or_default();
                    self.claim_store
                        .delete_if(&name, Precondition::Uid(&uid))
                        .await
                        .map_err(|e| self.refused(lock, e))?;
                    continue;
                }
                Some(claim) => {
                    let replaced = self.claim_store.replace(&edit::refreshed(&claim, timing, Timestamp::now())).await;
                    // Turned away or unanswered: the claim as we know it is still the one to
                    // replace (if the write landed after all, its resourceVersion refuses the
                    // next one, and the claim is read again).
                    if replaced.as_ref().is_err_and(CasError::is_transient) {
                        *last = Some(claim);
                    }
                    replaced
                }
            };
            match written {
                Ok(claim) => {
                    match created {
                        Some(sent) => self.claims.created(lock, claim.metadata.uid.clone(), sent),
                        None => self.claims.set_uid(lock, claim.metadata.uid.clone()),
                    }
                    let lifetime = edit::allowed_lifetime(&claim.spec, timing);
                    *last = Some(claim);
                    return Ok(lifetime);
                }
                Err(CasError::NotFound { .. }) => gone = true,
                Err(CasError::AlreadyExists { .. } | CasError::Conflict { .. }) => gone = false,
                Err(e) => return Err(self.refused(lock, e)),
            }
        }
        // Still contended: the next refresh, a new claim's third of a lifetime on, tries again.
        debug!(lock, claim = %name, "claim kept changing under us");
        Ok(timing.claim_ttl())
    }

    /// An error of a claim write as an acquisition error: refusals name the lock.
    fn refused(&self, lock: &str, error: CasError) -> AcquireError {
        match error {
            CasError::Forbidden { message, .. } | CasError::Unauthorized { message, .. } => {
                AcquireError::Forbidden { namespace: self.namespace().into(), lock: lock.into(), message }
            }
            e => e.into(),
        }
    }

    /// Deletes our claim on `lock` (only the claim object we made, when we know it).
    /// Call while holding the claim book's write gate for `lock`.
    async fn delete_claim(&self, lock: &str) -> Result<(), CasError> {
        let uid = self.claims.uid(lock);
        let precondition = uid.as_deref().map_or(Precondition::None, Precondition::Uid);
        let result = self.claim_store.delete_if(&self.identity.claim_name(lock), precondition).await;
        if result.is_ok() {
            self.claims.set_uid(lock, None);
        }
        result
    }

    /// Withdraws acquisition `ticket` from `lock`: deletes our claim, then gives back a
    /// grant that may have arrived meanwhile (never confirmed, so never reported held),
    /// handing it on to the waiter the controller recorded as next when it recorded one.
    /// Nothing to do once a newer acquisition of the lock has begun: claim and grant are
    /// its.
    ///
    /// A claim the lock's Lease names as next may still be handed the lock by a release
    /// sent before the controller saw the claim go: while the Lease names it (at most
    /// [`WITHDRAWN_NEXT_WATCH`]), such a grant is given back as it arrives.
    pub(crate) async fn withdraw(&self, lock: &str, ticket: book::Ticket) {
        let named_next = {
            let Some(_writing) = self.claims.withdrawal(lock, ticket).await else { return };
            let withdrawn = self.claims.uid(lock);
            if let Err(e) = self.delete_claim(lock).await {
                debug!(lock, error = %e, "failed to delete claim");
            }
            // On any slot: slot 0 says how many there are.
            let mut slots = 1;
            let mut slot = 0;
            let mut named_next = None;
            while slot < slots {
                if let Ok(Some(lease)) = self.store.get(&slot::lease_name(lock, slot)).await {
                    if slot == 0 {
                        slots = edit::permits(&lease);
                        named_next = withdrawn.clone().filter(|uid| names_next(&lease, uid));
                    }
                    if edit::names_us(&lease, &self.identity) {
                        self.give_back_unanswered(lock, slot, &lease).await;
                    }
                }
                slot += 1;
            }
            named_next
        };
        // In the background: the caller's answer (a timeout, say) does not wait for it,
        // and the watch ends by itself.
        if let Some(uid) = named_next {
            let (claimant, lock) = (self.clone(), lock.to_owned());
            tokio::spawn(async move { claimant.give_back_handoffs(&lock, &uid).await });
        }
    }

    /// Gives back a grant on `lease` (slot `slot` of `lock`) that we never reported held:
    /// handed on to the waiter recorded as next, or cleared.
    async fn give_back_unanswered(&self, lock: &str, slot: u32, lease: &Lease) {
        let back = crate::lease::next::handed_on(lease, Timestamp::now()).unwrap_or_else(|| edit::released(lease));
        if let Err(e) = self.store.replace(&back).await {
            debug!(lock, slot, error = %e, "failed to give back an unconfirmed grant");
        }
    }

    /// While `lock`'s Lease names our withdrawn claim `uid` as next, gives back a grant on
    /// that claim as it arrives; done once the Lease names another (or nobody), after a
    /// grant given back, or after [`WITHDRAWN_NEXT_WATCH`].
    async fn give_back_handoffs(&self, lock: &str, uid: &str) {
        let mut states = self.watches.states(&slot::lease_name(lock, 0));
        let deadline = tokio::time::Instant::now() + WITHDRAWN_NEXT_WATCH;
        while let Ok(Some(Some(lease))) = tokio::time::timeout_at(deadline, states.next()).await {
            if edit::names_us(&lease, &self.identity) && edit::claim_uid(&lease) == Some(uid) {
                debug!(lock, "handed a withdrawn claim: giving it back");
                return self.give_back_unanswered(lock, 0, &lease).await;
            }
            if !names_next(&lease, uid) {
                return;
            }
        }
    }
}

/// Whether `lease` names the claim with `uid` as the next waiter.
fn names_next(lease: &Lease, uid: &str) -> bool {
    crate::lease::next::of_lease(lease).is_some_and(|n| n.claim_uid == uid)
}

/// How long a withdrawn claim the lock's Lease names as next is watched for a handoff to
/// it: the controller names another within moments of seeing the claim go; a release that
/// hands on later, with no controller running that long, leaves the grant to the
/// controller, which revokes it unanswered.
const WITHDRAWN_NEXT_WATCH: Duration = Duration::from_secs(30);

/// The lifetime of a first claim, made before the lock's timing is read.
const DEFAULT_CLAIM_TTL: Duration = Duration::from_secs(45);

/// After a confirmation got no answer: how soon to look again.
const UNANSWERED_PAUSE: Duration = Duration::from_millis(200);

/// Whether an acquisition that started from remembered terms (`fresh` false: not read
/// from the lock since) must read the lock before it goes on with `state`, slot `slot`'s
/// Lease: a Lease that does not record its hold's terms is judged by the lock's terms,
/// which must be the spec's as it is now; and a missing lock Lease (slot 0's) may mean the
/// lock is gone, which the caller is told at once rather than after its wait. Another
/// slot's Lease may just not be made yet.
fn must_read_terms(fresh: bool, slot: u32, state: Option<&Lease>) -> bool {
    !fresh
        && match state {
            Some(lease) => !granted::recorded(lease),
            None => slot == 0,
        }
}

/// What an acquisition keeps between refreshes of its claim.
struct Refreshing {
    /// The claim as our last write of it returned.
    last: Option<LockClaim>,
    /// The pauses before the next try while refreshes fail.
    failing: backon::ExponentialBackoff,
}

/// Withdraws a claim when an acquisition is abandoned (its future dropped).
struct Withdraw {
    claimant: Claimant,
    lock: String,
    ticket: book::Ticket,
    armed: bool,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if self.armed
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let (claimant, lock, ticket) = (self.claimant.clone(), std::mem::take(&mut self.lock), self.ticket);
            runtime.spawn(async move { claimant.withdraw(&lock, ticket).await });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    #[test]
    fn remembered_terms_are_read_again_before_an_unrecorded_lease_or_a_missing_lock_lease() {
        let recorded = {
            let mut lease = Lease::default();
            granted::record(&mut lease, &GrantedTiming::of_spec(&crate::crd::DistributedLockSpec::default()));
            lease
        };
        let unrecorded = Lease::default();
        // (case, fresh, slot, state, read the lock first)
        let table = [
            ("remembered, a Lease recording its terms", false, 0, Some(&recorded), false),
            ("remembered, another slot's Lease recording its terms", false, 2, Some(&recorded), false),
            ("remembered, a Lease without its terms", false, 0, Some(&unrecorded), true),
            ("remembered, another slot's Lease without its terms", false, 1, Some(&unrecorded), true),
            ("remembered, no lock Lease", false, 0, None, true),
            ("remembered, another slot's Lease not made yet", false, 1, None, false),
            ("read, a Lease without its terms", true, 0, Some(&unrecorded), false),
            ("read, no lock Lease", true, 0, None, false),
        ];
        for (case, fresh, slot, state, expected) in table {
            assert_eq!(must_read_terms(fresh, slot, state), expected, "{case}");
        }
    }

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Status::failure("refused", "Reason").with_code(code).boxed())
    }

    fn lease(source: kube::Error) -> AcquireError {
        let at = |kind: &str| (kind.to_owned(), "ns".to_owned(), "db".to_owned());
        let (kind, namespace, name) = at("lease");
        AcquireError::Lease(CasError::Api { verb: "create", kind, namespace, name, source })
    }

    #[test]
    fn only_a_busy_failing_or_silent_apiserver_is_worth_another_try_a_busy_one_after_longer_pauses() {
        let read = |source| AcquireError::ReadLock { namespace: "ns".into(), lock: "db".into(), source };
        // (name, error, worth another try, busy: 429)
        let table: Vec<(&str, AcquireError, bool, bool)> = vec![
            ("429 on the read", read(api(429)), true, true),
            ("503 on the read", read(api(503)), true, false),
            (
                "no answer to the read",
                AcquireError::ReadTimeout { namespace: "ns".into(), lock: "db".into(), after: Duration::from_secs(5) },
                true,
                false,
            ),
            ("429 on the claim", lease(api(429)), true, true),
            ("500 on the claim", lease(api(500)), true, false),
            ("422 on the claim", lease(api(422)), false, false),
            ("unknown lock", AcquireError::UnknownLock { namespace: "ns".into(), lock: "db".into() }, false, false),
            (
                "forbidden",
                AcquireError::Forbidden { namespace: "ns".into(), lock: "db".into(), message: "no".into() },
                false,
                false,
            ),
            (
                "timed out waiting",
                AcquireError::Timeout { namespace: "ns".into(), lock: "db".into(), waited: Duration::from_secs(1) },
                false,
                false,
            ),
        ];
        for (name, error, transient, busy) in table {
            assert_eq!(error.is_transient(), transient, "{name}: {error}");
            assert_eq!(error.is_busy(), busy, "{name}: {error}");
        }
    }
}
