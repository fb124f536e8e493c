//! One HTTP/1.1 request to a local sidecar (hyper).

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::Value;

/// Sends one request; `None` if nothing answers within `limit`.
pub async fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Option<(u16, Value)> {
    request_within(addr, method, path, body, Duration::from_secs(60)).await
}

/// [`request`] with an explicit time limit.
pub async fn request_within(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    limit: Duration,
) -> Option<(u16, Value)> {
    tokio::time::timeout(limit, async {
        let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.ok()?;
        tokio::spawn(connection);
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr.to_string())
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body.unwrap_or("").to_owned())))
            .ok()?;
        let response = sender.send_request(request).await.ok()?;
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.ok()?.to_bytes();
        Some((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    })
    .await
    .ok()?
}
