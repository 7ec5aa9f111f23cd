//! The agent's error type and its one mapping to gRPC status codes, per
//! the CSI spec's "Error Scheme" tables (NodeStageVolume, NodePublishVolume,
//! …) and the convention that transient conditions are retryable
//! (UNAVAILABLE) rather than INTERNAL.

use std::time::Duration;

use ebs_csi_helper_client::ClientError;
use ebs_csi_helper_proto::{HelperError, VolumeId};
use tonic::{Code, Status};

/// Why a Node or Identity RPC failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A required field is missing or malformed (checked before any side
    /// effect).
    #[error("{0}")]
    InvalidArgument(String),
    /// Another operation for the same volume is in flight.
    #[error("an operation for volume {0} is already in progress")]
    Aborted(String),
    /// The volume's device did not appear before the deadline.
    #[error("no device for volume {volume_id} appeared within {waited:?}; is it attached to this node?")]
    DeviceNotFound {
        /// The volume looked for.
        volume_id: VolumeId,
        /// How long the agent waited.
        waited: Duration,
    },
    /// The volume path does not exist.
    #[error("{0} does not exist")]
    NotFound(String),
    /// The helper could not be reached or refused.
    #[error(transparent)]
    Helper(#[from] ClientError),
    /// A local read (statvfs, sysfs, mountinfo) failed.
    #[error("{0}")]
    Internal(String),
    /// The helper answered with a reply of another kind than the
    /// request's (a helper of another protocol, or a bug).
    #[error("the helper answered {reply}, not {expected}")]
    UnexpectedReply {
        /// The kind of reply the request has.
        expected: &'static str,
        /// The reply the helper sent.
        reply: String,
    },
    /// The node's instance type runs on Xen, where no volume is staged.
    #[error(transparent)]
    Xen(#[from] crate::limits::XenInstance),
}

impl From<NodeError> for Status {
    fn from(error: NodeError) -> Self {
        let code = match &error {
            NodeError::InvalidArgument(_) => Code::InvalidArgument,
            NodeError::Aborted(_) => Code::Aborted,
            NodeError::DeviceNotFound { .. } => Code::Unavailable,
            NodeError::NotFound(_) => Code::NotFound,
            NodeError::Internal(_) | NodeError::UnexpectedReply { .. } => Code::Internal,
            NodeError::Xen(_) => Code::FailedPrecondition,
            NodeError::Helper(ClientError::Connect { .. } | ClientError::Frame(_)) => Code::Unavailable,
            NodeError::Helper(ClientError::Helper(e)) => helper_code(e),
        };
        Status::new(code, error.to_string())
    }
}

fn helper_code(error: &HelperError) -> Code {
    match error {
        HelperError::InvalidRequest(_) | HelperError::PathRefused { .. } | HelperError::MountOptionRefused(_) => {
            Code::InvalidArgument
        }
        HelperError::AlreadyMounted { .. } => Code::AlreadyExists,
        HelperError::DeviceRefused { .. }
        | HelperError::FilesystemMismatch { .. }
        | HelperError::NotMounted { .. }
        | HelperError::NotStaged { .. }
        | HelperError::StatisticsUnavailable { .. }
        | HelperError::UnsupportedVersion(_) => Code::FailedPrecondition,
        HelperError::Busy => Code::Unavailable,
        HelperError::MountLimit { .. } => Code::ResourceExhausted,
        HelperError::InProgress { .. } => Code::Aborted,
        HelperError::ToolFailed { .. } | HelperError::System { .. } => Code::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_each_error_to_its_code() {
        let volume_id = VolumeId::parse("vol-0123456789abcdef0").unwrap();
        let s = String::new;
        let cases: Vec<(NodeError, Code)> = vec![
            (NodeError::InvalidArgument(s()), Code::InvalidArgument),
            (NodeError::Aborted(s()), Code::Aborted),
            (
                NodeError::DeviceNotFound {
                    volume_id,
                    waited: Duration::from_secs(1),
                },
                Code::Unavailable,
            ),
            (NodeError::NotFound(s()), Code::NotFound),
            (NodeError::Internal(s()), Code::Internal),
            (
                ClientError::Connect {
                    socket: "/x".into(),
                    source: std::io::ErrorKind::NotFound.into(),
                }
                .into(),
                Code::Unavailable,
            ),
            (
                ClientError::Frame(ebs_csi_helper_proto::FrameError::Truncated).into(),
                Code::Unavailable,
            ),
            (
                ClientError::Helper(HelperError::PathRefused { path: s(), reason: s() }).into(),
                Code::InvalidArgument,
            ),
            (
                ClientError::Helper(HelperError::MountOptionRefused(s())).into(),
                Code::InvalidArgument,
            ),
            (
                ClientError::Helper(HelperError::AlreadyMounted { path: s(), detail: s() }).into(),
                Code::AlreadyExists,
            ),
            (
                ClientError::Helper(HelperError::NotMounted { path: s() }).into(),
                Code::FailedPrecondition,
            ),
            (
                ClientError::Helper(HelperError::NotStaged {
                    path: s(),
                    volume_id: s(),
                })
                .into(),
                Code::FailedPrecondition,
            ),
            (
                ClientError::Helper(HelperError::FilesystemMismatch {
                    device: s(),
                    found: s(),
                    requested: s(),
                })
                .into(),
                Code::FailedPrecondition,
            ),
            (
                ClientError::Helper(HelperError::DeviceRefused {
                    device: s(),
                    volume_id: s(),
                    reason: s(),
                })
                .into(),
                Code::FailedPrecondition,
            ),
            (ClientError::Helper(HelperError::Busy).into(), Code::Unavailable),
            (
                ClientError::Helper(HelperError::MountLimit { limit: 1 }).into(),
                Code::ResourceExhausted,
            ),
            (
                ClientError::Helper(HelperError::InProgress { device: s() }).into(),
                Code::Aborted,
            ),
            (
                ClientError::Helper(HelperError::ToolFailed { tool: s(), detail: s() }).into(),
                Code::Internal,
            ),
        ];
        for (error, code) in cases {
            let text = error.to_string();
            assert_eq!(Status::from(error).code(), code, "{text}");
        }
    }
}
