//! What the controller asks about Pods: is a holder's Pod gone, and may a claimant's Pod
//! hold a lock (its ServiceAccount among the lock's clients).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use tracing::warn;

use super::context::Context;
use super::error::Error;
use super::view::Claim;
use crate::lease::identity::PodRef;

/// Whether Pod `pod` is gone: not in the cache and confirmed missing by a direct read, or
/// present with another UID. Errors count as "not gone": never revoke on a guess.
pub async fn pod_gone(ctx: &Context, namespace: &str, pod: &PodRef) -> Result<bool, Error> {
    if let Some(cached) = ctx.pods.get(&ObjectRef::new(&pod.name).within(namespace)) {
        return Ok(cached.uid().as_deref() != Some(pod.uid.as_str()));
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    match api.get_metadata_opt(&pod.name).await {
        Ok(None) => Ok(true),
        Ok(Some(meta)) => Ok(PartialObjectMeta::<Pod>::uid(&meta).as_deref() != Some(pod.uid.as_str())),
        Err(source) => {
            let error = Error::Pod { namespace: namespace.to_owned(), name: pod.name.clone(), source };
            warn!(%error, "cannot tell whether the holder's pod exists");
            Ok(false)
        }
    }
}

/// Whether the claimant of `claim` may hold a lock with `clients` (empty: anyone the
/// namespace's RBAC lets claim). A pod claims as its ServiceAccount (read once per pod);
/// anyone else by the `system:serviceaccount:<ns>:<name>/` prefix of its identity.
pub async fn client_allowed(ctx: &Context, namespace: &str, clients: &[String], claim: &Claim) -> bool {
    if clients.is_empty() {
        return true;
    }
    let account = match &claim.identity.pod {
        Some(pod) => {
            let known = ctx.pod_accounts.lock().expect("pod accounts are never poisoned").get(&pod.uid).cloned();
            match known {
                Some(account) => Some(account),
                None => {
                    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
                    let account = pods
                        .get_opt(&pod.name)
                        .await
                        .ok()
                        .flatten()
                        .filter(|p| p.metadata.uid.as_deref() == Some(pod.uid.as_str()))
                        .and_then(|p| p.spec.and_then(|s| s.service_account_name));
                    if let Some(a) = &account {
                        ctx.pod_accounts
                            .lock()
                            .expect("pod accounts are never poisoned")
                            .insert(pod.uid.clone(), a.clone());
                    }
                    account
                }
            }
        }
        None => claim
            .identity
            .id
            .strip_prefix(&format!("system:serviceaccount:{namespace}:"))
            .and_then(|rest| rest.split_once('/'))
            .map(|(account, _)| account.to_owned()),
    };
    let allowed = account.as_ref().is_some_and(|a| clients.contains(a));
    if !allowed {
        warn!(namespace, claimant = %claim.identity, ?account, "claimant is not among the lock's clients; dropping its claim");
    }
    allowed
}
