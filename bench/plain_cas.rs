//! The raw-CAS floor with no Kubernetes client at all: one keep-alive HTTPS connection
//! (hyper's HTTP/1 client over rustls, verified against the cluster CA, admin bearer token),
//! each Lease update a plain `PUT` carrying the resourceVersion the previous one returned.
//! It shows what kube-rs itself adds to a CAS; the ratios divide by the faster floor.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, ensure};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;

use crate::record::{Panel, Series};
use crate::stats::ms;

/// One HTTP/1.1 connection to the apiserver, kept alive, authenticated by a bearer token.
struct Connection {
    sender: SendRequest<Full<Bytes>>,
    token: String,
    task: tokio::task::JoinHandle<()>,
}

impl Connection {
    /// Connects to `server` (`https://127.0.0.1:<port>`), verifying it against `ca_pem`.
    async fn open(server: &str, ca_pem: &str, token: &str) -> anyhow::Result<Connection> {
        let authority = server.strip_prefix("https://").context("the apiserver URL is https")?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.context("failed to parse the cluster CA")?).context("failed to trust the cluster CA")?;
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .context("failed to choose TLS versions")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h).to_owned();
        let tcp = tokio::net::TcpStream::connect(authority)
            .await
            .with_context(|| format!("failed to connect to the apiserver at {authority}"))?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from(host).context("the apiserver host is a valid name")?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .context("failed the TLS handshake with the apiserver")?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .context("failed the HTTP/1 handshake with the apiserver")?;
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Connection { sender, token: token.to_owned(), task })
    }

    /// Sends one request and reads the whole answer: status and JSON body.
    async fn call(&mut self, method: &str, path: &str, body: Option<Vec<u8>>) -> anyhow::Result<(u16, Bytes)> {
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "kubernetes")
            .header("authorization", format!("Bearer {}", self.token))
            .header("accept", "application/json")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .context("failed to build a request")?;
        self.sender.ready().await.context("the apiserver connection closed")?;
        let response = self.sender.send_request(request).await.with_context(|| format!("failed to {method} {path}"))?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.with_context(|| format!("failed to read {method} {path}"))?;
        Ok((status, body.to_bytes()))
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `warmup` then `samples` Lease updates in `namespace` over one kept-alive connection,
/// each sending the object the previous one returned (so its resourceVersion: a CAS);
/// only the `PUT` is timed. Ends by checking that a stale resourceVersion is refused with 409.
pub async fn lease_cas(
    server: &str,
    ca_pem: &str,
    token: &str,
    namespace: &str,
    warmup: usize,
    samples: usize,
) -> anyhow::Result<Series> {
    let name = "bench-floor-cas-plain";
    let collection = format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases");
    let path = format!("{collection}/{name}");
    let mut conn = Connection::open(server, ca_pem, token).await?;
    let lease = crate::floors::floor_lease(name);
    let (status, body) = conn.call("POST", &collection, Some(serde_json::to_vec(&lease)?)).await?;
    ensure!(
        status == 201,
        "creating the plain-client floor Lease answered {status}: {}",
        String::from_utf8_lossy(&body)
    );
    let first: Lease = serde_json::from_slice(&body).context("failed to parse the created floor Lease")?;
    let mut current = first.clone();
    let mut out = Vec::with_capacity(samples);
    for i in 0..warmup + samples {
        let mut next = current.clone();
        next.spec.get_or_insert_with(LeaseSpec::default).renew_time = Some(MicroTime(Timestamp::now()));
        // Timed like kube's replace(): serialise, send, read, parse.
        let started = Instant::now();
        let (status, answer) = conn.call("PUT", &path, Some(serde_json::to_vec(&next)?)).await?;
        ensure!(status == 200, "updating the floor Lease answered {status}: {}", String::from_utf8_lossy(&answer));
        current = serde_json::from_slice(&answer).context("failed to parse the updated floor Lease")?;
        let took = started.elapsed();
        if i >= warmup {
            out.push(ms(took));
        }
    }
    let (stale, _) = conn.call("PUT", &path, Some(serde_json::to_vec(&first)?)).await?;
    ensure!(stale == 409, "a stale resourceVersion was answered {stale}, not refused with 409");
    let (deleted, _) = conn.call("DELETE", &path, None).await?;
    ensure!(deleted == 200, "deleting the plain-client floor Lease answered {deleted}");
    Ok(Series::new(
        "floor.lease_cas.plain",
        "One Lease CAS (update with resourceVersion) through the apiserver, plain keep-alive HTTPS client",
        "floor",
        Panel::Fast,
        out,
        json!({
            "client": "hyper HTTP/1.1 over rustls (ring), one connection kept alive, admin bearer token, JSON, sequential",
            "warmup": warmup,
            "samples": samples,
            "sample_start": "before serialising the Lease (as kube's replace() is called)",
            "sample_stop": "the answer read and parsed into a Lease (as replace() returns)",
            "stale_write_refused_409": true,
        }),
    ))
}
