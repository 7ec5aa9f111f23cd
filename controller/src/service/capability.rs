//! Which volume capabilities EBS volumes offer.

use ebs_csi_proto::v1::VolumeCapability;
use ebs_csi_proto::v1::volume_capability::AccessType;
use ebs_csi_proto::v1::volume_capability::access_mode::Mode;

use crate::error::ControllerError;

/// What a set of capabilities asks of a new volume.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// Some capability is a raw block one.
    pub block: bool,
    /// Some capability is MULTI_NODE_MULTI_WRITER: io2 Multi-Attach.
    pub multi_attach: bool,
}

/// Checks capabilities: single-node modes with block or mount access,
/// MULTI_NODE_MULTI_WRITER only with block access (io2 Multi-Attach
/// has no cluster filesystem).
///
/// # Errors
/// INVALID_ARGUMENT when the list is empty or a capability is not offered.
pub fn check(capabilities: &[VolumeCapability]) -> Result<Needs, ControllerError> {
    if capabilities.is_empty() {
        return Err(ControllerError::InvalidArgument(
            "volume_capabilities are required".into(),
        ));
    }
    capabilities.iter().try_fold(Needs::default(), |needs, cap| {
        let block = match cap.access_type {
            Some(AccessType::Block(_)) => true,
            Some(AccessType::Mount(_)) => false,
            None => return Err(ControllerError::InvalidArgument("access_type is required".into())),
        };
        let mode = cap.access_mode.as_ref().map(|m| m.mode()).unwrap_or(Mode::Unknown);
        let multi = match mode {
            Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter => false,
            Mode::MultiNodeMultiWriter if block => true,
            Mode::MultiNodeMultiWriter | Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::Unknown => {
                return Err(ControllerError::InvalidArgument(format!(
                    "access mode {} with {} access is not supported",
                    mode.as_str_name(),
                    if block { "block" } else { "mount" }
                )));
            }
        };
        Ok(Needs {
            block: needs.block || block,
            multi_attach: needs.multi_attach || multi,
        })
    })
}

#[cfg(test)]
mod tests {
    use ebs_csi_proto::v1::volume_capability::{AccessMode, BlockVolume, MountVolume};

    use super::*;

    fn cap(mode: Mode, block: bool) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume::default())
            }),
        }
    }

    #[test]
    fn accepts_single_node_modes_and_block_multi_attach() {
        assert_eq!(check(&[cap(Mode::SingleNodeWriter, false)]).unwrap(), Needs::default());
        assert_eq!(
            check(&[cap(Mode::MultiNodeMultiWriter, true)]).unwrap(),
            Needs {
                block: true,
                multi_attach: true
            }
        );
        assert!(check(&[]).is_err());
        assert!(check(&[cap(Mode::MultiNodeMultiWriter, false)]).is_err());
        assert!(check(&[cap(Mode::MultiNodeReaderOnly, true)]).is_err());
        assert!(check(&[VolumeCapability::default()]).is_err());
    }
}
