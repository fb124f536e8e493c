//! Reading and checking what callers send the local API: bodies, lock names, waits, TTLs,
//! containers, owner handles. Each check names the problem; nothing half-read is acted on.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::Deserialize;

use super::api::ApiError;
use super::owner::{Binding, Handle, Terms};
use crate::claim::MIN_WAIT;
use crate::crd::ClaimMode;
use crate::names::{InvalidLockName, is_dns_label};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// The wait used when a request names none.
pub const DEFAULT_WAIT_SECONDS: f64 = 30.0;
/// The shortest caller TTL accepted.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// Body of an acquire request.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AcquireRequest {
    /// How long to wait for the grant, in seconds.
    #[serde(default)]
    pub wait_seconds: Option<f64>,
    /// Bind the hold to this request's connection: the answer streams, and the hold ends
    /// when the connection closes.
    #[serde(default)]
    pub session: Option<bool>,
    /// The caller's own TTL, in seconds: it must send keep-alives within it.
    #[serde(default)]
    pub ttl_seconds: Option<f64>,
    /// The app container the caller runs in: the hold ends when that container restarts.
    #[serde(default)]
    pub container: Option<String>,
    /// `read` (the default: one permit, shared with other readers) or `write` (every
    /// permit, alone).
    #[serde(default)]
    pub mode: Option<String>,
}

fn bad(code: &'static str, message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code, message)
}

impl From<InvalidLockName> for ApiError {
    fn from(e: InvalidLockName) -> ApiError {
        bad("invalid_lock_name", e.to_string())
    }
}

/// Checks a wait: a finite number of seconds in `0..=max`.
pub fn validate_wait(wait: Option<f64>, max: Duration) -> Result<Duration, ApiError> {
    let seconds = wait.unwrap_or(DEFAULT_WAIT_SECONDS);
    if !seconds.is_finite() || seconds < 0.0 || seconds > max.as_secs_f64() {
        return Err(bad(
            "invalid_wait",
            format!("waitSeconds must be a number from 0 to {}, got {seconds}", max.as_secs_f64()),
        ));
    }
    Ok(Duration::from_secs_f64(seconds).max(MIN_WAIT))
}

/// Checks a caller TTL against the lock's lease duration: from 0.1 s up to it.
pub fn validate_ttl(lock: &str, ttl: f64, lease_duration: Duration) -> Result<Duration, ApiError> {
    if !ttl.is_finite() || ttl < MIN_TTL.as_secs_f64() || ttl > lease_duration.as_secs_f64() {
        return Err(bad(
            "invalid_ttl",
            format!(
                "ttlSeconds must be a number from {} to the lease duration of lock {lock} ({} s), got {ttl}",
                MIN_TTL.as_secs_f64(),
                lease_duration.as_secs_f64()
            ),
        ));
    }
    Ok(Duration::from_secs_f64(ttl))
}

/// Checks a container name against the Pod's app containers, when the Pod is known.
pub fn validate_container(name: &str, app_containers: Option<&[&str]>) -> Result<(), ApiError> {
    if !is_dns_label(name) {
        let shown: String = name.chars().take(80).collect();
        return Err(bad("invalid_container", format!("container {shown:?} is not a container name (a DNS label)")));
    }
    match app_containers {
        Some(names) if !names.contains(&name) => Err(bad(
            "invalid_container",
            format!("this Pod has no app container {name:?} (its app containers: {})", names.join(", ")),
        )),
        _ => Ok(()),
    }
}

/// Checks a mode: `read` (the default) or `write`.
pub fn validate_mode(mode: Option<&str>) -> Result<ClaimMode, ApiError> {
    match mode {
        None | Some("read") => Ok(ClaimMode::Read),
        Some("write") => Ok(ClaimMode::Write),
        Some(other) => {
            let shown: String = other.chars().take(80).collect();
            Err(bad("invalid_mode", format!("mode must be \"read\" or \"write\", got {shown:?}")))
        }
    }
}

/// Reads an owner handle from a path.
pub fn parse_handle(text: &str) -> Result<Handle, ApiError> {
    Handle::parse(text).map_err(|message| bad("invalid_handle", message))
}

/// What the caller asked for: the mode (checked), and what ends the hold besides a release
/// (the TTL checked later, against the lock).
pub fn terms(request: &AcquireRequest, ttl: Option<Duration>, mode: ClaimMode) -> Terms {
    let session = request.session.unwrap_or(false);
    let binding = match (&request.container, session || ttl.is_some()) {
        (Some(name), _) => Binding::Container(name.clone()),
        // A session or a heartbeat ends with the caller's process anyway.
        (None, true) => Binding::None,
        (None, false) => Binding::OnlyAppContainer,
    };
    Terms { session, ttl, binding, mode }
}

/// What a JSON text starting with `first` is, for error messages.
fn json_kind(first: u8) -> &'static str {
    match first {
        b'[' => "an array",
        b'"' => "a string",
        b'-' | b'0'..=b'9' => "a number",
        b't' | b'f' => "a boolean",
        b'n' => "null",
        _ => "not JSON",
    }
}

/// The bytes of a request body, or the error naming why they could not be read.
fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("request body exceeds {MAX_BODY_BYTES} bytes"),
            )
        } else {
            bad("invalid_body", format!("unreadable request body: {}", rejection.body_text()))
        }
    })
}

/// Parses an acquire body: empty (defaults) or a JSON object. Anything else — an array,
/// which serde would otherwise read as the fields in order, a number, `null` — is refused.
pub fn parse_acquire(body: Result<Bytes, BytesRejection>) -> Result<AcquireRequest, ApiError> {
    let body = read_body(body)?;
    let Some(&first) = body.iter().find(|b| !b.is_ascii_whitespace()) else {
        return Ok(AcquireRequest::default());
    };
    if first != b'{' {
        return Err(bad(
            "invalid_body",
            format!("the acquire body must be a JSON object such as {{\"waitSeconds\": 30}}, got {}", json_kind(first)),
        ));
    }
    Json::<AcquireRequest>::from_bytes(&body)
        .map(|Json(request)| request)
        .map_err(|rejection| bad("invalid_body", format!("invalid JSON body: {}", rejection.body_text())))
}

/// Checks the body of an operation that takes none (release, keep-alive): none, or `{}`.
pub fn check_no_body(what: &str, body: Result<Bytes, BytesRejection>) -> Result<(), ApiError> {
    let body = read_body(body)?;
    let text: Vec<u8> = body.iter().copied().filter(|b| !b.is_ascii_whitespace()).collect();
    if text.is_empty() || text == b"{}" {
        return Ok(());
    }
    Err(bad("invalid_body", format!("{what} takes no body (send none, or {{}})")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(text: &str) -> Result<Bytes, BytesRejection> {
        Ok(Bytes::from(text.to_owned()))
    }

    #[test]
    fn bad_lock_names_answer_400_invalid_lock_name() {
        for bad in ["", "A", "a.b", "-a", "a-", "a_b", &"x".repeat(64), "a b", "ü"] {
            let e = ApiError::from(crate::names::validate_lock_name(bad).expect_err(bad));
            assert_eq!((e.status(), e.code()), (StatusCode::BAD_REQUEST, "invalid_lock_name"));
            assert_eq!(
                e.message(),
                format!("lock name {bad:?} is not a DNS label (at most 63 lowercase letters, digits and '-')")
            );
        }
    }

    #[test]
    fn acquire_bodies() {
        let wait = |w| AcquireRequest { wait_seconds: Some(w), ..AcquireRequest::default() };
        let cases = [
            ("", AcquireRequest::default()),
            ("  \n", AcquireRequest::default()),
            ("{}", AcquireRequest::default()),
            (" {\"waitSeconds\": 2.5} ", wait(2.5)),
            (" {\"mode\": \"write\"} ", AcquireRequest { mode: Some("write".into()), ..AcquireRequest::default() }),
            (
                "{\"session\": true, \"ttlSeconds\": 5, \"container\": \"app\"}",
                AcquireRequest {
                    session: Some(true),
                    ttl_seconds: Some(5.0),
                    container: Some("app".into()),
                    ..AcquireRequest::default()
                },
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_acquire(body(text)).expect(text), expected, "{text:?}");
        }
        for (text, named) in [
            ("[30]", "got an array"),
            ("[]", "got an array"),
            ("30", "got a number"),
            ("-1", "got a number"),
            ("\"30\"", "got a string"),
            ("null", "got null"),
            ("true", "got a boolean"),
            ("waitSeconds=30", "got not JSON"),
            ("{not json", "invalid JSON body"),
            ("{\"waitSeconds\": \"ten\"}", "invalid JSON body"),
            ("{\"session\": \"yes\"}", "invalid JSON body"),
            ("{\"ttlSeconds\": true}", "invalid JSON body"),
            ("{\"container\": 3}", "invalid JSON body"),
            ("{\"wait\": 3}", "unknown field"),
            ("{\"handle\": \"h0\"}", "unknown field"),
            ("{\"waitSeconds\": 1, \"waitSeconds\": 2}", "duplicate field"),
            ("{\"waitSeconds\": 1} {}", "trailing"),
        ] {
            let e = parse_acquire(body(text)).expect_err(text);
            assert_eq!((e.status(), e.code()), (StatusCode::BAD_REQUEST, "invalid_body"), "{text}");
            assert!(e.message().contains(named), "{text}: {}", e.message());
        }
    }

    #[test]
    fn bodyless_operations() {
        for ok in ["", " ", "{}", " { } "] {
            assert!(check_no_body("release", body(ok)).is_ok(), "{ok:?}");
        }
        for bad in ["{\"force\": true}", "[]", "null", "x", "{\"handle\": \"h1\"}"] {
            let e = check_no_body("keep-alive", body(bad)).expect_err(bad);
            assert_eq!(e.code(), "invalid_body", "{bad}");
            assert!(e.message().starts_with("keep-alive takes no body"), "{}", e.message());
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
            assert_eq!(e.code(), "invalid_wait", "{bad}");
        }
    }

    #[test]
    fn ttls_are_bounded_by_the_lease() {
        let lease = Duration::from_secs(15);
        assert_eq!(validate_ttl("orders", 5.0, lease).expect("5 s"), Duration::from_secs(5));
        assert_eq!(validate_ttl("orders", 15.0, lease).expect("the lease itself"), lease);
        assert_eq!(validate_ttl("orders", 0.1, lease).expect("the minimum"), Duration::from_millis(100));
        for bad in [0.0, 0.05, -1.0, 15.001, f64::NAN, f64::INFINITY] {
            let e = validate_ttl("orders", bad, lease).expect_err("rejected");
            assert_eq!(e.code(), "invalid_ttl", "{bad}");
            assert!(e.message().contains("lease duration of lock orders (15 s)"), "{}", e.message());
        }
    }

    #[test]
    fn containers() {
        assert!(validate_container("app", Some(&["app", "helper"])).is_ok());
        assert!(validate_container("app", None).is_ok(), "an unknown Pod cannot refute it");
        let e = validate_container("worker", Some(&["app", "helper"])).expect_err("not in the Pod");
        assert_eq!(e.code(), "invalid_container");
        assert!(e.message().contains("app, helper"), "{}", e.message());
        assert_eq!(validate_container("Bad_Name", None).expect_err("not a name").code(), "invalid_container");
    }

    #[test]
    fn terms_follow_the_request() {
        let ttl = Some(Duration::from_secs(3));
        let request = |session, container: Option<&str>| AcquireRequest {
            session,
            container: container.map(str::to_owned),
            ..AcquireRequest::default()
        };
        let read = ClaimMode::Read;
        assert_eq!(terms(&request(None, None), None, read), Terms::pod());
        assert_eq!(terms(&request(Some(false), None), None, read), Terms::pod());
        assert_eq!(
            terms(&request(Some(true), None), None, read),
            Terms { session: true, ttl: None, binding: Binding::None, mode: read }
        );
        assert_eq!(
            terms(&request(None, None), ttl, read),
            Terms { session: false, ttl, binding: Binding::None, mode: read }
        );
        assert_eq!(
            terms(&request(Some(true), Some("app")), ttl, ClaimMode::Write),
            Terms { session: true, ttl, binding: Binding::Container("app".into()), mode: ClaimMode::Write }
        );
    }

    #[test]
    fn modes() {
        assert_eq!(validate_mode(None).expect("no mode"), ClaimMode::Read);
        assert_eq!(validate_mode(Some("read")).expect("read"), ClaimMode::Read);
        assert_eq!(validate_mode(Some("write")).expect("write"), ClaimMode::Write);
        for bad in ["Write", "READ", "", "exclusive", "write "] {
            let e = validate_mode(Some(bad)).expect_err(bad);
            assert_eq!((e.status(), e.code()), (StatusCode::BAD_REQUEST, "invalid_mode"));
            assert_eq!(e.message(), format!("mode must be \"read\" or \"write\", got {bad:?}"));
        }
    }

    #[test]
    fn handles() {
        assert_eq!(parse_handle("nope").expect_err("malformed").code(), "invalid_handle");
        let handle = Handle::random();
        assert_eq!(parse_handle(handle.as_str()).expect("a handle"), handle);
    }
}
