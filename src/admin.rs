//! The admin HTTP server: `/livez` (and `/healthz`), `/readyz`, `/metrics`.
//!
//! Readiness is a real check passed in by each component (the controller: its watches
//! have synced; the sidecar: its API listener is bound and, in hold mode, optionally that
//! it holds), never a constant 200.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// A health check: `Ok` or the reason it fails.
pub type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What the admin server reports.
#[derive(Clone)]
pub struct Admin {
    /// Metrics to expose.
    pub registry: Arc<Registry>,
    /// Liveness.
    pub live: Check,
    /// Readiness.
    pub ready: Check,
}

fn answer(check: &Check) -> Response {
    match check() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// The admin routes.
pub fn router(admin: Admin) -> Router {
    Router::new()
        .route("/livez", get(|State(a): State<Admin>| async move { answer(&a.live) }))
        .route("/healthz", get(|State(a): State<Admin>| async move { answer(&a.live) }))
        .route("/readyz", get(|State(a): State<Admin>| async move { answer(&a.ready) }))
        .route(
            "/metrics",
            get(|State(a): State<Admin>| async move {
                let body = crate::metrics::render(&a.registry);
                ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
            }),
        )
        .with_state(admin)
}

/// Serves `router` on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router).with_graceful_shutdown(shutdown.cancelled_owned()).await
}

/// A check that always passes (liveness of a process whose tasks are supervised: if a
/// task dies, the process exits).
pub fn always_ok() -> Check {
    Arc::new(|| Ok(()))
}
