//! Sidecar injection, as a pure function from a Pod to a JSON patch.
//!
//! Pods labelled `leasehold.dev/inject: "true"` get the sidecar as a native sidecar (an
//! init container with `restartPolicy: Always`, first, so it runs before the other init
//! containers and outlives the app containers), with the pod's identity from the downward
//! API and its own projected, Pod-bound service-account token. Injection is idempotent:
//! a Pod that already has the sidecar gets no patch. A malformed `leasehold.dev/*`
//! annotation is refused with a message naming it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::crd::{ANNOTATION_HOLD, LABEL_INJECT};

/// Name of the injected container.
pub const SIDECAR_NAME: &str = "leasehold-sidecar";
/// Where the hold-mode file is, in every container of an injected pod.
pub const RUN_DIR: &str = "/var/run/leasehold";
/// Annotation: report the sidecar ready only while it holds (hold mode).
pub const ANNOTATION_READY_WHEN_HOLDING: &str = "leasehold.dev/ready-when-holding";
/// Annotation: the lock API port (default 7070; choose per pod with hostNetwork).
pub const ANNOTATION_API_PORT: &str = "leasehold.dev/api-port";
/// Annotation: the admin port (default 7071).
pub const ANNOTATION_ADMIN_PORT: &str = "leasehold.dev/admin-port";
/// Annotation: hold mode gives leadership up when an app container has not been running
/// and ready for this long (a duration such as `10s`).
pub const ANNOTATION_HOLD_APP_DOWN_AFTER: &str = "leasehold.dev/hold-app-down-after";
/// The `leasehold.dev/*` annotations a Pod may carry.
const KNOWN: [&str; 5] = [
    ANNOTATION_HOLD,
    ANNOTATION_READY_WHEN_HOLDING,
    ANNOTATION_API_PORT,
    ANNOTATION_ADMIN_PORT,
    ANNOTATION_HOLD_APP_DOWN_AFTER,
];

/// What the injected sidecar looks like (from the controller's configuration).
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    /// Container image.
    pub image: String,
    /// Resource requests and limits, as a Kubernetes `resources` object.
    pub resources: Value,
    /// Lifetime of the projected token, seconds.
    pub token_expiration_seconds: i64,
}

impl Default for Template {
    fn default() -> Template {
        Template {
            image: "ghcr.io/leasehold/leasehold:0.1.0".into(),
            resources: json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}}),
            token_expiration_seconds: 3600,
        }
    }
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

/// Reads and checks a Pod's `leasehold.dev/*` annotations.
pub fn pod_options(annotations: &BTreeMap<String, String>) -> Result<PodOptions, String> {
    for key in annotations.keys().filter(|k| k.starts_with("leasehold.dev/")) {
        if !KNOWN.contains(&key.as_str()) {
            return Err(format!("unknown annotation {key}; known: {}", KNOWN.join(", ")));
        }
    }
    let hold = match annotations.get(ANNOTATION_HOLD) {
        None => None,
        Some(lock) => {
            crate::sidecar::api::validate_lock_name(lock)
                .map_err(|_| format!("annotation {ANNOTATION_HOLD}: {lock:?} is not a lock name (a DNS label)"))?;
            Some(lock.clone())
        }
    };
    let ready_when_holding = match annotations.get(ANNOTATION_READY_WHEN_HOLDING).map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(format!("annotation {ANNOTATION_READY_WHEN_HOLDING}: {other:?} is not true or false"));
        }
    };
    if ready_when_holding && hold.is_none() {
        return Err(format!("annotation {ANNOTATION_READY_WHEN_HOLDING} needs {ANNOTATION_HOLD}"));
    }
    let api_port = port(annotations, ANNOTATION_API_PORT, 7070)?;
    let admin_port = port(annotations, ANNOTATION_ADMIN_PORT, 7071)?;
    if api_port == admin_port {
        return Err(format!("annotations {ANNOTATION_API_PORT} and {ANNOTATION_ADMIN_PORT} must differ"));
    }
    let hold_app_down_after = match annotations.get(ANNOTATION_HOLD_APP_DOWN_AFTER) {
        None => None,
        Some(_) if hold.is_none() => {
            return Err(format!("annotation {ANNOTATION_HOLD_APP_DOWN_AFTER} needs {ANNOTATION_HOLD}"));
        }
        Some(value) => match crate::controller::parse_duration(value) {
            Ok(d) if !d.is_zero() => Some(value.clone()),
            _ => {
                return Err(format!(
                    "annotation {ANNOTATION_HOLD_APP_DOWN_AFTER}: {value:?} is not a positive duration such as 10s"
                ));
            }
        },
    };
    Ok(PodOptions { hold, ready_when_holding, api_port, admin_port, hold_app_down_after })
}

fn field_env(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}})
}

/// The sidecar container.
pub fn sidecar_container(template: &Template, options: &PodOptions) -> Value {
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_UID", "metadata.uid"),
    ];
    if let Some(lock) = &options.hold {
        env.push(json!({"name": "LEASEHOLD_HOLD", "value": lock}));
        env.push(json!({"name": "LEASEHOLD_HOLD_FILE", "value": format!("{RUN_DIR}/hold.json")}));
        env.push(json!({"name": "LEASEHOLD_READY_WHEN_HOLDING", "value": options.ready_when_holding.to_string()}));
    }
    if let Some(after) = &options.hold_app_down_after {
        env.push(json!({"name": "LEASEHOLD_HOLD_APP_DOWN_AFTER", "value": after}));
    }
    json!({
        "name": SIDECAR_NAME,
        "image": template.image,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "sidecar",
            "--listen", format!("127.0.0.1:{}", options.api_port),
            "--admin-addr", format!("0.0.0.0:{}", options.admin_port),
        ],
        "restartPolicy": "Always",
        "env": env,
        "ports": [{"name": "leasehold-admin", "containerPort": options.admin_port, "protocol": "TCP"}],
        // The kubelet starts the app containers once this probe passes: the lock API is
        // listening before the app's first request.
        "startupProbe": {"httpGet": {"path": "/healthz", "port": options.admin_port}, "periodSeconds": 1, "failureThreshold": 120},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": options.admin_port}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": options.admin_port}, "periodSeconds": 10},
        "resources": template.resources,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "leasehold-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true},
            {"name": "leasehold-run", "mountPath": RUN_DIR},
        ],
    })
}

/// The volumes the sidecar needs: its own Pod-bound token (the pod may not automount one,
/// and the ServiceAccount admission plugin has run before us), and a shared directory.
pub fn volumes(template: &Template) -> [Value; 2] {
    [
        json!({"name": "leasehold-token", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": template.token_expiration_seconds}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]}}),
        json!({"name": "leasehold-run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}),
    ]
}

/// Adds `items` to the array at `path` (creating it if `present` is false).
fn append(ops: &mut Vec<Value>, path: &str, present: bool, items: Vec<Value>) {
    if present {
        ops.extend(items.into_iter().map(|v| json!({"op": "add", "path": format!("{path}/-"), "value": v})));
    } else if !items.is_empty() {
        ops.push(json!({"op": "add", "path": path, "value": items}));
    }
}

/// The JSON patch that injects the sidecar into `pod`: `Ok(None)` when the Pod did not
/// opt in or already has it; `Err` names a malformed annotation.
pub fn inject(pod: &Pod, template: &Template) -> Result<Option<json_patch::Patch>, String> {
    let opted_in = pod.metadata.labels.as_ref().and_then(|l| l.get(LABEL_INJECT)).map(String::as_str) == Some("true");
    if !opted_in {
        return Ok(None);
    }
    let options = pod_options(&pod.metadata.annotations.clone().unwrap_or_default())?;
    let spec = pod.spec.clone().unwrap_or_default();
    let has_sidecar =
        spec.init_containers.iter().flatten().chain(spec.containers.iter()).any(|c| c.name == SIDECAR_NAME);
    if has_sidecar {
        return Ok(None);
    }
    let mut ops = Vec::new();
    match &spec.init_containers {
        Some(existing) if !existing.is_empty() => {
            ops.push(
                json!({"op": "add", "path": "/spec/initContainers/0", "value": sidecar_container(template, &options)}),
            );
        }
        _ => ops.push(
            json!({"op": "add", "path": "/spec/initContainers", "value": [sidecar_container(template, &options)]}),
        ),
    }
    append(&mut ops, "/spec/volumes", spec.volumes.as_ref().is_some_and(|v| !v.is_empty()), volumes(template).into());
    for (i, container) in spec.containers.iter().enumerate() {
        let mut env = vec![json!({"name": "LEASEHOLD_URL", "value": format!("http://127.0.0.1:{}", options.api_port)})];
        if options.hold.is_some() {
            env.push(json!({"name": "LEASEHOLD_HOLD_FILE", "value": format!("{RUN_DIR}/hold.json")}));
        }
        append(
            &mut ops,
            &format!("/spec/containers/{i}/env"),
            container.env.as_ref().is_some_and(|e| !e.is_empty()),
            env,
        );
        let mount = json!({"name": "leasehold-run", "mountPath": RUN_DIR, "readOnly": true});
        let has_mounts = container.volume_mounts.as_ref().is_some_and(|m| !m.is_empty());
        append(&mut ops, &format!("/spec/containers/{i}/volumeMounts"), has_mounts, vec![mount]);
    }
    let patch =
        serde_json::from_value(Value::Array(ops)).map_err(|e| format!("internal error building the patch: {e}"))?;
    Ok(Some(patch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: Value, labels: Value, annotations: Value) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": labels, "annotations": annotations},
            "spec": spec,
        }))
        .expect("a valid pod")
    }

    fn opted(spec: Value) -> Pod {
        pod(spec, json!({LABEL_INJECT: "true"}), json!({}))
    }

    fn app() -> Value {
        json!({"name": "app", "image": "app:1"})
    }

    /// Golden patches, one per pod shape, in `src/webhook/testdata/inject/`. Set
    /// `UPDATE_GOLDEN=1` to rewrite them after an intended change, then review the diff.
    #[test]
    fn golden_patches_for_pod_shapes() {
        let cases: Vec<(&str, Pod)> = vec![
            ("no-env", opted(json!({"containers": [app()]}))),
            (
                "existing-env-and-volumes",
                opted(json!({
                    "containers": [{"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}],
                                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                })),
            ),
            (
                "existing-init-containers",
                opted(
                    json!({"initContainers": [{"name": "migrate", "image": "m:1"}], "containers": [app(), {"name": "second", "image": "s:1"}]}),
                ),
            ),
            (
                "host-network",
                pod(
                    json!({"hostNetwork": true, "containers": [app()]}),
                    json!({LABEL_INJECT: "true"}),
                    json!({ANNOTATION_API_PORT: "17070", ANNOTATION_ADMIN_PORT: "17071"}),
                ),
            ),
            (
                "hold-mode",
                pod(
                    json!({"containers": [app()]}),
                    json!({LABEL_INJECT: "true"}),
                    json!({ANNOTATION_HOLD: "leader", ANNOTATION_READY_WHEN_HOLDING: "true"}),
                ),
            ),
            (
                "hold-mode-app-down",
                pod(
                    json!({"containers": [app()]}),
                    json!({LABEL_INJECT: "true"}),
                    json!({ANNOTATION_HOLD: "leader", ANNOTATION_HOLD_APP_DOWN_AFTER: "10s"}),
                ),
            ),
            (
                "sidecar-already-present",
                opted(
                    json!({"initContainers": [{"name": SIDECAR_NAME, "image": "x", "restartPolicy": "Always"}], "containers": [app()]}),
                ),
            ),
            ("not-opted-in", pod(json!({"containers": [app()]}), json!({"app": "web"}), json!({}))),
        ];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/webhook/testdata/inject");
        for (name, pod) in cases {
            let patch = inject(&pod, &Template::default()).expect("injects");
            let actual = serde_json::to_string_pretty(&patch).expect("serializes") + "\n";
            let path = dir.join(format!("{name}.json"));
            if std::env::var_os("UPDATE_GOLDEN").is_some() {
                std::fs::create_dir_all(&dir).expect("mkdir");
                std::fs::write(&path, &actual).expect("write golden");
            }
            let golden = std::fs::read_to_string(&path).unwrap_or_else(|_| panic!("missing golden {}", path.display()));
            assert_eq!(actual, golden, "patch for {name} differs from {}", path.display());
            // Every patch applies to its pod.
            if let Some(patch) = patch {
                let mut doc = serde_json::to_value(&pod).expect("pod json");
                json_patch::patch(&mut doc, &patch).unwrap_or_else(|e| panic!("{name}: patch does not apply: {e}"));
                let patched: Pod = serde_json::from_value(doc).expect("still a pod");
                let sidecar = &patched.spec.expect("spec").init_containers.expect("init containers")[0];
                assert_eq!((sidecar.name.as_str(), sidecar.restart_policy.as_deref()), (SIDECAR_NAME, Some("Always")));
                // Injecting the patched pod again changes nothing.
                let again: Pod = {
                    let mut doc = serde_json::to_value(&pod).expect("pod json");
                    json_patch::patch(&mut doc, &inject(&pod, &Template::default()).expect("ok").expect("patch"))
                        .expect("applies");
                    serde_json::from_value(doc).expect("pod")
                };
                assert_eq!(inject(&again, &Template::default()), Ok(None), "{name}: injection is not idempotent");
            }
        }
    }

    #[test]
    fn malformed_annotations_are_named() {
        let cases = [
            (json!({ANNOTATION_HOLD: "Not_A_Lock"}), ANNOTATION_HOLD),
            (json!({ANNOTATION_READY_WHEN_HOLDING: "yes", ANNOTATION_HOLD: "l"}), ANNOTATION_READY_WHEN_HOLDING),
            (json!({ANNOTATION_READY_WHEN_HOLDING: "true"}), ANNOTATION_READY_WHEN_HOLDING),
            (json!({ANNOTATION_API_PORT: "0"}), ANNOTATION_API_PORT),
            (json!({ANNOTATION_ADMIN_PORT: "70000"}), ANNOTATION_ADMIN_PORT),
            (json!({ANNOTATION_API_PORT: "9000", ANNOTATION_ADMIN_PORT: "9000"}), ANNOTATION_API_PORT),
            (json!({ANNOTATION_HOLD_APP_DOWN_AFTER: "10s"}), ANNOTATION_HOLD_APP_DOWN_AFTER),
            (json!({ANNOTATION_HOLD: "l", ANNOTATION_HOLD_APP_DOWN_AFTER: "soon"}), ANNOTATION_HOLD_APP_DOWN_AFTER),
            (json!({ANNOTATION_HOLD: "l", ANNOTATION_HOLD_APP_DOWN_AFTER: "0s"}), ANNOTATION_HOLD_APP_DOWN_AFTER),
            (json!({"leasehold.dev/hodl": "l"}), "leasehold.dev/hodl"),
        ];
        for (annotations, named) in cases {
            let p = pod(json!({"containers": [app()]}), json!({LABEL_INJECT: "true"}), annotations.clone());
            let error = inject(&p, &Template::default()).expect_err("denied");
            assert!(error.contains(named), "{annotations}: {error:?} does not name {named}");
        }
        // Annotations of other owners are none of our business.
        let p =
            pod(json!({"containers": [app()]}), json!({LABEL_INJECT: "true"}), json!({"example.com/x": "whatever"}));
        assert!(inject(&p, &Template::default()).expect("ok").is_some());
    }
}
