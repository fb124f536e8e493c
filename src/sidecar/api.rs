//! The sidecar's local HTTP/JSON API, documented by `docs/sidecar-api.yaml`.
//!
//! Every error is a JSON body `{"error": {"code", "message"}}` whose message names the
//! problem, and a rejected request changes nothing. Requests are read and checked in
//! [`super::request`]; holds live in [`super::slots`]; session-bound answers stream from
//! [`super::session`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use serde_json::json;

use super::request::{self, MAX_BODY_BYTES, check_no_body, parse_acquire, parse_handle};
use super::slots::{Granted, HandleError, HandleRelease, Slots, millis, wall_after};
use crate::claim::AcquireError;
use crate::names::validate_lock_name;

/// An API error: status, machine code, human message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    /// An error answered with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
    }

    /// Its HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Its machine code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// Its message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": {"code": self.code, "message": self.message}}))).into_response()
    }
}

impl From<&AcquireError> for ApiError {
    fn from(e: &AcquireError) -> ApiError {
        let status = match e {
            AcquireError::UnknownLock { .. } => StatusCode::NOT_FOUND,
            AcquireError::Timeout { .. } => StatusCode::CONFLICT,
            AcquireError::Forbidden { .. } => StatusCode::FORBIDDEN,
            AcquireError::ReadLock { .. } | AcquireError::ReadTimeout { .. } | AcquireError::Lease(_) => {
                StatusCode::BAD_GATEWAY
            }
        };
        let code = match e {
            AcquireError::UnknownLock { .. } => "unknown_lock",
            AcquireError::Timeout { .. } => "timeout",
            AcquireError::Forbidden { .. } => "forbidden",
            _ => "apiserver",
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl From<HandleError> for ApiError {
    fn from(e: HandleError) -> ApiError {
        let code = match e {
            HandleError::Wrong { .. } => "wrong_handle",
            HandleError::Lost { .. } => "lost",
            HandleError::Ended { .. } => "hold_ended",
        };
        ApiError::new(StatusCode::CONFLICT, code, e.to_string())
    }
}

/// Shared state of the API.
#[derive(Clone)]
pub struct Api {
    /// The slots.
    pub slots: Slots,
    /// Largest wait accepted.
    pub max_wait: Duration,
}

/// The API routes.
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/v1/locks/{name}", get(view).fallback(method_not_allowed))
        .route("/v1/locks/{name}/acquire", post(acquire).fallback(method_not_allowed))
        .route("/v1/locks/{name}/release", post(release).fallback(method_not_allowed))
        .route("/v1/locks/{name}/events", get(events).fallback(method_not_allowed))
        .route("/v1/locks/{name}/holds/{handle}", get(hold_view).fallback(method_not_allowed))
        .route("/v1/locks/{name}/holds/{handle}/keepalive", post(keepalive).fallback(method_not_allowed))
        .route("/v1/locks/{name}/holds/{handle}/release", post(release_handle).fallback(method_not_allowed))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(refuse_queries))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(Arc::new(api))
}

/// No operation takes query parameters: one sent anyway (`?waitSeconds=5`) would be
/// silently ignored, so it is refused instead.
async fn refuse_queries(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    match request.uri().query() {
        Some(query) => {
            let shown: String = query.chars().take(80).collect();
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                format!("this API takes no query parameters (got {shown:?}); send options in the JSON body"),
            )
            .into_response()
        }
        None => next.run(request).await,
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint; see docs/sidecar-api.yaml")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this endpoint")
}

async fn acquire(
    State(api): State<Arc<Api>>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    validate_lock_name(&name)?;
    let request = parse_acquire(body)?;
    if api.slots.is_closing() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            format!("the sidecar is shutting down: lock {name} cannot be acquired through it"),
        ));
    }
    let wait = request::validate_wait(request.wait_seconds, api.max_wait)?;
    let mode = request::validate_mode(request.mode.as_deref())?;
    if let Some(container) = &request.container {
        let pod = api.slots.pod();
        let names = pod.as_deref().map(super::pod::app_containers);
        request::validate_container(container, names.as_deref())?;
    }
    let ttl = match request.ttl_seconds {
        Some(ttl) => {
            // The TTL is bounded by the lock's lease duration: read it (an unknown lock is
            // answered here, before anything is queued).
            let timing = api.slots.claimant().timing(&name).await.map_err(|e| ApiError::from(&e))?;
            Some(request::validate_ttl(&name, ttl, timing.lease_duration)?)
        }
        None => None,
    };
    let terms = request::terms(&request, ttl, mode);
    let session = terms.session;
    let (id, mut reply) = api.slots.enqueue(&name, terms);
    let mut leave = Leave { slots: api.slots.clone(), lock: name.clone(), id, armed: true };
    let outcome = match tokio::time::timeout(wait, &mut reply).await {
        Ok(received) => received.ok(),
        // The grant may have arrived just as the wait ran out: take it rather than drop it.
        Err(_) => reply.try_recv().ok(),
    };
    match outcome {
        Some(Ok(granted)) => {
            // A session follows the hold's events from before the last check on.
            let events = session.then(|| api.slots.subscribe(&name));
            // Check once more as the answer leaves: a hold lost meanwhile (the sidecar was
            // paused, say) is never reported held. Leaving the queue releases it.
            let Some(left) = api.slots.remaining_for(&name, id) else {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "lost",
                    format!(
                        "lock {name} was granted with token {} but the hold was lost before it could be reported",
                        granted.fencing_token
                    ),
                ));
            };
            leave.armed = false;
            let granted = Granted {
                remaining_ms: millis(left.remaining),
                valid_until_boottime_ms: left.boottime_ms,
                expires_at: wall_after(left.remaining),
                ..granted
            };
            Ok(match events {
                Some(events) => {
                    let handle = granted.handle.clone();
                    super::session::respond(api.slots.clone(), granted, handle, events)
                }
                None => Json(granted).into_response(),
            })
        }
        Some(Err(error)) => Err(ApiError::from(error.as_ref())),
        None => {
            Err(ApiError::new(StatusCode::CONFLICT, "timeout", format!("lock {name} was not granted within {wait:?}")))
        }
    }
}

/// Leaves the queue when an acquire request ends without taking a grant (timeout, error,
/// or the caller disconnecting, which drops the request future).
struct Leave {
    slots: Slots,
    lock: String,
    id: u64,
    armed: bool,
}

impl Drop for Leave {
    fn drop(&mut self) {
        if self.armed {
            self.slots.leave(&self.lock, self.id);
        }
    }
}

async fn release(
    State(api): State<Arc<Api>>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    validate_lock_name(&name)?;
    check_no_body("release", body)?;
    let body = match api.slots.release(&name).await {
        Ok(Some(outcome)) => json!({"lock": name, "released": true, "wasHeld": outcome.was_held}),
        Ok(None) => json!({"lock": name, "released": false, "wasHeld": false}),
        Err(refused) => return Err(ApiError::new(StatusCode::CONFLICT, "handle_required", refused.to_string())),
    };
    Ok(Json(body).into_response())
}

async fn release_handle(
    State(api): State<Arc<Api>>,
    Path((name, handle)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    validate_lock_name(&name)?;
    let handle = parse_handle(&handle)?;
    check_no_body("release", body)?;
    let body = match api.slots.release_handle(&name, &handle).await? {
        HandleRelease::Released(outcome) => json!({"lock": name, "released": true, "wasHeld": outcome.was_held}),
        HandleRelease::AlreadyEnded(ending) => {
            json!({"lock": name, "released": false, "wasHeld": false, "reason": ending.to_string()})
        }
    };
    Ok(Json(body).into_response())
}

async fn keepalive(
    State(api): State<Arc<Api>>,
    Path((name, handle)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    validate_lock_name(&name)?;
    let handle = parse_handle(&handle)?;
    check_no_body("keep-alive", body)?;
    Ok(Json(api.slots.keepalive(&name, &handle)?).into_response())
}

async fn hold_view(
    State(api): State<Arc<Api>>,
    Path((name, handle)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    validate_lock_name(&name)?;
    let handle = parse_handle(&handle)?;
    Ok(Json(api.slots.hold_view(&name, &handle)?).into_response())
}

async fn view(State(api): State<Arc<Api>>, Path(name): Path<String>) -> Result<Response, ApiError> {
    validate_lock_name(&name)?;
    Ok(Json(api.slots.view(&name)).into_response())
}

async fn events(
    State(api): State<Arc<Api>>,
    Path(name): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    validate_lock_name(&name)?;
    let receiver = api.slots.subscribe(&name);
    let events = futures::stream::unfold(receiver, |mut receiver| async move {
        let event = match receiver.recv().await {
            Ok(event) => Event::default().event(event.name()).data(serde_json::to_string(&event).unwrap_or_default()),
            // A slow reader missed events: say so, keep going.
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                Event::default().event("lagged").data(json!({"event": "lagged", "missed": n}).to_string())
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok(event), receiver))
    })
    .boxed();
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

#[cfg(test)]
mod tests {
    /// docs/sidecar-api.md covers every operation, field and error code of the OpenAPI
    /// document (which an end-to-end test checks against the running server).
    #[test]
    fn the_reference_page_covers_the_openapi_document() {
        let spec: serde_json::Value =
            serde_saphyr::from_str(include_str!("../../docs/sidecar-api.yaml")).expect("parses");
        let page = include_str!("../../docs/sidecar-api.md");
        for (path, item) in spec["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("operations").keys() {
                let heading = format!("`{} {path}`", method.to_uppercase());
                assert!(page.contains(&heading), "docs/sidecar-api.md lacks {heading}");
            }
        }
        for (name, schema) in spec["components"]["schemas"].as_object().expect("schemas") {
            for field in schema["properties"].as_object().into_iter().flatten().map(|(k, _)| k) {
                assert!(page.contains(&format!("`{field}`")), "docs/sidecar-api.md lacks the field {field} of {name}");
            }
        }
        for code in spec["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
            .as_array()
            .expect("codes")
        {
            let code = code.as_str().expect("a string");
            assert!(page.contains(&format!("`{code}`")), "docs/sidecar-api.md lacks the error code {code}");
        }
    }
}
