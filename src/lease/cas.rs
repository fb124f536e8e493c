//! Compare-and-swap access to the objects of one namespace: lock Leases and LockClaims.
//!
//! Every write that decides ownership is a full `replace` carrying the `resourceVersion`
//! it was computed from, so a 409 means "someone moved first: re-read and decide again".
//! Deletions carry a precondition for the same reason.

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, GetParams, PostParams, Preconditions};
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

    /// Whether the apiserver answered 429: busy, to be asked again after longer pauses.
    pub fn is_busy(&self) -> bool {
        matches!(self, CasError::Api { source, .. } if super::retry::is_busy(source))
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

/// How long the apiserver is told it has for each request of a [`CasStore`] (the request's
/// `timeout` parameter): short of [`REQUEST_TIMEOUT`], so that an apiserver too busy to
/// finish in time answers 504 before the client gives up. It then stops working on a
/// request nobody waits for, and the connection stays open for the next one: over
/// HTTP/1.1 a request abandoned before its answer costs its connection, and every try
/// after it a new TLS handshake — under overload, nearly a fifth of the apiserver's CPU.
pub const SERVER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(4);
const _: () = assert!(SERVER_DEADLINE.as_secs() < REQUEST_TIMEOUT.as_secs() && SERVER_DEADLINE.subsec_nanos() == 0);

/// `request` with [`SERVER_DEADLINE`] as its `timeout` parameter.
pub fn with_deadline<B>(mut request: http::Request<B>) -> Result<http::Request<B>, kube::core::request::Error> {
    let uri = request.uri();
    let deadline = format!("timeout={}s", SERVER_DEADLINE.as_secs());
    let query = match uri.query() {
        Some(query) if !query.is_empty() => format!("{query}&{deadline}"),
        _ => deadline,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(
        format!("{}?{query}", uri.path())
            .parse()
            .map_err(|e: http::uri::InvalidUri| kube::core::request::Error::BuildRequest(e.into()))?,
    );
    *request.uri_mut() =
        http::Uri::from_parts(parts).map_err(|e| kube::core::request::Error::BuildRequest(e.into()))?;
    Ok(request)
}

/// Objects of kind `K` in one namespace, with every write a compare-and-swap.
#[derive(Clone)]
pub struct CasStore<K> {
    api: Api<K>,
    /// The client under `api`, for the requests built here (an `Api` only gives its
    /// client away, not lends it).
    client: kube::Client,
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
            api: Api::namespaced(client.clone(), namespace),
            client,
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

    /// A request builder for this store's objects.
    fn request(&self) -> kube::core::Request {
        kube::core::Request::new(self.api.resource_url())
    }

    /// Sends `built` with [`SERVER_DEADLINE`], bounded by [`REQUEST_TIMEOUT`].
    async fn send<T: DeserializeOwned>(
        &self,
        verb: &'static str,
        name: &str,
        built: Result<http::Request<Vec<u8>>, kube::Error>,
    ) -> Result<T, CasError> {
        let request = built.and_then(|r| with_deadline(r).map_err(kube::Error::BuildRequest));
        match request {
            Ok(request) => self.bounded(verb, name, self.client.request::<T>(request)).await,
            Err(e) => Err(self.error(verb, name, e)),
        }
    }

    /// A write of `object` that `build` makes from its body.
    fn write(
        object: &K,
        build: impl FnOnce(Vec<u8>) -> Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<http::Request<Vec<u8>>, kube::Error> {
        let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
        build(body).map_err(kube::Error::BuildRequest)
    }

    /// Reads an object; `None` when it does not exist.
    pub async fn get(&self, name: &str) -> Result<Option<K>, CasError> {
        let built = self.request().get(name, &GetParams::default()).map_err(kube::Error::BuildRequest);
        match self.send::<K>("get", name, built).await {
            Ok(object) => Ok(Some(object)),
            Err(CasError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates an object.
    pub async fn create(&self, object: &K) -> Result<K, CasError> {
        let name = object.name_any();
        let built = Self::write(object, |body| self.request().create(&self.post_params(), body));
        self.send("create", &name, built).await
    }

    /// Replaces an object if its `resourceVersion` is still the one in `object`'s metadata.
    pub async fn replace(&self, object: &K) -> Result<K, CasError> {
        let name = object.name_any();
        debug_assert!(object.meta().resource_version.is_some(), "a CAS write needs a resourceVersion");
        let built = Self::write(object, |body| self.request().replace(&name, &self.post_params(), body));
        self.send("update", &name, built).await
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
        let built = self.request().delete(name, &params).map_err(kube::Error::BuildRequest);
        // The answer is the object (still finalizing) or a Status: either way, accepted.
        match self.send::<serde::de::IgnoredAny>("delete", name, built).await {
            Ok(_) | Err(CasError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_joins_the_query_and_keeps_the_rest() {
        let leases = "/apis/coordination.k8s.io/v1/namespaces/shop/leases";
        let table = [
            ("no query", format!("{leases}/orders"), format!("{leases}/orders?timeout=4s")),
            ("an empty query", format!("{leases}/orders?"), format!("{leases}/orders?timeout=4s")),
            (
                "a query",
                format!("{leases}?fieldManager=leasehold"),
                format!("{leases}?fieldManager=leasehold&timeout=4s"),
            ),
        ];
        for (name, uri, expected) in table {
            let request = http::Request::put(uri).body(vec![1u8, 2]).expect("a valid request");
            let request = with_deadline(request).expect("a deadline fits any request");
            assert_eq!(request.uri().to_string(), expected, "{name}");
            assert_eq!(request.method(), http::Method::PUT, "{name}");
            assert_eq!(request.body(), &vec![1u8, 2], "{name}");
        }
    }
}
