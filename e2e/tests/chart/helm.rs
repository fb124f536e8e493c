//! Helm and the chart's tools for tests: the binaries from `e2e/tools/build.sh` (built from
//! the Go module proxy on first use), a Helm with its own config/cache/data directories per
//! test, and `helm template` output as JSON values.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use leasehold_harness::ControlPlane;
use serde_json::Value;

/// The release name and namespace every chart test uses (each on its own control plane).
pub const RELEASE: &str = "leasehold";
/// See [`RELEASE`].
pub const NAMESPACE: &str = "leasehold-system";

/// The repository root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The chart directory.
pub fn chart_dir() -> PathBuf {
    repo().join("charts/leasehold")
}

/// Path of a tool built by `e2e/tools/build.sh` (`helm`, `kubeconform`).
pub fn tool(name: &str) -> PathBuf {
    static TOOLS: OnceLock<HashMap<String, PathBuf>> = OnceLock::new();
    let tools = TOOLS.get_or_init(|| {
        let script = repo().join("e2e/tools/build.sh");
        let output = std::process::Command::new(&script)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("failed to run {}: {e}", script.display()));
        assert!(output.status.success(), "{} failed: {}", script.display(), String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(name, path)| (name.to_owned(), PathBuf::from(path)))
            .collect()
    });
    tools.get(name).unwrap_or_else(|| panic!("e2e/tools/build.sh does not provide {name}")).clone()
}

/// Helm with private directories, optionally pointed at a control plane.
pub struct Helm {
    home: PathBuf,
    kubeconfig: Option<PathBuf>,
}

impl Helm {
    /// Helm for `helm template` and `helm lint` (no cluster).
    pub fn offline() -> Helm {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let home = std::env::temp_dir().join("leasehold-e2e").join(format!(
            "helm-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&home).expect("create Helm's home");
        Helm { home, kubeconfig: None }
    }

    /// Helm that installs into `cp` as its admin.
    pub fn for_cluster(cp: &ControlPlane) -> Helm {
        let mut helm = Helm::offline();
        helm.kubeconfig = Some(cp.kubeconfig_path().to_owned());
        helm
    }

    /// Runs helm with `args`; stdout on success, the failure's output as the error.
    pub async fn run(&self, args: &[&str]) -> Result<String, String> {
        let mut command = tokio::process::Command::new(tool("helm"));
        command
            .args(args)
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_DATA_HOME", self.home.join("data"))
            .stdin(std::process::Stdio::null());
        if let Some(kubeconfig) = &self.kubeconfig {
            command.env("KUBECONFIG", kubeconfig);
        }
        let output = command.output().await.map_err(|e| format!("failed to run helm: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "helm {} failed ({}): {}{stdout}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    /// Like [`Self::run`], panicking on failure.
    pub async fn must(&self, args: &[&str]) -> String {
        self.run(args).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// `helm template` of the chart with `--set` values, as the rendered objects.
    pub async fn template(&self, sets: &[&str]) -> Vec<Value> {
        let chart = chart_dir();
        let version = pinned_release();
        let mut args = vec!["template", RELEASE, chart.to_str().expect("a UTF-8 path"), "--namespace", NAMESPACE];
        args.extend(["--kube-version", version.as_str()]);
        for set in sets {
            args.extend(["--set", set]);
        }
        objects(&self.must(&args).await)
    }
}

impl Drop for Helm {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// The release pinned in `e2e/controlplane/go.mod`.
pub fn pinned_release() -> String {
    leasehold_harness::schemas::pinned_release().expect("the pinned release is readable")
}

/// The objects of a YAML stream (empty documents dropped).
pub fn objects(yaml: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap_or_else(|e| panic!("not YAML: {e}\n{yaml}"));
    docs.into_iter().filter(|d| d.is_object()).collect()
}

/// The object of `kind` named `name`, if rendered.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects.iter().find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

/// How many objects of `kind` were rendered.
pub fn count(objects: &[Value], kind: &str) -> usize {
    objects.iter().filter(|o| o["kind"] == kind).count()
}
