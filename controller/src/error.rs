//! The controller's error type and its one mapping to gRPC status codes,
//! per the CSI spec's "Error Scheme" tables (DESIGN.md §7). Throttling
//! that survives the SDK's retries and unreachable endpoints are
//! UNAVAILABLE, never INTERNAL, so orchestrators retry.

use ebs_csi_proto::inflight::AlreadyInFlight;
use tonic::{Code, Status};

use crate::ec2::Ec2Error;

/// Why a Controller or Identity RPC failed.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// A field or parameter is missing or malformed (before any EC2 call).
    #[error("{0}")]
    InvalidArgument(String),
    /// The requested capacity is outside what the volume type allows.
    #[error("{0}")]
    OutOfRange(String),
    /// The volume, snapshot or node does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A volume or snapshot of that name exists with other parameters.
    #[error("{0}")]
    AlreadyExists(String),
    /// The resource's state does not allow the call (attached elsewhere, …).
    #[error("{0}")]
    FailedPrecondition(String),
    /// No attachment slot, or no zone satisfies the topology.
    #[error("{0}")]
    ResourceExhausted(String),
    /// Another operation for the same key is in flight.
    #[error("{0}")]
    Aborted(String),
    /// The request asks for something this driver does not do.
    #[error("{0}")]
    Unimplemented(String),
    /// A state change did not complete in time; retry.
    #[error("{0}")]
    Unavailable(String),
    /// An EC2 call failed.
    #[error(transparent)]
    Ec2(#[from] Ec2Error),
    /// Something that should not happen did.
    #[error("{0}")]
    Internal(String),
}

impl From<AlreadyInFlight> for ControllerError {
    fn from(e: AlreadyInFlight) -> Self {
        Self::Aborted(e.to_string())
    }
}

impl From<ControllerError> for Status {
    fn from(error: ControllerError) -> Self {
        let code = match &error {
            ControllerError::InvalidArgument(_) => Code::InvalidArgument,
            ControllerError::OutOfRange(_) => Code::OutOfRange,
            ControllerError::NotFound(_) => Code::NotFound,
            ControllerError::AlreadyExists(_) => Code::AlreadyExists,
            ControllerError::FailedPrecondition(_) => Code::FailedPrecondition,
            ControllerError::ResourceExhausted(_) => Code::ResourceExhausted,
            ControllerError::Aborted(_) => Code::Aborted,
            ControllerError::Unimplemented(_) => Code::Unimplemented,
            ControllerError::Unavailable(_) => Code::Unavailable,
            ControllerError::Internal(_) => Code::Internal,
            ControllerError::Ec2(e) => match e {
                Ec2Error::NotFound(_) => Code::NotFound,
                Ec2Error::IdempotentParameterMismatch(_) => Code::AlreadyExists,
                Ec2Error::IncorrectState(_) => Code::FailedPrecondition,
                Ec2Error::AttachmentLimitExceeded(_) | Ec2Error::QuotaExceeded(_) => Code::ResourceExhausted,
                Ec2Error::InvalidParameter(_) => Code::InvalidArgument,
                Ec2Error::DeviceNameRefused(_) | Ec2Error::Throttled(_) | Ec2Error::Transport(_) => Code::Unavailable,
                Ec2Error::Service { .. } => Code::Internal,
            },
        };
        Status::new(code, error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_each_error_to_its_code() {
        let s = || "x".to_owned();
        let cases: Vec<(ControllerError, Code)> = vec![
            (ControllerError::InvalidArgument(s()), Code::InvalidArgument),
            (ControllerError::OutOfRange(s()), Code::OutOfRange),
            (ControllerError::NotFound(s()), Code::NotFound),
            (ControllerError::AlreadyExists(s()), Code::AlreadyExists),
            (ControllerError::FailedPrecondition(s()), Code::FailedPrecondition),
            (ControllerError::ResourceExhausted(s()), Code::ResourceExhausted),
            (ControllerError::Aborted(s()), Code::Aborted),
            (ControllerError::Unimplemented(s()), Code::Unimplemented),
            (ControllerError::Unavailable(s()), Code::Unavailable),
            (ControllerError::Internal(s()), Code::Internal),
            (Ec2Error::NotFound(s()).into(), Code::NotFound),
            (Ec2Error::IdempotentParameterMismatch(s()).into(), Code::AlreadyExists),
            (Ec2Error::IncorrectState(s()).into(), Code::FailedPrecondition),
            (Ec2Error::AttachmentLimitExceeded(s()).into(), Code::ResourceExhausted),
            (Ec2Error::InvalidParameter(s()).into(), Code::InvalidArgument),
            (Ec2Error::DeviceNameRefused(s()).into(), Code::Unavailable),
            (Ec2Error::QuotaExceeded(s()).into(), Code::ResourceExhausted),
            (Ec2Error::Throttled(s()).into(), Code::Unavailable),
            (Ec2Error::Transport(s()).into(), Code::Unavailable),
            (
                Ec2Error::Service {
                    code: s(),
                    message: s(),
                }
                .into(),
                Code::Internal,
            ),
            (AlreadyInFlight(s()).into(), Code::Aborted),
        ];
        for (error, code) in cases {
            let text = format!("{error:?}");
            assert_eq!(Status::from(error).code(), code, "{text}");
        }
    }
}
