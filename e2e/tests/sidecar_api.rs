//! The committed OpenAPI document (`docs/sidecar-api.yaml`) against the running sidecar:
//! every documented operation is served, every answer's status is documented for its
//! operation, and every body has the documented shape.

use std::collections::BTreeSet;
use std::time::Duration;

use leasehold::crd::DistributedLockSpec;
use serde_json::{Value, json};

use crate::support::{Env, http_send};

const SPEC: &str = include_str!("../../docs/sidecar-api.yaml");

fn spec() -> Value {
    serde_saphyr::from_str(SPEC).expect("docs/sidecar-api.yaml parses")
}

/// Follows a `$ref` inside the document.
fn resolve<'a>(spec: &'a Value, value: &'a Value) -> &'a Value {
    match value.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let pointer = reference.trim_start_matches('#');
            resolve(spec, spec.pointer(pointer).unwrap_or_else(|| panic!("dangling $ref {reference}")))
        }
        None => value,
    }
}

/// Checks `value` against the subset of JSON Schema the document uses: type, required,
/// properties, enum, additionalProperties (absent means allowed).
fn check(spec: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let schema = resolve(spec, schema);
    let ty = schema.get("type").and_then(Value::as_str);
    let ok = match ty {
        Some("object") => value.is_object(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("array") => value.is_array(),
        _ => true,
    };
    if !ok {
        return Err(format!("{at}: expected {ty:?}, got {value}"));
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        return Err(format!("{at}: {value} is not one of {allowed:?}"));
    }
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for field in required.iter().filter_map(Value::as_str) {
            if value.get(field).is_none() {
                return Err(format!("{at}: missing required {field} in {value}"));
            }
        }
    }
    if let (Some(properties), Some(object)) = (schema.get("properties").and_then(Value::as_object), value.as_object()) {
        for (key, field) in object {
            match properties.get(key) {
                Some(sub) => check(spec, sub, field, &format!("{at}.{key}"))?,
                None => return Err(format!("{at}: undocumented field {key}")),
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn the_sidecar_serves_exactly_its_openapi_document() {
    let spec = spec();
    let env = Env::new("sc-openapi").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    env.lock("orders", DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let sidecar = env.sidecar(&a, &[]).await;

    // A hold with a handle (a heartbeat), and a session-bound one on another lock: the
    // probes below use their handles.
    env.lock("billing", DistributedLockSpec::default()).await;
    let (status, held) = sidecar.acquire_with("orders", json!({"waitSeconds": 10, "ttlSeconds": 15})).await;
    assert_eq!(status, 200, "{held}");
    check(&spec, &spec["components"]["schemas"]["Acquired"], &held, "acquire with ttlSeconds")
        .unwrap_or_else(|e| panic!("{e}"));
    let handle = held["handle"].as_str().expect("a handle").to_owned();
    let (status, mut session) = sidecar.session("billing", json!({"waitSeconds": 10})).await;
    assert_eq!(status, 200);
    let documented = &spec["paths"]["/v1/locks/{name}/acquire"]["post"]["responses"]["200"]["content"];
    assert!(documented.get(&session.content_type).is_some(), "undocumented {}", session.content_type);
    let first = session.next(Duration::from_secs(10)).await.expect("the grant line");
    check(&spec, &spec["components"]["schemas"]["Acquired"], &first, "session's first line")
        .unwrap_or_else(|e| panic!("{e}"));
    let line = session.expect("held", Duration::from_secs(5)).await;
    check(&spec, &documented["application/x-ndjson"]["schema"], &line, "a session line")
        .unwrap_or_else(|e| panic!("{e}"));
    let session_handle = first["handle"].as_str().expect("a handle").to_owned();
    let hold = format!("/v1/locks/orders/holds/{handle}");
    let keepalive = format!("{hold}/keepalive");
    let release_own = format!("{hold}/release");
    let billing_by_orders = format!("/v1/locks/orders/holds/{session_handle}/release");
    let release_session = format!("/v1/locks/billing/holds/{session_handle}/release");

    // (operation path, method, concrete path, body, expected status)
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(20_000));
    let probes: Vec<(&str, &str, &str, Option<&str>, u16)> = vec![
        ("/v1/locks/{name}", "get", "/v1/locks/orders", None, 200),
        ("/v1/locks/{name}/holds/{handle}", "get", &hold, None, 200),
        ("/v1/locks/{name}/holds/{handle}/keepalive", "post", &keepalive, None, 200),
        ("/v1/locks/{name}/holds/{handle}", "get", "/v1/locks/orders/holds/nope", None, 400),
        ("/v1/locks/{name}/holds/{handle}/keepalive", "post", &keepalive, Some("{\"ttlSeconds\": 5}"), 400),
        ("/v1/locks/{name}/holds/{handle}/release", "post", &billing_by_orders, None, 409),
        (
            "/v1/locks/{name}/holds/{handle}",
            "get",
            "/v1/locks/orders/holds/h0123456789abcdef0123456789abcdef",
            None,
            409,
        ),
        (
            "/v1/locks/{name}/holds/{handle}/keepalive",
            "post",
            "/v1/locks/billing/holds/h0123456789abcdef0123456789abcdef/keepalive",
            None,
            409,
        ),
        ("/v1/locks/{name}/release", "post", "/v1/locks/orders/release", None, 409),
        ("/v1/locks/{name}/holds/{handle}/release", "post", &release_own, None, 200),
        ("/v1/locks/{name}/holds/{handle}/release", "post", &release_own, None, 200),
        ("/v1/locks/{name}/holds/{handle}/keepalive", "delete", &keepalive, None, 405),
        ("/v1/locks/{name}/holds/{handle}/release", "get", &release_own, None, 405),
        ("/v1/locks/{name}/holds/{handle}", "post", &hold, None, 405),
        ("/v1/locks/{name}/holds/{handle}/release", "post", &release_session, None, 200),
        ("/v1/locks/{name}/acquire", "post", "/v1/locks/orders/acquire", Some("{\"waitSeconds\": 10}"), 200),
        ("/v1/locks/{name}/release", "post", "/v1/locks/orders/release", None, 200),
        ("/v1/locks/{name}/release", "post", "/v1/locks/orders/release", None, 200),
        ("/v1/locks/{name}/acquire", "post", "/v1/locks/orders/acquire", Some("{\"ttlSeconds\": 99}"), 400),
        ("/v1/locks/{name}/acquire", "post", "/v1/locks/orders/acquire", Some("{\"waitSeconds\": -3}"), 400),
        ("/v1/locks/{name}/acquire", "post", "/v1/locks/orders/acquire", Some("[10]"), 400),
        ("/v1/locks/{name}/acquire", "post", "/v1/locks/orders/acquire?waitSeconds=10", None, 400),
        ("/v1/locks/{name}/release", "post", "/v1/locks/orders/release", Some("{\"force\": true}"), 400),
        ("/v1/locks/{name}/acquire", "post", "/v1/locks/missing/acquire", Some("{\"waitSeconds\": 3}"), 404),
        ("/v1/locks/{name}/acquire", "post", "/v1/locks/orders/acquire", Some(&big), 413),
        ("/v1/locks/{name}/acquire", "put", "/v1/locks/orders/acquire", None, 405),
        ("/v1/locks/{name}/release", "post", "/v1/locks/NOPE/release", None, 400),
        ("/v1/locks/{name}/release", "get", "/v1/locks/orders/release", None, 405),
        ("/v1/locks/{name}", "get", "/v1/locks/-bad", None, 400),
        ("/v1/locks/{name}", "post", "/v1/locks/orders", None, 405),
        ("/v1/locks/{name}/events", "get", "/v1/locks/orders/events", None, 200),
        ("/v1/locks/{name}/events", "get", "/v1/locks/Bad/events", None, 400),
        ("/v1/locks/{name}/events", "post", "/v1/locks/orders/events", None, 405),
    ];
    let mut exercised = BTreeSet::new();
    for (template, method, path, body, expected) in probes {
        let response = http_send(sidecar.api, &method.to_uppercase(), path, body).await.expect("answer");
        let status = response.status().as_u16();
        assert_eq!(status, expected, "{method} {path}");
        let operation = spec["paths"][template].get(method);
        let responses = match operation {
            Some(op) => &op["responses"],
            // A method the path does not document: it must answer the documented 405 of
            // one of the path's operations.
            None => {
                assert_eq!(status, 405, "{method} {path} is undocumented but answered {status}");
                let any = spec["paths"][template].as_object().expect("a path item").values().next().expect("an op");
                &any["responses"]
            }
        };
        let documented = resolve(&spec, &responses[status.to_string()]);
        assert!(!documented.is_null(), "{method} {path}: status {status} is not documented");
        let content_type =
            response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        if content_type.starts_with("text/event-stream") {
            assert!(documented["content"].get("text/event-stream").is_some(), "{method} {path}: undocumented SSE");
            exercised.insert((template, method));
            continue;
        }
        use http_body_util::BodyExt;
        let bytes = tokio::time::timeout(Duration::from_secs(30), response.into_body().collect())
            .await
            .expect("body in time")
            .expect("body")
            .to_bytes();
        let json: Value =
            serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("{method} {path}: body is not JSON"));
        let schema = &documented["content"]["application/json"]["schema"];
        check(&spec, schema, &json, &format!("{method} {path}")).unwrap_or_else(|e| panic!("{e}"));
        if operation.is_some() {
            exercised.insert((template, method));
        }
    }
    // Every documented operation was exercised.
    for (template, item) in spec["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("operations").keys() {
            assert!(exercised.contains(&(template.as_str(), method.as_str())), "{method} {template} never exercised");
        }
    }
    // And nothing else is served.
    let (status, body) = sidecar.call("GET", "/v1/locks", None).await;
    assert_eq!(status, 404, "{body}");
}
