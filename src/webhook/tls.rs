//! TLS for the webhook server, with the certificate reloaded from its files without a
//! restart: every handshake checks the files' modification time and size, and reloads them
//! when they changed (cert-manager and the chart both rotate by replacing the files). A
//! pair that fails to load keeps the last good certificate in service.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::crypto::ring::{default_provider, sign::any_supported_type};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

/// A certificate and key that failed to load.
#[derive(Debug, thiserror::Error)]
#[error("failed to load the TLS certificate {cert} and key {key}: {reason}")]
pub struct TlsError {
    cert: String,
    key: String,
    reason: String,
}

type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path).ok().and_then(|m| Some((m.modified().ok()?, m.len())))
}

struct Loaded {
    stamps: (Stamp, Stamp),
    key: Arc<CertifiedKey>,
}

/// Serves the certificate in `cert`/`key`, reloading it when the files change.
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    current: Mutex<Loaded>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert").field("cert", &self.cert).field("key", &self.key).finish_non_exhaustive()
    }
}

fn load(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let error = |reason: String| TlsError { cert: cert.display().to_string(), key: key.display().to_string(), reason };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| error(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| error(e.to_string()))?;
    if chain.is_empty() {
        return Err(error("no certificate in the file".into()));
    }
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| error(e.to_string()))?;
    let signing = any_supported_type(&der).map_err(|e| error(e.to_string()))?;
    let certified = CertifiedKey::new(chain, signing);
    // During a rotation one file may already be new and the other still old.
    certified.keys_match().map_err(|e| error(format!("the key does not match the certificate: {e}")))?;
    Ok(Arc::new(certified))
}

impl ReloadingCert {
    /// Loads the pair now (an error here stops start-up).
    pub fn new(cert: &Path, key: &Path) -> Result<ReloadingCert, TlsError> {
        let loaded = Loaded { stamps: (stamp(cert), stamp(key)), key: load(cert, key)? };
        Ok(ReloadingCert { cert: cert.to_owned(), key: key.to_owned(), current: Mutex::new(loaded) })
    }

    /// The certificate to serve, reloaded first if the files changed.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut current = self.current.lock().expect("certificate state is never poisoned");
        let stamps = (stamp(&self.cert), stamp(&self.key));
        if stamps != current.stamps {
            match load(&self.cert, &self.key) {
                Ok(key) => {
                    info!(cert = %self.cert.display(), "reloaded the webhook certificate");
                    *current = Loaded { stamps, key };
                }
                // Half-written during rotation, most likely: keep serving the old one and
                // try again at the next handshake.
                Err(e) => warn!(error = %e, "keeping the previous webhook certificate"),
            }
        }
        current.key.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A rustls server configuration serving `resolver`'s certificate, HTTP/1.1 only.
pub fn server_config(resolver: Arc<ReloadingCert>) -> Result<rustls::ServerConfig, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
