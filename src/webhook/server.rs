//! The webhook HTTPS server: TLS accept loop (certificate reloaded from files) and the
//! admission handlers, each answer counted and timed by webhook and outcome.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::extract::State;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, info, warn};

use super::{fence, force, inject, lock, refusals, request as forcerequest, tls};
use crate::crd::{ANNOTATION_TOKEN, ForceReleaseRequest, LABEL_FENCED_BY};
use crate::metrics::{ResourceLabel, WebhookLabel, WebhookMetrics, WebhookOutcomeLabel};

/// What the handlers need.
#[derive(Clone)]
pub struct Webhooks {
    /// Client for reading locks (fencing).
    pub client: kube::Client,
    /// The sidecar to inject.
    pub template: inject::Template,
    /// Approvals a force release needs on a lock whose policy does not say.
    pub force_release_approvals: u32,
    /// Admission metrics.
    pub metrics: Arc<WebhookMetrics>,
    /// Where refused fenced writes go to become Events.
    pub refusals: refusals::Reporter,
}

type Review = Json<AdmissionReview<DynamicObject>>;

/// How an admission request ended, for `leasehold_webhook_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted (possibly with a patch).
    Allowed,
    /// Refused on its merits.
    Denied,
    /// Not decided: a malformed review, or the state it depends on could not be read.
    Error,
}

impl Outcome {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::Error => "error",
        }
    }
}

/// An admission answer and how it ended (carried to the metrics layer in the response's
/// extensions; the answer itself is the same whatever the outcome).
struct Answer {
    review: AdmissionReview<DynamicObject>,
    outcome: Outcome,
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        (axum::Extension(self.outcome), Json(self.review)).into_response()
    }
}

fn request(review: AdmissionReview<DynamicObject>) -> Result<AdmissionRequest<DynamicObject>, String> {
    review.try_into().map_err(|e| format!("not an admission request: {e}"))
}

fn invalid(message: String) -> Answer {
    Answer { review: AdmissionResponse::invalid(message).into_review(), outcome: Outcome::Error }
}

fn respond(response: AdmissionResponse) -> Answer {
    let outcome = if response.allowed { Outcome::Allowed } else { Outcome::Denied };
    Answer { review: response.into_review(), outcome }
}

fn refuse(request: &AdmissionRequest<DynamicObject>, message: String, outcome: Outcome) -> Answer {
    debug!(kind = %request.kind.kind, name = %request.name, %message, "denied");
    let mut response = AdmissionResponse::from(request).deny(message);
    response.result.code = 403;
    Answer { review: response.into_review(), outcome }
}

/// Refuses `request` on its merits.
fn deny(request: &AdmissionRequest<DynamicObject>, message: String) -> Answer {
    refuse(request, message, Outcome::Denied)
}

/// Refuses `request` because it could not be decided (the answer is the same as
/// [`deny`]'s; only the outcome counted differs).
fn fail(request: &AdmissionRequest<DynamicObject>, message: String) -> Answer {
    refuse(request, message, Outcome::Error)
}

fn with_patch(request: &AdmissionRequest<DynamicObject>, patch: Option<json_patch::Patch>) -> Answer {
    with_patch_and_warnings(request, patch, Vec::new())
}

/// Admits with `patch`; `warnings` reach whoever made the request (kubectl prints them).
fn with_patch_and_warnings(
    request: &AdmissionRequest<DynamicObject>,
    patch: Option<json_patch::Patch>,
    warnings: Vec<String>,
) -> Answer {
    let mut response = AdmissionResponse::from(request);
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    match patch {
        None => respond(response),
        Some(patch) => match response.with_patch(patch) {
            Ok(response) => respond(response),
            Err(e) => fail(request, format!("internal error: {e}")),
        },
    }
}

/// The webhook a route serves, for metric labels.
pub fn webhook_of(path: &str) -> Option<&'static str> {
    match path {
        "/mutate/pods" => Some("inject"),
        "/mutate/distributedlocks" => Some("force"),
        "/mutate/forcereleaserequests" => Some("request"),
        "/validate/fenced" => Some("fence"),
        _ => None,
    }
}

/// Counts and times each admission request by webhook and outcome.
async fn observe(State(metrics): State<Arc<WebhookMetrics>>, request: axum::extract::Request, next: Next) -> Response {
    let webhook = webhook_of(request.uri().path());
    let started = Instant::now();
    let response = next.run(request).await;
    if let Some(webhook) = webhook {
        // No outcome: the review never reached the handler (not JSON, not a review).
        let outcome = response.extensions().get::<Outcome>().copied().unwrap_or(Outcome::Error);
        metrics.requests.get_or_create(&WebhookOutcomeLabel { webhook, outcome: outcome.label() }).inc();
        metrics.request_seconds.get_or_create(&WebhookLabel { webhook }).observe(started.elapsed().as_secs_f64());
    }
    response
}

async fn mutate_pods(State(hooks): State<Arc<Webhooks>>, Json(review): Review) -> Answer {
    let request = match request(review) {
        Ok(r) => r,
        Err(message) => return invalid(message),
    };
    let Some(object) = request.object.clone() else { return respond(AdmissionResponse::from(&request)) };
    let pod: Pod = match serde_json::to_value(object).and_then(serde_json::from_value) {
        Ok(pod) => pod,
        Err(e) => return deny(&request, format!("not a Pod: {e}")),
    };
    match inject::inject(&pod, &hooks.template) {
        Ok(injection) => {
            if !injection.warnings.is_empty() {
                debug!(name = %request.name, warnings = ?injection.warnings, "admitted with warnings");
            }
            with_patch_and_warnings(&request, injection.patch, injection.warnings)
        }
        Err(message) => deny(&request, message),
    }
}

async fn mutate_locks(State(hooks): State<Arc<Webhooks>>, Json(review): Review) -> Answer {
    let request = match request(review) {
        Ok(r) => r,
        Err(message) => return invalid(message),
    };
    let user = request.user_info.username.clone().unwrap_or_else(|| "unknown".into());
    let old = request.old_object.as_ref().map(|o| o.annotations());
    let new = request.object.as_ref().map(|o| o.annotations());
    let reason = match force::requested(old, new) {
        Ok(Some(reason)) => reason.to_owned(),
        Ok(None) => return respond(AdmissionResponse::from(&request)),
        Err(message) => return deny(&request, message),
    };
    let namespace = request.namespace.clone().unwrap_or_default();
    let lock_ref = format!("{namespace}/{}", request.name);
    let policy = request.object.as_ref().and_then(|o| o.data["spec"]["forceRelease"]["approvals"].as_u64());
    let required = policy.map_or(hooks.force_release_approvals, |n| u32::try_from(n).unwrap_or(u32::MAX));
    if required > 0 {
        return deny(
            &request,
            format!(
                "lock {lock_ref} needs {required} approval(s) for a force release: create a ForceReleaseRequest (`leasehold release --force` does) and have another person approve it"
            ),
        );
    }
    // The hold as it is now, read fresh: the request is about this hold and no later one.
    let hold = match lock::read(&hooks.client, &namespace, &request.name).await {
        Ok(Some(state)) => state.hold,
        Ok(None) => lock::Hold::Free,
        Err(message) => return fail(&request, message),
    };
    match force::stamp(&lock_ref, &hold, &user) {
        Ok(patch) => {
            info!(lock = %lock_ref, %user, %reason, ?hold, "force release requested");
            with_patch(&request, Some(patch))
        }
        Err(message) => {
            info!(lock = %lock_ref, %user, %reason, %message, "force release refused");
            deny(&request, message)
        }
    }
}

fn typed(object: Option<&DynamicObject>) -> Result<Option<ForceReleaseRequest>, String> {
    object
        .map(|o| serde_json::to_value(o).and_then(serde_json::from_value))
        .transpose()
        .map_err(|e| format!("not a ForceReleaseRequest: {e}"))
}

/// Whether the requesting user holds the `approve` verb on this request's approval
/// subresource, by a SubjectAccessReview (the apiserver's authorizer decides, as for
/// CertificateSigningRequests).
async fn may_approve(
    client: &kube::Client,
    request: &AdmissionRequest<DynamicObject>,
    namespace: &str,
) -> Result<bool, String> {
    let info = &request.user_info;
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: info.username.clone(),
            uid: info.uid.clone(),
            groups: info.groups.clone(),
            extra: info.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_owned()),
                verb: Some(forcerequest::APPROVE_VERB.into()),
                group: Some(crate::crd::GROUP.into()),
                resource: Some("forcereleaserequests".into()),
                subresource: Some(forcerequest::APPROVAL_SUBRESOURCE.into()),
                name: Some(request.name.clone()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let answer = reviews.create(&PostParams::default(), &review).await.map_err(|e| {
        format!("failed to check who may approve forcereleaserequest {namespace}/{}: {e}", request.name)
    })?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

async fn mutate_requests(State(hooks): State<Arc<Webhooks>>, Json(review): Review) -> Answer {
    let request = match request(review) {
        Ok(r) => r,
        Err(message) => return invalid(message),
    };
    let user = request.user_info.username.clone().unwrap_or_else(|| "unknown".into());
    let namespace = request.namespace.clone().unwrap_or_default();
    let name = format!("{namespace}/{}", request.name);
    let (old, new) = match (typed(request.old_object.as_ref()), typed(request.object.as_ref())) {
        (Ok(old), Ok(Some(new))) => (old, new),
        (Ok(_), Ok(None)) => return respond(AdmissionResponse::from(&request)),
        (Err(message), _) | (_, Err(message)) => return deny(&request, message),
    };
    let now = jiff::Timestamp::now();
    match (&request.operation, old) {
        (Operation::Create, _) => {
            let lock_ref = format!("{namespace}/{}", new.spec.lock);
            // The holds as they are now, read fresh: the request is about one of these.
            let holds = match lock::read_holds(&hooks.client, &namespace, &new.spec.lock).await {
                Ok(holds) => holds,
                Err(message) => return fail(&request, message),
            };
            match forcerequest::admit_create(&name, &new, &lock_ref, holds.as_deref(), &user, now) {
                Ok(patch) => {
                    info!(request = %name, lock = %lock_ref, %user, ?holds, "force-release request admitted");
                    with_patch(&request, Some(patch))
                }
                Err(message) => deny(&request, message),
            }
        }
        (Operation::Update, Some(old)) => {
            let change = match forcerequest::classify_update(&name, &old, &new) {
                Ok(change) => change,
                Err(message) => return deny(&request, message),
            };
            let requester = new.spec.requester.as_deref() == Some(user.as_str());
            let needs_review = match &change {
                forcerequest::Change::Other => false,
                forcerequest::Change::Approve => !requester,
                forcerequest::Change::Deny(_) => !requester,
            };
            let allowed = if needs_review {
                match may_approve(&hooks.client, &request, &namespace).await {
                    Ok(allowed) => allowed,
                    Err(message) => return fail(&request, message),
                }
            } else {
                false
            };
            match forcerequest::admit_change(&name, &new, &change, &user, allowed, now) {
                Ok(patch) => {
                    if patch.is_some() {
                        info!(request = %name, %user, ?change, "force-release request approval admitted");
                    }
                    with_patch(&request, patch)
                }
                Err(message) => {
                    info!(request = %name, %user, ?change, %message, "force-release request approval refused");
                    deny(&request, message)
                }
            }
        }
        _ => respond(AdmissionResponse::from(&request)),
    }
}

/// The fencing label and token annotation of an object.
fn fencing(object: Option<&DynamicObject>) -> (Option<&str>, Option<&str>) {
    let Some(object) = object else { return (None, None) };
    (
        object.labels().get(LABEL_FENCED_BY).map(String::as_str),
        object.annotations().get(ANNOTATION_TOKEN).map(String::as_str),
    )
}

async fn validate_fenced(State(hooks): State<Arc<Webhooks>>, Json(review): Review) -> Answer {
    let request = match request(review) {
        Ok(r) => r,
        Err(message) => return invalid(message),
    };
    let operation = match request.operation {
        Operation::Create => fence::Operation::Create,
        Operation::Update => fence::Operation::Update,
        Operation::Delete => fence::Operation::Delete,
        Operation::Connect => return respond(AdmissionResponse::from(&request)),
    };
    let user = request.user_info.username.as_deref().unwrap_or_default();
    if operation == fence::Operation::Delete && crate::webhook::guard::CLEANUP_USERS.contains(&user) {
        // The garbage collector (the object's owner is gone) or the namespace controller
        // (its namespace is being deleted): a deletion decided elsewhere, never refused.
        return respond(AdmissionResponse::from(&request));
    }
    let (old_lock, old_token) = fencing(request.old_object.as_ref());
    let (new_lock, new_token) = fencing(request.object.as_ref());
    let write = fence::Write { old_lock, old_token, new_lock, new_token };
    let involved = fence::locks(operation, &write);
    if involved.is_empty() {
        return respond(AdmissionResponse::from(&request));
    }
    let Some(namespace) = request.namespace.clone().filter(|n| !n.is_empty()) else {
        // Locks are namespaced: no lock fences a cluster-scoped object. Labelling one is a
        // mistake worth refusing; removing the label or deleting it never is.
        return match write.new_lock {
            Some(lock) => {
                deny(&request, format!("object fenced by lock {lock} must be namespaced (locks are namespaced)"))
            }
            None => respond(AdmissionResponse::from(&request)),
        };
    };
    let mut tokens = fence::Tokens::new();
    let mut uids = std::collections::BTreeMap::new();
    for name in involved {
        match lock::read_identified(&hooks.client, &namespace, &name).await {
            Ok(Some((state, uid))) => {
                uids.insert(name.clone(), uid);
                tokens.insert(name, Some(state.token));
            }
            Ok(None) => {
                tokens.insert(name, None);
            }
            Err(message) => return fail(&request, message),
        };
    }
    match fence::judge(operation, &write, &namespace, &tokens) {
        Ok(()) => respond(AdmissionResponse::from(&request)),
        Err(refusal) => {
            let resource = resource_of(&request.resource);
            let object = format!("{resource} {}", request.name);
            warn!(
                %namespace,
                lock = %refusal.lock,
                %object,
                operation = ?operation,
                presented = refusal.presented.as_deref().unwrap_or("none"),
                current = ?refusal.current,
                %user,
                "fenced write refused"
            );
            hooks.metrics.stale_writes_refused.get_or_create(&ResourceLabel { resource }).inc();
            // A lock that does not exist has no current token and nowhere to put an Event.
            let lock = refusal.lock.strip_prefix(&format!("{namespace}/")).unwrap_or(&refusal.lock).to_owned();
            if let Some(current) = refusal.current {
                hooks.refusals.report(refusals::StaleWrite {
                    namespace: namespace.clone(),
                    lock_uid: uids.get(&lock).cloned().flatten(),
                    lock,
                    operation: match operation {
                        fence::Operation::Create => "CREATE",
                        fence::Operation::Update => "UPDATE",
                        fence::Operation::Delete => "DELETE",
                    },
                    object,
                    user: user.to_owned(),
                    presented: refusal.presented.clone(),
                    current,
                });
            }
            deny(&request, refusal.message)
        }
    }
}

/// The `group/resource` of a written object (`configmaps` in the core group).
pub fn resource_of(resource: &kube::core::GroupVersionResource) -> String {
    if resource.group.is_empty() {
        resource.resource.clone()
    } else {
        format!("{}/{}", resource.group, resource.resource)
    }
}

/// The webhook routes.
pub fn router(hooks: Webhooks) -> Router {
    let metrics = hooks.metrics.clone();
    Router::new()
        .route("/mutate/pods", post(mutate_pods))
        .route("/mutate/distributedlocks", post(mutate_locks))
        .route("/mutate/forcereleaserequests", post(mutate_requests))
        .route("/validate/fenced", post(validate_fenced))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(Arc::new(hooks))
        .layer(axum::middleware::from_fn_with_state(metrics, observe))
}

/// Serves `router` over TLS on `listener` until `shutdown`. `bound` turns true once
/// accepting (readiness).
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: rustls::ServerConfig,
    router: Router,
    bound: Arc<AtomicBool>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    bound.store(true, Ordering::Release);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => accepted?,
        };
        let (acceptor, router) = (acceptor.clone(), router.clone());
        // Small responses, written in pieces: no Nagle delay.
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(tls) => tls,
                Err(e) => {
                    debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |req| router.clone().oneshot(req));
            if let Err(e) =
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).await
            {
                warn!(%peer, error = %e, "webhook connection failed");
            }
        });
    }
}

/// Binds the webhook server and returns its task, or an error naming what failed.
pub async fn start(
    config: &super::Config,
    client: kube::Client,
    force_release_approvals: u32,
    metrics: Arc<WebhookMetrics>,
    refusals: refusals::Reporter,
    bound: Arc<AtomicBool>,
    shutdown: CancellationToken,
) -> anyhow::Result<Option<impl std::future::Future<Output = std::io::Result<()>> + use<>>> {
    let Some(addr) = config.webhook_addr else { return Ok(None) };
    let resolver = Arc::new(tls::ReloadingCert::new(&config.tls_cert_file, &config.tls_key_file)?);
    let tls = tls::server_config(resolver)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("failed to bind the webhook server to {addr}: {e}"))?;
    info!(addr = %listener.local_addr()?, "webhook server listening");
    let router = router(Webhooks { client, template: config.template(), force_release_approvals, metrics, refusals });
    Ok(Some(serve(listener, tls, router, bound, shutdown)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_webhook_route_has_a_label() {
        let cases = [
            ("/mutate/pods", Some("inject")),
            ("/mutate/distributedlocks", Some("force")),
            ("/mutate/forcereleaserequests", Some("request")),
            ("/validate/fenced", Some("fence")),
            ("/healthz", None),
            ("/validate/fenced/x", None),
        ];
        for (path, expected) in cases {
            assert_eq!(webhook_of(path), expected, "{path}");
        }
    }

    #[test]
    fn the_outcome_follows_the_answer() {
        let refused = respond(AdmissionResponse::invalid("x").deny("no"));
        assert_eq!(refused.outcome, Outcome::Denied);
        assert_eq!(invalid("bad".into()).outcome, Outcome::Error);
        let labels = [Outcome::Allowed, Outcome::Denied, Outcome::Error].map(Outcome::label);
        assert_eq!(labels, ["allowed", "denied", "error"]);
    }

    #[test]
    fn resources_are_group_qualified_outside_the_core_group() {
        let gvr = |group: &str, resource: &str| kube::core::GroupVersionResource::gvr(group, "v1", resource);
        assert_eq!(resource_of(&gvr("", "configmaps")), "configmaps");
        assert_eq!(resource_of(&gvr("apps", "deployments")), "apps/deployments");
    }
}
