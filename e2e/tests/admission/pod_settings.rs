//! Per-pod sidecar settings through the real apiserver: annotations this version does not
//! know admit the Pod with a warning its creator sees; log and resource annotations reach
//! the injected sidecar over the controller's defaults, and the sidecar binary logs as they
//! say; malformed ones are refused and nothing is stored.

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use super::{WAIT, denial, pod_json};
use crate::support::{Env, LeaseholdProcess, free_port, sidecar_bin};

fn sidecar_of(pod: &Pod) -> Container {
    let init = pod.spec.as_ref().and_then(|s| s.init_containers.clone()).unwrap_or_default();
    init.into_iter().find(|c| c.name == "leasehold-sidecar").unwrap_or_else(|| panic!("no sidecar in {pod:?}"))
}

fn env_value(sidecar: &Container, name: &str) -> Option<String> {
    sidecar.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.clone())
}

#[tokio::test]
async fn an_unknown_annotation_admits_the_pod_with_a_warning_its_creator_sees() {
    let env = Env::new("adm-unknown").await;
    let _controller = env.webhook_controller(None, &[]).await;
    let pods: Api<Pod> = Api::namespaced(env.ns.client.clone(), env.name());

    // kubectl prints the apiserver's Warning headers, which carry the webhook's warnings.
    let pod = pod_json(
        "newer",
        json!({"leasehold.dev/inject": "true"}),
        json!({"leasehold.dev/hold": "leader", "leasehold.dev/from-a-newer-version": "yes"}),
    );
    let file = env.log_dir().join("newer-pod.json");
    std::fs::write(&file, serde_json::to_vec(&pod).expect("json")).expect("write the pod");
    let output = env
        .cp
        .kubectl()
        .args(["create", "-n", env.name(), "-o", "json", "-f"])
        .arg(&file)
        .output()
        .expect("run kubectl");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "kubectl create failed: {stderr}");
    let warning =
        stderr.lines().find(|l| l.starts_with("Warning:")).unwrap_or_else(|| panic!("no warning in {stderr:?}"));
    assert!(warning.contains("leasehold.dev/from-a-newer-version") && warning.contains("ignored"), "{warning}");

    // Stored, with the sidecar and the settings this version knows.
    let stored = pods.get("newer").await.expect("the pod was created");
    let sidecar = sidecar_of(&stored);
    assert_eq!(env_value(&sidecar, "LEASEHOLD_HOLD").as_deref(), Some("leader"));
}

#[tokio::test]
async fn pod_annotations_set_the_sidecars_log_settings_and_resources_over_the_controllers() {
    let env = Env::new("adm-podcfg").await;
    let _controller = env
        .webhook_controller(
            None,
            &[
                "--sidecar-log-level=warn",
                "--sidecar-log-format=json",
                r#"--sidecar-resources={"requests":{"cpu":"10m","memory":"16Mi"},"limits":{"memory":"32Mi"}}"#,
            ],
        )
        .await;
    let pods: Api<Pod> = Api::namespaced(env.ns.client.clone(), env.name());

    // The controller's settings.
    let plain = pods
        .create(&PostParams::default(), &pod_json("defaults", json!({"leasehold.dev/inject": "true"}), json!({})))
        .await
        .expect("create");
    let sidecar = sidecar_of(&plain);
    assert_eq!(env_value(&sidecar, "RUST_LOG").as_deref(), Some("warn"));
    assert_eq!(env_value(&sidecar, "LEASEHOLD_LOG_FORMAT").as_deref(), Some("json"));
    let resources = serde_json::to_value(sidecar.resources.expect("resources")).expect("json");
    assert_eq!(resources, json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}}));

    // The pod's own.
    let tuned = pods
        .create(
            &PostParams::default(),
            &pod_json(
                "tuned",
                json!({"leasehold.dev/inject": "true"}),
                json!({
                    "leasehold.dev/log-level": "info,leasehold=debug",
                    "leasehold.dev/log-format": "plain",
                    "leasehold.dev/cpu-request": "25m",
                    "leasehold.dev/memory-request": "24Mi",
                    "leasehold.dev/cpu-limit": "500m",
                    "leasehold.dev/memory-limit": "64Mi",
                    "leasehold.dev/api-port": "17070",
                    "leasehold.dev/admin-port": "17071",
                }),
            ),
        )
        .await
        .expect("create");
    let sidecar = sidecar_of(&tuned);
    assert_eq!(env_value(&sidecar, "RUST_LOG").as_deref(), Some("info,leasehold=debug"));
    assert_eq!(env_value(&sidecar, "LEASEHOLD_LOG_FORMAT").as_deref(), Some("plain"));
    let resources = serde_json::to_value(sidecar.resources.clone().expect("resources")).expect("json");
    assert_eq!(
        resources,
        json!({"requests": {"cpu": "25m", "memory": "24Mi"}, "limits": {"cpu": "500m", "memory": "64Mi"}})
    );
    let args = sidecar.args.clone().expect("args");
    assert!(args.contains(&"127.0.0.1:17070".to_owned()) && args.contains(&"0.0.0.0:17071".to_owned()), "{args:?}");
    let app = &tuned.spec.expect("spec").containers[0];
    assert!(
        app.env
            .iter()
            .flatten()
            .any(|e| e.name == "LEASEHOLD_URL" && e.value.as_deref() == Some("http://127.0.0.1:17070")),
        "{app:?}"
    );
}

#[tokio::test]
async fn malformed_pod_settings_are_denied_naming_them_and_nothing_is_created() {
    let env = Env::new("adm-badcfg").await;
    let _controller = env.webhook_controller(None, &[]).await;
    let pods: Api<Pod> = Api::namespaced(env.ns.client.clone(), env.name());

    let app_on = |port: i64| json!([{"name": "app", "image": "app:1", "ports": [{"containerPort": port}]}]);
    let cases: [(&str, Value, Option<Value>, &[&str]); 7] = [
        ("level", json!({"leasehold.dev/log-level": "loud"}), None, &["leasehold.dev/log-level", "\"loud\"", "debug"]),
        (
            "format",
            json!({"leasehold.dev/log-format": "xml"}),
            None,
            &["leasehold.dev/log-format", "\"xml\"", "plain or json"],
        ),
        (
            "quantity",
            json!({"leasehold.dev/memory-limit": "lots"}),
            None,
            &["leasehold.dev/memory-limit", "\"lots\"", "64Mi"],
        ),
        (
            "over-limit",
            json!({"leasehold.dev/memory-request": "64Mi", "leasehold.dev/memory-limit": "32Mi"}),
            None,
            &["leasehold.dev/memory-request", "leasehold.dev/memory-limit", "64Mi", "32Mi"],
        ),
        (
            "port-range",
            json!({"leasehold.dev/api-port": "70000"}),
            None,
            &["leasehold.dev/api-port", "\"70000\"", "1-65535"],
        ),
        (
            "same-ports",
            json!({"leasehold.dev/api-port": "9000", "leasehold.dev/admin-port": "9000"}),
            None,
            &["leasehold.dev/api-port", "leasehold.dev/admin-port", "must differ"],
        ),
        (
            "port-taken",
            json!({"leasehold.dev/admin-port": "8080"}),
            Some(app_on(8080)),
            &["leasehold.dev/admin-port", "8080", "container app"],
        ),
    ];
    for (name, annotations, containers, says) in cases {
        let mut pod = pod_json(name, json!({"leasehold.dev/inject": "true"}), annotations.clone());
        if let Some(containers) = containers {
            pod.spec.as_mut().expect("spec").containers = serde_json::from_value(containers).expect("containers");
        }
        let message = denial(pods.create(&PostParams::default(), &pod).await);
        for part in says {
            assert!(message.contains(part), "{name} {annotations}: {message:?} does not say {part:?}");
        }
        assert!(pods.get_opt(name).await.expect("get").is_none(), "{name}: nothing was created");
    }
}

/// The environment the webhook puts on the sidecar is what the binary reads: a sidecar
/// started with the injected container's `RUST_LOG` and `LEASEHOLD_LOG_FORMAT` logs JSON
/// lines at the annotated level.
#[tokio::test]
async fn a_sidecar_started_with_the_injected_log_settings_logs_json_at_that_level() {
    let env = Env::new("adm-podlog").await;
    let _controller = env.webhook_controller(None, &["--sidecar-log-level=warn"]).await;
    let pods: Api<Pod> = Api::namespaced(env.ns.client.clone(), env.name());
    let injected = pods
        .create(
            &PostParams { dry_run: true, field_manager: None },
            &pod_json(
                "logs",
                json!({"leasehold.dev/inject": "true"}),
                json!({"leasehold.dev/log-level": "debug", "leasehold.dev/log-format": "json"}),
            ),
        )
        .await
        .expect("admitted");
    let sidecar = sidecar_of(&injected);

    // A sidecar process for a pod of the test namespace, with the injected log settings.
    let pod = env.pod("logs").await;
    let kubeconfig = env.log_dir().join("kubeconfig-logs");
    env.ns.kubeconfig_for_token(&pod.token, &kubeconfig).expect("kubeconfig");
    let api = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut command = std::process::Command::new(sidecar_bin());
    command
        .args(["sidecar", "--listen", &api.to_string(), "--admin-addr", &admin.to_string()])
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", env.name())
        .env("POD_NAME", &pod.name)
        .env("POD_UID", &pod.uid)
        .env_remove("RUST_LOG")
        .env_remove("LEASEHOLD_LOG_FORMAT");
    for name in ["RUST_LOG", "LEASEHOLD_LOG_FORMAT"] {
        command.env(name, env_value(&sidecar, name).unwrap_or_else(|| panic!("{name} injected")));
    }
    let process = LeaseholdProcess::spawn(&format!("sidecar-logs-{}", api.port()), command, admin);
    let log = process.process.as_ref().expect("running").log().to_path_buf();
    leasehold_harness::eventually("the sidecar logs at debug", WAIT, || async {
        let text = std::fs::read_to_string(&log).map_err(|e| e.to_string())?;
        if text.contains("\"level\":\"DEBUG\"") { Ok(()) } else { Err(process.log_tail(5)) }
    })
    .await;
    let text = std::fs::read_to_string(&log).expect("read the log");
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parsed: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(parsed["level"].is_string(), "{line}");
    }
}
