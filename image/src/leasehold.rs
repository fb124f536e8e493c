//! Leasehold's image: the statically linked `leasehold` binary, beside it the sidecar alone
//! (`leasehold-sidecar`, which the chart injects into app pods), the `nonroot` user and
//! nothing else (no shell, no C library, no CA certificates: every component reaches only
//! the apiserver, verified with the ServiceAccount's CA). Named after the chart: its
//! `image.repository` and `appVersion`, so that a default `helm install` runs exactly it.
//!
//! The `Dockerfile` builds the same image for users with a container engine; its final
//! stage must agree with [`USER`], [`ENTRYPOINT`], [`CMD`], [`labels`] and the files (a
//! test compares them, see [`crate::dockerfile`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use object::read::elf::{ElfFile64, ProgramHeader as _};

use crate::{Entry, Error, ImageSpec, Reference};

/// The numeric user and group (distroless's `nonroot`): the kubelet can check
/// `runAsNonRoot` only against a numeric user.
pub const USER: &str = "65532:65532";
/// Where the binary is, and how every role starts.
pub const ENTRYPOINT: &str = "/leasehold";
/// Where the sidecar-only binary is: the command of the injected sidecar container.
pub const SIDECAR: &str = "/leasehold-sidecar";
/// Arguments when none are given.
pub const CMD: &str = "--help";
/// The directory of the repository whose tree is copied to `/` (`/etc/passwd`, `/etc/group`).
pub const ROOTFS: &str = "image/rootfs";

/// Why the Leasehold image cannot be described.
#[derive(Debug, thiserror::Error)]
pub enum LeaseholdImageError {
    /// A file of the repository could not be read or parsed.
    #[error("{path}: {problem}")]
    Repository {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The binary is not statically linked, so it would not run in an image without a C library.
    #[error(
        "{0} is dynamically linked (it names an ELF interpreter); build it with \
         RUSTFLAGS='-C target-feature=+crt-static' and --target x86_64-unknown-linux-gnu (make image does)"
    )]
    NotStatic(PathBuf),
    /// Building the image failed.
    #[error(transparent)]
    Image(#[from] Error),
}

fn read(path: &Path) -> Result<String, LeaseholdImageError> {
    std::fs::read_to_string(path)
        .map_err(|e| LeaseholdImageError::Repository { path: path.to_owned(), problem: e.to_string() })
}

fn yaml_string(path: &Path, keys: &[&str]) -> Result<String, LeaseholdImageError> {
    let document: serde_json::Value = serde_saphyr::from_str(&read(path)?)
        .map_err(|e| LeaseholdImageError::Repository { path: path.to_owned(), problem: e.to_string() })?;
    keys.iter()
        .try_fold(&document, |value, key| value.get(key))
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| LeaseholdImageError::Repository {
            path: path.to_owned(),
            problem: format!("no string at {}", keys.join(".")),
        })
}

/// The chart's `appVersion`.
pub fn app_version(repo: &Path) -> Result<String, LeaseholdImageError> {
    yaml_string(&repo.join("charts/leasehold/Chart.yaml"), &["appVersion"])
}

/// The image a default install of the chart runs: `image.repository:appVersion`.
pub fn chart_reference(repo: &Path) -> Result<Reference, LeaseholdImageError> {
    let repository = yaml_string(&repo.join("charts/leasehold/values.yaml"), &["image", "repository"])?;
    Ok(Reference::parse(&format!("{repository}:{}", app_version(repo)?))?)
}

/// The image's labels (OCI annotation keys).
pub fn labels(version: &str) -> BTreeMap<String, String> {
    [
        ("org.opencontainers.image.title", "leasehold"),
        (
            "org.opencontainers.image.description",
            "Safe distributed locks for Kubernetes: FIFO grants, fencing tokens, a renewal sidecar",
        ),
        ("org.opencontainers.image.licenses", "Apache-2.0"),
        ("org.opencontainers.image.version", version),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Refuses a binary that needs a dynamic loader.
pub fn check_static(binary: &Path) -> Result<(), LeaseholdImageError> {
    let bytes = std::fs::read(binary)
        .map_err(|e| LeaseholdImageError::Repository { path: binary.to_owned(), problem: e.to_string() })?;
    let elf =
        ElfFile64::<object::Endianness>::parse(bytes.as_slice()).map_err(|e| LeaseholdImageError::Repository {
            path: binary.to_owned(),
            problem: format!("not a 64-bit ELF executable: {e}"),
        })?;
    let endian = elf.endian();
    if elf.elf_program_headers().iter().any(|header| header.p_type(endian) == object::elf::PT_INTERP) {
        return Err(LeaseholdImageError::NotStatic(binary.to_owned()));
    }
    Ok(())
}

/// Leasehold's image, from the repository at `repo` and the static binaries `binary`
/// (`leasehold`) and `sidecar` (`leasehold-sidecar`), named `reference` (default:
/// [`chart_reference`]).
pub fn spec(
    repo: &Path,
    binary: &Path,
    sidecar: &Path,
    reference: Option<Reference>,
) -> Result<ImageSpec, LeaseholdImageError> {
    check_static(binary)?;
    check_static(sidecar)?;
    assemble(repo, binary, sidecar, reference)
}

/// [`spec`] without the check that the binaries are static (for tests of the contents).
pub fn assemble(
    repo: &Path,
    binary: &Path,
    sidecar: &Path,
    reference: Option<Reference>,
) -> Result<ImageSpec, LeaseholdImageError> {
    let reference = match reference {
        Some(reference) => reference,
        None => chart_reference(repo)?,
    };
    let mut spec = ImageSpec::new(reference);
    spec.add_tree(&repo.join(ROOTFS), "/")?;
    spec.entries.push(Entry::from_host(ENTRYPOINT, 0o755, binary)?);
    spec.entries.push(Entry::from_host(SIDECAR, 0o755, sidecar)?);
    spec.user = Some(USER.to_owned());
    spec.entrypoint = vec![ENTRYPOINT.to_owned()];
    spec.cmd = vec![CMD.to_owned()];
    spec.labels = labels(&app_version(repo)?);
    Ok(spec)
}
