//! The admission webhooks, served by every controller replica (not gated by leadership):
//! sidecar injection ([`inject`], configured per pod by [`pod_settings`]), audited and
//! targeted force release ([`force`], and the requests and approvals of [`request`]), and
//! resource-side fencing of Kubernetes objects ([`fence`], its refusals recorded as Events
//! by [`refusals`]), both reading a lock's state fresh ([`lock`]). The guard is not served
//! here: it is two ValidatingAdmissionPolicies
//! in CEL, evaluated by the apiserver itself ([`guard`] writes them; the chart ships them).

pub mod fence;
pub mod force;
pub mod guard;
pub mod inject;
pub mod lock;
pub mod pod_settings;
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
    /// Log filter of the injected sidecar (its `RUST_LOG`): a level such as `info`, or
    /// directives such as `info,leasehold=debug`. Pods override it with the
    /// `leasehold.dev/log-level` annotation. Unset: the sidecar logs at info.
    #[arg(long, env = "LEASEHOLD_SIDECAR_LOG_LEVEL", value_parser = parse_filter)]
    pub sidecar_log_level: Option<String>,
    /// Log format of the injected sidecar. Pods override it with the
    /// `leasehold.dev/log-format` annotation. Unset: plain.
    #[arg(long, env = "LEASEHOLD_SIDECAR_LOG_FORMAT", value_enum)]
    pub sidecar_log_format: Option<crate::telemetry::LogFormat>,
}

fn parse_resources(s: &str) -> Result<serde_json::Value, String> {
    let value: serde_json::Value = serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))?;
    pod_settings::check_default_resources(&value)?;
    Ok(value)
}

fn parse_filter(s: &str) -> Result<String, String> {
    crate::telemetry::check_filter(s).map(|()| s.to_owned())
}

impl Config {
    /// The sidecar template from these settings.
    pub fn template(&self) -> inject::Template {
        inject::Template {
            image: self.sidecar_image.clone(),
            resources: self.sidecar_resources.clone(),
            log_level: self.sidecar_log_level.clone(),
            log_format: self.sidecar_log_format,
            ..Default::default()
        }
    }
}
