//! Compare-and-swap access to Leases in one namespace.
//!
//! Every write that decides ownership is a full `replace` carrying the `resourceVersion`
//! it was computed from, so a 409 means "someone moved first: re-read and decide again".
//! Deletions carry a precondition for the same reason.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};

/// A failed Lease operation, naming the Lease.
#[derive(Debug, thiserror::Error)]
pub enum CasError {
    /// The Lease changed since it was read (HTTP 409 on update).
    #[error("lease {namespace}/{name} changed since it was read (conflict)")]
    Conflict {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
    },
    /// The Lease does not exist (HTTP 404).
    #[error("lease {namespace}/{name} does not exist")]
    NotFound {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
    },
    /// The Lease already exists (HTTP 409 on create).
    #[error("lease {namespace}/{name} already exists")]
    AlreadyExists {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
    },
    /// The apiserver refused the write (RBAC or admission, HTTP 403 or 422).
    #[error("failed to {verb} lease {namespace}/{name}: forbidden: {message}")]
    Forbidden {
        /// What was attempted.
        verb: &'static str,
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// The apiserver's message.
        message: String,
    },
    /// The request did not complete in time (a connection that died silently).
    #[error("failed to {verb} lease {namespace}/{name}: no answer within {after:?}")]
    Timeout {
        /// What was attempted.
        verb: &'static str,
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// The limit.
        after: std::time::Duration,
    },
    /// Any other failure (network, server error).
    #[error("failed to {verb} lease {namespace}/{name}: {source}")]
    Api {
        /// What was attempted.
        verb: &'static str,
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
}

impl CasError {
    /// A short label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            CasError::Conflict { .. } => "conflict",
            CasError::NotFound { .. } => "not_found",
            CasError::AlreadyExists { .. } => "already_exists",
            CasError::Forbidden { .. } => "forbidden",
            CasError::Timeout { .. } => "timeout",
            CasError::Api { .. } => "api",
        }
    }
}

/// The HTTP status of an apiserver error, if it is one.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// How long one Lease request may take. A Lease request answers in milliseconds; one
/// that does not answer in seconds went to a connection that died without telling (an
/// apiserver restarted, a network path dropped), and must not stall a renewal, a grant or
/// an acquisition behind it.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Leases of one namespace, with every write a compare-and-swap.
#[derive(Clone)]
pub struct LeaseStore {
    api: Api<Lease>,
    namespace: String,
    manager: &'static str,
}

impl LeaseStore {
    /// Leases in `namespace`, written with field manager `manager`.
    pub fn new(client: kube::Client, namespace: &str, manager: &'static str) -> LeaseStore {
        LeaseStore { api: Api::namespaced(client, namespace), namespace: namespace.to_owned(), manager }
    }

    /// The underlying API handle (for watches).
    pub fn api(&self) -> &Api<Lease> {
        &self.api
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn error(&self, verb: &'static str, name: &str, source: kube::Error) -> CasError {
        let (namespace, name) = (self.namespace.clone(), name.to_owned());
        match (&source, verb) {
            (kube::Error::Api(s), "create") if s.code == 409 => CasError::AlreadyExists { namespace, name },
            (kube::Error::Api(s), _) if s.code == 409 => CasError::Conflict { namespace, name },
            (kube::Error::Api(s), _) if s.code == 404 => CasError::NotFound { namespace, name },
            (kube::Error::Api(s), _) if s.code == 403 || s.code == 422 => {
                CasError::Forbidden { verb, namespace, name, message: s.message.clone() }
            }
            _ => CasError::Api { verb, namespace, name, source },
        }
    }

    /// Runs one request with [`REQUEST_TIMEOUT`].
    async fn bounded<T>(
        &self,
        verb: &'static str,
        name: &str,
        request: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, CasError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
            Ok(result) => result.map_err(|e| self.error(verb, name, e)),
            Err(_) => Err(CasError::Timeout {
                verb,
                namespace: self.namespace.clone(),
                name: name.to_owned(),
                after: REQUEST_TIMEOUT,
            }),
        }
    }

    fn post_params(&self) -> PostParams {
        PostParams { dry_run: false, field_manager: Some(self.manager.to_owned()) }
    }

    /// Reads a Lease; `None` when it does not exist.
    pub async fn get(&self, name: &str) -> Result<Option<Lease>, CasError> {
        self.bounded("get", name, self.api.get_opt(name)).await
    }

    /// Creates a Lease.
    pub async fn create(&self, lease: &Lease) -> Result<Lease, CasError> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        self.bounded("create", &name, self.api.create(&self.post_params(), lease)).await
    }

    /// Replaces a Lease if its `resourceVersion` is still the one in `lease.metadata`.
    pub async fn replace(&self, lease: &Lease) -> Result<Lease, CasError> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        debug_assert!(lease.metadata.resource_version.is_some(), "a CAS write needs a resourceVersion");
        self.bounded("update", &name, self.api.replace(&name, &self.post_params(), lease)).await
    }

    /// Deletes a Lease if it is still at `resource_version` (any version when `None`).
    /// Deleting a Lease that is already gone is success.
    pub async fn delete(&self, name: &str, resource_version: Option<&str>) -> Result<(), CasError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions { resource_version: resource_version.map(str::to_owned), uid: None }),
            ..DeleteParams::default()
        };
        match self.bounded("delete", name, self.api.delete(name, &params)).await {
            Ok(_) | Err(CasError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
