//! Serving gRPC on the CSI unix socket.

use std::path::{Path, PathBuf};

use ebs_csi_proto::v1::identity_server::IdentityServer;
use ebs_csi_proto::v1::node_server::NodeServer;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::identity::IdentityService;
use crate::node::NodeService;

/// Why the endpoint could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The endpoint is not `unix://PATH` (or `unix:PATH`).
    #[error("endpoint {0:?} is not unix:///absolute/path")]
    Endpoint(String),
    /// The socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
}

/// The socket path of a CSI endpoint such as `unix:///csi/csi.sock`.
///
/// # Errors
/// [`ServeError::Endpoint`] for anything but an absolute unix path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, ServeError> {
    endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .filter(|p| p.starts_with('/'))
        .map(PathBuf::from)
        .ok_or_else(|| ServeError::Endpoint(endpoint.to_owned()))
}

/// Serves Identity and Node on `socket` (a stale socket file is replaced)
/// until `shutdown` completes.
///
/// # Errors
/// [`ServeError::Listen`] or [`ServeError::Transport`].
pub async fn serve(
    socket: &Path,
    identity: IdentityService,
    node: NodeService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let listen_error = |source| ServeError::Listen {
        path: socket.to_owned(),
        source,
    };
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(listen_error(e)),
        _ => {}
    }
    let listener = UnixListener::bind(socket).map_err(listen_error)?;
    tracing::info!(socket = %socket.display(), "serving CSI Identity and Node");
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(identity))
        .add_service(NodeServer::new(node))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    let _ = std::fs::remove_file(socket);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unix_endpoints() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        for bad in ["tcp://127.0.0.1:1", "unix://relative", "/csi.sock"] {
            assert!(socket_path(bad).is_err(), "{bad}");
        }
    }
}
