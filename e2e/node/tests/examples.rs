//! Every example under `examples/` on the real node, as a user runs it: `kubectl apply -k`,
//! the example's own pods, scripts and Jobs in real containers (the images they name are
//! built here from Debian's busybox-static, the pinned kubectl and the image's `leasehold`,
//! and imported under those names, as a user would build and push them).

use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::Api;
use leasehold_harness::Node;
use leasehold_image::{Entry, ImageSpec, Reference};

use crate::support::{exec, installed, kubectl, node, repo, run, text, wait_pod};

/// A busybox userland plus `extra` files, named `reference`.
fn busybox_with(reference: &str, extra: Vec<Entry>) -> ImageSpec {
    let mut spec = leasehold_harness::node::images::busybox(reference).expect("a busybox image");
    spec.entries.extend(extra);
    spec.reference = Reference::parse(reference).expect("a reference");
    spec
}

/// Builds and imports the images the examples and the quickstart name (once).
pub fn import_example_images() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let node = node();
        let kubectl = node.state.bin_dir.join("kubectl");
        let leasehold = repo().join("target/x86_64-unknown-linux-gnu/release/leasehold");
        let kubectl_entry = || Entry::from_host("/usr/local/bin/kubectl", 0o755, &kubectl).expect("kubectl");
        let worker = session_worker_binary();
        let images: [ImageSpec; 5] = [
            // The quickstart's and the leader-election example's shell.
            busybox_with("busybox:1.36", Vec::new()),
            // What fenced-configmap's writer.yaml asks for: sh, wget, kubectl.
            busybox_with("example.com/kubectl-shell:1", vec![kubectl_entry()]),
            // What the cronjob example asks for: sh, kubectl, and leasehold from its image.
            leasehold_harness::node::images::postgres("postgres:15-alpine").expect("the PostgreSQL image"),
            busybox_with(
                "example.com/report:1",
                vec![
                    kubectl_entry(),
                    Entry::from_host("/usr/local/bin/leasehold", 0o755, &leasehold).expect("leasehold"),
                ],
            ),
            // What the session-worker example asks for: its Go worker on a busybox userland.
            busybox_with(
                "example.com/session-worker:1",
                vec![Entry::from_host("/usr/local/bin/session-worker", 0o755, &worker).expect("the worker")],
            ),
        ];
        // In parallel: compressing the layers is most of the time.
        std::thread::scope(|scope| {
            for image in &images {
                scope.spawn(move || {
                    node.build_and_import(image).unwrap_or_else(|e| panic!("import {}: {e:#}", image.reference))
                });
            }
        });
    });
}

/// The session-worker example's Go worker, built statically as its Deployment's comment
/// says.
fn session_worker_binary() -> std::path::PathBuf {
    let binary = leasehold_harness::node::test_dir().with_file_name("session-worker");
    let output = std::process::Command::new("go")
        .args(["build", "-buildvcs=false", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(repo().join("examples/session-worker"))
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("run go build");
    assert!(output.status.success(), "go build: {}", String::from_utf8_lossy(&output.stderr));
    binary
}

/// `kubectl apply -n <namespace> -k examples/<name>`.
fn apply_example(namespace: &str, name: &str) -> String {
    let mut command = kubectl();
    command.args(["apply", "-n", namespace, "-k"]).arg(format!("examples/{name}"));
    text(&run(command, &format!("kubectl apply -k examples/{name}")))
}

#[test]
fn every_example_directory_runs_on_the_node() {
    let source = include_str!("examples.rs");
    for entry in std::fs::read_dir(repo().join("examples")).expect("examples/") {
        let name = entry.expect("entry").file_name().to_string_lossy().into_owned();
        let applied = format!("apply_example(&ns.name, \"{name}\")");
        // The README's quickstart (run as written by quickstart.rs) applies examples/basic.
        let in_quickstart =
            crate::support::quickstart_commands().iter().any(|c| c.contains(&format!("examples/{name}/")));
        let covered = source.contains(&applied) || in_quickstart;
        assert!(covered, "examples/{name} is not run on the node by e2e/node/tests/examples.rs");
    }
}

#[tokio::test]
async fn fenced_configmap_example_writes_with_the_holders_token_and_refuses_a_stale_writer() {
    let node = node();
    import_example_images();
    installed();
    let ns = node.namespace("ex-fenced").await;
    apply_example(&ns.name, "fenced-configmap");
    let manifest = std::fs::read_to_string(repo().join("examples/fenced-configmap/writer.yaml")).expect("writer.yaml");
    let pods: Api<Pod> = Api::namespaced(node.admin_client().await, &ns.name);
    for name in ["writer-a", "writer-b"] {
        crate::support::apply(
            &ns.name,
            &manifest.replace("name: writer\n  labels", &format!("name: {name}\n  labels")),
        );
        wait_pod(&pods, name, "Ready", |p: Option<&Pod>| crate::support::is_ready(p)).await;
    }
    let write = |pod: &str, value: &str| {
        let output = exec(&ns.name, pod, "app", &["sh", "/example/writer.sh", value]);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "writer.sh in {pod}: {stdout}{}", String::from_utf8_lossy(&output.stderr));
        stdout
            .rsplit("with token ")
            .next()
            .and_then(|t| t.trim().parse::<i64>().ok())
            .unwrap_or_else(|| panic!("{stdout}"))
    };
    let first = write("writer-a", "v2");
    let second = write("writer-b", "v3");
    assert!(second > first, "the second writer's token is higher");
    // writer-a, resuming with its old token, applies the template itself: refused.
    let stale = format!(
        "sed -e 's/\"TOKEN\"/\"{first}\"/' -e 's/routes: \"v1\"/routes: \"stale\"/' /example/configmap.yaml | \
         kubectl apply --server-side --field-manager=writer --force-conflicts -f -"
    );
    let refused = exec(&ns.name, "writer-a", "app", &["sh", "-c", &stale]);
    assert!(!refused.status.success(), "a write with a stale token was admitted");
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("stale write rejected"), "{message}");
    let stored =
        Api::<ConfigMap>::namespaced(node.admin_client().await, &ns.name).get("routing-table").await.expect("cm");
    assert_eq!(stored.data.unwrap_or_default()["routes"], "v3");
}

#[tokio::test]
async fn cronjob_example_runs_real_jobs_under_leasehold_run_once_at_a_time() {
    let node = node();
    import_example_images();
    installed();
    let ns = node.namespace("ex-cron").await;
    apply_example(&ns.name, "cronjob");
    // Two runs of the CronJob's Job at once (a retried or overlapping schedule).
    for job in ["run-a", "run-b"] {
        let mut create = kubectl();
        create.args(["create", "job", "-n", &ns.name, job, "--from=cronjob/nightly-report"]).stdin(Stdio::null());
        run(create, "kubectl create job --from=cronjob/nightly-report");
    }
    let jobs: Api<Job> = Api::namespaced(node.admin_client().await, &ns.name);
    for job in ["run-a", "run-b"] {
        let done = |j: Option<&Job>| {
            j.and_then(|j| j.status.as_ref()?.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True"))
        };
        let finished = match tokio::time::timeout(
            Duration::from_secs(180),
            kube::runtime::wait::await_condition(jobs.clone(), job, done),
        )
        .await
        {
            Ok(Ok(Some(job))) => job,
            other => panic!("job {job} did not finish: {other:?}"),
        };
        let succeeded = finished.status.and_then(|s| s.succeeded).unwrap_or(0);
        assert_eq!(succeeded, 1, "job {job} failed:\n{}", job_logs(&ns.name, job));
    }
    let (a, b) = (job_logs(&ns.name, "run-a"), job_logs(&ns.name, "run-b"));
    let did = [&a, &b].iter().filter(|l| l.contains(" done\n") || l.trim_end().ends_with(" done")).count();
    let skipped = [&a, &b].iter().filter(|l| l.contains("already done")).count();
    assert_eq!((did, skipped), (1, 1), "exactly one run does the work:\n--- run-a\n{a}\n--- run-b\n{b}");
    let period = jiff::Timestamp::now().strftime("%Y-%m-%d").to_string();
    let marker = Api::<ConfigMap>::namespaced(node.admin_client().await, &ns.name)
        .get(&format!("report-done-{period}"))
        .await
        .expect("the completion marker");
    let token = marker.metadata.annotations.unwrap_or_default().get("leasehold.dev/fencing-token").cloned();
    assert!(token.is_some_and(|t| t.parse::<i64>().is_ok()), "the marker carries the run's token");
}

fn job_logs(namespace: &str, job: &str) -> String {
    let output = kubectl().args(["logs", "-n", namespace, &format!("job/{job}")]).output().expect("kubectl logs");
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// The pods of the leader-election Deployment that hold the lock in their own view: the
/// example's `holding.sh` run in each app container, as the app runs it. Returns (pod, token).
fn leaders(namespace: &str, pods: &[String]) -> Vec<(String, i64)> {
    pods.iter()
        .filter_map(|pod| {
            let check = ". /leader/holding.sh; leasehold_holding && echo \"$LEASEHOLD_TOKEN\"";
            let output = exec(namespace, pod, "app", &["sh", "-c", check]);
            let token = String::from_utf8_lossy(&output.stdout).trim().parse().ok()?;
            output.status.success().then(|| (pod.clone(), token))
        })
        .collect()
}

async fn singleton_pods(pods: &Api<Pod>) -> Vec<String> {
    let listed = pods.list(&kube::api::ListParams::default().labels("app=singleton")).await.expect("pods");
    listed
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect()
}

#[tokio::test]
async fn leader_election_example_has_exactly_one_leader_and_its_rollouts_complete() {
    let node = node();
    import_example_images();
    installed();
    let ns = node.namespace("ex-leader").await;
    apply_example(&ns.name, "leader-election");
    let rollout = |what: &str| {
        let mut status = kubectl();
        status.args(["rollout", "status", "-n", &ns.name, "deployment/singleton", "--timeout=4m"]);
        run(status, what);
    };
    rollout("the first rollout");
    let pods: Api<Pod> = Api::namespaced(node.admin_client().await, &ns.name);
    let one_leader = |what: &'static str| {
        let pods = pods.clone();
        let namespace = ns.name.clone();
        async move {
            leasehold_harness::eventually(what, Duration::from_secs(60), || async {
                let names = singleton_pods(&pods).await;
                match leaders(&namespace, &names).as_slice() {
                    [one] if names.len() == 3 => Ok(one.clone()),
                    other => Err(format!("leaders {other:?} among {names:?}")),
                }
            })
            .await
        }
    };
    let (first_leader, first_token) = one_leader("exactly one leader of three").await;

    // A rolling update (what `helm upgrade` or a new image does) completes, and leadership
    // passes on with a higher token.
    let mut restart = kubectl();
    restart.args(["rollout", "restart", "-n", &ns.name, "deployment/singleton"]);
    run(restart, "kubectl rollout restart");
    rollout("the rolling update");
    let (leader, token) = one_leader("exactly one leader after the rolling update").await;
    assert_ne!(leader, first_leader, "every pod was replaced");
    assert!(token > first_token, "the new leader's token {token} is higher than {first_token}");
}

/// `psql` in the example's database pod.
fn query(namespace: &str, pod: &str, sql: &str) -> String {
    let output = exec(namespace, pod, "postgres", &["psql", "-U", "postgres", "-tAq", "-c", sql]);
    assert!(output.status.success(), "{sql}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Waits for the rollouts of an example's database Deployment `db` (its Pods labelled
/// `app=<db>`) and its `workers`; returns the database Pod's name.
async fn database_after_rollouts(node: &Node, namespace: &str, db: &str, workers: &str) -> String {
    for deployment in [db, workers] {
        let mut status = kubectl();
        status.args(["rollout", "status", "-n", namespace, &format!("deployment/{deployment}"), "--timeout=4m"]);
        run(status, &format!("rollout of {deployment}"));
    }
    let pods: Api<Pod> = Api::namespaced(node.admin_client().await, namespace);
    pods.list(&kube::api::ListParams::default().labels(&format!("app={db}")))
        .await
        .expect("the database pod")
        .items
        .into_iter()
        .find_map(|p| p.metadata.name)
        .expect("a database pod")
}

#[tokio::test]
async fn inventory_example_sells_from_real_pods_and_refuses_a_stale_token() {
    let node = node();
    import_example_images();
    installed();
    let ns = node.namespace("ex-inventory").await;
    apply_example(&ns.name, "inventory-postgres");
    let db = database_after_rollouts(node, &ns.name, "inventory-db", "inventory-worker").await;
    // The workers sell, one at a time under the lock, each sale stamped with its token.
    let (stock, token) = leasehold_harness::eventually("ten widgets sold", Duration::from_secs(120), || async {
        let row = query(&ns.name, &db, "SELECT stock, token FROM inventory WHERE item = 'widget'");
        let (stock, token) = row.split_once('|').ok_or_else(|| format!("no row: {row}"))?;
        let (stock, token): (i64, i64) =
            (stock.parse().map_err(|e| format!("{e}"))?, token.parse().map_err(|e| format!("{e}"))?);
        if stock <= 90 { Ok((stock, token)) } else { Err(format!("stock {stock}")) }
    })
    .await;
    assert!(token > 0 && stock >= 0, "sales carry the holder's token");
    // The workers stop; then a holder with an older token (one that paused past its lease
    // and woke up after others sold) changes nothing.
    let mut scale = kubectl();
    scale.args(["scale", "-n", &ns.name, "deployment/inventory-worker", "--replicas=0"]);
    run(scale, "scale the workers down");
    let mut gone = kubectl();
    gone.args(["wait", "-n", &ns.name, "--for=delete", "pod", "-l", "app=inventory-worker", "--timeout=2m"]);
    run(gone, "the workers are gone");
    let before = query(&ns.name, &db, "SELECT stock, token FROM inventory");
    let token: i64 = before.split_once('|').and_then(|(_, t)| t.parse().ok()).expect("a token");
    let decrement = std::fs::read_to_string(repo().join("examples/inventory-postgres/decrement.sql")).expect("sql");
    let answered = query(&ns.name, &db, &format!("PREPARE take(bigint) AS {decrement} EXECUTE take({});", token - 1));
    assert!(answered.is_empty(), "a stale token sold a widget: {answered}");
    assert_eq!(query(&ns.name, &db, "SELECT stock, token FROM inventory"), before, "nothing changed");
}

#[tokio::test]
async fn report_builders_example_holds_at_most_three_permits_from_real_pods_each_fenced_on_its_row() {
    let node = node();
    import_example_images();
    installed();
    let ns = node.namespace("ex-builders").await;
    apply_example(&ns.name, "report-builders-postgres");
    let db = database_after_rollouts(node, &ns.name, "report-db", "report-builder").await;
    let admin = node.admin_client().await;
    // Five builders, three permits: all three held at once, the others waiting.
    let locks: Api<leasehold::crd::DistributedLock> = Api::namespaced(admin, &ns.name);
    leasehold_harness::eventually("three permits held, builders waiting", Duration::from_secs(120), || async {
        let lock = locks.get("report-builders").await.map_err(|e| e.to_string())?;
        let status = lock.status.ok_or("no status")?;
        match (status.held_permits.as_deref(), status.queue_length) {
            (Some("3/3"), waiting) if waiting > 0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Every slot's row was started and stepped by a holder of that slot, with its token.
    let rows = leasehold_harness::eventually("every slot's row built", Duration::from_secs(120), || async {
        let rows = query(&ns.name, &db, "SELECT slot, token FROM builder_slots WHERE progress > 0 ORDER BY slot");
        if rows.lines().count() == 3 { Ok(rows) } else { Err(rows) }
    })
    .await;
    let (slot, token) = rows.lines().next().and_then(|r| r.split_once('|')).expect("slot 0's row");
    let token: i64 = token.parse().expect("a token");
    // A builder of slot 0 with an older token (one that paused past its lease) changes nothing.
    let step = std::fs::read_to_string(repo().join("examples/report-builders-postgres/step.sql")).expect("sql");
    let answered =
        query(&ns.name, &db, &format!("PREPARE step(int, bigint) AS {step} EXECUTE step({slot}, {});", token - 1));
    assert!(answered.is_empty(), "a stale token stepped slot {slot}: {answered}");
}

/// The lock's lease duration in the session-worker example.
const SESSION_LEASE: Duration = Duration::from_secs(15);

#[tokio::test]
async fn session_worker_example_hands_the_lock_on_at_once_when_a_workers_container_is_killed() {
    let node = node();
    import_example_images();
    installed();
    let admin = node.admin_client().await;
    let ns = node.namespace("ex-session").await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(admin.clone(), &ns.name);
    let mut grants = crate::e2e_support::watch::GrantLog::start(leases, "reports");
    apply_example(&ns.name, "session-worker");
    let mut status = kubectl();
    status.args(["rollout", "status", "-n", &ns.name, "deployment/report-worker", "--timeout=4m"]);
    run(status, "the workers' rollout");
    // The workers take turns (20 s of work each): right after a grant, kill the holder's
    // app container from the node (as the OOM killer would), mid-report.
    let first = grants.wait_for(1, Duration::from_secs(120)).await.pop().expect("a grant");
    let pod_name = first.holder.split('_').next().expect("<pod>_<uid>").to_owned();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns.name);
    let holder = pods.get(&pod_name).await.expect("the holder's pod");
    let pid = node.container_pid(&crate::pods::container_id(&holder, "app")).expect("the app's pid");
    let killed = std::time::Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL)
        .expect("kill the app container's process");
    let seen = grants.wait_for(2, SESSION_LEASE).await;
    let handover = seen[1].seen - killed;
    eprintln!("session worker's container killed → next holder granted: {:.0} ms", handover.as_secs_f64() * 1000.0);
    assert!(seen[1].token > seen[0].token, "tokens increase");
    assert!(
        seen[1].acquire_time < first.acquire_time + jiff::SignedDuration::from_secs(20),
        "the next grant came after the killed worker's 20 s report would have ended: {seen:?}"
    );
    // Released (its session closed), not expired or revoked.
    let locks: Api<leasehold::crd::DistributedLock> = Api::namespaced(admin.clone(), &ns.name);
    let lock =
        crate::e2e_support::watch::until(&locks, "reports", Duration::from_secs(30), "two grants in status", |l| {
            l.status.as_ref().is_some_and(|s| s.stats.grants >= 2)
        })
        .await;
    let stats = lock.status.expect("status").stats;
    assert_eq!(stats.expirations, 0, "the killed worker's hold expired instead of being released: {stats:?}");
}
