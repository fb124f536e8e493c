//! [`TestNamespace`]: one fresh namespace per test, with helpers for the identities a test
//! needs (service accounts, Pod objects, tokens bound to those Pods), and a dump of the
//! namespace's state to stderr when the test panics.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;
use k8s_openapi::{
    api::{
        authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
        core::v1::{Container, Namespace, Pod, PodSpec, ServiceAccount},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::api::{Api, PostParams};

use crate::{ControlPlane, kubeconfig::Identity, process, startup};

/// Lifetime of tokens from [`TestNamespace::pod_token`]: longer than any test.
const POD_TOKEN_SECONDS: i64 = 3600;

/// The image of test Pods. Without a kubelet nothing pulls it; `.invalid` makes sure
/// nothing ever could.
const PLACEHOLDER_IMAGE: &str = "leasehold.invalid/never-pulled:0";

/// What `kubectl get` dumps when a test fails.
const DUMPED_KINDS: &str = "all,leases,events,configmaps,serviceaccounts,roles,rolebindings";

/// A namespace created for one test; `client` is an admin client defaulting to it.
///
/// Not deleted on drop: the control plane is thrown away with the test binary, and a
/// failed test's objects are worth keeping. If the test panics, every object in the
/// namespace is written to stderr (libtest shows it with the failure).
pub struct TestNamespace {
    /// The generated name, `<prefix>-<random suffix>`.
    pub name: String,
    /// An admin client whose default namespace is this one.
    pub client: kube::Client,
    server_url: String,
    ca_pem: String,
    kubectl: PathBuf,
    admin_kubeconfig: PathBuf,
    /// Where the component logs are, for the failure report.
    work_dir: PathBuf,
}

/// How to reach a cluster as its admin: what a [`TestNamespace`] needs.
pub(crate) struct Access {
    pub(crate) admin: kube::Client,
    pub(crate) server_url: String,
    pub(crate) ca_pem: String,
    pub(crate) admin_token: String,
    pub(crate) kubectl: PathBuf,
    pub(crate) admin_kubeconfig: PathBuf,
    pub(crate) work_dir: PathBuf,
}

impl TestNamespace {
    pub(crate) async fn create(control_plane: &ControlPlane, prefix: &str) -> anyhow::Result<TestNamespace> {
        let access = Access {
            admin: control_plane.admin_client().await,
            server_url: control_plane.server_url().to_owned(),
            ca_pem: control_plane.ca_pem().to_owned(),
            admin_token: control_plane.admin_token().to_owned(),
            kubectl: control_plane.binary("kubectl"),
            admin_kubeconfig: control_plane.kubeconfig_path().to_owned(),
            work_dir: control_plane.work_dir().to_owned(),
        };
        Self::create_with(&access, prefix).await
    }

    pub(crate) async fn create_with(access: &Access, prefix: &str) -> anyhow::Result<TestNamespace> {
        let namespace = Namespace {
            metadata: ObjectMeta {
                // The apiserver appends a unique suffix: no clashes across tests or runs.
                generate_name: Some(format!("{}-", dns_label_prefix(prefix))),
                labels: Some(BTreeMap::from([("leasehold.dev/e2e".to_owned(), "true".to_owned())])),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let created = Api::<Namespace>::all(access.admin.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("failed to create a namespace with prefix {prefix:?}"))?;
        let name = created.metadata.name.context("the apiserver returned a namespace without a name")?;
        let identity = Identity {
            server: &access.server_url,
            ca_pem: &access.ca_pem,
            user: startup::ADMIN_USER,
            token: &access.admin_token,
            namespace: &name,
        };
        let client = identity.client().await?;
        Ok(TestNamespace {
            name,
            client,
            server_url: access.server_url.clone(),
            ca_pem: access.ca_pem.clone(),
            kubectl: access.kubectl.clone(),
            admin_kubeconfig: access.admin_kubeconfig.clone(),
            work_dir: access.work_dir.clone(),
        })
    }

    /// Creates a ServiceAccount (with no permissions) and returns the stored object.
    pub async fn service_account(&self, name: &str) -> ServiceAccount {
        let service_account = ServiceAccount { metadata: self.metadata(name, &[]), ..ServiceAccount::default() };
        Api::<ServiceAccount>::namespaced(self.client.clone(), &self.name)
            .create(&PostParams::default(), &service_account)
            .await
            .unwrap_or_else(|error| panic!("failed to create ServiceAccount {}/{name}: {error}", self.name))
    }

    /// Creates a Pod object running as `service_account` and returns the stored Pod (with
    /// its uid). Without a kubelet it never runs: it exists so that tokens can be bound to
    /// it and so that RBAC and admission see what they would see in a cluster.
    pub async fn pod(&self, name: &str, service_account: &str, labels: &[(&str, &str)]) -> Pod {
        let pod = Pod {
            metadata: self.metadata(name, labels),
            spec: Some(PodSpec {
                service_account_name: Some(service_account.to_owned()),
                containers: vec![Container {
                    name: "app".to_owned(),
                    image: Some(PLACEHOLDER_IMAGE.to_owned()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        Api::<Pod>::namespaced(self.client.clone(), &self.name)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|error| panic!("failed to create Pod {}/{name}: {error}", self.name))
    }

    /// A token for `service_account` from the TokenRequest API, bound to `pod` (by name
    /// and uid) and valid for an hour: the apiserver attaches the pod's name and uid to
    /// the identity, and rejects the token once the pod is gone.
    pub async fn pod_token(&self, service_account: &str, pod: &Pod) -> String {
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                // None: the apiserver's own audiences (--api-audiences).
                audiences: None,
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".to_owned()),
                    kind: Some("Pod".to_owned()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
                expiration_seconds: Some(POD_TOKEN_SECONDS),
            }),
            ..TokenRequest::default()
        };
        let pod_name = pod.metadata.name.as_deref().unwrap_or("<unnamed>");
        let issued = Api::<ServiceAccount>::namespaced(self.client.clone(), &self.name)
            .create_token_request(service_account, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "failed to request a token for ServiceAccount {}/{service_account} bound \
                     to Pod {pod_name}: {error}",
                    self.name
                )
            });
        issued
            .status
            .and_then(|status| status.token)
            .expect("a successful TokenRequest carries a status with the token")
    }

    /// A new client authenticating with a fresh [`Self::pod_token`], defaulting to this
    /// namespace.
    pub async fn pod_client(&self, service_account: &str, pod: &Pod) -> kube::Client {
        let token = self.pod_token(service_account, pod).await;
        self.identity(&token).client().await.expect("a generated kubeconfig is valid")
    }

    /// Writes a kubeconfig for `token`, defaulting to this namespace, to `path` (for
    /// processes under test, such as a sidecar started as a local process).
    pub fn kubeconfig_for_token(&self, token: &str, path: &Path) -> anyhow::Result<()> {
        self.identity(token).write(path)
    }

    /// Like [`Self::kubeconfig_for_token`], but for a client that reaches the apiserver
    /// through `server_url`: a [`crate::FaultProxy`] in front of it, as
    /// `https://<proxy addr>` (the apiserver's certificate covers 127.0.0.1).
    pub fn kubeconfig_for_token_via(&self, token: &str, server_url: &str, path: &Path) -> anyhow::Result<()> {
        Identity { server: server_url, ..self.identity(token) }.write(path)
    }

    fn identity<'a>(&'a self, token: &'a str) -> Identity<'a> {
        Identity { server: &self.server_url, ca_pem: &self.ca_pem, user: "token-user", token, namespace: &self.name }
    }

    fn metadata(&self, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(self.name.clone()),
            labels: (!labels.is_empty())
                .then(|| labels.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect()),
            ..ObjectMeta::default()
        }
    }

    fn kubectl(&self) -> Command {
        let mut kubectl = Command::new(&self.kubectl);
        kubectl
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            // The dump must not hang a failing test if the apiserver was stopped.
            .arg("--request-timeout=10s");
        kubectl
    }

    /// Everything in the namespace as YAML, including DistributedLocks, LockClaims and
    /// ForceReleaseRequests once their CRDs are installed; errors are included rather than hidden.
    fn dump(&self) -> String {
        let mut kinds = DUMPED_KINDS.to_owned();
        for crd in ["distributedlocks.leasehold.dev", "lockclaims.leasehold.dev", "forcereleaserequests.leasehold.dev"]
        {
            let installed =
                self.kubectl().args(["get", "crd", crd]).output().is_ok_and(|output| output.status.success());
            if installed {
                kinds.push(',');
                kinds.push_str(crd);
            }
        }
        match self.kubectl().args(["get", &kinds, "--namespace", &self.name, "--output=yaml"]).output() {
            Ok(output) => {
                format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
            }
            Err(error) => format!("failed to run kubectl: {error}"),
        }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        process::keep_logs();
        eprintln!(
            "===== namespace {} at the time of the failure (control-plane logs: {}) =====\n{}\n\
             ===== end of namespace {} =====",
            self.name,
            self.work_dir.display(),
            self.dump(),
            self.name
        );
    }
}

/// `prefix` made fit for `metadata.generateName` of a namespace (a DNS label once the
/// apiserver has appended 5 characters).
fn dns_label_prefix(prefix: &str) -> String {
    let cleaned: String =
        prefix.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).take(50).collect();
    let trimmed = cleaned.trim_matches('-');
    if trimmed.is_empty() { "test".to_owned() } else { trimmed.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::dns_label_prefix;

    #[test]
    fn prefixes_become_dns_labels() {
        for (prefix, expected) in
            [("rbac", "rbac"), ("Lease_CAS", "lease-cas"), ("--", "test"), ("", "test"), ("a.b/c", "a-b-c")]
        {
            assert_eq!(dns_label_prefix(prefix), expected, "prefix {prefix:?}");
        }
        assert!(dns_label_prefix(&"x".repeat(100)).len() <= 50);
    }
}
