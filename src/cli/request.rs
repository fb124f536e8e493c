//! ForceReleaseRequests from the command line: `leasehold release --force` creates one
//! where the lock's policy needs approvals; `leasehold requests` lists them with where each
//! stands; `leasehold approve` and `leasehold deny` put
//! the annotation the admission webhook turns into an approval or denial naming the
//! caller (the webhook refuses the requester's own approval and anyone without the
//! `approve` verb on `forcereleaserequests/approval`).

use std::time::Duration;

use anyhow::Context as _;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::json;

use super::Release;
use crate::crd::{
    ANNOTATION_APPROVE, ANNOTATION_DENY, ForceReleaseRequest, ForceReleaseRequestSpec, MANAGER_CLI, Phase,
};
use crate::run::parse_lock;

/// `leasehold approve` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct Approve {
    /// The request, as `<namespace>/<name>` (`kubectl get forcereleaserequests` lists them).
    #[arg(value_parser = parse_lock)]
    pub request: (String, String),
    /// How long to wait for the controller to take the approval in.
    #[arg(long, default_value = "30s", value_parser = crate::duration::parse_duration)]
    pub timeout: Duration,
}

/// `leasehold deny` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct Deny {
    /// The request, as `<namespace>/<name>`.
    #[arg(value_parser = parse_lock)]
    pub request: (String, String),
    /// Why: recorded with your user name.
    #[arg(long)]
    pub reason: String,
    /// How long to wait for the controller to take the denial in.
    #[arg(long, default_value = "30s", value_parser = crate::duration::parse_duration)]
    pub timeout: Duration,
}

/// `leasehold requests` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct List {
    /// The namespace whose requests to list.
    pub namespace: String,
}

/// The requests of a namespace as a table, oldest first: who asks to release which hold,
/// why, how many approvals it has of how many, and its outcome.
pub fn table(requests: &[ForceReleaseRequest]) -> String {
    let mut rows =
        vec![["NAME", "LOCK", "TARGET", "REQUESTER", "APPROVALS", "PHASE", "EXPIRES", "REASON"].map(String::from)];
    let mut sorted: Vec<&ForceReleaseRequest> = requests.iter().collect();
    sorted.sort_by_key(|r| (r.metadata.creation_timestamp.clone().map(|t| t.0), r.name_any()));
    for r in sorted {
        let status = r.status.clone().unwrap_or_default();
        let target = match (&r.spec.target_holder, r.spec.target_token) {
            (Some(holder), Some(token)) => format!("{holder} (token {token})"),
            _ => "-".to_owned(),
        };
        rows.push([
            r.name_any(),
            r.spec.lock.clone(),
            target,
            r.spec.requester.clone().unwrap_or_else(|| "-".to_owned()),
            status.approvals_text.unwrap_or_else(|| format!("{}/?", r.spec.approvals.len())),
            status.phase.map_or("Pending", Phase::as_str).to_owned(),
            r.spec.expires_at.as_ref().map_or_else(|| "-".to_owned(), |t| t.0.to_string()),
            r.spec.reason.clone(),
        ]);
    }
    super::columns::columns(&rows)
}

/// Lists the requests of a namespace.
pub async fn list(args: List) -> anyhow::Result<String> {
    let client = crate::kube_client::client().await.context("failed to build a Kubernetes client")?;
    let api: Api<ForceReleaseRequest> = Api::namespaced(client, &args.namespace);
    let requests = api
        .list(&ListParams::default())
        .await
        .with_context(|| format!("failed to list the forcereleaserequests of namespace {}", args.namespace))?;
    if requests.items.is_empty() {
        return Ok(format!("no forcereleaserequests in namespace {}", args.namespace));
    }
    Ok(table(&requests.items).trim_end().to_owned())
}

fn describe(request: &ForceReleaseRequest, namespace: &str) -> String {
    let name = request.name_any();
    let status = request.status.clone().unwrap_or_default();
    let phase = status.phase.map_or("Pending", Phase::as_str);
    let message = status.message.unwrap_or_default();
    format!("forcereleaserequest {namespace}/{name}: {phase} ({message})")
}

/// Waits until the controller has judged `name` since `seen` (a status different from it).
async fn judged(
    api: Api<ForceReleaseRequest>,
    namespace: &str,
    name: &str,
    seen: Option<crate::crd::ForceReleaseRequestStatus>,
    timeout: Duration,
) -> anyhow::Result<ForceReleaseRequest> {
    let done = await_condition(api, name, move |r: Option<&ForceReleaseRequest>| {
        r.and_then(|r| r.status.as_ref()).is_some_and(|s| s.phase.is_some() && Some(s) != seen.as_ref())
    });
    tokio::time::timeout(timeout, done)
        .await
        .with_context(|| {
            format!("the controller did not take forcereleaserequest {namespace}/{name} in within {timeout:?} (is it running?)")
        })??
        .with_context(|| format!("forcereleaserequest {namespace}/{name} was deleted"))
}

/// Creates a ForceReleaseRequest for lock `namespace/lock`, and reports where it stands
/// once the controller has looked at it.
pub async fn create(
    client: kube::Client,
    namespace: &str,
    lock: &str,
    reason: &str,
    args: &Release,
    token: Option<i64>,
) -> anyhow::Result<String> {
    let api: Api<ForceReleaseRequest> = Api::namespaced(client, namespace);
    let ttl = i32::try_from(args.ttl.as_secs()).context("--ttl is too long")?;
    let spec = ForceReleaseRequestSpec {
        lock: lock.to_owned(),
        reason: reason.to_owned(),
        target_holder: None,
        target_token: token,
        ttl_seconds: ttl,
        requester: None,
        expires_at: None,
        approvals: Vec::new(),
        denial: None,
    };
    let mut request = ForceReleaseRequest::new("", spec);
    request.metadata.name = None;
    request.metadata.generate_name = Some(format!("{lock}-"));
    let params = PostParams { field_manager: Some(MANAGER_CLI.into()), ..PostParams::default() };
    let created = api
        .create(&params, &request)
        .await
        .with_context(|| format!("failed to request a force release of lock {namespace}/{lock}"))?;
    let name = created.name_any();
    let target = format!(
        "{} (token {})",
        created.spec.target_holder.as_deref().unwrap_or("?"),
        created.spec.target_token.map_or_else(|| "?".to_owned(), |t| t.to_string())
    );
    let judged = judged(api, namespace, &name, None, args.timeout).await?;
    let mut out = format!("requested a force release of {target}: {}", describe(&judged, namespace));
    if judged.status.as_ref().and_then(|s| s.phase) == Some(Phase::Pending) {
        out.push_str(&format!("\nanother person approves it with: leasehold approve {namespace}/{name}"));
    }
    Ok(out)
}

async fn annotate(api: &Api<ForceReleaseRequest>, name: &str, key: &str, value: &str) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"annotations": {key: value}}});
    let params = PatchParams { field_manager: Some(MANAGER_CLI.into()), ..PatchParams::default() };
    api.patch(name, &params, &Patch::Merge(patch)).await?;
    Ok(())
}

/// Approves a request (as the caller), and reports where it stands once the controller has
/// taken the approval in.
pub async fn approve(args: Approve) -> anyhow::Result<String> {
    let (namespace, name) = &args.request;
    let client = crate::kube_client::client().await.context("failed to build a Kubernetes client")?;
    let api: Api<ForceReleaseRequest> = Api::namespaced(client, namespace);
    let before =
        api.get(name).await.with_context(|| format!("failed to read forcereleaserequest {namespace}/{name}"))?;
    annotate(&api, name, ANNOTATION_APPROVE, "true")
        .await
        .with_context(|| format!("failed to approve forcereleaserequest {namespace}/{name}"))?;
    let judged = judged(api, namespace, name, before.status, args.timeout).await?;
    Ok(format!("approved: {}", describe(&judged, namespace)))
}

/// Denies a request (as the caller).
pub async fn deny(args: Deny) -> anyhow::Result<String> {
    let (namespace, name) = &args.request;
    let reason = args.reason.trim();
    anyhow::ensure!(!reason.is_empty(), "--reason is required: say why the request is denied");
    let client = crate::kube_client::client().await.context("failed to build a Kubernetes client")?;
    let api: Api<ForceReleaseRequest> = Api::namespaced(client, namespace);
    let before =
        api.get(name).await.with_context(|| format!("failed to read forcereleaserequest {namespace}/{name}"))?;
    annotate(&api, name, ANNOTATION_DENY, reason)
        .await
        .with_context(|| format!("failed to deny forcereleaserequest {namespace}/{name}"))?;
    let judged = judged(api, namespace, name, before.status, args.timeout).await?;
    Ok(format!("denied: {}", describe(&judged, namespace)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &str, second: i64, phase: Option<Phase>, approvals: Option<&str>) -> ForceReleaseRequest {
        let spec = ForceReleaseRequestSpec {
            lock: "orders".into(),
            reason: "stuck since 09:00".into(),
            target_holder: Some("worker-1_uid".into()),
            target_token: Some(17),
            ttl_seconds: 600,
            requester: Some("alice".into()),
            expires_at: None,
            approvals: Vec::new(),
            denial: None,
        };
        let mut r = ForceReleaseRequest::new(name, spec);
        r.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::from_second(second).expect("a time"),
        ));
        r.status = Some(crate::crd::ForceReleaseRequestStatus {
            phase,
            approvals_text: approvals.map(str::to_owned),
            ..Default::default()
        });
        r
    }

    #[test]
    fn the_table_lists_requests_oldest_first_with_target_approvals_and_outcome() {
        let text =
            table(&[request("orders-b", 20, Some(Phase::Executed), Some("1/1")), request("orders-a", 10, None, None)]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("NAME") && lines[0].contains("APPROVALS") && lines[0].ends_with("REASON"));
        assert!(
            lines[1].starts_with("orders-a ") && lines[1].contains(" Pending ") && lines[1].contains("0/?"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("orders-b ") && lines[2].contains(" Executed ") && lines[2].contains(" 1/1 "),
            "{text}"
        );
        assert!(lines[2].contains("worker-1_uid (token 17)") && lines[2].ends_with("stuck since 09:00"), "{text}");
        // Columns line up: every row's PHASE starts where the header's does.
        let at = lines[0].find("PHASE").expect("a PHASE column");
        assert!(lines[1][at..].starts_with("Pending") && lines[2][at..].starts_with("Executed"), "{text}");
    }
}
