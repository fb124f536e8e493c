//! The channel from `leasehold run` to its guard: a Unix socket in the abstract namespace
//! (nothing on disk, so it works on a read-only filesystem), one line per message.
//!
//! - `deadline <ms>`: the hold is valid until `CLOCK_BOOTTIME` reads `<ms>` milliseconds
//!   (sent at start and after every renewal);
//! - `stop`: the hold is lost or `run` is shutting down: stop the command.
//!
//! Each side checks the other's pid on the socket (`SO_PEERCRED`), so another process of
//! the pod that learns the name can neither pose as `run` nor as its guard. The end of the
//! stream means `run` is gone.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

/// A message from `run` to its guard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// The hold is valid until the boot clock reads this.
    Deadline(Duration),
    /// Stop the command.
    Stop,
}

impl Message {
    /// The line for this message (with its newline).
    pub fn encode(&self) -> String {
        match self {
            Message::Deadline(at) => format!("deadline {}\n", crate::boottime::millis(*at)),
            Message::Stop => "stop\n".to_owned(),
        }
    }

    /// Parses one line (without its newline); `None` if it is not a message.
    pub fn parse(line: &str) -> Option<Message> {
        match line.split_once(' ') {
            Some(("deadline", ms)) => ms.parse().ok().map(|ms| Message::Deadline(Duration::from_millis(ms))),
            None if line == "stop" => Some(Message::Stop),
            _ => None,
        }
    }
}

fn address(name: &str) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes())
}

/// Listens on a fresh abstract name; returns the listener and the name.
pub fn listen() -> std::io::Result<(UnixListener, String)> {
    let name = format!("leasehold-run/{}/{:016x}", std::process::id(), rand::random::<u64>());
    let listener = std::os::unix::net::UnixListener::bind_addr(&address(&name)?)?;
    listener.set_nonblocking(true)?;
    Ok((UnixListener::from_std(listener)?, name))
}

/// Accepts the connection of process `pid`, refusing any other.
pub async fn accept_from(listener: &UnixListener, pid: u32) -> std::io::Result<UnixStream> {
    loop {
        let (stream, _) = listener.accept().await?;
        if peer_is(&stream, pid)? {
            return Ok(stream);
        }
    }
}

/// Connects to `name`, served by process `pid`.
pub fn connect_to(name: &str, pid: u32) -> std::io::Result<UnixStream> {
    let stream = std::os::unix::net::UnixStream::connect_addr(&address(name)?)?;
    stream.set_nonblocking(true)?;
    let stream = UnixStream::from_std(stream)?;
    if !peer_is(&stream, pid)? {
        return Err(std::io::Error::other(format!("{name} is not served by process {pid}")));
    }
    Ok(stream)
}

fn peer_is(stream: &UnixStream, pid: u32) -> std::io::Result<bool> {
    Ok(stream.peer_cred()?.pid().and_then(|p| u32::try_from(p).ok()) == Some(pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        for message in [Message::Deadline(Duration::from_millis(123_456)), Message::Stop] {
            let line = message.encode();
            assert_eq!(Message::parse(line.trim_end()), Some(message), "{line}");
        }
        for bad in ["", "deadline", "deadline x", "deadline -1", "stop now", "start"] {
            assert_eq!(Message::parse(bad), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn only_the_named_process_gets_through() {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let (listener, name) = listen().expect("listen");
        let me = std::process::id();
        let client = connect_to(&name, me).expect("connect");
        let mut server = accept_from(&listener, me).await.expect("accept");
        server.write_all(Message::Stop.encode().as_bytes()).await.expect("write");
        let mut lines = BufReader::new(client).lines();
        assert_eq!(lines.next_line().await.expect("read").as_deref(), Some("stop"));
        // The accepting side skips a connection from another process (here: from us,
        // while it expects someone else) and keeps waiting.
        let _other = connect_to(&name, me).expect("connect");
        let skipped = tokio::time::timeout(Duration::from_millis(200), accept_from(&listener, me + 1)).await;
        assert!(skipped.is_err(), "a connection from the wrong process was accepted");
        // The connecting side refuses a server that is not the expected process.
        assert!(connect_to(&name, me + 1).is_err());
    }
}
