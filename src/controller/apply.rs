//! The Lease writes of one reconcile, each followed by what it entails: the grant
//! recorded in memory and counted, a revocation counted and announced with its own Event
//! reason and its holder's claim dropped, the end of a drain announced.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::context::{Context, LockKey};
use super::decide::{self, Revocation};
use super::error::Error;
use super::events::{self, publish};
use super::status::{Granted, Outcome};
use super::view::{Claim, LeaseState};
use super::{build, claims, clocks, force, lock_lease};
use crate::crd::{DistributedLock, LockClaim};
use crate::lease::RevokeReason;
use crate::lease::{self, CasStore, GrantedTiming, LeaseStore};
use crate::metrics::ReasonLabel;

/// What a decision's writes produced.
pub struct Applied {
    /// The Lease after them.
    pub lease: Lease,
    /// What they did, for status.
    pub outcome: Outcome,
    /// When to look again.
    pub recheck: Option<Duration>,
}

/// The writes of one reconcile, with what they need.
pub struct Write<'a> {
    /// Shared controller state.
    pub ctx: &'a Context,
    /// The lock.
    pub lock: &'a DistributedLock,
    /// Its namespace and name.
    pub key: &'a LockKey,
    /// Its UID (keys the controller's memory).
    pub uid: &'a str,
    /// Lock Leases of its namespace.
    pub store: &'a LeaseStore,
    /// LockClaims of its namespace.
    pub claim_store: &'a CasStore<LockClaim>,
    /// The lock Lease the decision was made from.
    pub lease: &'a Lease,
    /// What that Lease said.
    pub state: &'a LeaseState,
    /// The force release acted on in this reconcile, if any.
    pub force: Option<&'a force::Request>,
}

impl Write<'_> {
    /// A drain ends (the next write frees the Lease, grants it, or deletes it): say so.
    pub fn drained(&self) {
        let LeaseState::Draining(d) = self.state else { return };
        let token = d.revoked.map_or_else(|| "unknown".to_owned(), |t| t.to_string());
        let how = if d.holder.is_none() { "acknowledged by its holder" } else { "timed out" };
        info!(namespace = %self.key.namespace, lock = %self.key.name, token, how, "drain over");
        publish(self.ctx, self.lock, EventType::Normal, "Drained", format!("drain of token {token} {how}"), None);
    }

    /// Grants the head of the queue, revoking the current hold in the same write if told.
    pub async fn grant(
        &self,
        head: &Claim,
        token: i64,
        revoked: Option<&Revocation>,
        terms: &GrantedTiming,
        wall: Timestamp,
        inputs: &decide::Inputs,
    ) -> Result<Applied, Error> {
        let (ctx, key) = (self.ctx, self.key);
        self.drained();
        let reason = revoked.map(|r| format!("{:?}", r.reason));
        let desired = build::granted(self.lease, head, token, terms, wall, reason.as_deref());
        let written = lock_lease::write(ctx, key, self.uid, self.store, Some(self.lease), &desired).await?;
        ctx.record_issued(key, token);
        ctx.with_memory(key, self.uid, |m| clocks::granted(m, &head.identity.id, token, Instant::now()));
        let waited = wall.duration_since(head.requested).as_secs_f64().max(0.0);
        // From the holder's release (the Lease's last renewal) to this grant; none after a drain.
        let handoff_ms = match (&inputs.current, revoked) {
            (decide::Current::Free, None) => self
                .lease
                .spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| wall.duration_since(t.0).as_millis().max(0) as i64),
            (decide::Current::Draining(_), _) => None,
            _ => Some(0),
        };
        ctx.metrics.grants.inc();
        ctx.metrics.wait_seconds.observe(waited);
        if let Some(ms) = handoff_ms {
            ctx.metrics.handoff_seconds.observe(ms as f64 / 1000.0);
        }
        info!(namespace = %key.namespace, lock = %key.name, token, holder = %head.identity, waited, "granted");
        let note = format!("granted to {} with token {token}", head.identity);
        publish(ctx, self.lock, EventType::Normal, "Granted", note, head.identity.pod.as_ref());
        let mut outcome =
            Outcome { granted: Some(Granted { waited_seconds: waited, handoff_ms }), ..Outcome::default() };
        if let Some(r) = revoked {
            self.revoked(r, token).await;
            outcome.revoked = Some(r.reason.clone());
        }
        Ok(Applied { lease: written, outcome, recheck: Some(ctx.settings.confirm_timeout) })
    }

    /// Writes a revocation (one write, or the start of a drain) raising the token to `raise_to`.
    pub async fn revoke(
        &self,
        desired: &Lease,
        revocation: &Revocation,
        raise_to: i64,
        recheck: Option<Duration>,
    ) -> Result<Applied, Error> {
        let written = lock_lease::write(self.ctx, self.key, self.uid, self.store, Some(self.lease), desired).await?;
        self.ctx.record_issued(self.key, raise_to);
        self.revoked(revocation, raise_to).await;
        let outcome = Outcome { revoked: Some(revocation.reason.clone()), ..Outcome::default() };
        Ok(Applied { lease: written, outcome, recheck })
    }

    /// After a revocation was written: count it, tell people, drop the holder's claim (it
    /// claims again, at the back, if it still wants the lock).
    async fn revoked(&self, revocation: &Revocation, raised_to: i64) {
        let (ctx, key) = (self.ctx, self.key);
        let LeaseState::Held(hold) = self.state else { return };
        ctx.metrics.revocations.get_or_create(&ReasonLabel { reason: revocation.reason.as_str().into() }).inc();
        let token = revocation.token.map_or_else(|| "none".to_owned(), |t| t.to_string());
        warn!(namespace = %key.namespace, lock = %key.name, token, raised_to, holder = %hold.identity, reason = ?revocation.reason, "revoked");
        let (event, why) = events::revocation(&revocation.reason);
        let note = match &revocation.reason {
            RevokeReason::Forced => {
                let (by, reason) =
                    self.force.map_or_else(|| ("unknown".into(), String::new()), |r| (r.by.clone(), r.reason.clone()));
                let approved = match self.force {
                    Some(r) if !r.approved_by.is_empty() => format!(", approved by {}", r.approved_by.join(", ")),
                    _ => String::new(),
                };
                let request = self
                    .force
                    .and_then(|r| r.request.as_deref())
                    .map(|r| format!(" [forcereleaserequest {r}]"))
                    .unwrap_or_default();
                format!(
                    "force-released by {by} ({reason}{approved}){request}: revoked {} with token {token}",
                    hold.identity
                )
            }
            _ => format!("revoked {} with token {token}: {why}", hold.identity),
        };
        publish(ctx, self.lock, EventType::Warning, event, note, hold.identity.pod.as_ref());
        let holder_claim = claims::of_lock(ctx, key, &lease::Timing::of(&self.lock.spec))
            .into_iter()
            .find(|c| c.identity == hold.identity);
        claims::delete_revoked(self.claim_store, key, holder_claim.as_ref()).await;
    }
}
