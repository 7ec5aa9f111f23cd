//! A client connection on a CSI socket (unix or TCP), as tonic serves it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tonic::transport::server::{Connected, TcpConnectInfo, UdsConnectInfo};

use crate::authority::AuthorityFilter;

/// How many bytes one read from the socket takes.
const READ_CHUNK: usize = 8192;

/// A stream whose incoming bytes pass through an [`AuthorityFilter`], so
/// that h2 accepts every gRPC client's `:authority`; outgoing bytes are
/// written unchanged.
pub struct Connection<S> {
    stream: S,
    filter: AuthorityFilter,
    filtered: BytesMut,
}

impl<S> Connection<S> {
    /// Wraps an accepted stream from `peer` (named in the filter's warnings).
    fn with_peer(stream: S, peer: String) -> Self {
        Self {
            stream,
            filter: AuthorityFilter::new(peer),
            filtered: BytesMut::new(),
        }
    }
}

impl Connection<UnixStream> {
    /// Wraps a stream accepted on a unix socket; the peer is its process
    /// and user (SO_PEERCRED).
    pub fn unix(stream: UnixStream) -> Self {
        let peer = match stream.peer_cred() {
            Ok(cred) => format!("pid {} uid {}", cred.pid().unwrap_or_default(), cred.uid()),
            Err(e) => format!("unknown ({e})"),
        };
        Self::with_peer(stream, peer)
    }
}

impl Connection<TcpStream> {
    /// Wraps a stream accepted on a TCP address; the peer is its address.
    pub fn tcp(stream: TcpStream) -> Self {
        let peer = match stream.peer_addr() {
            Ok(address) => address.to_string(),
            Err(e) => format!("unknown ({e})"),
        };
        Self::with_peer(stream, peer)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Connection<S> {
    /// Reads what the filter let through; a client whose bytes it cannot
    /// follow gets InvalidData (h2 then drops the connection), logged at
    /// warn with the peer.
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.filtered.is_empty() {
            let mut chunk = [0; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.stream).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
            if let Err(e) = this.filter.push(read.filled(), &mut this.filtered) {
                tracing::warn!(peer = %this.filter.peer(), error = %e, "closing a CSI client connection");
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
            }
        }
        let n = buf.remaining().min(this.filtered.len());
        buf.put_slice(&this.filtered[..n]);
        this.filtered.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Connection<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl Connected for Connection<UnixStream> {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> UdsConnectInfo {
        self.stream.connect_info()
    }
}

impl Connected for Connection<TcpStream> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}
