//! The sidecar's local HTTP/JSON API, documented by `docs/sidecar-api.yaml`.
//!
//! Every error is a JSON body `{"error": {"code", "message"}}` whose message names the
//! problem, and a rejected request changes nothing.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::json;

use super::slots::Slots;
use crate::claim::AcquireError;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// The wait used when a request names none.
pub const DEFAULT_WAIT_SECONDS: f64 = 30.0;
/// A wait of 0 still gives the grant this long to arrive (a try-lock, not an instant fail).
pub const MIN_WAIT: Duration = Duration::from_secs(1);

/// An API error: status, machine code, human message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
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

/// Body of an acquire request.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AcquireRequest {
    /// How long to wait for the grant, in seconds.
    #[serde(default)]
    pub wait_seconds: Option<f64>,
}

/// Checks a lock name: a DNS label, as the CRD requires.
pub fn validate_lock_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        let shown: String = name.chars().take(80).collect();
        Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_lock_name",
            format!("lock name {shown:?} is not a DNS label (at most 63 lowercase letters, digits and '-')"),
        ))
    }
}

/// Checks a wait: a finite number of seconds in `0..=max`.
pub fn validate_wait(wait: Option<f64>, max: Duration) -> Result<Duration, ApiError> {
    let seconds = wait.unwrap_or(DEFAULT_WAIT_SECONDS);
    if !seconds.is_finite() || seconds < 0.0 || seconds > max.as_secs_f64() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_wait",
            format!("waitSeconds must be a number from 0 to {}, got {seconds}", max.as_secs_f64()),
        ));
    }
    Ok(Duration::from_secs_f64(seconds).max(MIN_WAIT))
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
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(Arc::new(api))
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint; see docs/sidecar-api.yaml")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this endpoint")
}

fn body_error(rejection: JsonRejection) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_body", format!("invalid JSON body: {}", rejection.body_text()))
}

/// Parses an optional JSON body: an empty body means defaults.
fn parse_body(body: Result<Bytes, BytesRejection>) -> Result<AcquireRequest, ApiError> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("request body exceeds {MAX_BODY_BYTES} bytes"),
            )
        } else {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                format!("unreadable request body: {}", rejection.body_text()),
            )
        }
    })?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(AcquireRequest { wait_seconds: None });
    }
    Json::<AcquireRequest>::from_bytes(&body).map(|Json(request)| request).map_err(body_error)
}

async fn acquire(
    State(api): State<Arc<Api>>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<super::slots::Granted>, ApiError> {
    validate_lock_name(&name)?;
    let request = parse_body(body)?;
    let wait = validate_wait(request.wait_seconds, api.max_wait)?;
    let (id, mut reply) = api.slots.enqueue(&name);
    let mut leave = Leave { slots: api.slots.clone(), lock: name.clone(), id, armed: true };
    let outcome = match tokio::time::timeout(wait, &mut reply).await {
        Ok(received) => received.ok(),
        // The grant may have arrived just as the wait ran out: take it rather than drop it.
        Err(_) => reply.try_recv().ok(),
    };
    match outcome {
        // Check once more as the answer leaves: a hold lost meanwhile (the sidecar was
        // paused, say) is never reported held. Leaving the queue releases it.
        Some(Ok(granted)) => match api.slots.remaining_for(&name, id) {
            Some(remaining) => {
                leave.armed = false;
                let remaining_ms = u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX);
                Ok(Json(super::slots::Granted { remaining_ms, ..granted }))
            }
            None => Err(ApiError::new(
                StatusCode::CONFLICT,
                "lost",
                format!(
                    "lock {name} was granted with token {} but the hold was lost before it could be reported",
                    granted.fencing_token
                ),
            )),
        },
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

async fn release(State(api): State<Arc<Api>>, Path(name): Path<String>) -> Result<Response, ApiError> {
    validate_lock_name(&name)?;
    let body = match api.slots.release(&name).await {
        Some(outcome) => json!({"lock": name, "released": true, "wasHeld": outcome.was_held}),
        None => json!({"lock": name, "released": false, "wasHeld": false}),
    };
    Ok(Json(body).into_response())
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
    use super::*;

    #[test]
    fn lock_names() {
        for ok in ["a", "orders", "a-1", &"x".repeat(63)] {
            assert!(validate_lock_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "A", "a.b", "-a", "a-", "a_b", &"x".repeat(64), "a b", "ü"] {
            let e = validate_lock_name(bad).expect_err(bad);
            assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "invalid_lock_name"));
        }
    }

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

    #[test]
    fn waits() {
        let max = Duration::from_secs(3600);
        assert_eq!(validate_wait(None, max).expect("default"), Duration::from_secs(30));
        assert_eq!(validate_wait(Some(0.0), max).expect("zero"), MIN_WAIT);
        assert_eq!(validate_wait(Some(2.5), max).expect("fraction"), Duration::from_millis(2500));
        for bad in [-1.0, 3600.5, f64::NAN, f64::INFINITY, 1e300] {
            let e = validate_wait(Some(bad), max).expect_err("rejected");
            assert_eq!(e.code, "invalid_wait", "{bad}");
        }
    }
}
