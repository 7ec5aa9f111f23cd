//! Conversion of CSI request fields to validated types, before any side
//! effect. Every failure is INVALID_ARGUMENT, except a volume id that
//! cannot exist where the volume must ([`existing_volume_id`]: NOT_FOUND).

use std::collections::HashMap;
use std::path::PathBuf;

use ebs_csi_helper_proto::{FormatOptions, FsType, VolumeId};
use ebs_csi_proto::format_context;
use ebs_csi_proto::v1::VolumeCapability;
use ebs_csi_proto::v1::volume_capability::access_mode::Mode;
use ebs_csi_proto::v1::volume_capability::{AccessMode, AccessType};

use crate::error::NodeError;

/// The filesystem used when a Mount capability names none (the Go
/// driver's default).
pub const DEFAULT_FS_TYPE: FsType = FsType::Ext4;

/// How a volume is presented to the workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// A raw block device.
    Block,
    /// A mounted filesystem.
    Mount {
        /// The filesystem type.
        fs_type: FsType,
        /// Mount options (the helper checks them against its allowlist).
        mount_flags: Vec<String>,
    },
}

/// Parses a volume id.
///
/// # Errors
/// INVALID_ARGUMENT when it is empty or not an EBS volume id.
pub fn volume_id(id: &str) -> Result<VolumeId, NodeError> {
    if id.is_empty() {
        return Err(NodeError::InvalidArgument("volume_id is required".into()));
    }
    VolumeId::parse(id).map_err(|e| NodeError::InvalidArgument(e.to_string()))
}

/// Parses the volume id of a request about a volume that must exist on
/// this node (NodeUnstage, NodeUnpublish, NodeGetVolumeStats,
/// NodeExpandVolume): an id that names no EBS volume names no volume at
/// all, which the CSI spec answers with NOT_FOUND (csi-spec.md, the
/// "Errors" table of each of these RPCs: "Volume does not exist").
///
/// # Errors
/// INVALID_ARGUMENT when it is empty, NOT_FOUND when it is not an EBS
/// volume id.
pub fn existing_volume_id(id: &str) -> Result<VolumeId, NodeError> {
    match volume_id(id) {
        Err(NodeError::InvalidArgument(_)) if !id.is_empty() => {
            Err(NodeError::NotFound(format!("volume {id:?}: not an EBS volume id")))
        }
        other => other,
    }
}

/// Requires a non-empty path field.
///
/// # Errors
/// INVALID_ARGUMENT naming `field` when `value` is empty.
pub fn required_path<'a>(field: &str, value: &'a str) -> Result<&'a str, NodeError> {
    if value.is_empty() {
        return Err(NodeError::InvalidArgument(format!("{field} is required")));
    }
    Ok(value)
}

/// Checks a volume capability: an access mode this node supports and an
/// access type. MULTI_NODE_MULTI_WRITER (io2 Multi-Attach) is for block
/// volumes only.
///
/// # Errors
/// INVALID_ARGUMENT when the capability is missing, has no or an
/// unsupported access mode, no access type, or an unknown fs_type.
pub fn capability(capability: Option<&VolumeCapability>) -> Result<Access, NodeError> {
    let invalid = |m: String| NodeError::InvalidArgument(m);
    let capability = capability.ok_or_else(|| invalid("volume_capability is required".into()))?;
    let mode = capability
        .access_mode
        .as_ref()
        .map(AccessMode::mode)
        .ok_or_else(|| invalid("volume_capability.access_mode is required".into()))?;
    let access = match &capability.access_type {
        Some(AccessType::Block(_)) => Access::Block,
        Some(AccessType::Mount(mount)) => Access::Mount {
            fs_type: if mount.fs_type.is_empty() {
                DEFAULT_FS_TYPE
            } else {
                FsType::from_name(&mount.fs_type.to_ascii_lowercase()).ok_or_else(|| {
                    invalid(format!(
                        "fs_type {:?} is not supported (ext2, ext3, ext4, xfs)",
                        mount.fs_type
                    ))
                })?
            },
            mount_flags: mount.mount_flags.clone(),
        },
        None => return Err(invalid("volume_capability.access_type is required".into())),
    };
    let supported = match mode {
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => true,
        Mode::MultiNodeMultiWriter => access == Access::Block,
        Mode::Unknown | Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter => false,
    };
    if !supported {
        return Err(invalid(format!(
            "access mode {} is not supported for this access type",
            mode.as_str_name()
        )));
    }
    Ok(access)
}

/// Reads the formatting options from `volume_context` (keys as the Go
/// driver's StorageClass parameters, case-insensitive). Other keys are
/// ignored: the context carries more.
///
/// # Errors
/// INVALID_ARGUMENT when a value is not a number (or `true`/`false`).
pub fn format_options(context: &HashMap<String, String>) -> Result<FormatOptions, NodeError> {
    format_context::from_map(context).map_err(NodeError::InvalidArgument)
}

/// The Go driver's volume attribute that names a partition of the volume
/// to stage or publish (`pkg/driver/node.go`, `PartitionKey`); `0` or none
/// is the whole volume.
pub const PARTITION_KEY: &str = "partition";

/// The partition of the volume `volume_context` names ([`PARTITION_KEY`]):
/// `None` for the whole volume (no key, empty or `0`, as the Go driver
/// reads it). The helper proves a partition by its disk's identity.
///
/// # Errors
/// INVALID_ARGUMENT when the value is not a partition number.
pub fn partition(context: &HashMap<String, String>) -> Result<Option<u32>, NodeError> {
    match context.get(PARTITION_KEY).map(String::as_str) {
        None | Some("" | "0") => Ok(None),
        Some(value) => value.parse().map(Some).map_err(|_| {
            NodeError::InvalidArgument(format!(
                "volume attribute partition={value}: not a partition number (1, 2, …; 0 is the whole volume)"
            ))
        }),
    }
}

/// The device to act on: `disk`, or its partition `partition` as the
/// kernel names it, `<disk>p<N>` (every disk here, `nvmeXnY` or `loopN`,
/// ends in a digit: `block/partitions/core.c`, `add_partition`).
pub fn on_partition(disk: PathBuf, partition: Option<u32>) -> PathBuf {
    match partition {
        None => disk,
        Some(number) => {
            let mut name = disk.into_os_string();
            name.push(format!("p{number}"));
            name.into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_named_by_its_number() {
        use std::path::Path;

        let context = |value: &str| HashMap::from([(PARTITION_KEY.to_owned(), value.to_owned())]);
        for (value, expected) in [("0", None), ("", None), ("1", Some(1)), ("12", Some(12))] {
            assert_eq!(partition(&context(value)).unwrap(), expected, "{value}");
        }
        assert_eq!(partition(&HashMap::new()).unwrap(), None);
        for value in ["one", "-1", "1p"] {
            let Err(NodeError::InvalidArgument(message)) = partition(&context(value)) else {
                panic!("partition={value} accepted");
            };
            assert_eq!(
                message,
                format!("volume attribute partition={value}: not a partition number (1, 2, …; 0 is the whole volume)")
            );
        }
        assert_eq!(
            on_partition("/dev/nvme1n1".into(), Some(2)),
            Path::new("/dev/nvme1n1p2")
        );
        assert_eq!(on_partition("/dev/loop3".into(), None), Path::new("/dev/loop3"));
    }
    use ebs_csi_proto::v1::volume_capability::{BlockVolume, MountVolume};

    fn cap(mode: Mode, access_type: Option<AccessType>) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type,
        }
    }

    fn mount(fs_type: &str) -> Option<AccessType> {
        Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            ..MountVolume::default()
        }))
    }

    #[test]
    fn accepts_supported_capabilities() {
        let ext4 = Access::Mount {
            fs_type: FsType::Ext4,
            mount_flags: vec![],
        };
        assert_eq!(capability(Some(&cap(Mode::SingleNodeWriter, mount("")))).unwrap(), ext4);
        assert_eq!(
            capability(Some(&cap(Mode::SingleNodeReaderOnly, mount("XFS")))).unwrap(),
            Access::Mount {
                fs_type: FsType::Xfs,
                mount_flags: vec![]
            }
        );
        let block = Some(AccessType::Block(BlockVolume {}));
        assert_eq!(
            capability(Some(&cap(Mode::MultiNodeMultiWriter, block))).unwrap(),
            Access::Block
        );
    }

    #[test]
    fn refuses_bad_capabilities() {
        let cases = [
            None,
            Some(cap(Mode::SingleNodeWriter, None)),
            Some(VolumeCapability {
                access_mode: None,
                access_type: mount("ext4"),
            }),
            Some(cap(Mode::MultiNodeMultiWriter, mount("ext4"))),
            Some(cap(Mode::MultiNodeReaderOnly, mount("ext4"))),
            Some(cap(Mode::Unknown, mount("ext4"))),
            Some(cap(Mode::SingleNodeWriter, mount("btrfs"))),
        ];
        for case in cases {
            assert!(
                matches!(capability(case.as_ref()), Err(NodeError::InvalidArgument(_))),
                "{case:?}"
            );
        }
    }

    #[test]
    fn refuses_bad_ids_and_format_values() {
        let bad: HashMap<String, String> = [("blocksize".to_owned(), "4k".to_owned())].into();
        assert!(format_options(&bad).is_err());
        assert!(volume_id("").is_err() && volume_id("vol-xyz").is_err());
    }

    #[test]
    fn a_volume_that_cannot_exist_is_not_found() {
        assert!(matches!(existing_volume_id(""), Err(NodeError::InvalidArgument(_))));
        assert!(matches!(
            existing_volume_id("fake-vol-id"),
            Err(NodeError::NotFound(m)) if m == "volume \"fake-vol-id\": not an EBS volume id"
        ));
        assert_eq!(
            existing_volume_id("vol-0123456789abcdef0").unwrap().as_str(),
            "vol-0123456789abcdef0"
        );
        assert!(matches!(volume_id("fake-vol-id"), Err(NodeError::InvalidArgument(_))));
    }
}
