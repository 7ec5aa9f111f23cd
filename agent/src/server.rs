//! Serving gRPC on the CSI endpoint.

use ebs_csi_proto::listener::{self, Endpoint};
use ebs_csi_proto::v1::identity_server::IdentityServer;
use ebs_csi_proto::v1::node_server::NodeServer;

use crate::identity::IdentityService;
use crate::node::NodeService;

/// Why the endpoint could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The endpoint could not be listened on.
    #[error("cannot listen on {endpoint:?}: {source}")]
    Listen {
        /// The endpoint.
        endpoint: Endpoint,
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
/// `endpoint`, a unix socket created here and removed at exit or a TCP
/// address.
///
/// # Errors
/// [`ServeError::Listen`] or [`ServeError::Transport`].
pub async fn serve(endpoint: &Endpoint, identity: IdentityService, node: NodeService) -> Result<(), ServeError> {
    let listening = listener::listen(endpoint).await.map_err(|source| ServeError::Listen {
        endpoint: endpoint.clone(),
        source,
    })?;
    if listening.passed {
        tracing::info!("serving CSI Identity and Node on the socket passed in");
    } else {
        tracing::info!(endpoint = ?endpoint, "serving CSI Identity and Node");
    }
    let created = match endpoint {
        Endpoint::Unix(socket) if !listening.passed => Some(socket.clone()),
        _ => None,
    };
    let router = tonic::transport::Server::builder()
        .trace_fn(ebs_csi_proto::telemetry::rpc_span)
        .add_service(IdentityServer::new(identity))
        .add_service(NodeServer::new(node));
    listener::serve(router, listening.listener).await?;
    if let Some(socket) = created {
        let _ = std::fs::remove_file(socket);
    }
    Ok(())
}
