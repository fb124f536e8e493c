//! What the node tests share: the node (one per test binary, with the image `make image`
//! built), Helm and kubectl pointed at it, the chart installed as a user installs it, and
//! waits on pods.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::wait::{Condition, await_condition};
use leasehold_harness::Node;

/// The release every node test installs.
pub const RELEASE: &str = "leasehold";
/// Its namespace.
pub const NAMESPACE: &str = "leasehold-system";
/// How long a pod may take to become Ready or to finish on the loaded 2-core machine.
pub const POD_WAIT: Duration = Duration::from_secs(120);

/// The repository root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The archive `make image` writes.
pub fn image_archive() -> PathBuf {
    let version = leasehold_image::leasehold::app_version(repo()).expect("the chart's appVersion");
    repo().join(format!("target/image/leasehold-{version}.oci.tar"))
}

/// The node of this test binary, with Leasehold's image imported.
pub fn node() -> &'static Node {
    leasehold_harness::shared_node(&[image_archive()])
}

/// Runs `command`; its output, or a panic naming what failed and its output.
pub fn run(mut command: Command, what: &str) -> Output {
    let output = command.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{what}: failed to start: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// stdout as text.
pub fn text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `helm` (built by e2e/tools/build.sh) with the node's kubeconfig and private directories.
pub fn helm() -> Command {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    let helm = HELM.get_or_init(|| {
        let output = run(Command::new(repo().join("e2e/tools/build.sh")), "e2e/tools/build.sh");
        text(&output).lines().find_map(|l| l.strip_prefix("helm=")).map(PathBuf::from).expect("build.sh prints helm=")
    });
    let home = node().dir().join("helm");
    let mut command = Command::new(helm);
    command
        .env("KUBECONFIG", node().kubeconfig())
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .current_dir(repo());
    command
}

/// kubectl with the node's admin kubeconfig, in the repository (relative paths as in the docs).
pub fn kubectl() -> Command {
    let mut command = node().kubectl();
    command.current_dir(repo());
    command
}

/// `kubectl apply -n <namespace> -f -` of `yaml`.
pub fn apply(namespace: &str, yaml: &str) -> String {
    use std::io::Write as _;
    let mut child = kubectl()
        .args(["apply", "-n", namespace, "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child.stdin.take().expect("stdin").write_all(yaml.as_bytes()).expect("write the manifest");
    let output = child.wait_with_output().expect("kubectl");
    assert!(output.status.success(), "kubectl apply failed: {}\n{yaml}", String::from_utf8_lossy(&output.stderr));
    text(&output)
}

/// `kubectl exec` in a container; the output (success or not).
pub fn exec(namespace: &str, pod: &str, container: &str, command: &[&str]) -> Output {
    kubectl()
        .args(["exec", "-n", namespace, pod, "-c", container, "--"])
        .args(command)
        .stdin(Stdio::null())
        .output()
        .expect("run kubectl exec")
}

/// Waits (on a watch) until `pod` meets `condition`.
pub async fn wait_pod(pods: &Api<Pod>, name: &str, what: &str, condition: impl Condition<Pod>) -> Pod {
    match tokio::time::timeout(POD_WAIT, await_condition(pods.clone(), name, condition)).await {
        Ok(Ok(Some(pod))) => pod,
        Ok(Ok(None)) => panic!("pod {name} is gone while waiting until it is {what}"),
        Ok(Err(error)) => panic!("watching pod {name}: {error}"),
        Err(_) => {
            let now = pods.get_opt(name).await.ok().flatten().and_then(|p| p.status);
            panic!("pod {name} was not {what} within {POD_WAIT:?}; status: {now:#?}")
        }
    }
}

/// A pod's Ready condition.
pub fn is_ready(pod: Option<&Pod>) -> bool {
    pod.and_then(|p| p.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The commands of the README's quickstart block (the one after the `quickstart` marker),
/// without comments.
pub fn quickstart_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let after = readme.split("<!-- quickstart:").nth(1).expect("the README marks its quickstart block");
    let block = after.split("```sh\n").nth(1).and_then(|b| b.split("\n```").next()).expect("a sh block");
    block
        .lines()
        .map(|l| l.split(" #").next().unwrap_or_default().trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Runs a documented command line as a user would: `sh -c`, in the repository, with
/// `kubectl` and `helm` on PATH and KUBECONFIG pointing at the node, defaulting to
/// `namespace`.
pub fn as_user(line: &str, namespace: &str) -> Output {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    let bin = BIN.get_or_init(|| {
        let bin = node().dir().join("user-bin");
        std::fs::create_dir_all(&bin).expect("create the user's bin directory");
        for (name, target) in [("kubectl", node().state.bin_dir.join("kubectl")), ("helm", helm().get_program().into())]
        {
            let link = bin.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, &link).expect("link a tool");
        }
        bin
    });
    let mut kubeconfig: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(node().kubeconfig()).expect("the kubeconfig")).expect("JSON");
    kubeconfig["contexts"][0]["context"]["namespace"] = serde_json::Value::from(namespace);
    let path = node().dir().join(format!("kubeconfig-{namespace}"));
    std::fs::write(&path, kubeconfig.to_string()).expect("write a kubeconfig");
    let helm_home = node().dir().join("helm");
    Command::new("sh")
        .args(["-c", line])
        .current_dir(repo())
        .env("PATH", format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default()))
        .env("KUBECONFIG", &path)
        .env("HELM_CONFIG_HOME", helm_home.join("config"))
        .env("HELM_CACHE_HOME", helm_home.join("cache"))
        .env("HELM_DATA_HOME", helm_home.join("data"))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// The chart installed once per test binary with the README's own `helm install` line
/// (`--wait`; the image's default name and tag, the chart's; nothing else set).
pub fn installed() {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    let outcome = INSTALLED.get_or_init(|| {
        let line = quickstart_commands()
            .into_iter()
            .find(|l| l.starts_with("helm install"))
            .ok_or("the quickstart has no helm install")?;
        let began = Instant::now();
        let output = as_user(&line, "default");
        if !output.status.success() {
            let state = kubectl().args(["get", "all,events", "-n", NAMESPACE]).output().map(|o| text(&o));
            return Err(format!(
                "{line} failed: {}{}\n{state:?}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        eprintln!("{line}: {:.1} s", began.elapsed().as_secs_f64());
        Ok(())
    });
    if let Err(message) = outcome {
        panic!("{message}");
    }
}

/// The first pod of `pods` (all of a namespace's pods, by label) named in the Lease
/// `namespace/name`'s holder, or the holder identity itself.
pub async fn lease_holder(client: &kube::Client, namespace: &str, name: &str) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), namespace);
    leases.get_opt(name).await.ok().flatten().and_then(|l| l.spec?.holder_identity)
}
