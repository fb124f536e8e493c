//! The fault proxy's modes, against a local echo server, and one round trip through the
//! real apiserver: a kube client behind the proxy stops getting answers under a blackhole
//! and a fresh one gets them again once the proxy passes traffic.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    api::{Api, ListParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use leasehold_harness::{Fault, FaultProxy, eventually};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};

/// How long a test waits for something that should happen promptly.
const DEADLINE: Duration = Duration::from_secs(10);

/// How long a test watches for something that must not happen (no reply in a blackhole).
const QUIET_WINDOW: Duration = Duration::from_millis(500);

/// An echo server on a free loopback port, served by the test's runtime (it ends with the
/// test).
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding a loopback port should succeed");
    let addr = listener.local_addr().expect("a bound listener has an address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut from, mut to) = stream.split();
                // Echoes until the client half-closes, then half-closes back.
                if tokio::io::copy(&mut from, &mut to).await.is_ok() {
                    let _ = to.shutdown().await;
                }
            });
        }
    });
    addr
}

async fn connect(proxy: &FaultProxy) -> TcpStream {
    let stream = TcpStream::connect(proxy.addr()).await.expect("the proxy should accept connections");
    stream.set_nodelay(true).expect("setting TCP_NODELAY should succeed");
    stream
}

/// Sends `message` and returns what comes back, failing the test after [`DEADLINE`].
async fn round_trip(stream: &mut TcpStream, message: &[u8]) -> Vec<u8> {
    stream.write_all(message).await.expect("writing to the proxy should succeed");
    let mut reply = vec![0; message.len()];
    tokio::time::timeout(DEADLINE, stream.read_exact(&mut reply))
        .await
        .expect("the echo should arrive in time")
        .expect("reading the echo should succeed");
    reply
}

/// Whether the peer has closed or reset `stream` (checked within [`DEADLINE`]).
async fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0; 1];
    match tokio::time::timeout(DEADLINE, stream.read(&mut byte)).await {
        Ok(Ok(0) | Err(_)) => true,
        Ok(Ok(_)) | Err(_) => false,
    }
}

/// Whether `message`, sent on `stream`, comes back unchanged within [`QUIET_WINDOW`].
async fn echoes(stream: &mut TcpStream, message: &[u8]) -> bool {
    if stream.write_all(message).await.is_err() {
        return false;
    }
    let mut reply = vec![0; message.len()];
    matches!(
        tokio::time::timeout(QUIET_WINDOW, stream.read_exact(&mut reply)).await,
        Ok(Ok(_)) if reply == message
    )
}

/// Whether a reply arrives on `stream` within [`QUIET_WINDOW`].
async fn replies_within_window(stream: &mut TcpStream) -> bool {
    let mut byte = [0; 1];
    tokio::time::timeout(QUIET_WINDOW, stream.read(&mut byte)).await.is_ok()
}

async fn wait_for_connections(proxy: &FaultProxy, expected: usize) {
    eventually(&format!("{expected} open proxy connections"), DEADLINE, || async {
        let open = proxy.connections();
        if open == expected { Ok(()) } else { Err(format!("{open} open")) }
    })
    .await;
}

#[tokio::test]
async fn pass_forwards_both_ways_and_half_closes() {
    let proxy = FaultProxy::start(echo_server().await).expect("the proxy should start");
    assert_eq!(proxy.fault(), Fault::Pass, "a new proxy passes traffic");
    let mut stream = connect(&proxy).await;
    assert_eq!(round_trip(&mut stream, b"hello").await, b"hello");
    wait_for_connections(&proxy, 1).await;

    // The echo server answers a half-close with one: both travel through the proxy.
    stream.shutdown().await.expect("half-closing should succeed");
    assert!(closed(&mut stream).await, "the upstream's half-close should reach the client");
    wait_for_connections(&proxy, 0).await;
}

#[tokio::test]
async fn delay_holds_every_chunk_in_order() {
    let proxy = FaultProxy::start(echo_server().await).expect("the proxy should start");
    // Opened before the change: a delay applies to open connections too.
    let mut stream = connect(&proxy).await;
    assert_eq!(round_trip(&mut stream, b"warm").await, b"warm");

    let delay = Duration::from_millis(300);
    proxy.set(Fault::Delay(delay));
    let began = Instant::now();
    for part in [b"a", b"b", b"c"] {
        stream.write_all(part).await.expect("writing to the proxy should succeed");
    }
    let mut reply = [0; 3];
    tokio::time::timeout(DEADLINE, stream.read_exact(&mut reply))
        .await
        .expect("the delayed echo should arrive in time")
        .expect("reading the echo should succeed");
    let elapsed = began.elapsed();
    assert_eq!(&reply, b"abc", "delayed chunks keep their order");
    // Delayed on the way there and on the way back. Only a lower bound: a loaded machine
    // may add any amount.
    assert!(elapsed >= 2 * delay, "the round trip took {elapsed:?}, less than twice the {delay:?} delay");

    // Switching to Pass releases a chunk that would otherwise wait a minute.
    proxy.set(Fault::Delay(Duration::from_secs(60)));
    stream.write_all(b"z").await.expect("writing to the proxy should succeed");
    proxy.set(Fault::Pass);
    let mut byte = [0; 1];
    tokio::time::timeout(DEADLINE, stream.read_exact(&mut byte))
        .await
        .expect("Pass should release the waiting chunk")
        .expect("reading the echo should succeed");
    assert_eq!(&byte, b"z");
}

/// A TLS record header and body: type, version 1.2 on the wire, length, filler.
fn tls_record(kind: u8, body: usize) -> Vec<u8> {
    let length = u16::try_from(body).expect("a test record fits a TLS length").to_be_bytes();
    let mut bytes = vec![kind, 3, 3, length[0], length[1]];
    bytes.resize(5 + body, 0x5a);
    bytes
}

#[tokio::test]
async fn delay_after_handshake_spares_the_tls_handshake_and_holds_what_follows() {
    let proxy = FaultProxy::start(echo_server().await).expect("the proxy should start");
    // A minute: whatever comes back within the deadline was not delayed.
    proxy.set(Fault::DelayAfterHandshake(Duration::from_secs(60)));
    let mut stream = connect(&proxy).await;
    // ClientHello, a compatibility ChangeCipherSpec, Finished: echoed at once.
    for (kind, body) in [(22, 300), (20, 1), (23, 53)] {
        let record = tls_record(kind, body);
        assert_eq!(round_trip(&mut stream, &record).await, record, "handshake record of type {kind} was held");
    }
    // The first application data: held, both ways, until the fault changes.
    let request = tls_record(23, 100);
    stream.write_all(&request).await.expect("writing to the proxy should succeed");
    assert!(!replies_within_window(&mut stream).await, "application data after the handshake went through at once");
    proxy.set(Fault::Pass);
    let mut reply = vec![0; request.len()];
    tokio::time::timeout(DEADLINE, stream.read_exact(&mut reply))
        .await
        .expect("Pass should release the held request")
        .expect("reading the echo should succeed");
    assert_eq!(reply, request);

    // A connection that is not TLS is held from its first byte.
    proxy.set(Fault::DelayAfterHandshake(Duration::from_secs(60)));
    let mut plain = connect(&proxy).await;
    plain.write_all(b"plain").await.expect("writing to the proxy should succeed");
    assert!(!replies_within_window(&mut plain).await, "a connection that is not TLS went through at once");
}

#[tokio::test]
async fn drop_resets_open_connections_and_refuses_new_ones_until_pass() {
    let proxy = FaultProxy::start(echo_server().await).expect("the proxy should start");
    let mut open = connect(&proxy).await;
    assert_eq!(round_trip(&mut open, b"before").await, b"before");

    proxy.set(Fault::Drop);
    assert!(closed(&mut open).await, "an open connection should be reset");
    wait_for_connections(&proxy, 0).await;
    // The kernel completes the handshake before the proxy can refuse: a new connection
    // is closed right after it opens, or, if the reset wins the race, fails to connect.
    if let Ok(mut refused) = TcpStream::connect(proxy.addr()).await {
        assert!(closed(&mut refused).await, "a new connection should be closed at once");
    }

    proxy.set(Fault::Pass);
    let mut fresh = connect(&proxy).await;
    assert_eq!(round_trip(&mut fresh, b"after").await, b"after", "new connections work again after Pass");
}

#[tokio::test]
async fn blackhole_swallows_traffic_and_keeps_connections_open() {
    let proxy = FaultProxy::start(echo_server().await).expect("the proxy should start");
    let mut talking = connect(&proxy).await;
    assert_eq!(round_trip(&mut talking, b"ping").await, b"ping");
    let mut idle = connect(&proxy).await;
    assert_eq!(round_trip(&mut idle, b"ping").await, b"ping");

    proxy.set(Fault::Blackhole);
    talking.write_all(b"lost").await.expect("the proxy should still take data");
    assert!(!replies_within_window(&mut talking).await, "nothing may come back through a blackhole");
    let mut held = connect(&proxy).await;
    held.write_all(b"lost too").await.expect("the proxy should take data on a new connection");
    assert!(!replies_within_window(&mut held).await, "a new connection gets nothing back either");
    // A blackhole keeps every connection open.
    wait_for_connections(&proxy, 3).await;

    proxy.set(Fault::Pass);
    let mut fresh = connect(&proxy).await;
    assert_eq!(round_trip(&mut fresh, b"pong").await, b"pong", "new connections work again after Pass");
    // An untouched connection resumes; ones whose bytes were swallowed are reset rather
    // than left to hang on a corrupt stream.
    assert_eq!(round_trip(&mut idle, b"pong").await, b"pong", "a connection that lost nothing resumes");
    assert!(closed(&mut talking).await, "a connection that lost bytes should be reset");
    assert!(closed(&mut held).await, "a connection held in the blackhole with lost bytes should be reset");
}

#[tokio::test]
async fn dropping_the_proxy_closes_everything() {
    let proxy = FaultProxy::start(echo_server().await).expect("the proxy should start");
    let addr = proxy.addr();
    let mut stream = connect(&proxy).await;
    assert_eq!(round_trip(&mut stream, b"hi").await, b"hi");

    drop(proxy);
    assert!(closed(&mut stream).await, "open connections should be closed");
    // The port is free again, so another listener (a control plane starting in a parallel
    // test picks its ports the same way) may take it: what must hold is that nothing there
    // forwards to the upstream any more.
    if let Ok(mut other) = TcpStream::connect(addr).await {
        assert!(!echoes(&mut other, b"hi").await, "nothing at {addr} should forward to the upstream any more");
    }
}

#[tokio::test]
async fn kube_client_through_the_proxy_loses_and_regains_the_apiserver() {
    let control_plane = leasehold_harness::shared();
    let apiserver: SocketAddr = control_plane
        .server_url()
        .trim_start_matches("https://")
        .parse()
        .expect("the apiserver URL is https://<ip>:<port>");
    let proxy = FaultProxy::start(apiserver).expect("the proxy should start");
    let via_proxy = format!("https://{}", proxy.addr());
    let list = |client: kube::Client| async move { Api::<Namespace>::all(client).list(&ListParams::default()).await };

    let client = control_plane.admin_client_via(&via_proxy).await;
    list(client.clone()).await.expect("listing namespaces through the proxy should succeed");

    proxy.set(Fault::Blackhole);
    // A pooled connection and a new one (its TLS handshake swallowed) both hang.
    let window = Duration::from_secs(3);
    let pooled = tokio::time::timeout(window, list(client)).await;
    assert!(pooled.is_err(), "a request on an open connection should time out, got {pooled:?}");
    let fresh = tokio::time::timeout(window, list(control_plane.admin_client_via(&via_proxy).await)).await;
    assert!(fresh.is_err(), "a request on a new connection should time out, got {fresh:?}");

    proxy.set(Fault::Pass);
    // As a sidecar process would connect: from a kubeconfig file whose server is the proxy.
    let namespace = control_plane.namespace("netfault").await;
    let dir = tempfile::tempdir().expect("creating a temporary directory should succeed");
    let kubeconfig = dir.path().join("kubeconfig");
    namespace
        .kubeconfig_for_token_via(control_plane.admin_token(), &via_proxy, &kubeconfig)
        .expect("writing a kubeconfig should succeed");
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig).expect("the written kubeconfig should parse"),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("the written kubeconfig should load");
    assert_eq!(config.cluster_url.to_string().trim_end_matches('/'), via_proxy, "the kubeconfig points at the proxy");
    let recovered = kube::Client::try_from(config).expect("a client should build from the kubeconfig");
    tokio::time::timeout(DEADLINE, list(recovered))
        .await
        .expect("a fresh client should get an answer in time after Pass")
        .expect("listing namespaces through the proxy should succeed again");
}
