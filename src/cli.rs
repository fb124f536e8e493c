//! Operator commands: `leasehold release --force` (the one-step annotation where the lock's
//! policy needs no approval, else a ForceReleaseRequest), `leasehold approve` and
//! `leasehold deny` ([`request`]); `leasehold status` ([`status`]); `leasehold wait` ([`wait`]); lock arguments ([`target`]).

pub mod columns;
pub mod request;
pub mod status;
pub mod target;
pub mod wait;

use std::time::Duration;

use anyhow::Context as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::await_condition;
use serde_json::json;

use crate::crd::{ANNOTATION_FORCE_RELEASE, DistributedLock, MANAGER_CLI};
use crate::run::parse_lock;

/// `leasehold release` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct Release {
    /// The lock, as `<namespace>/<name>`.
    #[arg(value_parser = parse_lock)]
    pub lock: (String, String),
    /// Revoke the current hold whoever holds it (holders release through their sidecar).
    #[arg(long)]
    pub force: bool,
    /// Why: recorded with your user name in the lock's status and an Event.
    #[arg(long)]
    pub reason: Option<String>,
    /// How long to wait for the controller to carry it out (or, for a request, to take
    /// it in).
    #[arg(long, default_value = "30s", value_parser = crate::duration::parse_duration)]
    pub timeout: Duration,
    /// How long a request may wait for its approvals (where the lock's policy needs any).
    #[arg(long, default_value = "1h", value_parser = crate::duration::parse_duration)]
    pub ttl: Duration,
    /// Revoke the hold with this fencing token: on a lock with several permits, which of
    /// its holders (`leasehold status` lists them). Always made a ForceReleaseRequest,
    /// carried out at once where the lock's policy needs no approval.
    #[arg(long)]
    pub token: Option<i64>,
    /// Revoke every hold the lock's status lists: one ForceReleaseRequest per holder.
    #[arg(long, conflicts_with = "token")]
    pub all: bool,
}

/// `release --force --all`: a request for every hold `lock`'s status lists. Every one is
/// tried; the answer says what became of each.
async fn release_all(
    lock: &DistributedLock,
    client: kube::Client,
    reason: &str,
    args: &Release,
) -> anyhow::Result<String> {
    let (namespace, name) = &args.lock;
    let tokens: Vec<i64> = lock.status.iter().flat_map(|s| &s.holders).map(|h| h.fencing_token).collect();
    if tokens.is_empty() {
        anyhow::bail!("lock {namespace}/{name} is not held: there is no hold to force-release");
    }
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    for token in tokens {
        match request::create(client.clone(), namespace, name, reason, args, Some(token)).await {
            Ok(out) => done.push(out),
            Err(e) => failed.push(format!("token {token}: {e:#}")),
        }
    }
    if failed.is_empty() {
        return Ok(done.join("\n"));
    }
    anyhow::bail!("{}{}", done.iter().map(|d| format!("{d}\n")).collect::<String>(), failed.join("\n"))
}

/// Asks the controller to revoke the current hold of a lock, and waits until it has.
pub async fn release(args: Release) -> anyhow::Result<String> {
    if !args.force {
        anyhow::bail!(
            "only forced release is possible from the command line (holders release through their sidecar): add --force --reason \"...\""
        );
    }
    let reason = args.reason.as_deref().map(str::trim).filter(|r| !r.is_empty());
    let Some(reason) = reason else { anyhow::bail!("--reason is required: say why the hold must be revoked") };
    let (namespace, name) = &args.lock;
    let client = crate::kube_client::client().await.context("failed to build a Kubernetes client")?;
    let locks: Api<DistributedLock> = Api::namespaced(client, namespace);
    let before = locks.get_opt(name).await?.with_context(|| format!("lock {namespace}/{name} does not exist"))?;
    // The policy as the controller applies it; unknown (not reported yet): a request,
    // which acts at once where no approval is needed.
    let required = before.status.as_ref().and_then(|s| s.force_release_approvals);
    // A lock with several permits has a holder per slot: a request names which (the
    // one-step annotation is about slot 0's holder only).
    if args.all {
        return release_all(&before, client_of(&locks), reason, &args).await;
    }
    if required != Some(0) || args.token.is_some() || before.spec.permits > 1 {
        return request::create(client_of(&locks), namespace, name, reason, &args, args.token).await;
    }
    let previous = before.status.as_ref().and_then(|s| s.last_force_release.clone());
    let patch = json!({"metadata": {"annotations": {ANNOTATION_FORCE_RELEASE: reason}}});
    locks
        .patch(
            name,
            &PatchParams { field_manager: Some(MANAGER_CLI.into()), ..PatchParams::default() },
            &Patch::Merge(patch),
        )
        .await
        .with_context(|| format!("failed to request a force release of lock {namespace}/{name}"))?;
    let done = await_condition(locks, name, move |lock: Option<&DistributedLock>| {
        lock.and_then(|l| l.status.as_ref())
            .and_then(|s| s.last_force_release.as_ref())
            .is_some_and(|r| Some(r) != previous.as_ref())
    });
    let lock = tokio::time::timeout(args.timeout, done)
        .await
        .with_context(|| {
            format!(
                "the controller did not carry out the force release of {namespace}/{name} within {:?} (is it running?)",
                args.timeout
            )
        })??
        .with_context(|| format!("lock {namespace}/{name} was deleted"))?;
    let record = lock.status.and_then(|s| s.last_force_release).expect("the condition checked it");
    Ok(match record.revoked_token {
        Some(token) => format!(
            "force-released {namespace}/{name}: revoked token {token} (by {}, reason: {})",
            record.by, record.reason
        ),
        None => {
            format!("{namespace}/{name} was not held; request recorded (by {}, reason: {})", record.by, record.reason)
        }
    })
}

fn client_of(locks: &Api<DistributedLock>) -> kube::Client {
    locks.clone().into_client()
}
