//! Per-lock slots: the local queue of callers inside one pod, and the hold each is handed.
//!
//! A pod makes at most one claim per lock (design 3). Callers of the local API queue here,
//! first come first served: the head caller's wait is what the pod's claim serves. When a
//! grant arrives it goes to the first caller still waiting, under a fresh owner handle and
//! on the terms that caller chose ([`super::owner`]); a caller that gave up (timed out or
//! disconnected) leaves the queue, and if nobody is left the claim is withdrawn. When the
//! hold ends, the next caller's claim starts — at the back of the lock's global queue,
//! which keeps the lock fair across pods.
//!
//! A hold ends when its owner lets go: a release, its session closing, its heartbeat
//! lapsing, the app container that took it ending. A hold *lost* under a live owner
//! (revoked, or its Lease deleted) is kept — reported lost, never held — until the owner
//! lets go or until every deadline it was told has passed: only then is it given back, so
//! the lock is never handed on while the owner may still believe it holds.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use serde::Serialize;
use tokio::sync::{broadcast, oneshot};
use tokio::task::AbortHandle;
use tracing::{info, warn};

use super::owner::{self, Binding, Ending, Handle, Terms};
use super::pod::{self, PodView};
use crate::boottime;
use crate::claim::{AcquireError, Claimant, Hold, HoldEvent, HoldStatus, ReleaseOutcome};
use crate::crd::ClaimMode;

/// How many ended holds per lock are remembered, so that a late or repeated release with
/// an old handle is answered for what it is.
const REMEMBERED: usize = 64;

/// What a caller receives when the pod's hold is handed to it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Granted {
    /// Lock name.
    pub lock: String,
    /// The fencing token to present to protected resources.
    pub fencing_token: i64,
    /// The permit slot held (0 for a mutex; a lock with several permits has one Lease per
    /// slot, and a resource fenced per slot checks this slot's token).
    pub slot: u32,
    /// `read` (one permit, beside other readers) or `write` (every permit, alone).
    pub mode: &'static str,
    /// The holder identity (this pod).
    pub holder: String,
    /// When the hold lapses unless renewed (or kept alive): the earlier of the sidecar's
    /// self-fence deadline and the caller's TTL deadline.
    pub expires_at: Timestamp,
    /// The lock's lease duration.
    pub lease_duration_seconds: u64,
    /// Time left, ms, as the response is sent: the caller may count on the hold for this
    /// long from when it receives the answer, unless told otherwise. Never past the
    /// caller's TTL deadline.
    pub remaining_ms: u64,
    /// The same deadline on the pod's `CLOCK_BOOTTIME` (ms since boot, as in
    /// `/proc/uptime`): unlike `remainingMs` it does not stretch while the answer is in
    /// transit, so a caller that compares it with the clock never counts on a hold past
    /// its end, however late the answer arrives.
    pub valid_until_boottime_ms: u64,
    /// The owner handle: release, keep-alive and the hold's view take it.
    pub handle: Handle,
    /// Whether the hold is bound to the acquire's connection.
    pub session: bool,
    /// The caller's TTL, for a heartbeat hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<f64>,
    /// The app container whose restart releases the hold, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// Something that happened to a lock's hold in this pod, for the event streams.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum LockEvent {
    /// The pod holds the lock.
    #[serde(rename_all = "camelCase")]
    Acquired {
        /// Token.
        fencing_token: i64,
        /// Self-fence deadline (or the caller's TTL deadline, if earlier).
        expires_at: Timestamp,
    },
    /// A renewal failed; still held until the deadline.
    #[serde(rename_all = "camelCase")]
    RenewLate {
        /// Token.
        fencing_token: i64,
        /// Time left, ms.
        remaining_ms: u64,
        /// The hold's end on the pod's `CLOCK_BOOTTIME`, ms.
        valid_until_boottime_ms: u64,
        /// The failure.
        error: String,
    },
    /// The hold is lost and will never be reported held again.
    #[serde(rename_all = "camelCase")]
    Lost {
        /// Token.
        fencing_token: i64,
        /// Why.
        reason: String,
    },
    /// The hold ended and was given back.
    #[serde(rename_all = "camelCase")]
    Released {
        /// Token.
        fencing_token: i64,
        /// Whether it was still held.
        was_held: bool,
        /// Why it ended.
        reason: String,
    },
}

impl LockEvent {
    /// The event name.
    pub fn name(&self) -> &'static str {
        match self {
            LockEvent::Acquired { .. } => "acquired",
            LockEvent::RenewLate { .. } => "renew-late",
            LockEvent::Lost { .. } => "lost",
            LockEvent::Released { .. } => "released",
        }
    }

    /// The token of the hold it is about.
    pub fn token(&self) -> i64 {
        match self {
            LockEvent::Acquired { fencing_token, .. }
            | LockEvent::RenewLate { fencing_token, .. }
            | LockEvent::Lost { fencing_token, .. }
            | LockEvent::Released { fencing_token, .. } => *fencing_token,
        }
    }
}

/// This pod's view of a lock.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockView {
    /// Lock name.
    pub lock: String,
    /// `held`, `waiting`, `lost` or `free`.
    pub state: &'static str,
    /// Whether the pod holds it now (renew deadline checked against the clock).
    pub held: bool,
    /// The token of the current (or lost) hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    /// Time left, ms, when held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_ms: Option<u64>,
    /// The hold's end on the pod's `CLOCK_BOOTTIME`, ms, when held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_until_boottime_ms: Option<u64>,
    /// Callers of this pod waiting for the lock.
    pub local_waiters: usize,
}

/// One hold's view, by its owner handle.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HoldView {
    /// Lock name.
    pub lock: String,
    /// The owner handle.
    pub handle: String,
    /// `held`, `lost` (lost, not yet let go) or `ended`.
    pub state: &'static str,
    /// Whether it is held now.
    pub held: bool,
    /// Its token.
    pub fencing_token: i64,
    /// Time left, ms, when held (never past the caller's TTL deadline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_ms: Option<u64>,
    /// The hold's end on the pod's `CLOCK_BOOTTIME`, ms, when held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_until_boottime_ms: Option<u64>,
    /// Whether it is bound to the acquire's connection.
    pub session: bool,
    /// The caller's TTL, for a heartbeat hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<f64>,
    /// Why it was lost, or why it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Why an operation with an owner handle changed nothing.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum HandleError {
    /// The handle names no hold of this lock in this pod.
    #[error("handle {handle} does not own lock {lock} in this pod{}", belonging(.belongs_to))]
    Wrong {
        /// Lock.
        lock: String,
        /// The handle.
        handle: String,
        /// The lock it does belong to, if another.
        belongs_to: Option<String>,
    },
    /// The hold was lost; it is kept until its owner lets go but never held again.
    #[error("the hold on lock {lock} (token {token}) was lost: {reason}; release it")]
    Lost {
        /// Lock.
        lock: String,
        /// Token.
        token: i64,
        /// Why.
        reason: String,
    },
    /// The hold has ended.
    #[error("the hold on lock {lock} (token {token}) has ended: {ending}")]
    Ended {
        /// Lock.
        lock: String,
        /// Token.
        token: i64,
        /// Why.
        ending: Ending,
    },
}

/// " (it belongs to the hold on lock X)", when it does.
fn belonging(lock: &Option<String>) -> String {
    lock.as_ref().map(|other| format!(" (it belongs to the hold on lock {other})")).unwrap_or_default()
}

/// What a release by handle did.
#[derive(Clone, Debug, PartialEq)]
pub enum HandleRelease {
    /// The hold was given back.
    Released(ReleaseOutcome),
    /// It had ended already (a repeated release): nothing to do.
    AlreadyEnded(Ending),
}

/// A release by lock name alone was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error(
    "lock {lock} is held in this pod by a caller with an owner handle (a session or heartbeat hold); \
     release it with POST /v1/locks/{lock}/holds/{{handle}}/release, or end its session"
)]
pub struct HandleRequired {
    /// Lock.
    pub lock: String,
}

type Reply = oneshot::Sender<Result<Granted, Arc<AcquireError>>>;

struct Waiter {
    id: u64,
    reply: Reply,
    terms: Terms,
}

/// The hold a caller was handed, and what ends it.
struct Current {
    hold: Hold,
    handle: Handle,
    /// The caller (acquire request) it was handed to.
    caller: u64,
    terms: Terms,
    /// When it was handed over (wall clock, compared with the kubelet's timestamps).
    granted_at: Timestamp,
    /// The caller's TTL deadline, for a heartbeat hold.
    caller_deadline: Option<Instant>,
    /// The latest deadline any answer about this hold implied.
    told_until: Option<Instant>,
    /// Why it was lost, once lost (then kept until let go).
    lost: Option<String>,
}

impl Current {
    /// Time left to tell the owner, recording it as told; `None` unless held now.
    fn answer(&mut self, now: Instant) -> Option<Left> {
        if self.lost.is_some() || self.caller_deadline.is_some_and(|d| d <= now) {
            return None;
        }
        let left = owner::remaining(self.hold.remaining()?, self.caller_deadline, now);
        let until = now + left;
        self.told_until = Some(self.told_until.map_or(until, |t| t.max(until)));
        Some(Left::until(until, left))
    }

    fn ttl_seconds(&self) -> Option<f64> {
        self.terms.ttl.map(|t| t.as_secs_f64())
    }

    /// The container whose end releases the hold, given the Pod (for the default binding).
    fn container<'a>(&'a self, pod: Option<&'a k8s_openapi::api::core::v1::Pod>) -> Option<&'a str> {
        match &self.terms.binding {
            Binding::None => None,
            Binding::Container(name) => Some(name),
            Binding::OnlyAppContainer => pod.and_then(pod::only_app_container),
        }
    }
}

#[derive(Default)]
struct Slot {
    waiters: VecDeque<Waiter>,
    acquiring: Option<AbortHandle>,
    current: Option<Current>,
    /// Recently ended holds: handle, token, why.
    ended: VecDeque<(Handle, i64, Ending)>,
    lost_token: Option<i64>,
    events: Option<broadcast::Sender<LockEvent>>,
}

impl Slot {
    fn events(&mut self) -> broadcast::Sender<LockEvent> {
        self.events.get_or_insert_with(|| broadcast::channel(32).0).clone()
    }

    fn publish(&mut self, event: LockEvent) {
        // No subscriber is fine: events are for whoever listens now.
        let _ = self.events().send(event);
    }

    fn remember(&mut self, handle: Handle, token: i64, ending: Ending) {
        if self.ended.len() == REMEMBERED {
            self.ended.pop_front();
        }
        self.ended.push_back((handle, token, ending));
    }

    fn current_of(&mut self, handle: &Handle) -> Option<&mut Current> {
        self.current.as_mut().filter(|c| &c.handle == handle)
    }

    fn ended_of(&self, handle: &Handle) -> Option<&(Handle, i64, Ending)> {
        self.ended.iter().find(|(h, _, _)| h == handle)
    }
}

/// All slots of a sidecar.
#[derive(Clone)]
pub struct Slots {
    inner: Arc<Mutex<HashMap<String, Slot>>>,
    claimant: Claimant,
    /// The longest a claim may wait (the acquisition runs until a grant or until no caller
    /// waits any more).
    max_wait: Duration,
    next_id: Arc<AtomicU64>,
    /// The sidecar's own Pod, when it watches it.
    pod: Option<PodView>,
    metrics: owner::OwnerMetrics,
    /// Set when the sidecar shuts down: no new acquisition starts.
    closing: Arc<std::sync::atomic::AtomicBool>,
    /// Releases under way (a hold taken out of its slot, its Lease not yet cleared): the
    /// shutdown waits for them, or the process would end with the lock still held.
    releasing: tokio_util::task::TaskTracker,
}

impl Slots {
    /// Slots acquiring through `claimant`.
    pub fn new(claimant: Claimant, max_wait: Duration) -> Slots {
        Slots {
            inner: Arc::default(),
            claimant,
            max_wait,
            next_id: Arc::default(),
            pod: None,
            metrics: owner::OwnerMetrics::default(),
            closing: Arc::default(),
            releasing: tokio_util::task::TaskTracker::new(),
        }
    }

    /// Counts how holds end into `metrics`.
    pub fn with_metrics(mut self, metrics: owner::OwnerMetrics) -> Slots {
        self.metrics = metrics;
        self
    }

    /// Follows the Pod's container statuses in `view`: holds bound to a container end when
    /// the container instance that took them has. Run [`Slots::follow_containers`].
    pub fn with_pod(mut self, view: PodView) -> Slots {
        self.pod = Some(view);
        self
    }

    /// Whether the sidecar is shutting down (no new holds).
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// The claimant.
    pub fn claimant(&self) -> &Claimant {
        &self.claimant
    }

    /// The Pod as last seen, if the sidecar watches it.
    pub fn pod(&self) -> Option<Arc<k8s_openapi::api::core::v1::Pod>> {
        self.pod.as_ref().and_then(|v| v.borrow().clone())
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.inner.lock().expect("sidecar slots are never poisoned")
    }

    /// Queues a caller for `lock` on `terms`; returns its id and where its grant (or error)
    /// arrives.
    pub fn enqueue(&self, lock: &str, terms: Terms) -> (u64, oneshot::Receiver<Result<Granted, Arc<AcquireError>>>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = oneshot::channel();
        self.slots().entry(lock.to_owned()).or_default().waiters.push_back(Waiter { id, reply, terms });
        self.kick(lock);
        (id, rx)
    }

    /// Starts the pod's claim if callers wait and nothing holds or claims already.
    fn kick(&self, lock: &str) {
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(lock) else { return };
        slot.waiters.retain(|w| !w.reply.is_closed());
        if self.is_closing() {
            // Dropping the waiters' replies answers them; dropping the acquisition
            // withdraws its claim.
            slot.waiters.clear();
            if let Some(task) = slot.acquiring.take() {
                task.abort();
            }
            return;
        }
        if slot.current.is_some() || slot.acquiring.is_some() || slot.waiters.is_empty() {
            return;
        }
        let (this, name, claimant, wait) = (self.clone(), lock.to_owned(), self.claimant.clone(), self.max_wait);
        // The pod claims in the mode of the caller it serves first.
        let mode = slot.waiters.front().map_or(ClaimMode::Read, |w| w.terms.mode);
        let task = tokio::spawn(async move {
            let result = claimant.acquire_in(&name, wait, mode).await;
            this.granted(&name, mode, result);
        });
        slot.acquiring = Some(task.abort_handle());
    }

    /// Hands a grant (taken in `mode`) to the first caller still waiting, or gives it back:
    /// also when that caller asked for more than `mode` (a writer whose turn came as the
    /// reader the claim was made for left), and then claims again for it.
    fn granted(&self, lock: &str, mode: ClaimMode, result: Result<Hold, AcquireError>) {
        let pod = self.pod();
        let mut slots = self.slots();
        let slot = slots.entry(lock.to_owned()).or_default();
        slot.acquiring = None;
        let hold = match result {
            Ok(hold) => hold,
            Err(error) => {
                let error = Arc::new(error);
                for waiter in slot.waiters.drain(..) {
                    let _ = waiter.reply.send(Err(error.clone()));
                }
                return;
            }
        };
        let now = Instant::now();
        let handle = Handle::random();
        let mut unclaimed = Some(hold);
        let mut handed = None;
        while let Some(hold) = unclaimed.take() {
            let first_served = slot.waiters.front().is_some_and(|w| serves(mode, w.terms.mode));
            let Some(waiter) = slot.waiters.pop_front().filter(|_| first_served) else {
                unclaimed = Some(hold);
                break;
            };
            let caller_deadline = waiter.terms.ttl.map(|ttl| now + ttl);
            let current = Current {
                hold,
                handle: handle.clone(),
                caller: waiter.id,
                terms: waiter.terms,
                granted_at: Timestamp::now(),
                caller_deadline,
                told_until: None,
                lost: None,
            };
            let left = owner::remaining(current.hold.remaining().unwrap_or_default(), caller_deadline, now);
            let granted = Granted {
                lock: lock.to_owned(),
                fencing_token: current.hold.token(),
                slot: current.hold.slot(),
                mode: mode_name(mode),
                holder: self.claimant.identity().id.clone(),
                expires_at: wall_after(left),
                lease_duration_seconds: current.hold.timing().lease_duration.as_secs(),
                remaining_ms: 0,
                valid_until_boottime_ms: 0,
                handle: handle.clone(),
                session: current.terms.session,
                ttl_seconds: current.ttl_seconds(),
                container: current.container(pod.as_deref()).map(str::to_owned),
            };
            if waiter.reply.send(Ok(granted.clone())).is_ok() {
                handed = Some((current, granted));
            } else {
                unclaimed = Some(current.hold);
            }
        }
        let Some((current, granted)) = handed else {
            // Everyone left while the grant was on its way, or the first caller left
            // needs more than it: give it back, then claim for whoever waits.
            drop(slots);
            if let Some(hold) = unclaimed {
                let (this, name) = (self.clone(), lock.to_owned());
                tokio::spawn(async move {
                    hold.release().await;
                    this.kick(&name);
                });
            }
            return;
        };
        self.forward_events(lock, &current.hold, &handle);
        if let Some(ttl) = current.terms.ttl {
            self.watch_heartbeat(lock, &handle, ttl);
        }
        // A loss before the events were followed would otherwise go unheard.
        let lost_already = match current.hold.status() {
            HoldStatus::Lost(reason) => Some(reason.to_string()),
            _ => None,
        };
        slot.lost_token = None;
        slot.publish(LockEvent::Acquired { fencing_token: granted.fencing_token, expires_at: granted.expires_at });
        slot.current = Some(current);
        drop(slots);
        if let Some(reason) = lost_already {
            self.lost(lock, &handle, granted.fencing_token, reason);
        }
    }

    /// Relays a hold's events to the lock's stream; a loss is recorded (see [`Slots::lost`]).
    fn forward_events(&self, lock: &str, hold: &Hold, handle: &Handle) {
        let (this, name, handle, token, mut events) =
            (self.clone(), lock.to_owned(), handle.clone(), hold.token(), hold.events());
        tokio::spawn(async move {
            while let Ok(event) = events.recv().await {
                match event {
                    HoldEvent::RenewLate { error, .. } => this.renew_late(&name, &handle, token, error),
                    HoldEvent::Lost(reason) => {
                        this.lost(&name, &handle, token, reason.to_string());
                        return;
                    }
                    HoldEvent::Released { .. } => return,
                }
            }
        });
    }

    /// A renewal failed: tell listeners how long the hold still lasts (for its owner), as
    /// of now.
    fn renew_late(&self, lock: &str, handle: &Handle, token: i64, error: String) {
        let mut slots = self.slots();
        let slot = slots.entry(lock.to_owned()).or_default();
        let Some(left) = slot.current_of(handle).and_then(|c| c.answer(Instant::now())) else { return };
        slot.publish(LockEvent::RenewLate {
            fencing_token: token,
            remaining_ms: millis(left.remaining),
            valid_until_boottime_ms: left.boottime_ms,
            error,
        });
    }

    /// A hold was lost: report it; keep it until its owner lets go, or until everything
    /// its owner was told has run out.
    fn lost(&self, lock: &str, handle: &Handle, token: i64, reason: String) {
        let end = {
            let mut slots = self.slots();
            let slot = slots.entry(lock.to_owned()).or_default();
            // Heard once (the event, or the status seen at the grant).
            let Some(current) = slot.current_of(handle).filter(|c| c.lost.is_none()) else { return };
            current.lost = Some(reason.clone());
            let end = owner::belief_end(current.told_until, current.caller_deadline);
            slot.lost_token = Some(token);
            slot.publish(LockEvent::Lost { fencing_token: token, reason: reason.clone() });
            end
        };
        warn!(lock, token, %reason, "hold lost; kept until its owner lets go");
        let (this, lock, handle) = (self.clone(), lock.to_owned(), handle.clone());
        tokio::spawn(async move {
            if let Some(end) = end {
                tokio::time::sleep_until(end.into()).await;
            }
            this.let_go(&lock, &handle, Ending::BeliefEnded { lost: reason }).await;
        });
    }

    /// Ends a heartbeat hold when its caller's TTL lapses without a keep-alive.
    fn watch_heartbeat(&self, lock: &str, handle: &Handle, ttl: Duration) {
        let (this, lock, handle) = (self.clone(), lock.to_owned(), handle.clone());
        tokio::spawn(async move {
            loop {
                let deadline = {
                    let mut slots = this.slots();
                    match slots.get_mut(&lock).and_then(|s| s.current_of(&handle)) {
                        Some(current) => current.caller_deadline,
                        None => return,
                    }
                };
                let Some(deadline) = deadline else { return };
                if Instant::now() >= deadline {
                    this.let_go(&lock, &handle, Ending::HeartbeatLapsed { ttl }).await;
                    return;
                }
                tokio::time::sleep_until(deadline.into()).await;
            }
        });
    }

    /// The owner let go of the hold `handle` on `lock` (or the sidecar did, on its
    /// behalf): give it back. `None` if that hold is not the current one.
    pub async fn let_go(&self, lock: &str, handle: &Handle, ending: Ending) -> Option<ReleaseOutcome> {
        let current = {
            let mut slots = self.slots();
            let slot = slots.get_mut(lock)?;
            slot.current_of(handle)?;
            let current = slot.current.take()?;
            slot.remember(handle.clone(), current.hold.token(), ending.clone());
            current
        };
        let token = current.hold.token();
        let _releasing = self.releasing.token();
        let outcome = current.hold.release().await;
        info!(lock, token, was_held = outcome.was_held, reason = %ending, "hold ended");
        self.metrics.count(&ending);
        let event =
            LockEvent::Released { fencing_token: token, was_held: outcome.was_held, reason: ending.to_string() };
        self.slots().entry(lock.to_owned()).or_default().publish(event);
        self.kick(lock);
        Some(outcome)
    }

    /// A caller stopped waiting (timeout or disconnect). If the hold had just been handed
    /// to it, nobody will ever release it: release it now.
    pub fn leave(&self, lock: &str, id: u64) {
        let handle = {
            let mut slots = self.slots();
            let Some(slot) = slots.get_mut(lock) else { return };
            slot.waiters.retain(|w| w.id != id);
            if slot.waiters.is_empty()
                && let Some(task) = slot.acquiring.take()
            {
                // Dropping the acquisition withdraws the claim.
                task.abort();
            }
            slot.current.as_ref().filter(|c| c.caller == id).map(|c| c.handle.clone())
        };
        if let Some(handle) = handle {
            let (this, lock) = (self.clone(), lock.to_owned());
            tokio::spawn(async move {
                this.let_go(&lock, &handle, Ending::CallerGone).await;
            });
        }
    }

    /// Releases the pod's hold on `lock` by name: only a pod-scoped hold (its owner is the
    /// pod); `Ok(None)` if there is none.
    pub async fn release(&self, lock: &str) -> Result<Option<ReleaseOutcome>, HandleRequired> {
        let handle = {
            let slots = self.slots();
            let Some(current) = slots.get(lock).and_then(|s| s.current.as_ref()) else { return Ok(None) };
            if current.terms.caller_owned() {
                return Err(HandleRequired { lock: lock.to_owned() });
            }
            current.handle.clone()
        };
        Ok(self.let_go(lock, &handle, Ending::Released).await)
    }

    /// Releases the hold `handle` names. A handle of a hold that already ended is answered
    /// as such (a repeated release); any other handle changes nothing.
    pub async fn release_handle(&self, lock: &str, handle: &Handle) -> Result<HandleRelease, HandleError> {
        let ended = {
            let slots = self.slots();
            let slot = slots.get(lock);
            let current = slot.and_then(|s| s.current.as_ref()).is_some_and(|c| &c.handle == handle);
            match slot.and_then(|s| s.ended_of(handle)) {
                _ if current => None,
                Some((_, _, ending)) => Some(ending.clone()),
                None => return Err(self.wrong(lock, handle, &slots)),
            }
        };
        if let Some(ending) = ended {
            return Ok(HandleRelease::AlreadyEnded(ending));
        }
        match self.let_go(lock, handle, Ending::Released).await {
            Some(outcome) => Ok(HandleRelease::Released(outcome)),
            // It ended between the look and the release: say how.
            None => {
                let slots = self.slots();
                match slots.get(lock).and_then(|s| s.ended_of(handle)) {
                    Some((_, _, ending)) => Ok(HandleRelease::AlreadyEnded(ending.clone())),
                    None => Err(self.wrong(lock, handle, &slots)),
                }
            }
        }
    }

    /// A keep-alive from the owner of `handle`: its TTL starts again from now. Returns the
    /// hold's view; a lost or ended hold is an error saying so.
    pub fn keepalive(&self, lock: &str, handle: &Handle) -> Result<HoldView, HandleError> {
        let mut slots = self.slots();
        let now = Instant::now();
        if let Some(current) = slots.get_mut(lock).and_then(|s| s.current_of(handle)) {
            let token = current.hold.token();
            if let Some(reason) = &current.lost {
                return Err(HandleError::Lost { lock: lock.to_owned(), token, reason: reason.clone() });
            }
            if let (Some(deadline), Some(ttl)) = (current.caller_deadline, current.terms.ttl) {
                if deadline <= now {
                    // Its lapse is being acted on; the keep-alive came too late.
                    let ending = Ending::HeartbeatLapsed { ttl };
                    return Err(HandleError::Ended { lock: lock.to_owned(), token, ending });
                }
                current.caller_deadline = Some(now + ttl);
            }
            let view = hold_view(lock, current, now);
            if !view.held {
                let reason = match current.hold.status() {
                    HoldStatus::Lost(reason) => reason.to_string(),
                    _ => "the hold is no longer held".to_owned(),
                };
                return Err(HandleError::Lost { lock: lock.to_owned(), token, reason });
            }
            return Ok(view);
        }
        match slots.get(lock).and_then(|s| s.ended_of(handle)) {
            Some((_, token, ending)) => {
                Err(HandleError::Ended { lock: lock.to_owned(), token: *token, ending: ending.clone() })
            }
            None => Err(self.wrong(lock, handle, &slots)),
        }
    }

    /// The view of the hold `handle` names (current or recently ended).
    pub fn hold_view(&self, lock: &str, handle: &Handle) -> Result<HoldView, HandleError> {
        let mut slots = self.slots();
        if let Some(current) = slots.get_mut(lock).and_then(|s| s.current_of(handle)) {
            return Ok(hold_view(lock, current, Instant::now()));
        }
        match slots.get(lock).and_then(|s| s.ended_of(handle)) {
            Some((_, token, ending)) => Ok(HoldView {
                lock: lock.to_owned(),
                handle: handle.to_string(),
                state: "ended",
                held: false,
                fencing_token: *token,
                remaining_ms: None,
                valid_until_boottime_ms: None,
                session: false,
                ttl_seconds: None,
                reason: Some(ending.to_string()),
            }),
            None => Err(self.wrong(lock, handle, &slots)),
        }
    }

    /// The error for a handle that names no hold of `lock`.
    fn wrong(&self, lock: &str, handle: &Handle, slots: &HashMap<String, Slot>) -> HandleError {
        let belongs_to = slots
            .iter()
            .find(|(_, s)| s.current.as_ref().is_some_and(|c| &c.handle == handle) || s.ended_of(handle).is_some())
            .map(|(name, _)| name.clone());
        HandleError::Wrong { lock: lock.to_owned(), handle: handle.to_string(), belongs_to }
    }

    /// Shutdown: every hold is reported lost at once (never held again) and given back
    /// once its owner let go or everything it was told has run out — an app may be acting
    /// inside the time it was told, and another pod must not be granted before that ends.
    pub async fn release_all(&self) {
        self.closing.store(true, Ordering::Release);
        let locks: Vec<String> = self.slots().keys().cloned().collect();
        for lock in &locks {
            self.kick(lock);
        }
        let holds: Vec<(String, Handle, i64, Option<Instant>)> = self
            .slots()
            .iter()
            .filter_map(|(lock, s)| {
                let c = s.current.as_ref()?;
                Some((
                    lock.clone(),
                    c.handle.clone(),
                    c.hold.token(),
                    owner::belief_end(c.told_until, c.caller_deadline),
                ))
            })
            .collect();
        let endings = holds.into_iter().map(|(lock, handle, token, end)| {
            let mut events = self.subscribe(&lock);
            self.lost(&lock, &handle, token, "the sidecar is shutting down".into());
            async move {
                // Whichever comes first: the owner lets go, or what it was told runs out.
                let released = async {
                    loop {
                        match events.recv().await {
                            Ok(LockEvent::Released { fencing_token, .. }) if fencing_token == token => return,
                            Err(broadcast::error::RecvError::Closed) => return,
                            _ => {}
                        }
                    }
                };
                if let Some(end) = end {
                    tokio::select! {
                        _ = tokio::time::sleep_until(end.into()) => {}
                        _ = released => {}
                    }
                }
                self.let_go(&lock, &handle, Ending::Shutdown).await;
            }
        });
        futures::future::join_all(endings).await;
        // Holds let go just before (a container seen ended, a caller's release) may still
        // be on their way back.
        self.releasing.close();
        self.releasing.wait().await;
    }

    /// Ends every hold bound to an app container whose instance that took it has ended,
    /// each time the Pod's status changes. Runs until the view closes.
    pub async fn follow_containers(&self) {
        let Some(mut view) = self.pod.clone() else { return };
        loop {
            let pod = view.borrow_and_update().clone();
            if let Some(pod) = pod {
                let ended: Vec<(String, Handle, String)> = self
                    .slots()
                    .iter()
                    .filter_map(|(lock, slot)| {
                        let current = slot.current.as_ref()?;
                        let container = current.container(Some(&pod))?;
                        pod::instance_ended(&pod, container, current.granted_at)
                            .then(|| (lock.clone(), current.handle.clone(), container.to_owned()))
                    })
                    .collect();
                for (lock, handle, container) in ended {
                    let this = self.clone();
                    tokio::spawn(async move {
                        this.let_go(&lock, &handle, Ending::ContainerEnded { container }).await;
                    });
                }
            }
            if view.changed().await.is_err() {
                return;
            }
        }
    }

    /// This pod's view of `lock`.
    pub fn view(&self, lock: &str) -> LockView {
        let mut slots = self.slots();
        let (waiters, token, left, lost_token) = match slots.get_mut(lock) {
            None => (0, None, None, None),
            Some(slot) => {
                let waiters = slot.waiters.iter().filter(|w| !w.reply.is_closed()).count();
                let token = slot.current.as_ref().map(|c| c.hold.token());
                let left = slot.current.as_mut().and_then(|c| c.answer(Instant::now()));
                (waiters, token, left, slot.lost_token)
            }
        };
        let state = if left.is_some() {
            "held"
        } else if waiters > 0 {
            "waiting"
        } else if token.is_some() || lost_token.is_some() {
            "lost"
        } else {
            "free"
        };
        LockView {
            lock: lock.to_owned(),
            state,
            held: left.is_some(),
            fencing_token: token.or(lost_token),
            remaining_ms: left.map(|l| millis(l.remaining)),
            valid_until_boottime_ms: left.map(|l| l.boottime_ms),
            local_waiters: waiters,
        }
    }

    /// Time left on the hold of `lock` handed to caller `id`, if it is still held (told to
    /// that caller: recorded as such).
    pub fn remaining_for(&self, lock: &str, id: u64) -> Option<Left> {
        let mut slots = self.slots();
        let current = slots.get_mut(lock)?.current.as_mut().filter(|c| c.caller == id)?;
        current.answer(Instant::now())
    }

    /// Time left on the hold `handle` names, if it is still held (told to its owner:
    /// recorded as such).
    pub fn remaining_of(&self, lock: &str, handle: &Handle) -> Option<Left> {
        self.slots().get_mut(lock)?.current_of(handle)?.answer(Instant::now())
    }

    /// The status of the pod's hold on `lock` with token `token` (renew deadline applied
    /// against the clock now), and its timing; `None` once that hold is gone. A held status
    /// counts as told to its owner (hold mode writes its deadline to the hold file).
    pub fn hold_status(&self, lock: &str, token: i64) -> Option<(HoldStatus, crate::lease::Timing)> {
        let mut slots = self.slots();
        let current = slots.get_mut(lock)?.current.as_mut().filter(|c| c.hold.token() == token)?;
        if current.lost.is_some() {
            let reason = current.hold.status();
            return Some((reason, current.hold.timing()));
        }
        let status = current.hold.status();
        if let HoldStatus::Held { valid_until, .. } = status {
            current.told_until = Some(current.told_until.map_or(valid_until, |t| t.max(valid_until)));
        }
        Some((status, current.hold.timing()))
    }

    /// Whether the pod holds `lock` now.
    pub fn holds(&self, lock: &str) -> bool {
        self.slots().get(lock).and_then(|s| s.current.as_ref()).is_some_and(|c| c.lost.is_none() && c.hold.is_held())
    }

    /// Subscribes to `lock`'s events.
    pub fn subscribe(&self, lock: &str) -> broadcast::Receiver<LockEvent> {
        self.slots().entry(lock.to_owned()).or_default().events().subscribe()
    }
}

/// A hold's view for its owner (recording the time left as told).
fn hold_view(lock: &str, current: &mut Current, now: Instant) -> HoldView {
    let left = current.answer(now);
    HoldView {
        lock: lock.to_owned(),
        handle: current.handle.to_string(),
        state: if left.is_some() { "held" } else { "lost" },
        held: left.is_some(),
        fencing_token: current.hold.token(),
        remaining_ms: left.map(|l| millis(l.remaining)),
        valid_until_boottime_ms: left.map(|l| l.boottime_ms),
        session: current.terms.session,
        ttl_seconds: current.ttl_seconds(),
        reason: current.lost.clone(),
    }
}

/// Milliseconds, rounded down (never promising more than there is).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Time left on a hold as an answer tells it: relative, and as a deadline on the boot clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Left {
    /// Time left from the instant the answer was computed.
    pub remaining: Duration,
    /// The deadline on `CLOCK_BOOTTIME`, ms, rounded down: never later than the deadline
    /// `remaining` counts to.
    pub boottime_ms: u64,
}

impl Left {
    /// The hold runs out at `until`, `remaining` from now.
    pub fn until(until: Instant, remaining: Duration) -> Left {
        Left { remaining, boottime_ms: boottime::millis(boottime::deadline_of(until)) }
    }
}

/// The wall-clock time `left` from now.
pub fn wall_after(left: Duration) -> Timestamp {
    Timestamp::now().checked_add(jiff::SignedDuration::try_from(left).unwrap_or_default()).unwrap_or(Timestamp::MAX)
}

/// Whether a hold taken in `held` serves a caller asking for `asked`: a writer's hold
/// serves anyone, a reader's only readers.
fn serves(held: ClaimMode, asked: ClaimMode) -> bool {
    held == ClaimMode::Write || asked == ClaimMode::Read
}

/// A mode as the local API spells it.
pub fn mode_name(mode: ClaimMode) -> &'static str {
    match mode {
        ClaimMode::Read => "read",
        ClaimMode::Write => "write",
    }
}
