//! Shorthands for building the wire error from OS errors.

use std::fmt::Display;

use ebs_csi_helper_proto::HelperError;

/// [`HelperError::System`] for a failed `operation`.
pub(crate) fn system(operation: impl Into<String>, detail: impl Display) -> HelperError {
    HelperError::System {
        operation: operation.into(),
        detail: detail.to_string(),
    }
}
