//! The sidecar settings a Pod asks for through its `leasehold.dev/*` annotations, read and
//! checked as a pure function of the annotations and the ports the Pod's containers
//! declare.
//!
//! A known annotation with a malformed value is refused with a message naming the
//! annotation, the value and what is accepted. An annotation this version does not know
//! is ignored with a warning (the apiserver shows it to whoever created the Pod): a Pod
//! template written for a newer version must still be admitted after a rollback. Every
//! annotation here is documented in `docs/guides/pod-settings.md`, which a test keeps in
//! step with [`KNOWN`].

use std::collections::BTreeMap;

use kube_quantity::ParsedQuantity;
use serde_json::Value;

use crate::crd::{ANNOTATION_HOLD, ANNOTATION_TOKEN};
use crate::telemetry::LogFormat;

/// Annotation: report the sidecar ready only while it holds (hold mode).
pub const ANNOTATION_READY_WHEN_HOLDING: &str = "leasehold.dev/ready-when-holding";
/// Annotation: the lock API port (default 7070; choose per pod with hostNetwork).
pub const ANNOTATION_API_PORT: &str = "leasehold.dev/api-port";
/// Annotation: the admin port (default 7071).
pub const ANNOTATION_ADMIN_PORT: &str = "leasehold.dev/admin-port";
/// Annotation: hold mode gives leadership up when an app container has not been running
/// and ready for this long (a duration such as `10s`).
pub const ANNOTATION_HOLD_APP_DOWN_AFTER: &str = "leasehold.dev/hold-app-down-after";
/// Annotation: the sidecar's log filter (a level, or directives such as
/// `info,leasehold=debug`).
pub const ANNOTATION_LOG_LEVEL: &str = "leasehold.dev/log-level";
/// Annotation: the sidecar's log format (`plain` or `json`).
pub const ANNOTATION_LOG_FORMAT: &str = "leasehold.dev/log-format";
/// Annotation: the sidecar's CPU request (a Kubernetes quantity).
pub const ANNOTATION_CPU_REQUEST: &str = "leasehold.dev/cpu-request";
/// Annotation: the sidecar's memory request (a Kubernetes quantity).
pub const ANNOTATION_MEMORY_REQUEST: &str = "leasehold.dev/memory-request";
/// Annotation: the sidecar's CPU limit (a Kubernetes quantity).
pub const ANNOTATION_CPU_LIMIT: &str = "leasehold.dev/cpu-limit";
/// Annotation: the sidecar's memory limit (a Kubernetes quantity).
pub const ANNOTATION_MEMORY_LIMIT: &str = "leasehold.dev/memory-limit";

/// The `leasehold.dev/*` annotations a Pod may carry: the sidecar settings, and the
/// fencing token a fenced Pod presents (read by the fence webhook, not by injection).
pub const KNOWN: [&str; 12] = [
    ANNOTATION_HOLD,
    ANNOTATION_READY_WHEN_HOLDING,
    ANNOTATION_API_PORT,
    ANNOTATION_ADMIN_PORT,
    ANNOTATION_HOLD_APP_DOWN_AFTER,
    ANNOTATION_LOG_LEVEL,
    ANNOTATION_LOG_FORMAT,
    ANNOTATION_CPU_REQUEST,
    ANNOTATION_MEMORY_REQUEST,
    ANNOTATION_CPU_LIMIT,
    ANNOTATION_MEMORY_LIMIT,
    ANNOTATION_TOKEN,
];

/// Default lock API port.
pub const DEFAULT_API_PORT: u16 = 7070;
/// Default admin port.
pub const DEFAULT_ADMIN_PORT: u16 = 7071;

/// Per-pod overrides of the sidecar's resources, each a checked Kubernetes quantity.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResourceOverrides {
    /// `requests.cpu`.
    pub cpu_request: Option<String>,
    /// `requests.memory`.
    pub memory_request: Option<String>,
    /// `limits.cpu`.
    pub cpu_limit: Option<String>,
    /// `limits.memory`.
    pub memory_limit: Option<String>,
}

/// The sidecar settings a Pod asks for through annotations.
#[derive(Clone, Debug, PartialEq)]
pub struct PodOptions {
    /// Hold mode: the lock to hold.
    pub hold: Option<String>,
    /// Readiness follows holding.
    pub ready_when_holding: bool,
    /// Lock API port.
    pub api_port: u16,
    /// Admin port.
    pub admin_port: u16,
    /// Hold mode: give leadership up after the app has been down this long (as given).
    pub hold_app_down_after: Option<String>,
    /// The sidecar's log filter, overriding the controller's.
    pub log_level: Option<String>,
    /// The sidecar's log format, overriding the controller's.
    pub log_format: Option<LogFormat>,
    /// The sidecar's resources, overriding the controller's.
    pub resources: ResourceOverrides,
}

/// A port a container of the Pod declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclaredPort {
    /// The container declaring it.
    pub container: String,
    /// `containerPort`.
    pub port: i32,
}

/// What the annotations ask for, and warnings to show whoever created the Pod.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The checked settings.
    pub options: PodOptions,
    /// One line per ignored annotation.
    pub warnings: Vec<String>,
}

/// The warning for an annotation this version does not know.
pub fn unknown_warning(key: &str) -> String {
    format!("annotation {key} is not known to this Leasehold version and is ignored")
}

/// Reads and checks a Pod's `leasehold.dev/*` annotations; `ports` are those its
/// containers (other than the sidecar) declare.
pub fn read(annotations: &BTreeMap<String, String>, ports: &[DeclaredPort]) -> Result<Settings, String> {
    let warnings = annotations
        .keys()
        .filter(|k| k.starts_with("leasehold.dev/") && !KNOWN.contains(&k.as_str()))
        .map(|k| unknown_warning(k))
        .collect();
    let hold = match annotations.get(ANNOTATION_HOLD) {
        None => None,
        Some(lock) => {
            crate::names::validate_lock_name(lock).map_err(|_| {
                format!("annotation {ANNOTATION_HOLD}: {lock:?} is not a lock name (a lowercase DNS label)")
            })?;
            Some(lock.clone())
        }
    };
    let ready_when_holding = match annotations.get(ANNOTATION_READY_WHEN_HOLDING).map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(format!(
                "annotation {ANNOTATION_READY_WHEN_HOLDING}: {other:?} is not a boolean (true or false)"
            ));
        }
    };
    if ready_when_holding && hold.is_none() {
        return Err(format!("annotation {ANNOTATION_READY_WHEN_HOLDING} needs {ANNOTATION_HOLD}"));
    }
    let (api_port, admin_port) = ports_of(annotations, ports)?;
    let hold_app_down_after = match annotations.get(ANNOTATION_HOLD_APP_DOWN_AFTER) {
        None => None,
        Some(_) if hold.is_none() => {
            return Err(format!("annotation {ANNOTATION_HOLD_APP_DOWN_AFTER} needs {ANNOTATION_HOLD}"));
        }
        Some(value) => match crate::duration::parse_duration(value) {
            Ok(d) if !d.is_zero() => Some(value.clone()),
            _ => {
                return Err(format!(
                    "annotation {ANNOTATION_HOLD_APP_DOWN_AFTER}: {value:?} is not a positive duration such as 10s"
                ));
            }
        },
    };
    let log_level = annotations
        .get(ANNOTATION_LOG_LEVEL)
        .map(|value| {
            crate::telemetry::check_filter(value)
                .map(|()| value.clone())
                .map_err(|e| format!("annotation {ANNOTATION_LOG_LEVEL}: {e}"))
        })
        .transpose()?;
    let log_format = annotations
        .get(ANNOTATION_LOG_FORMAT)
        .map(|value| {
            <LogFormat as clap::ValueEnum>::from_str(value, false).map_err(|_| {
                format!("annotation {ANNOTATION_LOG_FORMAT}: {value:?} is not a log format (plain or json)")
            })
        })
        .transpose()?;
    let quantity = |key: &str| -> Result<Option<String>, String> {
        annotations
            .get(key)
            .map(|value| check_quantity(value).map(|()| value.clone()).map_err(|e| format!("annotation {key}: {e}")))
            .transpose()
    };
    let resources = ResourceOverrides {
        cpu_request: quantity(ANNOTATION_CPU_REQUEST)?,
        memory_request: quantity(ANNOTATION_MEMORY_REQUEST)?,
        cpu_limit: quantity(ANNOTATION_CPU_LIMIT)?,
        memory_limit: quantity(ANNOTATION_MEMORY_LIMIT)?,
    };
    let options = PodOptions {
        hold,
        ready_when_holding,
        api_port,
        admin_port,
        hold_app_down_after,
        log_level,
        log_format,
        resources,
    };
    Ok(Settings { options, warnings })
}

fn port(annotations: &BTreeMap<String, String>, key: &str, default: u16) -> Result<u16, String> {
    match annotations.get(key) {
        None => Ok(default),
        Some(v) => v
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("annotation {key}: {v:?} is not a port number (1-65535)")),
    }
}

/// The sidecar's two ports: in range, distinct, and free of the ports the Pod's own
/// containers declare (they share one network namespace, so either would fail to bind).
fn ports_of(annotations: &BTreeMap<String, String>, declared: &[DeclaredPort]) -> Result<(u16, u16), String> {
    let api = port(annotations, ANNOTATION_API_PORT, DEFAULT_API_PORT)?;
    let admin = port(annotations, ANNOTATION_ADMIN_PORT, DEFAULT_ADMIN_PORT)?;
    if api == admin {
        return Err(format!("annotations {ANNOTATION_API_PORT} and {ANNOTATION_ADMIN_PORT} must differ (both {api})"));
    }
    for (key, port, default) in
        [(ANNOTATION_API_PORT, api, DEFAULT_API_PORT), (ANNOTATION_ADMIN_PORT, admin, DEFAULT_ADMIN_PORT)]
    {
        if let Some(taken) = declared.iter().find(|d| d.port == i32::from(port)) {
            let container = &taken.container;
            return Err(if annotations.contains_key(key) {
                format!(
                    "annotation {key}: port {port} is declared by container {container}; choose a port the pod does not use"
                )
            } else {
                format!(
                    "container {container} declares port {port}, the sidecar's default for {key} ({default}); set {key} to a port the pod does not use"
                )
            });
        }
    }
    Ok((api, admin))
}

/// Checks `value` is a non-negative Kubernetes quantity such as `10m`, `64Mi` or `0.5`.
pub fn check_quantity(value: &str) -> Result<(), String> {
    // The parser is more lenient than Kubernetes in three ways, closed here: it reads a
    // bare suffix ("Mi") as zero, accepts a sign (resources cannot be negative), and takes
    // an exponent followed by a suffix ("1e3Mi"), which the apiserver refuses.
    let suffix = value.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    let has_digits = suffix.len() < value.len();
    // An exponent ("e3", "E-2", not the exa suffixes "E" and "Ei") must end the value.
    let exponent_then_suffix = match suffix.strip_prefix(['e', 'E']) {
        Some(rest) if rest.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-') => {
            !rest.trim_start_matches(['+', '-']).trim_start_matches(|c: char| c.is_ascii_digit()).is_empty()
        }
        _ => false,
    };
    match parse_quantity(value) {
        Some(_) if has_digits && !exponent_then_suffix => Ok(()),
        _ => Err(format!("{value:?} is not a Kubernetes quantity such as 100m, 0.5, 64Mi or 1Gi")),
    }
}

fn parse_quantity(value: &str) -> Option<ParsedQuantity> {
    ParsedQuantity::try_from(value).ok()
}

/// The sidecar's resources: `defaults` (a Kubernetes `resources` object) with the Pod's
/// overrides, every request at most its limit (Kubernetes refuses the Pod otherwise, with
/// a message that does not say where the values came from).
pub fn resources(defaults: &Value, overrides: &ResourceOverrides) -> Result<Value, String> {
    let mut merged = defaults.clone();
    for (section, resource, _, value) in overrides.entries() {
        if let Some(value) = value {
            merged[section][resource] = Value::String(value.clone());
        }
    }
    let source = |section: &str, resource: &str| {
        overrides
            .entries()
            .into_iter()
            .find(|(s, r, _, v)| *s == section && *r == resource && v.is_some())
            .map_or_else(|| "the default sidecar resources".to_owned(), |(_, _, key, _)| format!("annotation {key}"))
    };
    let empty = serde_json::Map::new();
    let requests = merged.get("requests").and_then(Value::as_object).unwrap_or(&empty);
    let limits = merged.get("limits").and_then(Value::as_object).unwrap_or(&empty);
    for (resource, request) in requests {
        let Some(limit) = limits.get(resource) else { continue };
        let (Some(request), Some(limit)) = (request.as_str(), limit.as_str()) else { continue };
        let (Some(parsed_request), Some(parsed_limit)) = (parse_quantity(request), parse_quantity(limit)) else {
            continue;
        };
        if parsed_request > parsed_limit {
            return Err(format!(
                "the sidecar's {resource} request {request} (from {}) is above its {resource} limit {limit} (from {}); a request may not exceed its limit",
                source("requests", resource),
                source("limits", resource),
            ));
        }
    }
    Ok(merged)
}

/// Checks the controller's sidecar `resources`: a Kubernetes `resources` object whose
/// quantities parse and whose requests are at most their limits.
pub fn check_default_resources(defaults: &Value) -> Result<(), String> {
    serde_json::from_value::<k8s_openapi::api::core::v1::ResourceRequirements>(defaults.clone())
        .map_err(|e| format!("not a resources object: {e}"))?;
    for section in ["requests", "limits"] {
        for (resource, value) in defaults.get(section).and_then(Value::as_object).into_iter().flatten() {
            let value = value.as_str().unwrap_or_default();
            check_quantity(value).map_err(|e| format!("{section}.{resource}: {e}"))?;
        }
    }
    resources(defaults, &ResourceOverrides::default()).map(drop)
}

impl ResourceOverrides {
    /// (section, resource, annotation, value) of each override.
    fn entries(&self) -> [(&'static str, &'static str, &'static str, &Option<String>); 4] {
        [
            ("requests", "cpu", ANNOTATION_CPU_REQUEST, &self.cpu_request),
            ("requests", "memory", ANNOTATION_MEMORY_REQUEST, &self.memory_request),
            ("limits", "cpu", ANNOTATION_CPU_LIMIT, &self.cpu_limit),
            ("limits", "memory", ANNOTATION_MEMORY_LIMIT, &self.memory_limit),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Annotations as written in a table row.
    type Pairs<'a> = &'a [(&'a str, &'a str)];

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn declared(container: &str, port: i32) -> DeclaredPort {
        DeclaredPort { container: container.into(), port }
    }

    #[test]
    fn unknown_annotations_are_ignored_with_a_warning_naming_each() {
        let cases: [(Pairs, &[&str]); 4] = [
            (&[], &[]),
            (&[("example.com/x", "whatever")], &[]),
            (&[("leasehold.dev/hodl", "l")], &["leasehold.dev/hodl"]),
            (
                &[(ANNOTATION_HOLD, "leader"), ("leasehold.dev/future-setting", "1"), ("leasehold.dev/hodl", "l")],
                &["leasehold.dev/future-setting", "leasehold.dev/hodl"],
            ),
        ];
        for (pairs, unknown) in cases {
            let settings = read(&annotations(pairs), &[]).unwrap_or_else(|e| panic!("{pairs:?}: denied: {e}"));
            assert_eq!(settings.warnings.len(), unknown.len(), "{pairs:?}: {:?}", settings.warnings);
            for (warning, key) in settings.warnings.iter().zip(unknown) {
                assert!(warning.contains(key) && warning.contains("ignored"), "{warning:?} for {key}");
            }
        }
        // The known settings still apply next to an unknown annotation.
        let settings =
            read(&annotations(&[(ANNOTATION_HOLD, "leader"), ("leasehold.dev/hodl", "l")]), &[]).expect("ok");
        assert_eq!(settings.options.hold.as_deref(), Some("leader"));
        // The fencing token of a fenced Pod is known, though injection does not read it.
        assert!(read(&annotations(&[(ANNOTATION_TOKEN, "7")]), &[]).expect("ok").warnings.is_empty());
    }

    #[test]
    fn malformed_known_annotations_are_denied_naming_annotation_value_and_what_is_accepted() {
        let cases: [(Pairs, &str, &str); 17] = [
            (&[(ANNOTATION_HOLD, "Not_A_Lock")], "\"Not_A_Lock\"", "DNS label"),
            (&[(ANNOTATION_HOLD, "l"), (ANNOTATION_READY_WHEN_HOLDING, "yes")], "\"yes\"", "true or false"),
            (&[(ANNOTATION_API_PORT, "0")], "\"0\"", "1-65535"),
            (&[(ANNOTATION_ADMIN_PORT, "70000")], "\"70000\"", "1-65535"),
            (&[(ANNOTATION_API_PORT, "http")], "\"http\"", "1-65535"),
            (&[(ANNOTATION_HOLD, "l"), (ANNOTATION_HOLD_APP_DOWN_AFTER, "soon")], "\"soon\"", "positive duration"),
            (&[(ANNOTATION_HOLD, "l"), (ANNOTATION_HOLD_APP_DOWN_AFTER, "0s")], "\"0s\"", "positive duration"),
            (&[(ANNOTATION_LOG_LEVEL, "verbose")], "\"verbose\"", "info,leasehold=debug"),
            (&[(ANNOTATION_LOG_LEVEL, "info,leasehold=loud")], "leasehold=loud", "info,leasehold=debug"),
            (&[(ANNOTATION_LOG_LEVEL, "")], "\"\"", "error, warn, info, debug, trace"),
            (&[(ANNOTATION_LOG_FORMAT, "yaml")], "\"yaml\"", "plain or json"),
            (&[(ANNOTATION_CPU_REQUEST, "lots")], "\"lots\"", "64Mi"),
            (&[(ANNOTATION_MEMORY_REQUEST, "64 MiB")], "\"64 MiB\"", "64Mi"),
            (&[(ANNOTATION_CPU_LIMIT, "-1")], "\"-1\"", "64Mi"),
            (&[(ANNOTATION_MEMORY_LIMIT, "Mi")], "\"Mi\"", "64Mi"),
            (&[(ANNOTATION_MEMORY_LIMIT, "")], "\"\"", "64Mi"),
            (&[(ANNOTATION_CPU_REQUEST, "1x")], "\"1x\"", "64Mi"),
        ];
        for (pairs, value, accepted) in cases {
            let key = pairs.last().expect("a pair").0;
            let error = read(&annotations(pairs), &[]).expect_err(&format!("{pairs:?} is denied"));
            for part in [key, value, accepted] {
                assert!(error.contains(part), "{pairs:?}: {error:?} does not say {part:?}");
            }
        }
    }

    #[test]
    fn annotations_that_need_hold_mode_are_denied_without_it() {
        for key in [ANNOTATION_READY_WHEN_HOLDING, ANNOTATION_HOLD_APP_DOWN_AFTER] {
            let value = if key == ANNOTATION_READY_WHEN_HOLDING { "true" } else { "10s" };
            let error = read(&annotations(&[(key, value)]), &[]).expect_err("denied");
            assert!(error.contains(key) && error.contains(ANNOTATION_HOLD), "{error:?}");
        }
    }

    #[test]
    fn ports_are_in_range_distinct_and_free_of_the_pods_own() {
        type Case<'a> = (&'a [(&'a str, &'a str)], Vec<DeclaredPort>, Result<(u16, u16), &'a [&'a str]>);
        let cases: Vec<Case> = vec![
            (&[], vec![], Ok((7070, 7071))),
            (&[(ANNOTATION_API_PORT, "17070"), (ANNOTATION_ADMIN_PORT, "17071")], vec![], Ok((17070, 17071))),
            (&[(ANNOTATION_API_PORT, "1"), (ANNOTATION_ADMIN_PORT, "65535")], vec![], Ok((1, 65535))),
            (&[], vec![declared("app", 8080)], Ok((7070, 7071))),
            (&[(ANNOTATION_API_PORT, "0")], vec![], Err(&[ANNOTATION_API_PORT, "1-65535"])),
            (&[(ANNOTATION_ADMIN_PORT, "65536")], vec![], Err(&[ANNOTATION_ADMIN_PORT, "1-65535"])),
            (&[(ANNOTATION_ADMIN_PORT, "-1")], vec![], Err(&[ANNOTATION_ADMIN_PORT, "1-65535"])),
            (
                &[(ANNOTATION_API_PORT, "9000"), (ANNOTATION_ADMIN_PORT, "9000")],
                vec![],
                Err(&[ANNOTATION_API_PORT, ANNOTATION_ADMIN_PORT, "must differ", "9000"]),
            ),
            // The default admin port, given explicitly as the API port.
            (
                &[(ANNOTATION_API_PORT, "7071")],
                vec![],
                Err(&[ANNOTATION_API_PORT, ANNOTATION_ADMIN_PORT, "must differ"]),
            ),
            (
                &[(ANNOTATION_API_PORT, "8080")],
                vec![declared("web", 8080)],
                Err(&[ANNOTATION_API_PORT, "8080", "container web"]),
            ),
            (
                &[(ANNOTATION_ADMIN_PORT, "9090")],
                vec![declared("web", 80), declared("metrics", 9090)],
                Err(&[ANNOTATION_ADMIN_PORT, "9090", "container metrics"]),
            ),
            (&[], vec![declared("app", 7070)], Err(&[ANNOTATION_API_PORT, "7070", "container app", "default"])),
            (&[], vec![declared("app", 7071)], Err(&[ANNOTATION_ADMIN_PORT, "7071", "container app", "default"])),
            // Moving off the default clears the collision.
            (&[(ANNOTATION_API_PORT, "7072")], vec![declared("app", 7070)], Ok((7072, 7071))),
        ];
        for (pairs, ports, expected) in cases {
            let result = read(&annotations(pairs), &ports).map(|s| (s.options.api_port, s.options.admin_port));
            match (result, expected) {
                (Ok(actual), Ok(expected)) => assert_eq!(actual, expected, "{pairs:?} {ports:?}"),
                (Err(error), Err(parts)) => {
                    for part in parts {
                        assert!(error.contains(part), "{pairs:?} {ports:?}: {error:?} does not say {part:?}");
                    }
                }
                (result, expected) => panic!("{pairs:?} {ports:?}: got {result:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn log_and_resource_settings_are_read() {
        let settings = read(
            &annotations(&[
                (ANNOTATION_LOG_LEVEL, "info,leasehold::sidecar=trace"),
                (ANNOTATION_LOG_FORMAT, "json"),
                (ANNOTATION_CPU_REQUEST, "25m"),
                (ANNOTATION_MEMORY_REQUEST, "24Mi"),
                (ANNOTATION_CPU_LIMIT, "0.5"),
                (ANNOTATION_MEMORY_LIMIT, "1Gi"),
            ]),
            &[],
        )
        .expect("ok");
        assert!(settings.warnings.is_empty());
        assert_eq!(settings.options.log_level.as_deref(), Some("info,leasehold::sidecar=trace"));
        assert_eq!(settings.options.log_format, Some(LogFormat::Json));
        assert_eq!(
            settings.options.resources,
            ResourceOverrides {
                cpu_request: Some("25m".into()),
                memory_request: Some("24Mi".into()),
                cpu_limit: Some("0.5".into()),
                memory_limit: Some("1Gi".into()),
            }
        );
        for level in ["error", "warn", "info", "debug", "trace", "off", "warn,leasehold=debug"] {
            let settings = read(&annotations(&[(ANNOTATION_LOG_LEVEL, level)]), &[]).expect(level);
            assert_eq!(settings.options.log_level.as_deref(), Some(level));
        }
        let none = read(&annotations(&[]), &[]).expect("ok").options;
        assert_eq!((none.log_level, none.log_format, none.resources), (None, None, ResourceOverrides::default()));
    }

    #[test]
    fn quantities_follow_the_kubernetes_grammar() {
        for good in ["0", "1", "10m", "0.5", ".5", "100Mi", "1Gi", "2k", "1e3", "1E3", "1.5e-3", "1500M"] {
            assert_eq!(check_quantity(good), Ok(()), "{good}");
        }
        for bad in [
            "", "Mi", "-1", "+1", "1x", "1 Mi", "lots", "1Mi ", "NaN", "inf", "1e3Mi", "2E-1Ki", "0x10", "1_000",
            "5.5.5",
        ] {
            assert!(check_quantity(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn resource_overrides_replace_the_defaults_and_requests_stay_within_limits() {
        let defaults = serde_json::json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}});
        let over = |pairs: &[(&str, &str)]| read(&annotations(pairs), &[]).expect("valid").options.resources;
        type Case<'a> = (&'a [(&'a str, &'a str)], Result<serde_json::Value, &'a [&'a str]>);
        let cases: Vec<Case> = vec![
            (&[], Ok(defaults.clone())),
            (
                &[(ANNOTATION_CPU_REQUEST, "50m"), (ANNOTATION_MEMORY_LIMIT, "64Mi")],
                Ok(serde_json::json!({"requests": {"cpu": "50m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}})),
            ),
            (
                &[(ANNOTATION_CPU_LIMIT, "1"), (ANNOTATION_MEMORY_REQUEST, "32Mi")],
                Ok(
                    serde_json::json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "32Mi"}}),
                ),
            ),
            // Units differ, order does not: 0.5 CPU is 500m.
            (
                &[(ANNOTATION_CPU_REQUEST, "500m"), (ANNOTATION_CPU_LIMIT, "0.5")],
                Ok(
                    serde_json::json!({"requests": {"cpu": "500m", "memory": "16Mi"}, "limits": {"cpu": "0.5", "memory": "32Mi"}}),
                ),
            ),
            (
                &[(ANNOTATION_MEMORY_REQUEST, "64Mi")],
                Err(&[ANNOTATION_MEMORY_REQUEST, "64Mi", "32Mi", "default sidecar resources", "above"]),
            ),
            (
                &[(ANNOTATION_MEMORY_LIMIT, "8Mi")],
                Err(&[ANNOTATION_MEMORY_LIMIT, "8Mi", "16Mi", "default sidecar resources", "above"]),
            ),
            (
                &[(ANNOTATION_CPU_REQUEST, "2"), (ANNOTATION_CPU_LIMIT, "1500m")],
                Err(&[ANNOTATION_CPU_REQUEST, ANNOTATION_CPU_LIMIT, "cpu request 2", "1500m"]),
            ),
            (&[(ANNOTATION_CPU_LIMIT, "5m")], Err(&[ANNOTATION_CPU_LIMIT, "5m", "10m"])),
        ];
        for (pairs, expected) in cases {
            match (resources(&defaults, &over(pairs)), expected) {
                (Ok(actual), Ok(expected)) => assert_eq!(actual, expected, "{pairs:?}"),
                (Err(error), Err(parts)) => {
                    for part in parts {
                        assert!(error.contains(part), "{pairs:?}: {error:?} does not say {part:?}");
                    }
                }
                (actual, expected) => panic!("{pairs:?}: got {actual:?}, expected {expected:?}"),
            }
        }
        // Without defaults, the overrides alone.
        assert_eq!(
            resources(&serde_json::Value::Null, &over(&[(ANNOTATION_MEMORY_LIMIT, "1Gi")])),
            Ok(serde_json::json!({"limits": {"memory": "1Gi"}}))
        );
    }

    #[test]
    fn default_resources_are_checked() {
        let good = serde_json::json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}});
        assert_eq!(check_default_resources(&good), Ok(()));
        assert_eq!(check_default_resources(&serde_json::json!({})), Ok(()));
        let cases = [
            (serde_json::json!({"requests": {"cpu": "ten"}}), "requests.cpu"),
            (serde_json::json!({"limits": {"memory": "32 MB"}}), "limits.memory"),
            (serde_json::json!({"requests": {"memory": "64Mi"}, "limits": {"memory": "32Mi"}}), "memory request 64Mi"),
            (serde_json::json!({"requests": ["cpu"]}), "not a resources object"),
        ];
        for (resources, says) in cases {
            let error = check_default_resources(&resources).expect_err("refused");
            assert!(error.contains(says), "{resources}: {error:?} does not say {says:?}");
        }
    }

    /// The table in docs/guides/pod-settings.md lists every annotation a Pod may carry and
    /// every label injection reads, so the documentation cannot drift from the code.
    #[test]
    fn every_pod_annotation_and_label_is_in_the_documented_table() {
        let doc = include_str!("../../docs/guides/pod-settings.md");
        let rows: Vec<&str> = doc.lines().filter(|l| l.starts_with("| `leasehold.dev/")).collect();
        for key in KNOWN.iter().chain([&crate::crd::LABEL_INJECT, &crate::crd::LABEL_FENCED_BY]) {
            assert!(
                rows.iter().any(|row| row.starts_with(&format!("| `{key}` |"))),
                "{key} has no row in docs/guides/pod-settings.md"
            );
        }
        // And the table documents nothing that does not exist.
        for row in rows {
            let key = row.split('`').nth(1).expect("a name in backquotes");
            assert!(
                KNOWN.contains(&key) || [crate::crd::LABEL_INJECT, crate::crd::LABEL_FENCED_BY].contains(&key),
                "docs/guides/pod-settings.md documents {key}, which is not a Pod annotation or label"
            );
        }
    }
}
