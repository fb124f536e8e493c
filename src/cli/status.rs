//! `leasehold status`: one lock in detail (holder, queue with waits, conditions, history,
//! open force-release requests), or the locks of a namespace or the cluster as a table.
//! The reads are here; what is shown is [`view`], pure.

pub mod view;

use std::collections::BTreeMap;

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::target::{self, PodNamespace};
use crate::crd::{DistributedLock, ForceReleaseRequest, LABEL_LOCK, LABEL_ROLE, LockClaim, ROLE_LOCK};
use crate::lease::{Identity, slot};

/// How `status` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// For people.
    Text,
    /// For programs: the shape documented in docs/guides/cli.md.
    Json,
    /// The same as `json`, as YAML.
    Yaml,
}

/// `leasehold status` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct Status {
    /// `<namespace>/<lock>` (or `<lock>` inside a Pod) for one lock; `<namespace>` for
    /// every lock of a namespace. Omitted: the locks of the current namespace.
    pub target: Option<String>,
    /// Every lock of every namespace, as a table.
    #[arg(short = 'A', long, conflicts_with = "target")]
    pub all_namespaces: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

fn render<T: serde::Serialize>(value: &T, output: Output, text: impl FnOnce(&T) -> String) -> anyhow::Result<String> {
    Ok(match output {
        Output::Text => text(value).trim_end().to_owned(),
        Output::Json => serde_json::to_string_pretty(value)?,
        Output::Yaml => serde_saphyr::to_string(value)?.trim_end().to_owned(),
    })
}

/// Shows one lock, or a table of locks.
pub async fn status(args: Status) -> anyhow::Result<String> {
    let client = crate::kube_client::client().await.context("failed to build a Kubernetes client")?;
    let one = args.target.as_deref().filter(|t| t.contains('/') || PodNamespace::read().get().is_some());
    // A bare word outside a Pod is a namespace; inside a Pod, `<lock>` if such a lock
    // exists in the Pod's namespace, else a namespace.
    if let Some(arg) = one {
        let (namespace, name) = target::resolve(arg, &PodNamespace::read())?;
        let locks: Api<DistributedLock> = Api::namespaced(client.clone(), &namespace);
        if arg.contains('/') || locks.get_opt(&name).await?.is_some() {
            let observed = observe(&client, &namespace, &name).await?;
            return render(&view::lock_view(&observed), args.output, view::lock_text);
        }
    }
    let (locks, scope): (Api<DistributedLock>, String) = match (&args.target, args.all_namespaces) {
        (_, true) => (Api::all(client), "the cluster".to_owned()),
        (Some(ns), false) => (Api::namespaced(client, ns), format!("namespace {ns}")),
        (None, false) => {
            let ns = PodNamespace::read().get().unwrap_or_else(|| client.default_namespace().to_owned());
            (Api::namespaced(client, &ns), format!("namespace {ns}"))
        }
    };
    let list =
        locks.list(&ListParams::default()).await.with_context(|| format!("failed to list the locks of {scope}"))?;
    let now = jiff::Timestamp::now();
    let rows: Vec<view::LockRow> = list.items.iter().map(|l| view::lock_row(l, now)).collect();
    if rows.is_empty() && args.output == Output::Text {
        return Ok(format!("no locks in {scope}"));
    }
    render(&rows, args.output, |rows| view::rows_text(rows))
}

/// Reads everything shown for `namespace/name`.
async fn observe(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<view::Observed> {
    let lock = Api::<DistributedLock>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .with_context(|| format!("failed to read lock {namespace}/{name}"))?
        .with_context(|| format!("lock {namespace}/{name} does not exist"))?;
    let lease = Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .with_context(|| format!("failed to read the Lease of lock {namespace}/{name}"))?;
    // The other slots of a lock with several permits: Leases labelled with the lock whose
    // name says which slot.
    let mut slots: Vec<(u32, Lease)> = Api::<Lease>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("{LABEL_LOCK}={name},{LABEL_ROLE}={ROLE_LOCK}")))
        .await
        .with_context(|| format!("failed to list the slot Leases of lock {namespace}/{name}"))?
        .items
        .into_iter()
        .filter_map(|l| Some((slot::of_lease_name(name, l.metadata.name.as_deref()?).filter(|s| *s > 0)?, l)))
        .collect();
    slots.sort_by_key(|(slot, _)| *slot);
    let claims = Api::<LockClaim>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("{LABEL_LOCK}={name}")))
        .await
        .with_context(|| format!("failed to list the lockclaims of lock {namespace}/{name}"))?
        .items;
    // Someone allowed to see the lock may not be allowed to list requests: show the rest.
    let requests = Api::<ForceReleaseRequest>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut pods: Vec<String> = claims.iter().filter_map(|c| c.spec.pod.clone()).collect();
    for holder in lease.iter().chain(slots.iter().map(|(_, l)| l)).filter_map(crate::claim::edit::holder) {
        pods.extend(Identity::parse(holder).pod.map(|p| p.name));
    }
    pods.sort();
    pods.dedup();
    Ok(view::Observed {
        lock,
        lease,
        slots,
        claims,
        requests,
        owners: owners(client, namespace, &pods).await,
        now: jiff::Timestamp::now(),
    })
}

/// Each Pod's controller as `Kind/name`; Pods that are gone or unreadable are left out.
async fn owners(client: &kube::Client, namespace: &str, pods: &[String]) -> BTreeMap<String, String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut owners = BTreeMap::new();
    for pod in pods {
        let Ok(Some(found)) = api.get_opt(pod).await else { continue };
        let controller = found.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
        if let Some(o) = controller {
            owners.insert(pod.clone(), format!("{}/{}", o.kind, o.name));
        }
    }
    owners
}
