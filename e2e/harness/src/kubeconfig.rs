//! Kubeconfigs for bearer tokens, written for kubectl and the Go components, and turned
//! into kube clients. They are JSON, which every kubeconfig reader accepts (YAML ⊃ JSON),
//! so the same value serves the files and the Rust clients.

use std::path::Path;

use anyhow::Context as _;
use base64::Engine as _;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

/// Who connects where: enough to build a kubeconfig.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Identity<'a> {
    pub(crate) server: &'a str,
    pub(crate) ca_pem: &'a str,
    pub(crate) user: &'a str,
    pub(crate) token: &'a str,
    pub(crate) namespace: &'a str,
}

impl Identity<'_> {
    /// A kubeconfig with one cluster, user and (current) context.
    pub(crate) fn kubeconfig(&self) -> Value {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem);
        json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{
                "name": "leasehold-test",
                "cluster": { "server": self.server, "certificate-authority-data": ca },
            }],
            "users": [{ "name": self.user, "user": { "token": self.token } }],
            "contexts": [{
                "name": "leasehold-test",
                "context": {
                    "cluster": "leasehold-test",
                    "user": self.user,
                    "namespace": self.namespace,
                },
            }],
            "current-context": "leasehold-test",
            "preferences": {},
        })
    }

    /// Writes the kubeconfig to `path`, readable by the owner only (it holds a token).
    pub(crate) fn write(&self, path: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let text = serde_json::to_string_pretty(&self.kubeconfig()).context("failed to serialize a kubeconfig")?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("failed to create kubeconfig {}", path.display()))?;
        std::io::Write::write_all(&mut file, text.as_bytes())
            .with_context(|| format!("failed to write kubeconfig {}", path.display()))
    }

    /// The kube client configuration for this identity.
    pub(crate) async fn config(&self) -> anyhow::Result<kube::Config> {
        let kubeconfig: Kubeconfig =
            serde_json::from_value(self.kubeconfig()).context("failed to parse a generated kubeconfig")?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("failed to load the kubeconfig for {}", self.user))
    }

    /// A new client for this identity. It belongs to the tokio runtime it is created in
    /// (its connection pool does), hence never cached across tests.
    pub(crate) async fn client(&self) -> anyhow::Result<kube::Client> {
        let config = self.config().await?;
        kube::Client::try_from(config).with_context(|| format!("failed to build a client for {}", self.user))
    }
}
