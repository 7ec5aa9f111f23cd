//! The helper, seen from the async agent: each call runs the blocking
//! client on tokio's blocking pool.

use std::path::PathBuf;
use std::time::Duration;

use ebs_csi_helper_proto::{HelperClient, Reply, Request};

use crate::error::NodeError;

/// Sends requests to the helper socket.
#[derive(Clone, Debug)]
pub struct Helper {
    client: HelperClient,
}

impl Helper {
    /// A helper client for `socket`; `timeout` bounds each read and write.
    pub fn new(socket: PathBuf, timeout: Duration) -> Self {
        Self {
            client: HelperClient::new(socket, timeout),
        }
    }

    /// Sends `request` and waits for the reply.
    ///
    /// # Errors
    /// [`NodeError::Helper`]: UNAVAILABLE when the helper is unreachable,
    /// otherwise the code of the helper's refusal.
    pub async fn call(&self, request: Request) -> Result<Reply, NodeError> {
        let client = self.client.clone();
        tokio::task::spawn_blocking(move || client.call(request))
            .await
            .map_err(|e| NodeError::Internal(format!("helper call task failed: {e}")))?
            .map_err(NodeError::from)
    }

    /// Whether the helper answers a ping.
    pub async fn is_ready(&self) -> bool {
        matches!(self.call(Request::Ping).await, Ok(Reply::Pong { .. }))
    }
}
