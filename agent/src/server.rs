//! Serving gRPC on the CSI unix socket.

use std::path::Path;

use ebs_csi_proto::endpoint;
use ebs_csi_proto::v1::identity_server::IdentityServer;
use ebs_csi_proto::v1::node_server::NodeServer;

use crate::identity::IdentityService;
use crate::node::NodeService;

/// Why the endpoint could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket path.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
}

/// Serves Identity and Node on `socket` until SIGTERM or SIGINT.
///
/// # Errors
/// [`ServeError::Listen`] or [`ServeError::Transport`].
pub async fn serve(socket: &Path, identity: IdentityService, node: NodeService) -> Result<(), ServeError> {
    let incoming = endpoint::bind(socket).map_err(|source| ServeError::Listen {
        path: socket.to_owned(),
        source,
    })?;
    tracing::info!(socket = %socket.display(), "serving CSI Identity and Node");
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(identity))
        .add_service(NodeServer::new(node))
        .serve_with_incoming_shutdown(incoming, endpoint::shutdown_signal())
        .await?;
    let _ = std::fs::remove_file(socket);
    Ok(())
}
