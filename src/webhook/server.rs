//! The webhook HTTPS server: TLS accept loop (certificate reloaded from files) and the
//! admission handlers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, info, warn};

use super::{fence, force, inject, tls};
use crate::crd::{ANNOTATION_TOKEN, DistributedLock, LABEL_FENCED_BY};
use crate::lease::token;

/// What the handlers need.
#[derive(Clone)]
pub struct Webhooks {
    /// Client for reading locks (fencing).
    pub client: kube::Client,
    /// The sidecar to inject.
    pub template: inject::Template,
}

type Review = Json<AdmissionReview<DynamicObject>>;

fn request(review: AdmissionReview<DynamicObject>) -> Result<AdmissionRequest<DynamicObject>, String> {
    review.try_into().map_err(|e| format!("not an admission request: {e}"))
}

fn invalid(message: String) -> Review {
    Json(AdmissionResponse::invalid(message).into_review())
}

fn respond(response: AdmissionResponse) -> Review {
    Json(response.into_review())
}

fn deny(request: &AdmissionRequest<DynamicObject>, message: String) -> Review {
    debug!(kind = %request.kind.kind, name = %request.name, %message, "denied");
    let mut response = AdmissionResponse::from(request).deny(message);
    response.result.code = 403;
    respond(response)
}

fn with_patch(request: &AdmissionRequest<DynamicObject>, patch: Option<json_patch::Patch>) -> Review {
    let response = AdmissionResponse::from(request);
    match patch {
        None => respond(response),
        Some(patch) => match response.with_patch(patch) {
            Ok(response) => respond(response),
            Err(e) => deny(request, format!("internal error: {e}")),
        },
    }
}

async fn mutate_pods(State(hooks): State<Arc<Webhooks>>, Json(review): Review) -> Review {
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
        Ok(patch) => with_patch(&request, patch),
        Err(message) => deny(&request, message),
    }
}

async fn mutate_locks(Json(review): Review) -> Review {
    let request = match request(review) {
        Ok(r) => r,
        Err(message) => return invalid(message),
    };
    let user = request.user_info.username.clone().unwrap_or_else(|| "unknown".into());
    let old = request.old_object.as_ref().map(|o| o.annotations());
    let new = request.object.as_ref().map(|o| o.annotations());
    match force::stamp(old, new, &user) {
        Ok(patch) => {
            if patch.is_some() {
                info!(lock = %request.name, namespace = ?request.namespace, %user, "force release requested");
            }
            with_patch(&request, patch)
        }
        Err(message) => deny(&request, message),
    }
}

/// The current token of `lock`: the highest recorded on its Lease or its status, read fresh.
async fn current_token(client: &kube::Client, namespace: &str, lock: &str) -> Result<i64, String> {
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), namespace);
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let dl = locks
        .get_opt(lock)
        .await
        .map_err(|e| format!("cannot read lock {namespace}/{lock}: {e}"))?
        .ok_or_else(|| format!("object is fenced by lock {namespace}/{lock}, which does not exist"))?;
    let lease = leases.get_opt(lock).await.map_err(|e| format!("cannot read lease {namespace}/{lock}: {e}"))?;
    let from_status = dl.status.and_then(|s| s.fencing_token).unwrap_or(0);
    Ok(from_status.max(lease.as_ref().and_then(token::of_lease).unwrap_or(0)))
}

async fn validate_fenced(State(hooks): State<Arc<Webhooks>>, Json(review): Review) -> Review {
    let request = match request(review) {
        Ok(r) => r,
        Err(message) => return invalid(message),
    };
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return respond(AdmissionResponse::from(&request));
    }
    let Some(object) = &request.object else { return respond(AdmissionResponse::from(&request)) };
    let Some(lock) = object.labels().get(LABEL_FENCED_BY).cloned() else {
        return respond(AdmissionResponse::from(&request));
    };
    let Some(namespace) = request.namespace.clone().filter(|n| !n.is_empty()) else {
        return deny(&request, format!("object fenced by lock {lock} must be namespaced (locks are namespaced)"));
    };
    let lock_ref = format!("{namespace}/{lock}");
    let current = match current_token(&hooks.client, &namespace, &lock).await {
        Ok(t) => t,
        Err(message) => return deny(&request, message),
    };
    let stored = request
        .old_object
        .as_ref()
        .and_then(|o| o.annotations().get(ANNOTATION_TOKEN).cloned())
        .and_then(|v| token::parse(&v).ok());
    let presented = object.annotations().get(ANNOTATION_TOKEN).map(String::as_str);
    match fence::judge(&lock_ref, presented, fence::Current { lock: current, object: stored }) {
        Ok(_) => respond(AdmissionResponse::from(&request)),
        Err(message) => deny(&request, message),
    }
}

/// The webhook routes.
pub fn router(hooks: Webhooks) -> Router {
    Router::new()
        .route("/mutate/pods", post(mutate_pods))
        .route("/mutate/distributedlocks", post(mutate_locks))
        .route("/validate/fenced", post(validate_fenced))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(Arc::new(hooks))
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
    let router = router(Webhooks { client, template: config.template() });
    Ok(Some(serve(listener, tls, router, bound, shutdown)))
}
