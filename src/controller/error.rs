//! Controller errors, each naming the object it concerns.

use crate::lease::CasError;

/// A failed reconcile step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Lease operation failed.
    #[error(transparent)]
    Lease(#[from] CasError),
    /// Writing a lock's status failed.
    #[error("failed to apply status of distributedlock {namespace}/{name}: {source}")]
    Status {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// Reading a lock from the apiserver failed.
    #[error("failed to read distributedlock {namespace}/{name}: {source}")]
    Read {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// Stamping or clearing the force-release annotations failed.
    #[error("failed to update the force-release annotations of distributedlock {namespace}/{name}: {source}")]
    Annotation {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// Writing a ForceReleaseRequest's status failed.
    #[error("failed to apply status of forcereleaserequest {namespace}/{name}: {source}")]
    Request {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// Adding or removing the finalizer failed.
    #[error("failed to {verb} the finalizer of distributedlock {namespace}/{name}: {source}")]
    Finalizer {
        /// `add` or `remove`.
        verb: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// Reading a Pod failed.
    #[error("failed to read pod {namespace}/{name}: {source}")]
    Pod {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// A reconcile took too long (an apiserver request hung).
    #[error("reconcile of distributedlock {namespace}/{name} timed out after {after:?}")]
    Timeout {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The limit.
        after: std::time::Duration,
    },
    /// Preparing a namespace's RBAC for claimants failed.
    #[error("failed to {verb} {kind} {namespace}/{name}: {source}")]
    Rbac {
        /// What was done: apply, read or delete.
        verb: &'static str,
        /// Role or RoleBinding.
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// A short label for metrics.
    pub fn category(&self) -> String {
        match self {
            Error::Lease(e) => format!("lease_{}", e.category()),
            Error::Status { .. } => "status".into(),
            Error::Read { .. } => "read".into(),
            Error::Annotation { .. } => "annotation".into(),
            Error::Request { .. } => "request".into(),
            Error::Finalizer { .. } => "finalizer".into(),
            Error::Pod { .. } => "pod".into(),
            Error::Rbac { .. } => "rbac".into(),
            Error::Timeout { .. } => "timeout".into(),
        }
    }
}
