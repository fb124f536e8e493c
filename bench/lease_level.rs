//! The protocol's own figures, at the Lease level with no sidecar in the way: grant latency
//! (LockClaim created → grant visible on a watch of the lock Lease) and voluntary handoff
//! (the holder's release CAS returned → next grant visible), both by a release that clears
//! the holder (the controller grants) and by one that hands the lock on to the next waiter
//! the Lease records. The claimants are the bench itself, writing exactly what a claimant
//! writes (`leasehold::claim::edit`, `leasehold::lease::next`).

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::PostParams;
use leasehold::claim::edit;
use leasehold::crd::LockClaim;
use leasehold::lease::{Identity, next};
use serde_json::json;

use crate::observe::Latest;
use crate::plan::Settle;
use crate::record::{Panel, Run, Series, part_params};
use crate::stats::{ms_between, wall_ms};
use crate::support::Env;
use crate::support::watch::GrantLog;

const WAIT: Duration = Duration::from_secs(60);
/// Claim TTL as the claimant API computes it for the default 15 s lease (3 × 15 s).
const CLAIM_TTL: i32 = 45;

/// Confirms the grant on `lease` (renewal by CAS), as a claimant does at once.
async fn confirm(leases: &Api<Lease>, lock: &str, lease: &Lease) -> anyhow::Result<Lease> {
    leases.replace(lock, &PostParams::default(), &edit::renewed(lease, Timestamp::now())).await.context("confirm")
}

/// Grant latency: the lock is free in the controller's view; a claim is created; the grant
/// to it is seen on a watch; the bench confirms, deletes the claim and releases.
pub async fn grant_latency(env: &Env, lock: &str, warmup: usize, samples: usize) -> anyhow::Result<Run> {
    let leases = env.leases();
    let claims: Api<LockClaim> = Api::namespaced(env.ns.client.clone(), env.name());
    let dl = Latest::start(env.locks(), lock);
    let mut grants = GrantLog::start(leases.clone(), lock);
    let me = Identity::for_process();
    let base = dl.wait("status", WAIT, |d| d.status.is_some()).await?.1.status.unwrap_or_default().stats.releases;
    let (mut from_created, mut from_call) = (Vec::new(), Vec::new());
    let (mut to_observed, mut from_observed) = (Vec::new(), Vec::new());
    for i in 0..warmup + samples {
        let want = base + i64::try_from(i).unwrap_or(0);
        dl.wait("the previous release recorded", WAIT, |d| d.status.as_ref().is_some_and(|s| s.stats.releases >= want))
            .await?;
        let seen_before = grants.grants().len();
        let call = Instant::now();
        claims.create(&PostParams::default(), &edit::lock_claim(lock, &me, CLAIM_TTL, Timestamp::now())).await?;
        let (created, created_wall) = (Instant::now(), Timestamp::now());
        let grant = grants.wait_for(seen_before + 1, WAIT).await.pop().context("a grant")?;
        ensure!(grant.holder == me.id, "granted to {}", grant.holder);
        if i >= warmup {
            from_created.push(ms_between(created, grant.seen));
            from_call.push(ms_between(call, grant.seen));
            // The grant's acquireTime is the controller's wall clock when the reconcile that
            // granted began to observe: it splits the latency at the controller.
            let observed_after = wall_ms(created_wall, grant.acquire_time);
            to_observed.push(observed_after);
            from_observed.push(ms_between(created, grant.seen) - observed_after);
        }
        let lease = leases.get(lock).await?;
        let confirmed = confirm(&leases, lock, &lease).await?;
        claims.delete(&me.claim_name(lock), &Default::default()).await?;
        leases.replace(lock, &PostParams::default(), &edit::released(&confirmed)).await?;
    }
    let params = json!({
        "warmup": warmup,
        "samples": samples,
        "claimant": "the bench, admin client, identity outside any Pod",
        "sample_start": "create of the LockClaim returned",
        "sample_stop": "the grant (holder = claimant) arrived on the bench's watch of the lock Lease",
        "between_cycles": "confirm, delete the claim, clear the holder; wait until status counts the release",
    });
    let mut run = Run::default();
    run.series.push(Series::new(
        "leasehold.lease.grant",
        "Leasehold grant latency, Lease level (claim created → grant visible on a watch)",
        "Leasehold",
        Panel::Fast,
        from_created,
        params.clone(),
    ));
    run.series.push(Series::new(
        "leasehold.lease.grant_from_call",
        "Leasehold grant latency, Lease level, from the claim create call",
        "Leasehold",
        Panel::Fast,
        from_call,
        params.clone(),
    ));
    let split = |part: &str| split_params(&params, "create", part);
    run.series.push(Series::new(
        "leasehold.lease.grant_to_reconcile",
        "Leasehold grant latency, Lease level, part 1: claim created → the granting reconcile began (the Lease's acquireTime)",
        "Leasehold",
        Panel::Fast,
        to_observed,
        split("the claim's watch event reaching the controller, and its queue, up to the observation of the reconcile that granted"),
    ));
    run.series.push(Series::new(
        "leasehold.lease.grant_from_reconcile",
        "Leasehold grant latency, Lease level, part 2: the granting reconcile began → grant visible on a watch",
        "Leasehold",
        Panel::Fast,
        from_observed,
        split("the reconcile's observation and plan, the Lease CAS, and the watch event reaching the bench"),
    ));
    Ok(run)
}

/// The parameters of one part of a series split at the granting reconcile: `params`, with
/// the part and the clocks the split reads (the bench's at the return of `call`).
fn split_params(params: &serde_json::Value, call: &str, part: &str) -> serde_json::Value {
    let clock =
        format!("wall clock of one machine: the bench's at the {call}'s return, the controller's in acquireTime");
    part_params(params, part, &clock)
}

/// How the Lease-level holder lets go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Clears the holder; the controller grants the waiter (a release with no next waiter
    /// recorded: an older claimant's, or one that raced the record).
    Clear,
    /// Hands the lock on, in the same write, to the next waiter the Lease records (what a
    /// claimant's release writes).
    HandOn,
}

/// Voluntary handoff at the Lease level between two claimant identities: the waiter's claim
/// is queued (status lists it, plus the `settle`); the holder deletes its claim, then
/// releases by CAS on the Lease as read then (timed from that call's return), as `release`
/// says; the grant to the waiter is seen on the watch, and the waiter confirms at once.
pub async fn handoff(
    env: &Env,
    lock: &str,
    settle: Settle,
    release: Release,
    (warmup, samples): (usize, usize),
) -> anyhow::Result<Run> {
    let leases = env.leases();
    let claims: Api<LockClaim> = Api::namespaced(env.ns.client.clone(), env.name());
    let dl = Latest::start(env.locks(), lock);
    let mut grants = GrantLog::start(leases.clone(), lock);
    let (a, b) = (Identity::for_process(), Identity::for_process());
    let post = PostParams::default();

    claims.create(&post, &edit::lock_claim(lock, &a, CLAIM_TTL, Timestamp::now())).await?;
    grants.wait_for(1, WAIT).await;
    confirm(&leases, lock, &leases.get(lock).await?).await?;
    let (mut holder, mut waiter) = (&a, &b);
    let (mut from_return, mut from_call) = (Vec::new(), Vec::new());
    let (mut to_observed, mut from_observed) = (Vec::new(), Vec::new());
    for i in 0..warmup + samples {
        claims.create(&post, &edit::lock_claim(lock, waiter, CLAIM_TTL, Timestamp::now())).await?;
        dl.wait("the waiter queued", WAIT, |d| {
            d.status.as_ref().is_some_and(|s| s.waiters.iter().any(|w| w.identity == waiter.id))
        })
        .await?;
        tokio::time::sleep(settle.pause()).await;
        claims.delete(&holder.claim_name(lock), &Default::default()).await?;
        // Read now: the controller writes the next waiter on the Lease as it queues.
        let held = leases.get(lock).await?;
        let released = match release {
            Release::Clear => edit::released(&held),
            Release::HandOn => {
                let handed = next::handed_on(&held, Timestamp::now());
                handed.with_context(|| format!("the Lease names no next waiter to hand on to ({waiter:?})"))?
            }
        };
        let seen_before = grants.grants().len();
        let call = Instant::now();
        leases.replace(lock, &post, &released).await.context("release")?;
        let (returned, returned_wall) = (Instant::now(), Timestamp::now());
        let grant = grants.wait_for(seen_before + 1, WAIT).await.pop().context("a grant")?;
        ensure!(grant.holder == waiter.id, "granted to {} instead of the waiter", grant.holder);
        confirm(&leases, lock, &leases.get(lock).await?).await?;
        if i >= warmup {
            from_return.push(ms_between(returned, grant.seen));
            from_call.push(ms_between(call, grant.seen));
            let observed_after = wall_ms(returned_wall, grant.acquire_time);
            to_observed.push(observed_after);
            from_observed.push(ms_between(returned, grant.seen) - observed_after);
        }
        std::mem::swap(&mut holder, &mut waiter);
    }
    claims.delete(&holder.claim_name(lock), &Default::default()).await?;
    leases.replace(lock, &post, &edit::released(&leases.get(lock).await?)).await?;
    let mut params = json!({
        "warmup": warmup,
        "samples": samples,
        "claimants": "the bench, two identities outside any Pod, admin client",
        "settle": format!("release once status lists the waiter, plus {}", settle.describe()),
        "sample_start": "the holder's CAS clearing holderIdentity returned",
        "sample_stop": "the grant to the waiter arrived on the bench's watch of the lock Lease",
    });
    let mut run = Run::default();
    if release == Release::HandOn {
        params["sample_start"] =
            json!("the holder's CAS handing the lock on to the waiter the Lease names as next returned");
        params["sample_stop"] = json!("that grant arrived on the bench's watch of the lock Lease");
        run.series.push(Series::new(
            "leasehold.lease.handoff_in_release",
            "Leasehold voluntary handoff, Lease level, handed on in the release (release CAS returned → grant visible)",
            "Leasehold",
            Panel::Handoff,
            from_return,
            params.clone(),
        ));
        run.series.push(Series::new(
            "leasehold.lease.handoff_in_release_from_call",
            "Leasehold voluntary handoff, Lease level, handed on in the release, from the release CAS call",
            "Leasehold",
            Panel::Handoff,
            from_call,
            params,
        ));
        return Ok(run);
    }
    run.series.push(Series::new(
        "leasehold.lease.handoff",
        "Leasehold voluntary handoff, Lease level, release clearing the holder (release CAS returned → the controller's grant visible)",
        "Leasehold",
        Panel::Handoff,
        from_return,
        params.clone(),
    ));
    run.series.push(Series::new(
        "leasehold.lease.handoff_from_call",
        "Leasehold voluntary handoff, Lease level, from the release CAS call",
        "Leasehold",
        Panel::Handoff,
        from_call,
        params.clone(),
    ));
    let split = |part: &str| split_params(&params, "release", part);
    run.series.push(Series::new(
        "leasehold.lease.handoff_to_reconcile",
        "Leasehold voluntary handoff, Lease level, part 1: release CAS returned → the granting reconcile began (acquireTime)",
        "Leasehold",
        Panel::Handoff,
        to_observed,
        split("the free Lease's watch event reaching the controller, and its queue, up to the observation of the reconcile that granted"),
    ));
    run.series.push(Series::new(
        "leasehold.lease.handoff_from_reconcile",
        "Leasehold voluntary handoff, Lease level, part 2: the granting reconcile began → grant visible on a watch",
        "Leasehold",
        Panel::Handoff,
        from_observed,
        split("the reconcile's observation and plan, the Lease CAS, and the watch event reaching the bench"),
    ));
    Ok(run)
}
