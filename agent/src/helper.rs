//! The helper, seen from the async agent: each call runs the blocking
//! client on tokio's blocking pool.

use std::path::PathBuf;
use std::time::Duration;

use ebs_csi_helper_client::HelperClient;
use ebs_csi_helper_proto::{
    ExpandRequest, PerformanceStatisticsRequest, Reply, Request, VolumeStatsRequest, VolumeUsage,
};
use ebs_csi_proto::telemetry;
use tracing::Instrument;

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

    /// Stage, Unstage, Publish or Unpublish: `request` done.
    ///
    /// # Errors
    /// As [`Helper::call`].
    pub async fn act(&self, request: Request) -> Result<(), NodeError> {
        match self.call(request).await? {
            Reply::Done => Ok(()),
            other => Err(unexpected("Done", &other)),
        }
    }

    /// Expand: the device's size in bytes.
    ///
    /// # Errors
    /// As [`Helper::call`].
    pub async fn expand(&self, request: ExpandRequest) -> Result<u64, NodeError> {
        match self.call(Request::Expand(request)).await? {
            Reply::Expanded { size_bytes } => Ok(size_bytes),
            other => Err(unexpected("Expanded", &other)),
        }
    }

    /// VolumeStats: the volume's usage.
    ///
    /// # Errors
    /// As [`Helper::call`].
    pub async fn volume_stats(&self, request: VolumeStatsRequest) -> Result<VolumeUsage, NodeError> {
        match self.call(Request::VolumeStats(request)).await? {
            Reply::VolumeStats(usage) => Ok(usage),
            other => Err(unexpected("VolumeStats", &other)),
        }
    }

    /// PerformanceStatistics: the log page's bytes.
    ///
    /// # Errors
    /// As [`Helper::call`].
    pub async fn performance_statistics(&self, request: PerformanceStatisticsRequest) -> Result<Vec<u8>, NodeError> {
        match self.call(Request::PerformanceStatistics(request)).await? {
            Reply::PerformanceStatistics(page) => Ok(page),
            other => Err(unexpected("PerformanceStatistics", &other)),
        }
    }

    /// Whether the helper answers a ping.
    pub async fn is_ready(&self) -> bool {
        matches!(self.call(Request::Ping).await, Ok(Reply::Pong { .. }))
    }

    /// Sends `request` and waits for the reply.
    ///
    /// # Errors
    /// [`NodeError::Helper`]: UNAVAILABLE when the helper is unreachable,
    /// otherwise the code of the helper's refusal.
    ///
    /// Its span ([`telemetry::call_span`]) is `helper.Stage` and so on.
    async fn call(&self, request: Request) -> Result<Reply, NodeError> {
        let span = telemetry::call_span("ebs-csi-helper", "helper", operation(&request));
        let client = self.client.clone();
        let reply = tokio::task::spawn_blocking(move || client.call(request))
            .instrument(span.clone())
            .await
            .map_err(|e| NodeError::Internal(format!("helper call task failed: {e}")))?
            .map_err(NodeError::from);
        if let Err(e) = &reply {
            telemetry::record_error(&span, &e.to_string());
        }
        reply
    }
}

/// The name of `request`'s operation, as the helper's protocol names it.
fn operation(request: &Request) -> &'static str {
    match request {
        Request::Ping => "Ping",
        Request::Stage(_) => "Stage",
        Request::Unstage(_) => "Unstage",
        Request::Publish(_) => "Publish",
        Request::Unpublish(_) => "Unpublish",
        Request::Expand(_) => "Expand",
        Request::VolumeStats(_) => "VolumeStats",
        Request::PerformanceStatistics(_) => "PerformanceStatistics",
    }
}

/// A reply of another kind than the request's.
fn unexpected(expected: &'static str, reply: &Reply) -> NodeError {
    NodeError::UnexpectedReply {
        expected,
        reply: format!("{reply:?}"),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use ebs_csi_helper_proto::{RequestFrame, Response, VolumeId, decode, read_payload, write_frame};
    use tonic::Code;

    use super::*;

    /// A helper that answers one request with `reply`, whatever it was.
    fn answering(reply: Reply) -> (tempfile::TempDir, Helper) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("helper.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let _: RequestFrame = decode(&read_payload(&mut stream).unwrap()).unwrap();
            write_frame(&mut stream, &Response::Ok(reply)).unwrap();
        });
        (dir, Helper::new(socket, Duration::from_secs(5)))
    }

    #[tokio::test]
    async fn a_reply_of_another_kind_is_internal_naming_both() {
        let (_dir, helper) = answering(Reply::Done);
        let request = ExpandRequest {
            volume_id: VolumeId::parse("vol-0123456789abcdef0").unwrap(),
            device: "/dev/nvme1n1".into(),
            volume_path: "/var/lib/kubelet/x".into(),
        };
        let error = helper.expand(request).await.unwrap_err();
        assert_eq!(error.to_string(), "the helper answered Done, not Expanded");
        assert_eq!(tonic::Status::from(error).code(), Code::Internal);
        let (_dir, helper) = answering(Reply::Expanded { size_bytes: 1 << 30 });
        let error = helper.act(Request::Ping).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "the helper answered Expanded { size_bytes: 1073741824 }, not Done"
        );
    }
}
