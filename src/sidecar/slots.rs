//! Per-lock slots: the local queue of callers inside one pod.
//!
//! A pod makes at most one claim per lock (design 3). Callers of the local API queue here,
//! first come first served: the head caller's wait is what the pod's claim serves. When a
//! grant arrives it goes to the first caller still waiting; a caller that gave up (timed
//! out or disconnected) leaves the queue, and if nobody is left the claim is withdrawn.
//! When the hold ends (released or lost), the next caller's claim starts — at the back of
//! the lock's global queue, which keeps the lock fair across pods.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;
use tokio::sync::{broadcast, oneshot};
use tokio::task::AbortHandle;
use tracing::{info, warn};

use crate::claim::{AcquireError, Claimant, Hold, HoldEvent, HoldStatus, LostReason, ReleaseOutcome};

/// What a caller receives when the pod's hold is handed to it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Granted {
    /// Lock name.
    pub lock: String,
    /// The fencing token to present to protected resources.
    pub fencing_token: i64,
    /// The holder identity (this pod).
    pub holder: String,
    /// When the hold lapses unless renewed: the sidecar's self-fence deadline.
    pub expires_at: Timestamp,
    /// The lock's lease duration.
    pub lease_duration_seconds: u64,
    /// Time left before self-fencing, ms, as the response is sent: the caller may count
    /// on the hold for this long from when it receives the answer, unless told otherwise.
    pub remaining_ms: u64,
}

/// Something that happened to a lock's hold in this pod, for the event stream.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum LockEvent {
    /// The pod holds the lock.
    #[serde(rename_all = "camelCase")]
    Acquired {
        /// Token.
        fencing_token: i64,
        /// Self-fence deadline.
        expires_at: Timestamp,
    },
    /// A renewal failed; still held until the deadline.
    #[serde(rename_all = "camelCase")]
    RenewLate {
        /// Token.
        fencing_token: i64,
        /// Time left, ms.
        remaining_ms: u64,
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
    /// The hold was released.
    #[serde(rename_all = "camelCase")]
    Released {
        /// Token.
        fencing_token: i64,
        /// Whether it was still held.
        was_held: bool,
    },
}

impl LockEvent {
    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            LockEvent::Acquired { .. } => "acquired",
            LockEvent::RenewLate { .. } => "renew-late",
            LockEvent::Lost { .. } => "lost",
            LockEvent::Released { .. } => "released",
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
    /// Time left before self-fencing, ms, when held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_ms: Option<u64>,
    /// Callers of this pod waiting for the lock.
    pub local_waiters: usize,
}

type Reply = oneshot::Sender<Result<Granted, Arc<AcquireError>>>;

#[derive(Default)]
struct Slot {
    waiters: VecDeque<(u64, Reply)>,
    acquiring: Option<AbortHandle>,
    hold: Option<Hold>,
    /// The caller the current hold was handed to.
    owner: Option<u64>,
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
}

/// All slots of a sidecar.
#[derive(Clone)]
pub struct Slots {
    inner: Arc<Mutex<HashMap<String, Slot>>>,
    claimant: Claimant,
    /// The longest a claim may wait (the acquisition runs until a grant or until no caller
    /// waits any more).
    max_wait: Duration,
    next_id: Arc<std::sync::atomic::AtomicU64>,
}

impl Slots {
    /// Slots acquiring through `claimant`.
    pub fn new(claimant: Claimant, max_wait: Duration) -> Slots {
        Slots { inner: Arc::default(), claimant, max_wait, next_id: Arc::default() }
    }

    /// The claimant.
    pub fn claimant(&self) -> &Claimant {
        &self.claimant
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.inner.lock().expect("sidecar slots are never poisoned")
    }

    /// Queues a caller for `lock`; returns its id and where its grant (or error) arrives.
    pub fn enqueue(&self, lock: &str) -> (u64, oneshot::Receiver<Result<Granted, Arc<AcquireError>>>) {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.slots().entry(lock.to_owned()).or_default().waiters.push_back((id, tx));
        self.kick(lock);
        (id, rx)
    }

    /// Starts the pod's claim if callers wait and nothing holds or claims already.
    fn kick(&self, lock: &str) {
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(lock) else { return };
        slot.waiters.retain(|(_, reply)| !reply.is_closed());
        if slot.hold.is_some() || slot.acquiring.is_some() || slot.waiters.is_empty() {
            return;
        }
        let (this, name, claimant, wait) = (self.clone(), lock.to_owned(), self.claimant.clone(), self.max_wait);
        let task = tokio::spawn(async move {
            let result = claimant.acquire(&name, wait).await;
            this.granted(&name, result);
        });
        slot.acquiring = Some(task.abort_handle());
    }

    /// Hands a grant to the first caller still waiting, or gives it back.
    fn granted(&self, lock: &str, result: Result<Hold, AcquireError>) {
        let mut slots = self.slots();
        let slot = slots.entry(lock.to_owned()).or_default();
        slot.acquiring = None;
        let hold = match result {
            Ok(hold) => hold,
            Err(error) => {
                let error = Arc::new(error);
                for (_, reply) in slot.waiters.drain(..) {
                    let _ = reply.send(Err(error.clone()));
                }
                return;
            }
        };
        let granted = Granted {
            lock: lock.to_owned(),
            fencing_token: hold.token(),
            holder: self.claimant.identity().id.clone(),
            expires_at: expires_at(&hold),
            lease_duration_seconds: hold.timing().lease_duration.as_secs(),
            remaining_ms: 0,
        };
        let mut owner = None;
        while let Some((id, reply)) = slot.waiters.pop_front() {
            if reply.send(Ok(granted.clone())).is_ok() {
                owner = Some(id);
                break;
            }
        }
        let Some(owner) = owner else {
            // Everyone left while the grant was on its way: give it back.
            drop(slots);
            tokio::spawn(async move {
                hold.release().await;
            });
            return;
        };
        self.forward_events(lock, &hold);
        slot.owner = Some(owner);
        slot.lost_token = None;
        slot.publish(LockEvent::Acquired { fencing_token: granted.fencing_token, expires_at: granted.expires_at });
        slot.hold = Some(hold);
    }

    /// Relays a hold's events to the lock's stream; a loss frees the slot for the next caller.
    fn forward_events(&self, lock: &str, hold: &Hold) {
        let (this, name, token, mut events) = (self.clone(), lock.to_owned(), hold.token(), hold.events());
        tokio::spawn(async move {
            while let Ok(event) = events.recv().await {
                match event {
                    HoldEvent::RenewLate { error, remaining } => {
                        let remaining_ms = u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX);
                        this.publish(&name, LockEvent::RenewLate { fencing_token: token, remaining_ms, error });
                    }
                    HoldEvent::Lost(reason) => {
                        this.lost(&name, token, &reason);
                        return;
                    }
                    HoldEvent::Released { .. } => return,
                }
            }
        });
    }

    fn publish(&self, lock: &str, event: LockEvent) {
        self.slots().entry(lock.to_owned()).or_default().publish(event);
    }

    /// A hold was lost: report it, drop it (withdrawing its claim), serve the next caller.
    fn lost(&self, lock: &str, token: i64, reason: &LostReason) {
        {
            let mut slots = self.slots();
            let slot = slots.entry(lock.to_owned()).or_default();
            if slot.hold.as_ref().map(Hold::token) != Some(token) {
                return;
            }
            slot.hold = None;
            slot.owner = None;
            slot.lost_token = Some(token);
            slot.publish(LockEvent::Lost { fencing_token: token, reason: reason.to_string() });
        }
        warn!(lock, token, %reason, "hold lost");
        self.kick(lock);
    }

    /// A caller stopped waiting (timeout or disconnect). If the hold had just been handed
    /// to it, nobody will ever release it: release it now.
    pub fn leave(&self, lock: &str, id: u64) {
        let release = {
            let mut slots = self.slots();
            let Some(slot) = slots.get_mut(lock) else { return };
            slot.waiters.retain(|(waiter, _)| *waiter != id);
            if slot.waiters.is_empty()
                && let Some(task) = slot.acquiring.take()
            {
                // Dropping the acquisition withdraws the claim.
                task.abort();
            }
            slot.owner == Some(id)
        };
        if release {
            let this = self.clone();
            let lock = lock.to_owned();
            tokio::spawn(async move {
                this.release(&lock).await;
            });
        }
    }

    /// Releases the pod's hold on `lock`; `None` if it had none.
    pub async fn release(&self, lock: &str) -> Option<ReleaseOutcome> {
        let hold = {
            let mut slots = self.slots();
            let slot = slots.get_mut(lock)?;
            slot.owner = None;
            slot.hold.take()
        }?;
        let token = hold.token();
        let outcome = hold.release().await;
        info!(lock, token, was_held = outcome.was_held, "released");
        self.publish(lock, LockEvent::Released { fencing_token: token, was_held: outcome.was_held });
        self.kick(lock);
        Some(outcome)
    }

    /// Releases every hold (shutdown).
    pub async fn release_all(&self) {
        let locks: Vec<String> = self.slots().keys().cloned().collect();
        for lock in locks {
            self.release(&lock).await;
        }
    }

    /// This pod's view of `lock`.
    pub fn view(&self, lock: &str) -> LockView {
        let slots = self.slots();
        let slot = slots.get(lock);
        let waiters = slot.map_or(0, |s| s.waiters.iter().filter(|(_, r)| !r.is_closed()).count());
        let hold = slot.and_then(|s| s.hold.as_ref());
        let status = hold.map(Hold::status);
        let held = matches!(status, Some(HoldStatus::Held { .. }));
        let state = if held {
            "held"
        } else if waiters > 0 {
            "waiting"
        } else if hold.is_some() || slot.is_some_and(|s| s.lost_token.is_some()) {
            "lost"
        } else {
            "free"
        };
        LockView {
            lock: lock.to_owned(),
            state,
            held,
            fencing_token: hold.map(Hold::token).or_else(|| slot.and_then(|s| s.lost_token)),
            remaining_ms: if held { hold.and_then(Hold::remaining).map(|r| r.as_millis() as u64) } else { None },
            local_waiters: waiters,
        }
    }

    /// Time left on the hold of `lock` handed to caller `id`, if it is still held.
    pub fn remaining_for(&self, lock: &str, id: u64) -> Option<std::time::Duration> {
        let slots = self.slots();
        let slot = slots.get(lock).filter(|s| s.owner == Some(id))?;
        slot.hold.as_ref().and_then(Hold::remaining)
    }

    /// Whether the pod holds `lock` now.
    pub fn holds(&self, lock: &str) -> bool {
        self.slots().get(lock).and_then(|s| s.hold.as_ref()).is_some_and(Hold::is_held)
    }

    /// Subscribes to `lock`'s events.
    pub fn subscribe(&self, lock: &str) -> broadcast::Receiver<LockEvent> {
        self.slots().entry(lock.to_owned()).or_default().events().subscribe()
    }
}

/// The wall-clock time at which a hold self-fences unless renewed.
fn expires_at(hold: &Hold) -> Timestamp {
    let remaining = hold.remaining().unwrap_or_default();
    Timestamp::now()
        .checked_add(jiff::SignedDuration::try_from(remaining).unwrap_or_default())
        .unwrap_or(Timestamp::MAX)
}
