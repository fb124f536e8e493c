//! The sidecar's uncontended acquire split in four at the clocks it passes on its way: the
//! sidecar's in the claim's `requestTime` (its acquisition began), the controller's in the
//! Lease's `acquireTime` (the granting reconcile began to observe), and the bench's own
//! watch of the lock Lease seeing the grant. All are clocks of one machine; the parts add
//! up to the whole acquire exactly (the third is what the other three leave).

use anyhow::Context as _;
use jiff::Timestamp;
use kube::Api;
use leasehold::crd::LockClaim;
use leasehold::lease::Identity;
use serde_json::Value;

use crate::record::{Panel, Series, part_params};
use crate::stats::wall_ms;

/// One acquire's parts, per sample.
#[derive(Default)]
pub struct AcquireSplit {
    parts: [Vec<f64>; 4],
}

/// The four parts: series key suffix, label, what the part holds.
const PARTS: [(&str, &str, &str); 4] = [
    (
        "to_claim",
        "part 1: request sent → the sidecar's acquisition began (the claim's requestTime)",
        "the HTTP request reaching the sidecar, its parsing, queue and the acquisition's start",
    ),
    (
        "to_reconcile",
        "part 2: acquisition began → the granting reconcile began (the Lease's acquireTime)",
        "the claim's create and lock read, the claim's watch event reaching the controller, and its queue",
    ),
    (
        "from_reconcile",
        "part 3: the granting reconcile began → grant visible on the bench's watch",
        "the reconcile's observation and plan, the Lease CAS, and the watch event reaching the bench",
    ),
    (
        "answer",
        "part 4: grant visible on the bench's watch → 200 returned",
        "the grant reaching the sidecar's watch, its reaction, the answer and the HTTP response",
    ),
];

impl AcquireSplit {
    /// Records one acquire of `total` ms: the request sent at `sent` (the bench's wall
    /// clock), the claim's `requested`, the grant's `granted` (acquireTime), and the grant
    /// seen on the bench's watch `seen_to_return` ms before the answer came back.
    pub fn push(&mut self, total: f64, sent: Timestamp, requested: Timestamp, granted: Timestamp, seen_to_return: f64) {
        let (p1, p2) = (wall_ms(sent, requested), wall_ms(requested, granted));
        let p3 = total - p1 - p2 - seen_to_return;
        for (part, value) in self.parts.iter_mut().zip([p1, p2, p3, seen_to_return]) {
            part.push(value);
        }
    }

    /// The four series, each with `params` and what its part holds.
    pub fn series(self, params: &Value) -> Vec<Series> {
        PARTS
            .iter()
            .zip(self.parts)
            .map(|((key, label, holds), samples)| {
                let p = part_params(
                    params,
                    holds,
                    "wall clocks of one machine: the bench's at the send, the sidecar's in requestTime, the controller's in acquireTime; the bench's monotonic clock for the watch",
                );
                Series::new(
                    &format!("leasehold.acquire_{key}"),
                    &format!("Leasehold uncontended acquire via sidecar, {label}"),
                    "Leasehold",
                    Panel::Fast,
                    samples,
                    p,
                )
            })
            .collect()
    }
}

/// The `requestTime` of the claim `holder` holds `lock` on, read by name: a LIST of the
/// namespace's claims took about 90 ms here, and held each lock that much longer.
pub async fn request_time(claims: &Api<LockClaim>, lock: &str, holder: &str) -> anyhow::Result<Timestamp> {
    let name = Identity::parse(holder).claim_name(lock);
    let claim = claims.get(&name).await.with_context(|| format!("get claim {name} of {holder}"))?;
    anyhow::ensure!(claim.spec.claimant == holder, "claim {name} is {}'s, not {holder}'s", claim.spec.claimant);
    Ok(claim.spec.request_time.0)
}
