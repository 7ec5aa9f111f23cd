//! A blocking client for the helper socket (the agent runs it on a
//! blocking thread), with what only the agent needs of the protocol: the
//! version of a request, its frame, the answer read back, the volume of an
//! NVMe serial. A crate of its own, so that the privileged helper, which
//! links `ebs-csi-helper-proto`, is not built from it.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use ebs_csi_helper_proto::{FrameError, HelperError, Reply, Request, Response, write_frame};

mod frame;
mod nvme;

pub use frame::{frame, read_response, version};
pub use nvme::volume_of_serial;

/// Why a call to the helper did not produce a reply.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached (helper down, wrong path, or the
    /// helper closed the connection because the peer is not allowed).
    #[error("cannot reach the helper at {socket}: {source}")]
    Connect {
        /// The helper socket path.
        socket: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The exchange broke off or did not decode.
    #[error("helper exchange failed: {0}")]
    Frame(#[from] FrameError),
    /// The helper answered with an error.
    #[error(transparent)]
    Helper(#[from] HelperError),
}

/// Connects to the helper at a socket path, one connection per call.
#[derive(Clone, Debug)]
pub struct HelperClient {
    socket: PathBuf,
    timeout: Duration,
}

impl HelperClient {
    /// A client for the helper listening at `socket`; `timeout` bounds each
    /// read and write of an exchange (formatting a large volume is the
    /// slowest request, a few seconds with lazy initialisation).
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
        }
    }

    /// Sends `request` and waits for the helper's answer.
    ///
    /// # Errors
    /// [`ClientError::Connect`] when the socket is unreachable,
    /// [`ClientError::Frame`] when the exchange fails,
    /// [`ClientError::Helper`] when the helper refuses.
    pub fn call(&self, request: Request) -> Result<Reply, ClientError> {
        let connect_error = |source| ClientError::Connect {
            socket: self.socket.clone(),
            source,
        };
        let mut stream = UnixStream::connect(&self.socket).map_err(connect_error)?;
        stream
            .set_read_timeout(Some(self.timeout))
            .and_then(|()| stream.set_write_timeout(Some(self.timeout)))
            .map_err(connect_error)?;
        write_frame(&mut stream, &frame(request))?;
        match read_response(&mut stream)? {
            Response::Ok(reply) => Ok(reply),
            Response::Err(error) => Err(ClientError::Helper(error)),
        }
    }
}
