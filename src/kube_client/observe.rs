//! A tower layer counting and timing the requests a Kubernetes client sends:
//! `leasehold_apiserver_requests_total{verb, code}` and
//! `leasehold_apiserver_request_seconds{verb}` (watches stay open for minutes, so they are
//! counted but not timed).

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use http::Method;

use crate::metrics::{ApiserverMetrics, VerbCodeLabel, VerbLabel};

/// The Kubernetes verb of a request, from its method, path and query.
pub fn verb(method: &Method, path: &str, query: Option<&str>) -> &'static str {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // What follows `/api/v1` or `/apis/<group>/<version>`.
    let rest: &[&str] = match segments.first() {
        Some(&"api") => segments.get(2..).unwrap_or_default(),
        Some(&"apis") => segments.get(3..).unwrap_or_default(),
        _ => &[],
    };
    let legacy_watch = rest.first() == Some(&"watch");
    let rest = if legacy_watch { &rest[1..] } else { rest };
    // `namespaces/<ns>/<resource>...`; `namespaces/<ns>` alone names a Namespace.
    let rest = if rest.first() == Some(&"namespaces") && rest.len() >= 3 { &rest[2..] } else { rest };
    let named = rest.len() >= 2;
    let watch = legacy_watch
        || query.is_some_and(|q| q.split('&').any(|pair| matches!(pair, "watch=true" | "watch=1" | "watch=True")));
    match *method {
        Method::GET if watch => "watch",
        // A named object, or a document that is not a collection (discovery, `/version`).
        Method::GET if named || rest.is_empty() => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

/// Adds [`Observe`] to a client's stack.
#[derive(Clone)]
pub struct ObserveLayer {
    metrics: Arc<ApiserverMetrics>,
}

impl ObserveLayer {
    /// Records into `metrics`.
    pub fn new(metrics: Arc<ApiserverMetrics>) -> ObserveLayer {
        ObserveLayer { metrics }
    }
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe { inner, metrics: self.metrics.clone() }
    }
}

/// Counts and times each request `inner` sends.
#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    metrics: Arc<ApiserverMetrics>,
}

impl<S, B, R> tower::Service<http::Request<B>> for Observe<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let verb = verb(request.method(), request.uri().path(), request.uri().query());
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let sent = self.inner.call(request);
        Box::pin(async move {
            let answer = sent.await;
            let code = match &answer {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "error".to_owned(),
            };
            metrics.requests.get_or_create(&VerbCodeLabel { verb, code }).inc();
            if verb != "watch" {
                metrics.request_seconds.get_or_create(&VerbLabel { verb }).observe(started.elapsed().as_secs_f64());
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_table() {
        let cases = [
            (Method::GET, "/api/v1/namespaces/shop/pods/web", None, "get"),
            (Method::GET, "/api/v1/namespaces/shop/pods", None, "list"),
            (Method::GET, "/api/v1/namespaces/shop/pods", Some("labelSelector=a%3Db&limit=500"), "list"),
            (Method::GET, "/api/v1/namespaces/shop/pods", Some("watch=true&resourceVersion=5"), "watch"),
            (Method::GET, "/api/v1/pods", Some("allowWatchBookmarks=true&watch=1"), "watch"),
            (Method::GET, "/api/v1/watch/namespaces/shop/pods", None, "watch"),
            (Method::GET, "/api/v1/namespaces/shop", None, "get"),
            (Method::GET, "/api/v1/namespaces", None, "list"),
            (Method::GET, "/api/v1/pods", None, "list"),
            (Method::GET, "/apis/coordination.k8s.io/v1/namespaces/shop/leases/orders", None, "get"),
            (Method::GET, "/apis/leasehold.dev/v1alpha1/distributedlocks", None, "list"),
            (Method::GET, "/apis/leasehold.dev/v1alpha1/namespaces/shop/distributedlocks/orders/status", None, "get"),
            (Method::GET, "/version", None, "get"),
            (Method::GET, "/apis", None, "get"),
            (Method::GET, "/apis/leasehold.dev/v1alpha1", None, "get"),
            (Method::POST, "/apis/coordination.k8s.io/v1/namespaces/shop/leases", None, "create"),
            (Method::POST, "/apis/authorization.k8s.io/v1/subjectaccessreviews", None, "create"),
            (Method::PUT, "/apis/coordination.k8s.io/v1/namespaces/shop/leases/orders", None, "update"),
            (
                Method::PATCH,
                "/apis/leasehold.dev/v1alpha1/namespaces/shop/distributedlocks/orders/status",
                None,
                "patch",
            ),
            (Method::DELETE, "/apis/leasehold.dev/v1alpha1/namespaces/shop/lockclaims/c", None, "delete"),
            (Method::DELETE, "/apis/leasehold.dev/v1alpha1/namespaces/shop/lockclaims", None, "delete"),
            (Method::HEAD, "/api/v1/pods", None, "other"),
        ];
        for (method, path, query, expected) in cases {
            assert_eq!(verb(&method, path, query), expected, "{method} {path}?{query:?}");
        }
    }

    #[tokio::test]
    async fn answers_are_counted_by_code_and_failures_as_error() {
        use tower::{Layer, ServiceExt};
        let metrics = Arc::new(ApiserverMetrics::unregistered());
        let layer = ObserveLayer::new(metrics.clone());
        let answering = layer.layer(tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::io::Error>(http::Response::builder().status(409).body(()).expect("a response"))
        }));
        let request = || http::Request::put("/apis/coordination.k8s.io/v1/namespaces/a/leases/b").body(()).expect("r");
        answering.oneshot(request()).await.expect("answered");
        let failing = layer.layer(tower::service_fn(|_: http::Request<()>| async {
            Err::<http::Response<()>, _>(std::io::Error::other("connection refused"))
        }));
        failing.oneshot(request()).await.expect_err("no answer");
        let watching = layer.layer(tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::io::Error>(http::Response::builder().status(200).body(()).expect("a response"))
        }));
        watching.oneshot(http::Request::get("/api/v1/pods?watch=true").body(()).expect("r")).await.expect("answered");

        let count = |verb, code: &str| metrics.requests.get_or_create(&VerbCodeLabel { verb, code: code.into() }).get();
        assert_eq!((count("update", "409"), count("update", "error"), count("watch", "200")), (1, 1, 1));
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("t", "t", metrics.request_seconds.clone());
        let text = crate::metrics::render(&registry);
        assert!(text.contains("t_count{verb=\"update\"} 2"), "{text}");
        assert!(!text.contains("verb=\"watch\""), "watches are not timed: {text}");
    }
}
