//! Container images without a container engine: a deterministic, single-layer OCI image
//! archive (an image layout in a tar file, as `ctr images import`, `skopeo copy oci-archive:`
//! and `docker load` of recent versions read it) from a list of files.
//!
//! Same inputs, same bytes: every tar header has mtime 0 and numeric owners, entries are
//! sorted, gzip carries no timestamp or name, and every JSON document is written with its
//! keys sorted. The image's digest (its manifest's) is therefore a function of the files,
//! the configuration and the name alone.
//!
//! [`leasehold`] describes Leasehold's own image (what `make image` builds and what the
//! `Dockerfile` builds for users with a container engine); [`dockerfile`] reads the
//! Dockerfile's final stage so that a test can check that both put in the same things.

pub mod archive;
pub mod dockerfile;
pub mod layer;
pub mod leasehold;
pub mod spec;

pub use archive::{Built, write_archive, write_archive_cached};
pub use spec::{Content, Entry, ImageSpec, Reference};

/// Why an image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file of the image could not be read, or the archive written.
    #[error("{what}: {source}")]
    Io {
        /// What was being read or written.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// An image reference is not `name:tag`.
    #[error("image reference {0:?} is not of the form name:tag")]
    Reference(String),
    /// A path inside the image is not absolute, or repeats.
    #[error("image path {path:?}: {problem}")]
    Path {
        /// The path.
        path: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// An OCI document could not be built.
    #[error("OCI {what}: {source}")]
    Oci {
        /// Which document.
        what: &'static str,
        /// The cause.
        source: oci_spec::OciSpecError,
    },
}

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}
