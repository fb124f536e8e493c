//! Leader election for controller replicas, on a plain Lease written by compare-and-swap.
//!
//! The same rules as client-go's leader election, with one difference that matters for a
//! lock service: leadership is *self-fenced*. [`Leadership::is_leading`] turns false the
//! moment the renew deadline (measured from the send time of the last successful
//! renewal) passes, whether or not the elector task got to run, so a paused or
//! partitioned leader stops granting before a successor can be elected.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{CasError, LeaseStore, Timing, clock::Sighting};

/// What the elector should do next, decided from the Lease as read.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// No election Lease yet: create it naming us.
    Create,
    /// We hold it: renew.
    Renew,
    /// It is free or its holder expired on our clock: take it.
    Acquire,
    /// Someone else holds it: check again after `wait`.
    Follow {
        /// The current leader.
        holder: String,
        /// How long until we look again.
        wait: Duration,
    },
}

/// What changes on every renewal of an election Lease.
pub type RenewalKey = (Option<String>, Option<MicroTime>);

/// Decides the next step. `seen` tracks, on our monotonic clock, since when the current
/// holder's renewal has been unchanged.
pub fn decide(
    lease: Option<&Lease>,
    me: &str,
    seen: &mut Option<Sighting<RenewalKey>>,
    now: Instant,
    timing: &Timing,
) -> Step {
    let Some(lease) = lease else { return Step::Create };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    match holder {
        None => Step::Acquire,
        Some(h) if h == me => Step::Renew,
        Some(h) => {
            let since = Sighting::observe(seen, (Some(h.clone()), spec.renew_time.clone()), now);
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(timing.lease_duration, Duration::from_secs);
            let left = (since + duration).saturating_duration_since(now);
            if left.is_zero() { Step::Acquire } else { Step::Follow { holder: h, wait: left.min(timing.retry_period) } }
        }
    }
}

/// The sending halves of a [`Leadership`].
type Senders = (watch::Sender<Option<Instant>>, watch::Sender<u64>, watch::Sender<u64>);

/// A handle on the elector's view of leadership.
#[derive(Clone)]
pub struct Leadership {
    rx: watch::Receiver<Option<Instant>>,
    terms: watch::Receiver<u64>,
    regains: watch::Receiver<u64>,
    /// For [`Leadership::always`]: the senders nobody else owns, kept alive.
    _fixed: Option<Arc<Senders>>,
}

impl Leadership {
    /// True while we lead and the renew deadline has not passed.
    pub fn is_leading(&self) -> bool {
        matches!(*self.rx.borrow(), Some(deadline) if Instant::now() < deadline)
    }

    /// How many times this replica has become leader. Anything judged on our clock
    /// during an earlier term is forgotten when the term changes.
    pub fn term(&self) -> u64 {
        *self.terms.borrow()
    }

    /// A receiver that changes whenever this replica starts leading again (a new term, or
    /// the same term resumed after a lapse): everything must be looked at again.
    pub fn regains(&self) -> watch::Receiver<u64> {
        self.regains.clone()
    }

    /// Leadership that is always held (for a single replica run without election).
    pub fn always() -> Leadership {
        let (tx, rx) = watch::channel(Some(Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)));
        let (terms_tx, terms) = watch::channel(1);
        let (regains_tx, regains) = watch::channel(1);
        Leadership { rx, terms, regains, _fixed: Some(Arc::new((tx, terms_tx, regains_tx))) }
    }

    /// Waits until we lead.
    pub async fn acquired(&mut self) {
        while !self.is_leading() {
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Waits until we no longer lead (deadline passed or stepped down).
    pub async fn lost(&mut self) {
        loop {
            let deadline = *self.rx.borrow_and_update();
            match deadline {
                None => return,
                Some(d) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(d.into()) => {
                            if !self.is_leading() { return; }
                        }
                        changed = self.rx.changed() => if changed.is_err() { return },
                    }
                }
            }
        }
    }
}

/// Runs leader election on Lease `name` until `shutdown`, then releases the Lease if held.
pub struct Elector {
    store: LeaseStore,
    name: String,
    identity: String,
    timing: Timing,
    tx: watch::Sender<Option<Instant>>,
    terms: watch::Sender<u64>,
    regains: watch::Sender<u64>,
    /// Labels and owner references the Lease is created with.
    created_with: ObjectMeta,
}

impl Elector {
    /// An elector for `identity` on Lease `name` in the store's namespace.
    pub fn new(store: LeaseStore, name: &str, identity: &str, timing: Timing) -> (Elector, Leadership) {
        let (tx, rx) = watch::channel(None);
        let (terms_tx, terms) = watch::channel(0);
        let (regains_tx, regains) = watch::channel(0);
        let elector = Elector {
            store,
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
            tx,
            terms: terms_tx,
            regains: regains_tx,
            created_with: ObjectMeta::default(),
        };
        (elector, Leadership { rx, terms, regains, _fixed: None })
    }

    /// Creates the Lease (when it has to) with `labels` and `owner_references`, so that it
    /// is found, and deleted with what owns it.
    pub fn created_with(
        mut self,
        labels: std::collections::BTreeMap<String, String>,
        owner_references: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
    ) -> Elector {
        self.created_with.labels = (!labels.is_empty()).then_some(labels);
        self.created_with.owner_references = (!owner_references.is_empty()).then_some(owner_references);
        self
    }

    fn desired(&self, base: Option<&Lease>, acquiring: bool) -> Lease {
        let now = MicroTime(jiff::Timestamp::now());
        let mut lease = base.cloned().unwrap_or_else(|| Lease {
            metadata: ObjectMeta { name: Some(self.name.clone()), ..self.created_with.clone() },
            spec: None,
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if acquiring {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + i32::from(base.is_some()));
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = i32::try_from(self.timing.lease_duration.as_secs()).ok();
        spec.renew_time = Some(now);
        lease
    }

    /// One round: read, decide, write. Returns how long to wait before the next round.
    async fn round(&self, seen: &mut Option<Sighting<RenewalKey>>) -> Result<Duration, CasError> {
        let lease = self.store.get(&self.name).await?;
        let sent = Instant::now();
        let step = decide(lease.as_ref(), &self.identity, seen, sent, &self.timing);
        let result = match &step {
            Step::Create => self.store.create(&self.desired(None, true)).await.map(|_| true),
            Step::Acquire => self.store.replace(&self.desired(lease.as_ref(), true)).await.map(|_| true),
            Step::Renew => self.store.replace(&self.desired(lease.as_ref(), false)).await.map(|_| true),
            Step::Follow { wait, .. } => {
                self.step_down();
                return Ok(*wait);
            }
        };
        match result {
            Ok(_) => {
                let regained = self.tx.borrow().is_none();
                self.tx.send_replace(Some(sent + self.timing.renew_deadline));
                if regained {
                    // Renewing our own Lease after a lapse (the apiserver was unreachable)
                    // continues the term: nobody else led meanwhile, so what we judged on
                    // our clock still holds. Taking the Lease over starts a new term.
                    if step != Step::Renew {
                        self.terms.send_modify(|t| *t += 1);
                    }
                    self.regains.send_modify(|r| *r += 1);
                    info!(lease = %self.name, identity = %self.identity, term = *self.terms.borrow(), "leading");
                }
                Ok(self.timing.retry_period)
            }
            // Someone else moved first: look again at once.
            Err(CasError::Conflict { .. } | CasError::AlreadyExists { .. }) => Ok(Duration::ZERO),
            Err(e) => Err(e),
        }
    }

    fn step_down(&self) {
        if self.tx.send_replace(None).is_some() {
            warn!(lease = %self.name, identity = %self.identity, "lost leadership");
        }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut seen = None;
        loop {
            let wait = tokio::select! {
                _ = shutdown.cancelled() => break,
                r = tokio::time::timeout(self.timing.renew_deadline, self.round(&mut seen)) => match r {
                    Ok(Ok(wait)) => wait,
                    Ok(Err(e)) => { warn!(error = %e, "leader election round failed"); self.timing.retry_period }
                    Err(_) => { warn!(lease = %self.name, "leader election round timed out"); Duration::ZERO }
                },
            };
            // A deadline passed without a successful renewal: we are no longer leader.
            if !matches!(*self.tx.borrow(), Some(d) if Instant::now() < d) {
                self.step_down();
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        self.release().await;
    }

    /// Gives the Lease up so a successor need not wait for it to expire.
    async fn release(&self) {
        let was_leading = self.tx.send_replace(None).is_some();
        if !was_leading {
            return;
        }
        let Ok(Some(mut lease)) = self.store.get(&self.name).await else { return };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        match self.store.replace(&lease).await {
            Ok(_) => info!(lease = %self.name, "released leadership"),
            Err(e) => warn!(error = %e, "failed to release leadership"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renew_s: i64) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(jiff::Timestamp::from_second(renew_s).expect("valid"))),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn decide_table() {
        let timing = Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        };
        let t0 = Instant::now();
        let mut seen = None;
        assert_eq!(decide(None, "me", &mut seen, t0, &timing), Step::Create);
        assert_eq!(decide(Some(&lease(None, 1)), "me", &mut seen, t0, &timing), Step::Acquire);
        assert_eq!(decide(Some(&lease(Some(""), 1)), "me", &mut seen, t0, &timing), Step::Acquire);
        assert_eq!(decide(Some(&lease(Some("me"), 1)), "me", &mut seen, t0, &timing), Step::Renew);
        // A fresh observer never expires the other holder early, whatever its renewTime says.
        let other = lease(Some("other"), 1);
        let follow = Step::Follow { holder: "other".into(), wait: Duration::from_secs(2) };
        assert_eq!(decide(Some(&other), "me", &mut seen, t0, &timing), follow);
        assert_eq!(
            decide(Some(&other), "me", &mut seen, t0 + Duration::from_secs(14), &timing),
            Step::Follow { holder: "other".into(), wait: Duration::from_secs(1) }
        );
        assert_eq!(decide(Some(&other), "me", &mut seen, t0 + Duration::from_secs(15), &timing), Step::Acquire);
        // A renewal restarts our clock.
        let renewed = lease(Some("other"), 2);
        assert_eq!(decide(Some(&renewed), "me", &mut seen, t0 + Duration::from_secs(16), &timing), follow);
    }
}
