//! Every directory under `examples/` is applied to the real control plane (`kubectl apply
//! -k`) and its flow is run with local sidecars and processes, so the guides cannot rot.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};
use leasehold_harness::{Postgres, eventually};

use crate::support::{Env, LeaseholdProcess, free_port, leasehold_bin, sidecar_bin};

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
    let mut command = Command::new(sidecar_bin());
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
async fn leader_election_example_elects_one_leader_and_every_replica_turns_ready() {
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
    // Every replica turns ready (so a rollout completes); the leader is the one whose
    // hold file the example's own check (holding.sh, mounted into the app) accepts.
    let check = example("leader-election").join("holding.sh");
    let configmaps: Api<ConfigMap> = Api::namespaced(env.ns.client.clone(), env.name());
    let mounted = configmaps.get("leader-check").await.expect("the check's ConfigMap").data.expect("data");
    assert_eq!(mounted["holding.sh"], std::fs::read_to_string(&check).expect("holding.sh"));
    // The guide shows the very function the example mounts and this test runs.
    let script = std::fs::read_to_string(&check).expect("holding.sh");
    let function = &script[script.find("leasehold_holding() {").expect("the function")..];
    let guide = include_str!("../../docs/guides/leader-election.md");
    assert!(guide.contains(function.trim_end()), "docs/guides/leader-election.md differs from holding.sh");
    let holding = |name: &str| {
        let file = dir.join(format!("hold-{name}.json"));
        let status = Command::new("sh")
            .arg("-c")
            .arg(". \"$1\" && leasehold_holding && echo \"$LEASEHOLD_TOKEN\"")
            .arg("sh")
            .arg(&check)
            .env("LEASEHOLD_HOLD_FILE", file)
            .output()
            .expect("sh");
        status.status.success().then(|| String::from_utf8_lossy(&status.stdout).trim().parse::<i64>().expect("token"))
    };
    for (sidecar, _) in &sidecars {
        sidecar.wait_ready().await;
    }
    let (leader, first) = eventually("one leader by the hold files", Duration::from_secs(30), || async {
        match (holding(&sidecars[0].1), holding(&sidecars[1].1)) {
            (Some(token), None) => Ok((0, token)),
            (None, Some(token)) => Ok((1, token)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    sidecars[leader].0.terminate(Duration::from_secs(30)).await;
    let other = 1 - leader;
    assert_eq!(holding(&sidecars[leader].1), None, "the terminated leader's file still vouches");
    let next = eventually("the other replica takes over", Duration::from_secs(30), || async {
        holding(&sidecars[other].1).ok_or("not yet")
    })
    .await;
    assert!(next > first, "{next} after {first}");
    assert!(matches!(crate::support::http_get(sidecars[other].0.admin, "/readyz").await, Some((200, _))));
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

    // The window the token alone leaves open: a's old write landing before b's first write
    // is applied, since nothing has told the row about b's token yet ...
    let (_, held) = sa.acquire("inventory", 30.0).await;
    let stale = held["fencingToken"].as_i64().expect("token");
    sa.release("inventory").await;
    let (_, held) = sb.acquire("inventory", 30.0).await;
    let fresh = held["fencingToken"].as_i64().expect("token");
    assert_eq!(db.query(&take, &[&stale]).await.expect("decrement").len(), 1, "before b writes, a's write lands");
    sb.release("inventory").await;
    // ... and how a new holder closes it: it pushes its token to the row before acting.
    let fence = std::fs::read_to_string(example("inventory-postgres").join("fence.sql")).expect("sql");
    let fence = db.prepare(&fence).await.expect("prepare the example's fence statement");
    let (_, held) = sa.acquire("inventory", 30.0).await;
    let stale = held["fencingToken"].as_i64().expect("token");
    sa.release("inventory").await;
    let (_, held) = sb.acquire("inventory", 30.0).await;
    let fresh_b = held["fencingToken"].as_i64().expect("token");
    assert!(fresh_b > fresh);
    assert_eq!(db.query(&fence, &[&fresh_b]).await.expect("fence").len(), 1, "b raised the row's token");
    assert!(db.query(&take, &[&stale]).await.expect("decrement").is_empty(), "a's late write after b's push");
    assert_eq!(db.query(&take, &[&fresh_b]).await.expect("decrement").len(), 1);
    assert!(db.query(&fence, &[&stale]).await.expect("fence").is_empty(), "a stale hold cannot fence");
    sb.release("inventory").await;
    let stock: i64 = db.query_one("SELECT stock FROM inventory", &[]).await.expect("stock").get(0);
    assert_eq!(stock, 100 - 13);
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

/// Builds the Go worker of examples/session-worker (standard library only) into `dir`.
fn build_go_worker(dir: &Path) -> PathBuf {
    let binary = dir.join("session-worker-go");
    let output = Command::new("go")
        .args(["build", "-buildvcs=false", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(example("session-worker"))
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("run go build");
    assert!(output.status.success(), "go build: {}", String::from_utf8_lossy(&output.stderr));
    binary
}

/// A session worker of the example, in `language`, against `sidecar`: LOCK SECONDS LOGFILE.
fn session_worker(language: &str, go: &Path, sidecar: &crate::support::Sidecar, seconds: &str, log: &Path) -> Command {
    let dir = example("session-worker");
    let mut command = match language {
        "python" => {
            let mut c = Command::new("python3");
            c.arg(dir.join("worker.py"));
            c
        }
        "go" => Command::new(go),
        _ => {
            let mut c = Command::new("sh");
            c.arg(dir.join("worker.sh"));
            c
        }
    };
    command.args(["reports", seconds]).arg(log).env("LEASEHOLD_URL", format!("http://{}", sidecar.api));
    command
}

/// The (start, end) lines of a session-worker log: (token, nanoseconds) each.
fn work_periods(log: &Path) -> Vec<(i64, u128, Option<u128>)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut periods: Vec<(i64, u128, Option<u128>)> = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (token, at) = (fields[1].parse().expect("token"), fields[2].parse().expect("ns"));
        match fields[0] {
            "start" => periods.push((token, at, None)),
            _ => {
                let open = periods.iter_mut().find(|p| p.0 == token).expect("a start before its end");
                open.2 = Some(at);
            }
        }
    }
    periods
}

#[tokio::test]
async fn session_worker_example_in_curl_go_and_python_takes_turns_and_a_killed_worker_lets_go() {
    let env = Env::new("ex-session").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    apply(&env, "session-worker");
    // The Deployment runs the Go worker this test builds and runs (on a real node too:
    // e2e/node/tests/examples.rs).
    let deployments: Api<Deployment> = Api::namespaced(env.ns.client.clone(), env.name());
    let template = deployments.get("report-worker").await.expect("deployment").spec.expect("spec").template;
    let command = template.spec.expect("a pod spec").containers[0].command.clone().unwrap_or_default().join(" ");
    assert!(command.contains("session-worker reports"), "{command}");
    let dir = env.log_dir();
    let go = build_go_worker(&dir);
    let (a, b, c) = (env.pod("a").await, env.pod("b").await, env.pod("c").await);
    env.wait_claim_rbac(&a).await;
    let (sa, sb, sc) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await, env.sidecar(&c, &[]).await);

    // The three workers at once: one at a time, tokens increasing, each ends cleanly.
    let log = dir.join("turns.log");
    let mut runs = Vec::new();
    for (language, sidecar) in [("python", &sa), ("go", &sb), ("curl", &sc)] {
        let mut command = tokio::process::Command::from(session_worker(language, &go, sidecar, "0.3", &log));
        command.kill_on_drop(true).stderr(std::process::Stdio::piped());
        runs.push((language, command.spawn().expect("start a worker")));
    }
    for (language, run) in runs {
        let output =
            tokio::time::timeout(Duration::from_secs(90), run.wait_with_output()).await.expect("in time").expect("run");
        assert!(output.status.success(), "{language}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let periods = work_periods(&log);
    assert_eq!(periods.len(), 3, "{periods:?}");
    let mut sorted = periods.clone();
    sorted.sort_by_key(|p| p.1);
    for pair in sorted.windows(2) {
        let (first, next) = (&pair[0], &pair[1]);
        assert!(next.0 > first.0, "tokens do not increase: {sorted:?}");
        assert!(next.1 >= first.2.expect("ended"), "two workers overlapped: {sorted:?}");
    }

    // A worker killed mid-work lets go: the next one (Go) is granted and works.
    let log = dir.join("kill.log");
    let victim = leasehold_harness::Supervised::spawn(
        "python-victim",
        session_worker("python", &go, &sa, "600", &log),
        &dir.join("python-victim.log"),
    )
    .expect("start the Python worker");
    let victim_token = eventually("the Python worker works", Duration::from_secs(60), || async {
        work_periods(&log).first().map(|p| p.0).ok_or_else(|| victim.log_tail(5))
    })
    .await;
    let mut next = tokio::process::Command::from(session_worker("go", &go, &sb, "0.2", &log));
    next.kill_on_drop(true).stderr(std::process::Stdio::piped());
    let next = next.spawn().expect("start the Go worker");
    eventually("the Go worker waits for the lock", Duration::from_secs(30), || async {
        let view = sb.view("reports").await;
        if view["state"] == "waiting" { Ok(()) } else { Err(view.to_string()) }
    })
    .await;
    victim.kill_and_reap();
    let output =
        tokio::time::timeout(Duration::from_secs(90), next.wait_with_output()).await.expect("in time").expect("run");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let periods = work_periods(&log);
    assert_eq!(periods.len(), 2, "{periods:?}");
    assert!(periods[1].0 > victim_token && periods[1].2.is_some(), "{periods:?}");
}

#[tokio::test]
async fn report_builders_example_holds_at_most_three_permits_and_fences_each_slots_row() {
    const LOCK: &str = "report-builders";
    let env = Env::new("ex-builders").await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    apply(&env, "report-builders-postgres");
    let pg = Postgres::start().expect("postgres");
    let (db, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    let sql = |file: &str| std::fs::read_to_string(example("report-builders-postgres").join(file)).expect("sql");
    db.batch_execute(&sql("schema.sql")).await.expect("schema");
    let start = db.prepare(&sql("start.sql")).await.expect("prepare the example's start statement");
    let step = db.prepare(&sql("step.sql")).await.expect("prepare the example's step statement");

    let pods = [env.pod("b0").await, env.pod("b1").await, env.pod("b2").await, env.pod("b3").await];
    env.wait_claim_rbac(&pods[0]).await;
    let mut sidecars = Vec::new();
    for pod in &pods {
        sidecars.push(env.sidecar(pod, &[]).await);
    }
    // Three builders hold at once, one per slot.
    let mut held: Vec<(i32, i64)> = Vec::new();
    for sidecar in &sidecars[..3] {
        let (status, answer) = sidecar.acquire(LOCK, 30.0).await;
        assert_eq!(status, 200, "{answer}");
        let slot = i32::try_from(answer["slot"].as_u64().expect("slot")).expect("a small slot");
        held.push((slot, answer["fencingToken"].as_i64().expect("token")));
    }
    let mut slots: Vec<i32> = held.iter().map(|(s, _)| *s).collect();
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2]);
    // A fourth is not granted while they hold.
    let (status, answer) = sidecars[3].acquire_with(LOCK, serde_json::json!({"waitSeconds": 1})).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (409, Some("timeout")), "{answer}");
    // Each starts its report on its own slot's row: all three apply, though their tokens
    // differ (one row shared by all would refuse every holder but the latest).
    for (slot, token) in &held {
        let report = format!("report-{slot}");
        assert_eq!(db.query(&start, &[slot, token, &report]).await.expect("start").len(), 1, "slot {slot}");
        assert_eq!(db.query(&step, &[slot, token]).await.expect("step").len(), 1, "slot {slot}");
    }

    // The first builder lets go; the fourth is granted that slot with a higher token.
    let (first_slot, first_token) = held[0];
    let (status, released) = sidecars[0].release(LOCK).await;
    assert_eq!((status, released["wasHeld"].as_bool()), (200, Some(true)), "{released}");
    let (status, answer) = sidecars[3].acquire(LOCK, 30.0).await;
    assert_eq!(status, 200, "{answer}");
    let next = answer["fencingToken"].as_i64().expect("token");
    assert_eq!(answer["slot"].as_u64(), u64::try_from(first_slot).ok(), "{answer}");
    assert!(held.iter().all(|(_, t)| next > *t), "{answer}");
    assert_eq!(db.query(&start, &[&first_slot, &next, &"report-next"]).await.expect("start").len(), 1);
    // The first builder resumes after a pause with its old token: refused on its slot.
    assert!(db.query(&step, &[&first_slot, &first_token]).await.expect("step").is_empty(), "a stale step applied");
    assert!(
        db.query(&start, &[&first_slot, &first_token, &"report-stale"]).await.expect("start").is_empty(),
        "a stale start applied"
    );
    // The holders of the other slots go on, below the new token.
    for (slot, token) in &held[1..] {
        assert_eq!(db.query(&step, &[slot, token]).await.expect("step").len(), 1, "slot {slot}");
    }
    let progress: i32 =
        db.query_one("SELECT progress FROM builder_slots WHERE slot = $1", &[&first_slot]).await.expect("row").get(0);
    assert_eq!(progress, 0, "the new report's progress, untouched by the stale builder");
    for sidecar in [&sidecars[1], &sidecars[2], &sidecars[3]] {
        assert_eq!(sidecar.release(LOCK).await.0, 200);
    }
}
