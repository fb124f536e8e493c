//! Finds the control-plane binaries in the cache that `e2e/controlplane/build.sh` fills,
//! by the same rule as the script, and runs the script when one is missing.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// Names a directory under `e2e/controlplane` (e.g. `releases/v1.30`) whose `go.mod` pins
/// the release to run instead of the default one: how `make test` runs suites against the
/// oldest supported release.
pub(crate) const RELEASE_ENV: &str = "LEASEHOLD_KUBE_RELEASE";

/// The binaries every control plane needs (`kubectl` is for dumps and for tests).
const REQUIRED: [&str; 4] = ["etcd", "kube-apiserver", "kube-controller-manager", "kubectl"];

/// The pinned release and the directory holding its binaries.
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    pub(crate) dir: PathBuf,
    pub(crate) version: String,
}

impl Binaries {
    /// Locates the binaries of the release pinned in `e2e/controlplane/go.mod` — or, when
    /// [`RELEASE_ENV`] names one (`releases/v1.30`), in that directory's `go.mod` — building
    /// the missing ones first.
    pub(crate) fn locate() -> anyhow::Result<Binaries> {
        let release = std::env::var(RELEASE_ENV).ok().filter(|r| !r.is_empty());
        let controlplane = match &release {
            Some(release) => controlplane_dir().join(release),
            None => controlplane_dir(),
        };
        let go_mod = controlplane.join("go.mod");
        let text = std::fs::read_to_string(&go_mod).with_context(|| format!("failed to read {}", go_mod.display()))?;
        let version = pinned_version(&text)
            .with_context(|| format!("no k8s.io/kubernetes requirement in {}", go_mod.display()))?;
        let dir = cache_dir()?.join("controlplane").join(&version).join("bin");
        let binaries = Binaries { dir, version };
        if !binaries.missing().is_empty() {
            binaries.build(release.as_deref())?;
        }
        let missing = binaries.missing();
        if !missing.is_empty() {
            bail!("build.sh finished but {} still lacks {missing:?}", binaries.dir.display());
        }
        Ok(binaries)
    }

    /// The path of one binary.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn missing(&self) -> Vec<&'static str> {
        REQUIRED.into_iter().filter(|name| !self.path(name).is_file()).collect()
    }

    fn build(&self, release: Option<&str>) -> anyhow::Result<()> {
        // Written straight to stderr (not `eprintln!`) so that it shows even while libtest
        // captures the output of the test that happened to trigger the build.
        let _ = writeln!(
            std::io::stderr(),
            "leasehold-harness: control-plane binaries missing in {}; running build.sh \
             (a cold build takes 10-20 minutes)",
            self.dir.display()
        );
        let script = controlplane_dir().join("build.sh");
        let status = Command::new(&script)
            .args(release)
            .stdin(Stdio::null())
            // The script prints the bin directory on stdout; its progress goes to stderr.
            .stdout(Stdio::null())
            .status()
            .with_context(|| format!("failed to run {}", script.display()))?;
        if !status.success() {
            bail!("{} failed: {status}", script.display());
        }
        Ok(())
    }
}

/// `e2e/controlplane`, found relative to this crate so that tests may run from any
/// working directory.
fn controlplane_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../controlplane")
}

/// `${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}`, as in build.sh.
fn cache_dir() -> anyhow::Result<PathBuf> {
    if let Some(cache) = std::env::var_os("LEASEHOLD_CACHE").filter(|value| !value.is_empty()) {
        return Ok(PathBuf::from(cache));
    }
    let home = std::env::var_os("HOME").context("neither LEASEHOLD_CACHE nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache/leasehold"))
}

/// The `k8s.io/kubernetes` version in a go.mod (the first line whose first field is the
/// module path, like build.sh's awk).
fn pinned_version(go_mod: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        if fields.next() == Some("k8s.io/kubernetes") { fields.next().map(str::to_owned) } else { None }
    })
}

#[cfg(test)]
mod tests {
    use super::pinned_version;

    #[test]
    fn pinned_version_reads_the_require_line() {
        let go_mod = "module x\n\nrequire (\n\tk8s.io/api v0.36.3 // indirect\n\tk8s.io/kubernetes v1.36.3\n)\n";
        assert_eq!(pinned_version(go_mod).as_deref(), Some("v1.36.3"));
        assert_eq!(pinned_version("module x\n"), None);
    }
}
