//! Compare-and-swap access to the objects of one namespace: lock Leases and LockClaims.
//!
//! Every write that decides ownership is a full `replace` carrying the `resourceVersion`
//! it was computed from, so a 409 means "someone moved first: re-read and decide again".
//! Deletions carry a precondition for the same reason.

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A failed operation, naming the object (`lease ns/name`, `lockclaim ns/name`).
#[derive(Debug, thiserror::Error)]
pub enum CasError {
    /// The object changed since it was read (HTTP 409 on update, or a failed delete
    /// precondition).
    #[error("{kind} {namespace}/{name} changed since it was read (conflict)")]
    Conflict {
        /// Kind of the object, lowercase.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The object does not exist (HTTP 404).
    #[error("{kind} {namespace}/{name} does not exist")]
    NotFound {
        /// Kind of the object, lowercase.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The object already exists (HTTP 409 on create).
    #[error("{kind} {namespace}/{name} already exists")]
    AlreadyExists {
        /// Kind of the object, lowercase.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The apiserver refused the write (RBAC or admission, HTTP 403 or 422).
    #[error("failed to {verb} {kind} {namespace}/{name}: forbidden: {message}")]
    Forbidden {
        /// What was attempted.
        verb: &'static str,
        /// Kind of the object, lowercase.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The apiserver's message.
        message: String,
    },
    /// The apiserver no longer accepts our credentials (HTTP 401): for a Pod-bound token,
    /// the Pod is gone.
    #[error("failed to {verb} {kind} {namespace}/{name}: unauthorized: {message}")]
    Unauthorized {
        /// What was attempted.
        verb: &'static str,
        /// Kind of the object, lowercase.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The apiserver's message.
        message: String,
    },
    /// The request did not complete in time (a connection that died silently).
    #[error("failed to {verb} {kind} {namespace}/{name}: no answer within {after:?}")]
    Timeout {
        /// What was attempted.
        verb: &'static str,
        /// Kind of the object, lowercase.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The limit.
        after: std::time::Duration,
    },
    /// Any other failure (network, server error).
    #[error("failed to {verb} {kind} {namespace}/{name}: {source}")]
    Api {
        /// What was attempted.
        verb: &'static str,
        /// Kind of the object, lowercase.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
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
            CasError::Unauthorized { .. } => "unauthorized",
            CasError::Timeout { .. } => "timeout",
            CasError::Api { .. } => "api",
        }
    }

    /// Whether trying again may succeed: no answer in time, or a busy (429), failing (5xx)
    /// or unreachable apiserver. A refusal (403, 404, a conflict) is an answer, not a
    /// passing state. A write that failed so may still have landed.
    pub fn is_transient(&self) -> bool {
        match self {
            CasError::Timeout { .. } => true,
            CasError::Api { source, .. } => super::retry::may_pass(source),
            _ => false,
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

/// How long one request may take. A request answers in milliseconds; one that does not
/// answer in seconds went to a connection that died without telling (an apiserver
/// restarted, a network path dropped), and must not stall a renewal, a grant or an
/// acquisition behind it.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Objects of kind `K` in one namespace, with every write a compare-and-swap.
#[derive(Clone)]
pub struct CasStore<K> {
    api: Api<K>,
    namespace: String,
    kind: String,
    manager: &'static str,
}

/// Leases of one namespace.
pub type LeaseStore = CasStore<Lease>;

/// What a delete must find to go ahead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precondition<'a> {
    /// Delete whatever has the name.
    #[default]
    None,
    /// Only this version of the object.
    ResourceVersion(&'a str),
    /// Only this object (not a later one re-created under the same name).
    Uid(&'a str),
}

impl<K> CasStore<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    /// Objects in `namespace`, written with field manager `manager`.
    pub fn new(client: kube::Client, namespace: &str, manager: &'static str) -> CasStore<K> {
        CasStore {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            kind: K::kind(&()).to_lowercase(),
            manager,
        }
    }

    /// The underlying API handle (for watches).
    pub fn api(&self) -> &Api<K> {
        &self.api
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn error(&self, verb: &'static str, name: &str, source: kube::Error) -> CasError {
        let (kind, namespace, name) = (self.kind.clone(), self.namespace.clone(), name.to_owned());
        match (&source, verb) {
            (kube::Error::Api(s), "create") if s.code == 409 => CasError::AlreadyExists { kind, namespace, name },
            (kube::Error::Api(s), _) if s.code == 409 => CasError::Conflict { kind, namespace, name },
            (kube::Error::Api(s), _) if s.code == 404 => CasError::NotFound { kind, namespace, name },
            (kube::Error::Api(s), _) if s.code == 401 => {
                CasError::Unauthorized { verb, kind, namespace, name, message: s.message.clone() }
            }
            (kube::Error::Api(s), _) if s.code == 403 || s.code == 422 => {
                CasError::Forbidden { verb, kind, namespace, name, message: s.message.clone() }
            }
            _ => CasError::Api { verb, kind, namespace, name, source },
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
                kind: self.kind.clone(),
                namespace: self.namespace.clone(),
                name: name.to_owned(),
                after: REQUEST_TIMEOUT,
            }),
        }
    }

    fn post_params(&self) -> PostParams {
        PostParams { dry_run: false, field_manager: Some(self.manager.to_owned()) }
    }

    /// Reads an object; `None` when it does not exist.
    pub async fn get(&self, name: &str) -> Result<Option<K>, CasError> {
        self.bounded("get", name, self.api.get_opt(name)).await
    }

    /// Creates an object.
    pub async fn create(&self, object: &K) -> Result<K, CasError> {
        let name = object.name_any();
        self.bounded("create", &name, self.api.create(&self.post_params(), object)).await
    }

    /// Replaces an object if its `resourceVersion` is still the one in `object`'s metadata.
    pub async fn replace(&self, object: &K) -> Result<K, CasError> {
        let name = object.name_any();
        debug_assert!(object.meta().resource_version.is_some(), "a CAS write needs a resourceVersion");
        self.bounded("update", &name, self.api.replace(&name, &self.post_params(), object)).await
    }

    /// Deletes an object if it is still at `resource_version` (any version when `None`).
    /// Deleting an object that is already gone is success.
    pub async fn delete(&self, name: &str, resource_version: Option<&str>) -> Result<(), CasError> {
        self.delete_if(name, resource_version.map_or(Precondition::None, Precondition::ResourceVersion)).await
    }

    /// Deletes an object if it meets `precondition` (409 → [`CasError::Conflict`]).
    /// Deleting an object that is already gone is success.
    pub async fn delete_if(&self, name: &str, precondition: Precondition<'_>) -> Result<(), CasError> {
        let preconditions = match precondition {
            Precondition::None => None,
            Precondition::ResourceVersion(rv) => {
                Some(Preconditions { resource_version: Some(rv.to_owned()), uid: None })
            }
            Precondition::Uid(uid) => Some(Preconditions { resource_version: None, uid: Some(uid.to_owned()) }),
        };
        let params = DeleteParams { preconditions, ..DeleteParams::default() };
        match self.bounded("delete", name, self.api.delete(name, &params)).await {
            Ok(_) | Err(CasError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
