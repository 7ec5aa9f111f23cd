//! The socket loop: check the peer, read one frame, handle, answer.

use std::io::{self, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ebs_csi_helper_proto::{
    FrameVersion, HelperError, OLDEST_VERSION, PROTOCOL_VERSION, RequestFrame, Response, decode, read_payload,
    write_frame,
};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use crate::handler::Handler;

/// How the server admits and times connections.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Peers (by `SO_PEERCRED` uid) that may send requests; any other peer
    /// is disconnected before a byte is read.
    pub allowed_uids: Vec<u32>,
    /// Connections served at once; more are answered [`HelperError::Busy`].
    pub max_connections: usize,
    /// Time allowed to send a whole request frame (one deadline for the
    /// frame, however the peer spaces its bytes), and to read the answer.
    pub io_timeout: Duration,
    /// Once asked to stop, how long requests in flight may go on before
    /// the helper exits anyway (its tools die with it).
    pub stop_timeout: Duration,
}

/// How often the accept loop looks whether it is asked to stop: the
/// listening socket's receive timeout (`SO_RCVTIMEO`, which `accept(2)` on
/// a unix socket honours). Not `shutdown(2)`: under socket activation the
/// socket is systemd's too, and the next helper takes it.
const STOP_POLL: Duration = Duration::from_millis(200);

/// Serves connections on `listener` until `stopping` is set, then waits
/// for the requests in flight, at most [`ServerConfig::stop_timeout`].
/// Connections still queued are left to the socket: under socket
/// activation the next helper serves them, otherwise they are reset when
/// the helper exits.
///
/// Each admitted connection runs on its own thread; the handler orders
/// the requests (see [`Handler`]).
///
/// # Errors
/// The error setting the listening socket's receive timeout; errors on
/// individual connections are logged.
pub fn serve(
    listener: &UnixListener,
    handler: Arc<Handler>,
    config: &ServerConfig,
    stopping: &AtomicBool,
) -> io::Result<()> {
    rustix::net::sockopt::set_socket_timeout(listener, rustix::net::sockopt::Timeout::Recv, Some(STOP_POLL))?;
    let active = Arc::new(AtomicUsize::new(0));
    while !stopping.load(Ordering::SeqCst) {
        let mut stream = match listener.accept() {
            // Taken from the queue as the stop came: closed unanswered,
            // as the connections left in the queue are.
            Ok(_) if stopping.load(Ordering::SeqCst) => break,
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let Some(uid) = admitted_peer(&stream, &config.allowed_uids) else {
            continue;
        };
        if stream.set_write_timeout(Some(config.io_timeout)).is_err() {
            continue;
        }
        if active.fetch_add(1, Ordering::SeqCst) >= config.max_connections {
            active.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(peer_uid = uid, "busy: connection limit reached");
            respond(&mut stream, Response::Err(HelperError::Busy));
            continue;
        }
        let (handler, slot, io_timeout) = (Arc::clone(&handler), Arc::clone(&active), config.io_timeout);
        let spawned = std::thread::Builder::new().name("connection".into()).spawn(move || {
            serve_connection(&mut stream, uid, &handler, io_timeout);
            slot.fetch_sub(1, Ordering::SeqCst);
        });
        if let Err(e) = spawned {
            // The closure never ran: give its slot back here.
            active.fetch_sub(1, Ordering::SeqCst);
            tracing::error!(error = %e, "cannot start a connection thread");
        }
    }
    finish(&active, config.stop_timeout);
    Ok(())
}

/// Waits until no connection is `active`, or `timeout` has passed.
fn finish(active: &AtomicUsize, timeout: Duration) {
    let until = Instant::now() + timeout;
    let mut in_flight = active.load(Ordering::SeqCst);
    while in_flight > 0 && Instant::now() < until {
        std::thread::sleep(STOP_POLL / 4);
        in_flight = active.load(Ordering::SeqCst);
    }
    match in_flight {
        0 => tracing::info!("stopped: no request in flight"),
        n => tracing::warn!(
            in_flight = n,
            timeout_seconds = timeout.as_secs(),
            "stopped with requests in flight"
        ),
    }
}

/// The peer's uid if it is allowed; logs and returns `None` otherwise. A
/// peer whose process the helper cannot see (pid 0) is admitted on its uid
/// alone, as any other.
fn admitted_peer(stream: &UnixStream, allowed_uids: &[u32]) -> Option<u32> {
    match getsockopt(stream, PeerCredentials) {
        Ok(cred) if allowed_uids.contains(&cred.uid()) => Some(cred.uid()),
        Ok(cred) => {
            tracing::warn!(peer_uid = cred.uid(), peer_pid = cred.pid(), "refused peer");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "refused peer: no credentials");
            None
        }
    }
}

fn serve_connection(stream: &mut UnixStream, peer_uid: u32, handler: &Handler, io_timeout: Duration) {
    let mut reader = FrameDeadline {
        stream,
        until: Instant::now() + io_timeout,
    };
    let request = read_payload(&mut reader)
        .map_err(|e| HelperError::InvalidRequest(e.to_string()))
        .and_then(|payload| match decode::<FrameVersion>(&payload) {
            Ok(FrameVersion { version }) if !(OLDEST_VERSION..=PROTOCOL_VERSION).contains(&version) => {
                Err(HelperError::UnsupportedVersion(version))
            }
            _ => decode::<RequestFrame>(&payload).map_err(|e| HelperError::InvalidRequest(e.to_string())),
        });
    let response = match request {
        Ok(frame) => {
            let span = tracing::info_span!("request", peer_uid, request = ?frame.request);
            let _entered = span.enter();
            let started = Instant::now();
            let result = handler.handle(&frame.request);
            let elapsed_ms = (started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
            match &result {
                Ok(reply) => tracing::info!(?reply, elapsed_ms, "done"),
                Err(error) => tracing::warn!(?error, elapsed_ms, "refused"),
            }
            result.map_or_else(Response::Err, Response::Ok)
        }
        Err(error) => {
            tracing::warn!(peer_uid, ?error, "bad frame");
            Response::Err(error)
        }
    };
    respond(stream, response);
}

/// Reads a stream under one deadline: each read may wait only for what is
/// left of the time, so a peer that trickles a byte at a time is cut off
/// when the frame's time is up, not reset by every byte.
struct FrameDeadline<'a> {
    stream: &'a UnixStream,
    until: Instant,
}

impl Read for FrameDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        stream.read(buf)
    }
}

fn respond(stream: &mut UnixStream, response: Response) {
    if let Err(e) = write_frame(stream, &response) {
        tracing::warn!(error = %e, "cannot send the response");
    }
}
