//! Every directory under `examples/` is applied to the real control plane (`kubectl apply
//! -k`) and its flow is run with local sidecars and processes, so the guides cannot rot.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};
use leasehold_harness::{Postgres, eventually};
use serde_json::Value;

use crate::support::{Env, LeaseholdProcess, free_port, leasehold_bin};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name)
}

/// `kubectl apply -k examples/<name>` into the test namespace; returns its output.
fn apply(env: &Env, name: &str) -> String {
    let output =
        env.cp.kubectl().args(["apply", "-n", env.name(), "-k"]).arg(example(name)).output().expect("run kubectl");
    assert!(output.status.success(), "applying examples/{name}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn every_example_directory_is_exercised_here() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("examples/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let source = include_str!("examples.rs");
    for name in names {
        assert!(
            source.contains(&format!("apply(&env, \"{name}\")")),
            "examples/{name} is not applied by a test in e2e/tests/examples.rs"
        );
    }
}

#[tokio::test]
async fn basic_lock_is_granted() {
    let env = Env::new("ex-basic").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    apply(&env, "basic");
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire("example", Duration::from_secs(30)).await.expect("granted");
    assert!(hold.release().await.was_held);
}

/// The sidecar container the webhook injected into `pod`, with ports moved to free
/// loopback ports and paths into `dir`, as a local command.
fn sidecar_from_injected(env: &Env, pod: &Pod, dir: &Path, token: &str) -> (Command, std::net::SocketAddr) {
    let spec = pod.spec.clone().expect("spec");
    let sidecar = spec
        .init_containers
        .expect("init containers")
        .into_iter()
        .find(|c| c.name == "leasehold-sidecar")
        .expect("injected");
    let kubeconfig = dir.join(format!("kubeconfig-{}", pod.metadata.name.clone().unwrap_or_default()));
    env.ns.kubeconfig_for_token(token, &kubeconfig).expect("kubeconfig");
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let api = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut args = sidecar.args.clone().expect("args");
    for arg in args.iter_mut() {
        if arg.starts_with("127.0.0.1:") {
            *arg = api.to_string();
        } else if arg.starts_with("0.0.0.0:") {
            *arg = admin.to_string();
        }
    }
    let mut command = Command::new(leasehold_bin());
    command.args(&args).env("KUBECONFIG", &kubeconfig).env("RUST_LOG", "info,kube=warn");
    for var in sidecar.env.expect("env") {
        let value = match var.name.as_str() {
            // The downward API, as the kubelet would fill it.
            "POD_NAME" => pod.metadata.name.clone(),
            "POD_NAMESPACE" => Some(env.name().to_owned()),
            "POD_UID" => pod.metadata.uid.clone(),
            "LEASEHOLD_HOLD_FILE" => Some(
                dir.join(format!("hold-{}.json", pod.metadata.name.clone().unwrap_or_default())).display().to_string(),
            ),
            _ => var.value,
        };
        command.env(&var.name, value.unwrap_or_default());
    }
    (command, admin)
}

#[tokio::test]
async fn leader_election_example_holds_for_life_and_readiness_follows() {
    let env = Env::new("ex-leader").await;
    let _controller = env.webhook_controller(None, &[]).await;
    apply(&env, "leader-election");
    let deployments: Api<Deployment> = Api::namespaced(env.ns.client.clone(), env.name());
    let template = deployments.get("singleton").await.expect("deployment").spec.expect("spec").template;
    // What the ReplicaSet controller would do (there is no kubelet or ReplicaSet controller
    // here): create Pods from the template; the webhook injects the sidecar.
    let pods: Api<Pod> = Api::namespaced(env.ns.client.clone(), env.name());
    let dir = env.log_dir();
    let mut sidecars = Vec::new();
    for i in 0..2 {
        let mut pod = Pod {
            metadata: template.metadata.clone().unwrap_or_default(),
            spec: template.spec.clone(),
            ..Pod::default()
        };
        pod.metadata.name = Some(format!("singleton-{i}"));
        let pod = pods.create(&PostParams::default(), &pod).await.expect("create a pod from the template");
        let token = env.ns.pod_token("default", &pod).await;
        if i == 0 {
            let client = env.cp.client_with_token(&token).await;
            let probe = crate::support::TestPod {
                name: "probe".into(),
                uid: String::new(),
                service_account: "default".into(),
                token: token.clone(),
                client,
                pod: pod.clone(),
            };
            env.wait_claim_rbac(&probe).await;
        }
        let (command, admin) = sidecar_from_injected(&env, &pod, &dir, &token);
        sidecars.push((
            LeaseholdProcess::spawn(&format!("singleton-{i}"), command, admin),
            pod.metadata.name.clone().unwrap_or_default(),
        ));
    }
    let ready = |s: &LeaseholdProcess| {
        let addr = s.admin;
        async move { matches!(crate::support::http_get(addr, "/readyz").await, Some((200, _))) }
    };
    let leader = eventually("one sidecar ready (holding)", Duration::from_secs(30), || async {
        let (a, b) = (ready(&sidecars[0].0).await, ready(&sidecars[1].0).await);
        match (a, b) {
            (true, false) => Ok(0),
            (false, true) => Ok(1),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let file = dir.join(format!("hold-{}.json", sidecars[leader].1));
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&file).expect("hold file")).expect("json");
    let first = record["fencingToken"].as_i64().expect("token");

    sidecars[leader].0.terminate(Duration::from_secs(10)).await;
    let other = 1 - leader;
    eventually("the other sidecar takes over", Duration::from_secs(30), || async {
        if ready(&sidecars[other].0).await { Ok(()) } else { Err("not yet") }
    })
    .await;
    let file = dir.join(format!("hold-{}.json", sidecars[other].1));
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&file).expect("hold file")).expect("json");
    assert!(record["fencingToken"].as_i64().expect("token") > first);
}

#[tokio::test]
async fn cronjob_example_runs_once_at_a_time_and_is_idempotent() {
    let env = Env::new("ex-cron").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    apply(&env, "cronjob");
    // The Job's container, run locally twice at once, as two Job pods with the `report`
    // account (each its own identity, as real Job pods are).
    let dir = env.log_dir();
    let mut kubeconfigs = Vec::new();
    for i in 0..2 {
        let pod = env.ns.pod(&format!("report-run-{i}"), "report", &[]).await;
        let token = env.ns.pod_token("report", &pod).await;
        let kubeconfig = dir.join(format!("kubeconfig-report-{i}"));
        env.ns.kubeconfig_for_token(&token, &kubeconfig).expect("kubeconfig");
        if i == 0 {
            let client = env.cp.client_with_token(&token).await;
            let probe = crate::support::TestPod {
                name: pod.metadata.name.clone().unwrap_or_default(),
                uid: String::new(),
                service_account: "report".into(),
                token,
                client,
                pod,
            };
            env.wait_claim_rbac(&probe).await;
        }
        kubeconfigs.push(kubeconfig);
    }
    let path = format!("{}:{}", env.cp.bin_dir().display(), std::env::var("PATH").unwrap_or_default());
    let run = |kubeconfig: &PathBuf| {
        let mut command = tokio::process::Command::new(leasehold_bin());
        command
            .args(["run", "--lock", &format!("{}/nightly-report", env.name()), "--wait", "60s", "--", "sh"])
            .arg(example("cronjob").join("report.sh"))
            .env("KUBECONFIG", kubeconfig)
            .env("PATH", &path)
            .env("PERIOD", "2026-11-30")
            .env("POD_NAMESPACE", env.name())
            .kill_on_drop(true);
        command.output()
    };
    let (first, second) = tokio::join!(run(&kubeconfigs[0]), run(&kubeconfigs[1]));
    let (first, second) = (first.expect("run"), second.expect("run"));
    let text = |o: &std::process::Output| {
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    };
    assert!(first.status.success() && second.status.success(), "{}\n{}", text(&first), text(&second));
    let did = [&first, &second].iter().filter(|o| text(o).contains("report for 2026-11-30 done")).count();
    let skipped = [&first, &second].iter().filter(|o| text(o).contains("already done")).count();
    assert_eq!((did, skipped), (1, 1), "exactly one run does the work:\n{}\n{}", text(&first), text(&second));
    let marker = Api::<ConfigMap>::namespaced(env.ns.client.clone(), env.name())
        .get("report-done-2026-11-30")
        .await
        .expect("marker");
    let token = marker
        .metadata
        .annotations
        .unwrap_or_default()
        .get("leasehold.dev/fencing-token")
        .cloned()
        .expect("token annotation");
    assert!(token.parse::<i64>().is_ok(), "{token}");
}

#[tokio::test]
async fn inventory_example_never_oversells_and_rejects_a_stale_holder() {
    let env = Env::new("ex-inventory").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    apply(&env, "inventory-postgres");
    let pg = Postgres::start().expect("postgres");
    let (db, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    db.batch_execute(&std::fs::read_to_string(example("inventory-postgres").join("schema.sql")).expect("schema"))
        .await
        .expect("schema");
    let decrement = std::fs::read_to_string(example("inventory-postgres").join("decrement.sql")).expect("sql");
    let take = db.prepare(&decrement).await.expect("prepare the example's statement");

    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);
    let mut sold = 0;
    for _ in 0..5 {
        for sidecar in [&sa, &sb] {
            let (status, held) = sidecar.acquire("inventory", 30.0).await;
            assert_eq!(status, 200, "{held}");
            let token = held["fencingToken"].as_i64().expect("token");
            sold += db.query(&take, &[&token]).await.expect("decrement").len();
            sidecar.release("inventory").await;
        }
    }
    assert_eq!(sold, 10);
    // A holder that paused past its lease comes back with its old token: refused.
    let (_, held) = sa.acquire("inventory", 30.0).await;
    let stale = held["fencingToken"].as_i64().expect("token");
    sa.release("inventory").await;
    let (_, held) = sb.acquire("inventory", 30.0).await;
    let fresh = held["fencingToken"].as_i64().expect("token");
    assert_eq!(db.query(&take, &[&fresh]).await.expect("decrement").len(), 1);
    assert!(db.query(&take, &[&stale]).await.expect("decrement").is_empty(), "the stale write must change nothing");
    sb.release("inventory").await;
    let stock: i64 = db.query_one("SELECT stock FROM inventory", &[]).await.expect("stock").get(0);
    assert_eq!(stock, 100 - 11);
}

#[tokio::test]
async fn fenced_configmap_example_admits_the_holder_and_rejects_a_stale_writer() {
    let env = Env::new("ex-fenced").await;
    let _controller = env.webhook_controller(None, &[]).await;
    apply(&env, "fenced-configmap");
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);
    let path = format!("{}:{}", env.cp.bin_dir().display(), std::env::var("PATH").unwrap_or_default());
    // writer.sh's kubectl uses the kubeconfig's namespace: a copy pointing at ours.
    let kubeconfig = env.log_dir().join("kubeconfig-writer");
    std::fs::copy(env.cp.kubeconfig_path(), &kubeconfig).expect("copy");
    let status = Command::new(env.cp.bin_dir().join("kubectl"))
        .args(["config", "set-context", "--current", "--namespace", env.name(), "--kubeconfig"])
        .arg(&kubeconfig)
        .status()
        .expect("kubectl");
    assert!(status.success());
    let writer = |sidecar: &crate::support::Sidecar, value: &str| {
        let output = Command::new("sh")
            .arg(example("fenced-configmap").join("writer.sh"))
            .arg(value)
            .env("LEASEHOLD_URL", format!("http://{}", sidecar.api))
            .env("KUBECONFIG", &kubeconfig)
            .env("PATH", &path)
            .output()
            .expect("run writer.sh");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        stdout
            .rsplit("with token ")
            .next()
            .and_then(|t| t.trim().parse::<i64>().ok())
            .unwrap_or_else(|| panic!("{stdout}"))
    };
    let first = writer(&sa, "v2");
    let second = writer(&sb, "v3");
    assert!(second > first);
    let cms: Api<ConfigMap> = Api::namespaced(env.ns.client.clone(), env.name());
    let stored = cms.get("routing-table").await.expect("configmap");
    assert_eq!(stored.data.clone().expect("data")["routes"], "v3");
    // The first writer, resuming after its hold passed on, writes with its old token.
    let manifest = std::fs::read_to_string(example("fenced-configmap").join("configmap.yaml")).expect("manifest");
    let stale = manifest.replace("\"TOKEN\"", &format!("\"{first}\""));
    let mut apply = Command::new(env.cp.bin_dir().join("kubectl"))
        .args(["apply", "--server-side", "--field-manager=writer", "--force-conflicts", "-f", "-", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    {
        use std::io::Write as _;
        apply.stdin.take().expect("stdin").write_all(stale.as_bytes()).expect("write");
    }
    let output = apply.wait_with_output().expect("kubectl");
    assert!(!output.status.success(), "a write with a stale token was admitted");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("stale write rejected"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(cms.get("routing-table").await.expect("configmap").data.expect("data")["routes"], "v3");
}
