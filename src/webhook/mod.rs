//! The admission webhooks, served by every controller replica (not gated by leadership):
//! sidecar injection ([`inject`]), audited and targeted force release ([`force`], and
//! the requests and approvals of [`request`]), and
//! resource-side fencing of Kubernetes objects ([`fence`], its refusals recorded as Events
//! by [`refusals`]), both reading a lock's state fresh ([`lock`]). The guard is not served here: it is two ValidatingAdmissionPolicies
//! in CEL, evaluated by the apiserver itself ([`guard`] writes them; the chart ships them).

pub mod fence;
pub mod force;
pub mod guard;
pub mod inject;
pub mod lock;
pub mod refusals;
pub mod request;
pub mod server;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;

/// Webhook settings of `leasehold controller`.
#[derive(Clone, Debug, clap::Args)]
#[group(id = "webhook-settings")]
pub struct Config {
    /// Serve the admission webhooks (HTTPS) on this address; off when unset.
    #[arg(long, env = "LEASEHOLD_WEBHOOK_ADDR")]
    pub webhook_addr: Option<SocketAddr>,
    /// PEM certificate of the webhook server (reloaded when the file changes).
    #[arg(long, env = "LEASEHOLD_TLS_CERT_FILE", default_value = "/etc/leasehold/tls/tls.crt")]
    pub tls_cert_file: PathBuf,
    /// PEM private key of the webhook server (reloaded when the file changes).
    #[arg(long, env = "LEASEHOLD_TLS_KEY_FILE", default_value = "/etc/leasehold/tls/tls.key")]
    pub tls_key_file: PathBuf,
    /// Image of the injected sidecar.
    #[arg(long, env = "LEASEHOLD_SIDECAR_IMAGE", default_value = "ghcr.io/leasehold/leasehold:0.1.0")]
    pub sidecar_image: String,
    /// Resources of the injected sidecar, as a JSON `resources` object.
    #[arg(
        long,
        env = "LEASEHOLD_SIDECAR_RESOURCES",
        default_value = r#"{"requests":{"cpu":"10m","memory":"16Mi"},"limits":{"memory":"32Mi"}}"#,
        value_parser = parse_resources
    )]
    pub sidecar_resources: serde_json::Value,
}

fn parse_resources(s: &str) -> Result<serde_json::Value, String> {
    let value: serde_json::Value = serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))?;
    let resources: k8s_openapi::api::core::v1::ResourceRequirements =
        serde_json::from_value(value.clone()).map_err(|e| format!("not a resources object: {e}"))?;
    let _ = resources;
    Ok(value)
}

impl Config {
    /// The sidecar template from these settings.
    pub fn template(&self) -> inject::Template {
        inject::Template {
            image: self.sidecar_image.clone(),
            resources: self.sidecar_resources.clone(),
            ..Default::default()
        }
    }
}
