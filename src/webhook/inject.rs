//! Sidecar injection, as a pure function from a Pod to a JSON patch.
//!
//! Pods labelled `leasehold.dev/inject: "true"` get the sidecar as a native sidecar (an
//! init container with `restartPolicy: Always`, first, so it runs before the other init
//! containers and outlives the app containers), with the pod's identity from the downward
//! API and its own projected, Pod-bound service-account token. Injection is idempotent:
//! a Pod that already has the sidecar gets no patch. The Pod's `leasehold.dev/*`
//! annotations ([`pod_settings`]) adjust the sidecar: a malformed one is refused with a
//! message naming it, an unknown one is ignored with a warning.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::crd::LABEL_INJECT;

/// Name of the injected container.
pub const SIDECAR_NAME: &str = "leasehold-sidecar";
/// The sidecar's own binary in the image, beside the full `leasehold`: it maps only the
/// sidecar's code, so it keeps less resident in every opted-in pod.
pub const SIDECAR_COMMAND: &str = "/leasehold-sidecar";
/// Where the hold-mode file is, in every container of an injected pod.
pub const RUN_DIR: &str = "/var/run/leasehold";
use super::pod_settings::{self, DeclaredPort};
pub use super::pod_settings::{
    ANNOTATION_ADMIN_PORT, ANNOTATION_API_PORT, ANNOTATION_CPU_LIMIT, ANNOTATION_CPU_REQUEST,
    ANNOTATION_HOLD_APP_DOWN_AFTER, ANNOTATION_LOG_FORMAT, ANNOTATION_LOG_LEVEL, ANNOTATION_MEMORY_LIMIT,
    ANNOTATION_MEMORY_REQUEST, ANNOTATION_READY_WHEN_HOLDING, PodOptions,
};
use crate::telemetry::LogFormat;

/// What the injected sidecar looks like (from the controller's configuration).
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    /// Container image.
    pub image: String,
    /// Resource requests and limits, as a Kubernetes `resources` object.
    pub resources: Value,
    /// Lifetime of the projected token, seconds.
    pub token_expiration_seconds: i64,
    /// The sidecar's log filter (`RUST_LOG`); the binary's default when unset.
    pub log_level: Option<String>,
    /// The sidecar's log format (`LEASEHOLD_LOG_FORMAT`); the binary's default when unset.
    pub log_format: Option<LogFormat>,
}

impl Default for Template {
    fn default() -> Template {
        Template {
            image: "ghcr.io/leasehold/leasehold:0.1.0".into(),
            resources: json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}}),
            token_expiration_seconds: 3600,
            log_level: None,
            log_format: None,
        }
    }
}

fn field_env(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}})
}

/// The sidecar container, with its `resources` (the template's with the Pod's overrides).
pub fn sidecar_container(template: &Template, options: &PodOptions, resources: Value) -> Value {
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
    if let Some(level) = options.log_level.as_ref().or(template.log_level.as_ref()) {
        env.push(json!({"name": "RUST_LOG", "value": level}));
    }
    if let Some(format) = options.log_format.or(template.log_format) {
        env.push(json!({"name": "LEASEHOLD_LOG_FORMAT", "value": format.as_str()}));
    }
    json!({
        "name": SIDECAR_NAME,
        "image": template.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [SIDECAR_COMMAND],
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
        "resources": resources,
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

/// What admitting a Pod does: the patch (none when the Pod did not opt in or already has
/// the sidecar) and warnings for whoever created it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Injection {
    /// The JSON patch adding the sidecar.
    pub patch: Option<json_patch::Patch>,
    /// One line per ignored annotation.
    pub warnings: Vec<String>,
}

/// The ports the Pod's own containers declare (the sidecar's excluded: a Pod created from
/// an injected spec carries it).
fn declared_ports(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<DeclaredPort> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .filter(|c| c.name != SIDECAR_NAME)
        .flat_map(|c| {
            c.ports.iter().flatten().map(|p| DeclaredPort { container: c.name.clone(), port: p.container_port })
        })
        .collect()
}

/// Injects the sidecar into `pod`: the patch and the warnings, or `Err` naming a
/// malformed annotation.
pub fn inject(pod: &Pod, template: &Template) -> Result<Injection, String> {
    let opted_in = pod.metadata.labels.as_ref().and_then(|l| l.get(LABEL_INJECT)).map(String::as_str) == Some("true");
    if !opted_in {
        return Ok(Injection::default());
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let settings = pod_settings::read(&pod.metadata.annotations.clone().unwrap_or_default(), &declared_ports(&spec))?;
    let (options, warnings) = (settings.options, settings.warnings);
    let resources = pod_settings::resources(&template.resources, &options.resources)?;
    let has_sidecar =
        spec.init_containers.iter().flatten().chain(spec.containers.iter()).any(|c| c.name == SIDECAR_NAME);
    if has_sidecar {
        return Ok(Injection { patch: None, warnings });
    }
    let mut ops = Vec::new();
    match &spec.init_containers {
        Some(existing) if !existing.is_empty() => {
            ops.push(
                json!({"op": "add", "path": "/spec/initContainers/0", "value": sidecar_container(template, &options, resources)}),
            );
        }
        _ => ops.push(
            json!({"op": "add", "path": "/spec/initContainers", "value": [sidecar_container(template, &options, resources)]}),
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
    Ok(Injection { patch: Some(patch), warnings })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::ANNOTATION_HOLD;

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
            let Injection { patch, warnings } = inject(&pod, &Template::default()).expect("injects");
            assert!(warnings.is_empty(), "{name}: {warnings:?}");
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
                    json_patch::patch(&mut doc, &inject(&pod, &Template::default()).expect("ok").patch.expect("patch"))
                        .expect("applies");
                    serde_json::from_value(doc).expect("pod")
                };
                assert_eq!(
                    inject(&again, &Template::default()),
                    Ok(Injection::default()),
                    "{name}: injection is not idempotent"
                );
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
            (json!({ANNOTATION_LOG_LEVEL: "loud"}), ANNOTATION_LOG_LEVEL),
            (json!({ANNOTATION_LOG_FORMAT: "xml"}), ANNOTATION_LOG_FORMAT),
            (json!({ANNOTATION_MEMORY_LIMIT: "lots"}), ANNOTATION_MEMORY_LIMIT),
            (json!({ANNOTATION_MEMORY_REQUEST: "1Gi"}), ANNOTATION_MEMORY_REQUEST),
        ];
        for (annotations, named) in cases {
            let p = pod(json!({"containers": [app()]}), json!({LABEL_INJECT: "true"}), annotations.clone());
            let error = inject(&p, &Template::default()).expect_err("denied");
            assert!(error.contains(named), "{annotations}: {error:?} does not name {named}");
        }
        // Annotations of other owners are none of our business.
        let p =
            pod(json!({"containers": [app()]}), json!({LABEL_INJECT: "true"}), json!({"example.com/x": "whatever"}));
        let injection = inject(&p, &Template::default()).expect("ok");
        assert!(injection.patch.is_some() && injection.warnings.is_empty(), "{injection:?}");
    }

    /// An annotation of a newer version (or a typo) no longer refuses the Pod: it is
    /// injected with the settings this version knows, and the warning names what was ignored.
    #[test]
    fn unknown_annotations_are_injected_with_a_warning() {
        let p = pod(
            json!({"containers": [app()]}),
            json!({LABEL_INJECT: "true"}),
            json!({"leasehold.dev/hodl": "l", ANNOTATION_HOLD: "leader"}),
        );
        let injection = inject(&p, &Template::default()).expect("admitted");
        let known =
            pod(json!({"containers": [app()]}), json!({LABEL_INJECT: "true"}), json!({ANNOTATION_HOLD: "leader"}));
        assert_eq!(
            injection.patch,
            inject(&known, &Template::default()).expect("ok").patch,
            "the known settings apply"
        );
        assert_eq!(injection.warnings.len(), 1, "{:?}", injection.warnings);
        assert!(
            injection.warnings[0].contains("leasehold.dev/hodl") && injection.warnings[0].contains("ignored"),
            "{:?}",
            injection.warnings
        );
        // A Pod that already has the sidecar still hears about it.
        let present = pod(
            json!({"initContainers": [{"name": SIDECAR_NAME, "image": "x", "restartPolicy": "Always"}], "containers": [app()]}),
            json!({LABEL_INJECT: "true"}),
            json!({"leasehold.dev/hodl": "l"}),
        );
        let injection = inject(&present, &Template::default()).expect("admitted");
        assert_eq!((injection.patch, injection.warnings.len()), (None, 1));
        // A Pod that did not opt in is not ours to warn about.
        let other = pod(json!({"containers": [app()]}), json!({}), json!({"leasehold.dev/hodl": "l"}));
        assert_eq!(inject(&other, &Template::default()), Ok(Injection::default()));
    }

    /// The sidecar a Pod gets, after its patch is applied.
    fn injected_sidecar(p: &Pod, template: &Template) -> k8s_openapi::api::core::v1::Container {
        let patch = inject(p, template).expect("admitted").patch.expect("a patch");
        let mut doc = serde_json::to_value(p).expect("pod json");
        json_patch::patch(&mut doc, &patch).expect("applies");
        let patched: Pod = serde_json::from_value(doc).expect("a pod");
        patched.spec.expect("spec").init_containers.expect("init")[0].clone()
    }

    fn env_of(sidecar: &k8s_openapi::api::core::v1::Container, name: &str) -> Option<String> {
        sidecar.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.clone())
    }

    #[test]
    fn log_settings_come_from_the_pod_then_the_controller_then_the_binary() {
        let controller =
            Template { log_level: Some("warn".into()), log_format: Some(LogFormat::Json), ..Template::default() };
        type Case<'a> = (&'a Template, Value, Option<&'a str>, Option<&'a str>);
        let cases: [Case; 4] = [
            (&Template::default(), json!({}), None, None),
            (&controller, json!({}), Some("warn"), Some("json")),
            (
                &controller,
                json!({ANNOTATION_LOG_LEVEL: "info,leasehold=debug", ANNOTATION_LOG_FORMAT: "plain"}),
                Some("info,leasehold=debug"),
                Some("plain"),
            ),
            (&Template::default(), json!({ANNOTATION_LOG_LEVEL: "trace"}), Some("trace"), None),
        ];
        for (template, annotations, level, format) in cases {
            let p = pod(json!({"containers": [app()]}), json!({LABEL_INJECT: "true"}), annotations.clone());
            let sidecar = injected_sidecar(&p, template);
            assert_eq!(env_of(&sidecar, "RUST_LOG").as_deref(), level, "{annotations}");
            assert_eq!(env_of(&sidecar, "LEASEHOLD_LOG_FORMAT").as_deref(), format, "{annotations}");
        }
    }

    #[test]
    fn resources_come_from_the_pod_over_the_controller() {
        let p = pod(
            json!({"containers": [app()]}),
            json!({LABEL_INJECT: "true"}),
            json!({ANNOTATION_CPU_REQUEST: "50m", ANNOTATION_MEMORY_LIMIT: "64Mi", ANNOTATION_CPU_LIMIT: "1"}),
        );
        let sidecar = injected_sidecar(&p, &Template::default());
        let resources = serde_json::to_value(sidecar.resources.expect("resources")).expect("json");
        assert_eq!(
            resources,
            json!({"requests": {"cpu": "50m", "memory": "16Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}})
        );
    }

    /// The injected container runs the sidecar-only binary of the image, with the same
    /// arguments `leasehold sidecar` takes.
    #[test]
    fn the_sidecar_runs_the_sidecar_binary() {
        let sidecar = injected_sidecar(&opted(json!({"containers": [app()]})), &Template::default());
        assert_eq!(sidecar.command.expect("command"), [SIDECAR_COMMAND]);
        assert_eq!(sidecar.args.expect("args")[0], "sidecar");
        assert_eq!(SIDECAR_COMMAND, leasehold_image::leasehold::SIDECAR, "the image has the binary injected");
    }

    #[test]
    fn the_sidecar_ports_avoid_the_pods_declared_ports() {
        let declaring = json!({"containers": [{"name": "app", "image": "app:1", "ports": [{"containerPort": 7070}]}]});
        let error = inject(&pod(declaring.clone(), json!({LABEL_INJECT: "true"}), json!({})), &Template::default())
            .expect_err("denied");
        assert!(error.contains(ANNOTATION_API_PORT) && error.contains("container app"), "{error}");
        let moved = pod(declaring, json!({LABEL_INJECT: "true"}), json!({ANNOTATION_API_PORT: "7072"}));
        let sidecar = injected_sidecar(&moved, &Template::default());
        assert_eq!(sidecar.args.expect("args")[2], "127.0.0.1:7072");
        // A Pod created from an injected spec keeps the sidecar's own port without a conflict.
        let present = pod(
            json!({"initContainers": [{"name": SIDECAR_NAME, "image": "x", "restartPolicy": "Always",
                                       "ports": [{"name": "leasehold-admin", "containerPort": 7071}]}],
                   "containers": [app()]}),
            json!({LABEL_INJECT: "true"}),
            json!({}),
        );
        assert_eq!(inject(&present, &Template::default()), Ok(Injection::default()));
    }
}
