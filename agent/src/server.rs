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

/// Serves Identity and Node until SIGTERM or SIGINT: on the socket passed
/// when the agent is socket-activated (`ebs-csi-agent.socket`, or the Nomad
/// job's `systemd-socket-activate`; the file is then theirs), otherwise on
/// `socket`, created here and removed at exit.
///
/// # Errors
/// [`ServeError::Listen`] or [`ServeError::Transport`].
pub async fn serve(socket: &Path, identity: IdentityService, node: NodeService) -> Result<(), ServeError> {
    let listen_error = |source| ServeError::Listen {
        path: socket.to_owned(),
        source,
    };
    let listening = endpoint::listen(socket).map_err(listen_error)?;
    if listening.passed {
        tracing::info!("serving CSI Identity and Node on the socket passed in");
    } else {
        tracing::info!(socket = %socket.display(), "serving CSI Identity and Node");
    }
    tonic::transport::Server::builder()
        .trace_fn(ebs_csi_proto::telemetry::rpc_span)
        .add_service(IdentityServer::new(identity))
        .add_service(NodeServer::new(node))
        .serve_with_incoming_shutdown(endpoint::connections(listening.listener), endpoint::shutdown_signal())
        .await?;
    if !listening.passed {
        let _ = std::fs::remove_file(socket);
    }
    Ok(())
}
