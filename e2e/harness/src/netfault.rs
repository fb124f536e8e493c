//! [`FaultProxy`]: a userspace TCP proxy in front of one upstream address that delays,
//! resets or black-holes the traffic through it on command, for fault-injection tests.
//!
//! Why a proxy: `tc netem` and network namespaces need privileges and kernel modules the
//! test machines do not have, and a fault between *one* client and *one* server (a
//! sidecar and the apiserver, a workload and PostgreSQL) is what the tests need anyway:
//! point the client at [`FaultProxy::addr`] instead of the server. TLS goes through
//! untouched; the apiserver's serving certificate covers `127.0.0.1`, which is also the
//! proxy's address, so a kubeconfig whose server is `https://<proxy addr>` still verifies.
//!
//! The proxy runs on a dedicated thread with its own tokio runtime: every `#[tokio::test]`
//! has a runtime of its own, and a proxy whose tasks lived on one would stall whenever
//! that test blocked its thread and die with it.
//!
//! What [`FaultProxy::set`] does to connections already open, and to new ones:
//!
//! | fault | open connections | new connections |
//! | --- | --- | --- |
//! | [`Fault::Pass`] | forward both ways (half-closes too) | connected upstream |
//! | [`Fault::Delay`] | each chunk is written the delay after it was read; order kept | as open ones (connecting itself is not delayed) |
//! | [`Fault::DelayAfterHandshake`] | as `Delay`, once past the TLS handshake | the TLS handshake passes at once; then as `Delay` |
//! | [`Fault::Drop`] | reset (RST) on both sides at once | accepted and reset at once |
//! | [`Fault::Blackhole`] | stay open; everything read is discarded, nothing written | accepted, held, never connected upstream |
//!
//! Changing the delay, or switching from `Delay` to `Pass`, re-times chunks already
//! waiting. Leaving `Blackhole` for `Pass` or `Delay`: a connection that lost bytes (in
//! either direction, including a half-close) is reset, because its byte stream is corrupt
//! (a TLS session cannot resume after lost records) and a silent hang would only hide
//! that; a connection that lost nothing resumes, as an idle pooled HTTP connection does
//! after a short real partition; a connection accepted during the blackhole is connected
//! upstream only then, if it sent nothing meanwhile. New connections always work again
//! after a switch back to `Pass`, from `Blackhole` and from `Drop` alike.
//!
//! Mode changes reach connections asynchronously (within microseconds, on the proxy's
//! thread): a test that needs a connection gone waits for [`FaultProxy::connections`] to
//! drop, or for its own read to fail, with a deadline.

use std::{
    io,
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::Context as _;
use handshake::HandshakeEnd;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{
        TcpListener, TcpStream,
        tcp::{ReadHalf, WriteHalf},
    },
    sync::{mpsc, oneshot, watch},
    time::Instant,
};

mod handshake;

/// The most bytes read (and later written) at once.
const CHUNK_BYTES: usize = 16 * 1024;

/// Chunks read but not yet written, per direction. Under a long [`Fault::Delay`] the
/// reader stops once this many wait, so a fast sender backs up into TCP flow control
/// instead of into memory.
const QUEUED_CHUNKS: usize = 64;

/// What the proxy does to the traffic through it. See the module docs for the effect on
/// connections that are already open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward both ways.
    Pass,
    /// Forward every chunk this long after it was read, in both directions, in order.
    Delay(Duration),
    /// As [`Fault::Delay`], except that a TLS 1.3 connection's handshake passes at once:
    /// the delay applies from the client's first application data on (in both
    /// directions). A slow network for requests and their answers, without the handshake
    /// of every new connection eating the client's request timeout. A connection that does
    /// not start with a TLS handshake record is delayed from its first byte.
    DelayAfterHandshake(Duration),
    /// Reset every open connection and reset new ones as soon as they are accepted.
    Drop,
    /// Keep connections open (and accept new ones) but forward nothing either way: the
    /// data is read and discarded.
    Blackhole,
}

impl Fault {
    /// Whether traffic goes through (perhaps late): not swallowed, not reset.
    fn forwards(self) -> bool {
        !matches!(self, Fault::Blackhole | Fault::Drop)
    }
}

/// A TCP proxy on `127.0.0.1:<free port>` to one upstream address, with a [`Fault`]
/// (initially [`Fault::Pass`]) that can be changed at any time.
///
/// Dropping it stops listening and closes every connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    open: Arc<AtomicUsize>,
    /// Dropped (or fired) to stop the proxy's runtime.
    stop: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream`, listening on a free loopback port.
    ///
    /// Does not contact `upstream`: each accepted connection connects to it (and is reset
    /// if that fails). May be called from inside a tokio runtime.
    pub fn start(upstream: SocketAddr) -> anyhow::Result<FaultProxy> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .context("failed to bind a loopback port for the fault proxy")?;
        let addr = listener.local_addr().context("failed to read the fault proxy's port")?;
        listener.set_nonblocking(true).context("failed to make the fault proxy's listener non-blocking")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("failed to build the fault proxy's tokio runtime")?;
        let listener = {
            // Registers the socket with the proxy's runtime, not the caller's.
            let _entered = runtime.enter();
            TcpListener::from_std(listener).context("failed to register the fault proxy's listener")?
        };
        let (fault, faults) = watch::channel(Fault::Pass);
        let open = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = oneshot::channel::<()>();
        let counter = Arc::clone(&open);
        let thread = thread::Builder::new()
            .name(format!("netfault-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        () = accept_loop(listener, upstream, faults, counter) => {}
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime drops every connection task, closing its sockets.
                drop(runtime);
            })
            .context("failed to start the fault proxy's thread")?;
        Ok(FaultProxy { addr, fault, open, stop: Some(stop), thread: Some(thread) })
    }

    /// The address clients connect to instead of the upstream one.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Applies `fault` to open and new connections (see the module docs).
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    /// Connections accepted and not yet closed (including ones held by a blackhole).
    pub fn connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // Only fails if the proxy thread panicked; its sockets are closed either way.
            let _ = thread.join();
        }
    }
}

/// Accepts connections until the runtime is stopped, each served by its own task.
async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    faults: watch::Receiver<Fault>,
    open: Arc<AtomicUsize>,
) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                let counted = OpenConnection::new(&open);
                // Not supervised: a connection task owns nothing but its two sockets, and
                // ends (closing them) on any error; the runtime drops it on shutdown.
                tokio::spawn(serve(client, upstream, faults.clone(), counted));
            }
            Err(error) => {
                // Out of file descriptors, typically: accepting again at once would spin.
                tracing::warn!(%error, "the fault proxy failed to accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Counts a connection in [`FaultProxy::connections`] for as long as it lives.
struct OpenConnection(Arc<AtomicUsize>);

impl OpenConnection {
    fn new(open: &Arc<AtomicUsize>) -> OpenConnection {
        open.fetch_add(1, Ordering::SeqCst);
        OpenConnection(Arc::clone(open))
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves one accepted connection until it closes, fails, or a fault ends it.
async fn serve(mut client: TcpStream, upstream: SocketAddr, mut faults: watch::Receiver<Fault>, _open: OpenConnection) {
    // Without it, small writes could wait for Nagle's algorithm and blur delay timings.
    let _ = client.set_nodelay(true);
    if !hold_until_forwarding(&mut client, &mut faults).await {
        reset(&client);
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        reset(&client);
        return;
    };
    let _ = server.set_nodelay(true);
    // Whether bytes were swallowed in either direction: the stream is corrupt from then on.
    let lost = AtomicBool::new(false);
    // Whether the client's application data has begun (its TLS handshake is over).
    let talking = AtomicBool::new(false);
    let closed_cleanly = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let upward = pump(client_read, server_write, faults.clone(), &lost, Direction::Up(&talking));
        let downward = pump(server_read, client_write, faults.clone(), &lost, Direction::Down(&talking));
        tokio::select! {
            forwarded = async { tokio::try_join!(upward, downward) } => forwarded.is_ok(),
            () = until_connection_must_end(faults, &lost) => false,
        }
    };
    if !closed_cleanly {
        reset(&client);
        reset(&server);
    }
}

/// Holds a new connection, without an upstream, while [`Fault::Blackhole`] is in force,
/// discarding what the client sends. Returns whether it may now be connected upstream.
async fn hold_until_forwarding(client: &mut TcpStream, faults: &mut watch::Receiver<Fault>) -> bool {
    let mut lost = false;
    let mut discarded = vec![0; CHUNK_BYTES];
    loop {
        match *faults.borrow_and_update() {
            Fault::Drop => return false,
            // Unless bytes were swallowed: the server would see a stream missing its start.
            fault if fault.forwards() => return !lost,
            _ => {}
        }
        tokio::select! {
            read = client.read(&mut discarded) => match read {
                Ok(0) | Err(_) => return false,
                Ok(_) => lost = true,
            },
            changed = faults.changed() => {
                if changed.is_err() {
                    return false;
                }
            }
        }
    }
}

/// Completes when the fault requires resetting an open connection: [`Fault::Drop`], or
/// forwarding again after bytes were lost (or the proxy is shutting down).
async fn until_connection_must_end(mut faults: watch::Receiver<Fault>, lost: &AtomicBool) {
    loop {
        match *faults.borrow_and_update() {
            Fault::Drop => return,
            fault if fault.forwards() && lost.load(Ordering::SeqCst) => return,
            _ => {}
        }
        if faults.changed().await.is_err() {
            return;
        }
    }
}

/// A chunk read from one side; empty for end-of-stream (forwarded as a half-close).
struct Chunk {
    read_at: Instant,
    bytes: Vec<u8>,
    /// Read before the client's application data began: spared by
    /// [`Fault::DelayAfterHandshake`].
    handshake: bool,
}

/// Which way a pump forwards, with the connection's flag saying whether the client's
/// application data has begun: the upward pump finds out and sets it, the downward one
/// reads it.
#[derive(Clone, Copy)]
enum Direction<'a> {
    Up(&'a AtomicBool),
    Down(&'a AtomicBool),
}

impl Direction<'_> {
    /// `bytes` read at `read_at` as chunks, split where the client's application data
    /// begins if it begins in them.
    fn chunks(self, bytes: Vec<u8>, read_at: Instant, end: &mut HandshakeEnd) -> Vec<Chunk> {
        let chunk = |bytes: Vec<u8>, handshake: bool| Chunk { read_at, bytes, handshake };
        match self {
            Direction::Down(talking) => vec![chunk(bytes, !talking.load(Ordering::SeqCst))],
            Direction::Up(talking) if talking.load(Ordering::SeqCst) => vec![chunk(bytes, false)],
            Direction::Up(talking) => match end.feed(&bytes) {
                None if !bytes.is_empty() => vec![chunk(bytes, true)],
                // End of stream during the handshake: the half-close is not spared.
                None => vec![chunk(bytes, false)],
                Some(at) => {
                    talking.store(true, Ordering::SeqCst);
                    let mut bytes = bytes;
                    let data = bytes.split_off(at);
                    let mut chunks = Vec::with_capacity(2);
                    if !bytes.is_empty() {
                        chunks.push(chunk(bytes, true));
                    }
                    chunks.push(chunk(data, false));
                    chunks
                }
            },
        }
    }
}

/// Forwards one direction until end-of-stream, applying the fault in force when each
/// chunk is due to be written. Reading goes on while writing waits out a delay.
async fn pump(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    mut faults: watch::Receiver<Fault>,
    lost: &AtomicBool,
    direction: Direction<'_>,
) -> io::Result<()> {
    let (queue, mut queued) = mpsc::channel::<Chunk>(QUEUED_CHUNKS);
    let read = async move {
        let mut handshake = HandshakeEnd::default();
        loop {
            let mut bytes = vec![0; CHUNK_BYTES];
            let count = from.read(&mut bytes).await?;
            bytes.truncate(count);
            let end = count == 0;
            for chunk in direction.chunks(bytes, Instant::now(), &mut handshake) {
                if queue.send(chunk).await.is_err() {
                    // The writer has finished (or failed, and reports why).
                    return io::Result::Ok(());
                }
            }
            if end {
                return Ok(());
            }
        }
    };
    let write = async move {
        while let Some(chunk) = queued.recv().await {
            let end = chunk.bytes.is_empty();
            if when_due(&chunk, &mut faults).await {
                if lost.load(Ordering::SeqCst) {
                    return Err(corrupt());
                }
                if end {
                    to.shutdown().await?;
                } else {
                    to.write_all(&chunk.bytes).await?;
                }
            } else {
                lost.store(true, Ordering::SeqCst);
                // If the blackhole ended while this chunk was judged, the watcher may have
                // looked at `lost` before it was set: end the connection from here.
                if faults.borrow().forwards() {
                    return Err(corrupt());
                }
            }
            if end {
                break;
            }
        }
        Ok(())
    };
    tokio::try_join!(read, write).map(|_| ())
}

/// Waits until `chunk` is due under the fault in force, following changes; returns
/// whether to write it (`false`: swallow it).
async fn when_due(chunk: &Chunk, faults: &mut watch::Receiver<Fault>) -> bool {
    loop {
        let due = match *faults.borrow_and_update() {
            Fault::Pass => return true,
            Fault::DelayAfterHandshake(_) if chunk.handshake => return true,
            // An absurdly long delay overflows: the chunk waits for the next change.
            Fault::Delay(delay) | Fault::DelayAfterHandshake(delay) => chunk.read_at.checked_add(delay),
            Fault::Blackhole | Fault::Drop => return false,
        };
        let delay_over = async {
            match due {
                Some(due) => tokio::time::sleep_until(due).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = delay_over => return true,
            changed = faults.changed() => {
                if changed.is_err() {
                    return false;
                }
            }
        }
    }
}

fn corrupt() -> io::Error {
    io::Error::other("bytes were lost in a blackhole; the stream cannot continue")
}

/// Makes dropping `stream` send RST instead of FIN: what a client sees of a network
/// failure, and immediate even with unsent data.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}
