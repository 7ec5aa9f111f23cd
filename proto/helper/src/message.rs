//! The requests and replies of protocol versions [`OLDEST_VERSION`]
//! through [`PROTOCOL_VERSION`].
//!
//! Paths travel as strings: the helper validates them itself against its
//! allowed roots and never trusts the agent's view of the file system.

use serde::{Deserialize, Serialize};

use crate::{FormatOptions, HelperError, VolumeId};

/// The newest protocol version this crate speaks.
///
/// A new version only adds requests (with their replies and errors), or
/// optional fields whose absence means what the older version did; it
/// never changes the meaning of one that exists. A frame carries the
/// version that introduced its request, or the newest field it uses
/// (the agent's `ebs_csi_helper_client::version`), and the helper serves
/// every frame from [`OLDEST_VERSION`] up to its own version. So the agent
/// and the helper may be upgraded in either order — a node's DaemonSet and
/// its host package never change at the same moment: an older agent's
/// frames are all known to a newer helper, and a newer agent's frames are
/// known to an older helper except for requests added since, which it
/// answers with [`HelperError::UnsupportedVersion`] naming the version.
/// An error added for an existing request
/// ([`HelperError::MountLimit`]) reaches an older agent as an answer it
/// cannot decode (`docs/helper.md`, "Protocol versions").
pub const PROTOCOL_VERSION: u16 = 6;

/// The oldest frame version the helper serves: version 3, the first under
/// the rule above (helpers of version 3 accept frames of exactly 3).
pub const OLDEST_VERSION: u16 = 3;

/// What the agent sends: one request tagged with its protocol version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestFrame {
    /// The version that introduced the request (the agent's
    /// `ebs_csi_helper_client::version`); the helper refuses anything
    /// outside [`OLDEST_VERSION`]..=[`PROTOCOL_VERSION`].
    pub version: u16,
    /// The operation asked for.
    pub request: Request,
}

/// The version field alone, read first so that a frame of a version the
/// helper does not serve is answered with [`HelperError::UnsupportedVersion`]
/// even when its request does not decode in this version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct FrameVersion {
    /// The sender's protocol version.
    pub version: u16,
}

/// Every operation the helper performs. The set is closed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Liveness check; answered with [`Reply::Pong`] and no side effect.
    Ping,
    /// Format a blank device if needed and mount it at the staging path.
    Stage(StageRequest),
    /// Unmount the staging path.
    Unstage(UnstageRequest),
    /// Bind-mount a staged filesystem or a block device at a target path.
    Publish(PublishRequest),
    /// Unmount a target path and remove the mount point.
    Unpublish(UnpublishRequest),
    /// Grow a mounted filesystem to the size of its device.
    Expand(ExpandRequest),
    /// Read the usage of a mounted volume; changes nothing.
    VolumeStats(VolumeStatsRequest),
    /// Read a volume's EBS performance statistics log page; changes
    /// nothing.
    PerformanceStatistics(PerformanceStatisticsRequest),
}

/// Filesystems the helper can create and mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsType {
    /// ext2, made with `mkfs.ext2`.
    Ext2,
    /// ext3, made with `mkfs.ext3`.
    Ext3,
    /// ext4, made with `mkfs.ext4` (the CSI default of the Go driver).
    Ext4,
    /// XFS, made with `mkfs.xfs`, always mounted with `nouuid`.
    Xfs,
}

impl FsType {
    /// The name used by the kernel, `blkid` and the CSI `fs_type` field.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ext2 => "ext2",
            Self::Ext3 => "ext3",
            Self::Ext4 => "ext4",
            Self::Xfs => "xfs",
        }
    }

    /// Parses a kernel/blkid filesystem name; `None` for anything else.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Ext2, Self::Ext3, Self::Ext4, Self::Xfs]
            .into_iter()
            .find(|fs| fs.name() == name)
    }
}

/// Stage: make `device` (which must be the EBS volume `volume_id`) a
/// mounted filesystem at `staging_path`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageRequest {
    /// The volume the device must prove to be.
    pub volume_id: VolumeId,
    /// The block device as `/dev/<kernel name>`, e.g. `/dev/nvme1n1`
    /// (no symlink, no udev link: the helper refuses any other form).
    pub device: String,
    /// Absolute staging path, under one of the helper's allowed roots.
    pub staging_path: String,
    /// The filesystem to create on a blank device, or to expect.
    pub fs_type: FsType,
    /// Mount options (each must be on the helper's allowlist).
    pub mount_flags: Vec<String>,
    /// Options for `mkfs`, used only when the device is blank.
    pub format: FormatOptions,
}

/// Unstage: unmount `staging_path`; success when it is not mounted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnstageRequest {
    /// Absolute staging path, under one of the helper's allowed roots.
    pub staging_path: String,
}

/// Publish: bind-mount a source at `target_path`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    /// Absolute target path; created (directory or file) when missing.
    pub target_path: String,
    /// Mount read-only.
    pub readonly: bool,
    /// What to bind-mount.
    pub source: PublishSource,
}

/// The source of a [`PublishRequest`]. Both name the volume and its
/// device: the helper binds only what it has proved to be that volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum PublishSource {
    /// A filesystem volume, already mounted at `staging_path` by Stage; the
    /// mount must be the filesystem on `device`, proved to be `volume_id`.
    Staging {
        /// The volume the staged filesystem must belong to.
        volume_id: VolumeId,
        /// The block device, `/dev/<kernel name>` (e.g. `/dev/nvme1n1`).
        device: String,
        /// Absolute staging path, under one of the helper's allowed roots.
        staging_path: String,
        /// Per-mount options (each must be on the helper's allowlist).
        mount_flags: Vec<String>,
    },
    /// A raw block volume: `device` is bind-mounted onto a file.
    Device {
        /// The volume the device must prove to be.
        volume_id: VolumeId,
        /// The block device, `/dev/<kernel name>`.
        device: String,
    },
}

/// Unpublish: unmount `target_path` and remove it; success when missing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnpublishRequest {
    /// Absolute target path, under one of the helper's allowed roots.
    pub target_path: String,
}

/// Expand: grow the filesystem mounted at `volume_path` from `device`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpandRequest {
    /// The volume the device must prove to be.
    pub volume_id: VolumeId,
    /// The block device, `/dev/<kernel name>`.
    pub device: String,
    /// A staging or target path where the device's filesystem is mounted.
    pub volume_path: String,
}

/// VolumeStats: the usage of the volume mounted at `volume_path`, for
/// NodeGetVolumeStats. The agent cannot read it itself: kubelet makes every
/// directory above a volume path root-owned and 0750.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeStatsRequest {
    /// The volume whose device must be what is mounted at `volume_path`.
    pub volume_id: VolumeId,
    /// A staging or target path: the mount of the volume's filesystem, or
    /// the bind of its device node (a raw block volume).
    pub volume_path: String,
}

/// PerformanceStatistics: the EBS detailed performance statistics of the
/// volume on `device` (NVMe Get Log Page 0xD0, which needs CAP_SYS_ADMIN
/// on every kernel), for the agent's `/metrics`. The helper returns the
/// page unparsed: the agent, unprivileged, parses what the device wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerformanceStatisticsRequest {
    /// The volume the device must prove to be.
    pub volume_id: VolumeId,
    /// The block device as `/dev/<kernel name>`, e.g. `/dev/nvme1n1`.
    pub device: String,
}

/// The usage of a volume (the answer to [`Request::VolumeStats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeUsage {
    /// A mounted filesystem, from statvfs(3).
    Filesystem {
        /// Size of the filesystem, in bytes (`f_blocks × f_frsize`).
        total_bytes: u64,
        /// Bytes an unprivileged user may still write (`f_bavail × f_frsize`).
        available_bytes: u64,
        /// Bytes in use (`(f_blocks − f_bfree) × f_frsize`).
        used_bytes: u64,
        /// Inodes in the filesystem (`f_files`).
        total_inodes: u64,
        /// Inodes free (`f_ffree`).
        free_inodes: u64,
        /// Inodes in use (`f_files − f_ffree`).
        used_inodes: u64,
    },
    /// A raw block volume: the size of its device, in bytes.
    Block {
        /// `BLKGETSIZE64` of the device.
        size_bytes: u64,
    },
}

/// A successful answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The request's end state holds (it may already have held).
    Done,
    /// Answer to [`Request::Ping`], with the helper's protocol version.
    Pong {
        /// The helper's [`PROTOCOL_VERSION`].
        version: u16,
    },
    /// Answer to [`Request::Expand`].
    Expanded {
        /// The size of the block device, and so of the grown filesystem's
        /// volume, in bytes.
        size_bytes: u64,
    },
    /// Answer to [`Request::VolumeStats`].
    VolumeStats(VolumeUsage),
    /// Answer to [`Request::PerformanceStatistics`]: the log page's first
    /// 4096 bytes, as the device wrote them.
    PerformanceStatistics(Vec<u8>),
}

/// What the helper sends back: exactly one frame per request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The request succeeded.
    Ok(Reply),
    /// The request was refused or failed; nothing was changed unless the
    /// error says so.
    Err(HelperError),
}

#[cfg(test)]
mod tests {
    use ciborium::Value;

    use super::*;
    use crate::{FrameError, decode};

    fn encode(value: &Value) -> Vec<u8> {
        let mut bytes = Vec::new();
        ciborium::into_writer(value, &mut bytes).unwrap();
        bytes
    }

    /// A frame of the oldest version around `request`.
    fn frame(request: Value) -> Value {
        Value::Map(vec![
            (Value::from("version"), Value::from(OLDEST_VERSION)),
            (Value::from("request"), request),
        ])
    }

    fn unstage_frame(extra: Option<(&str, &str)>) -> Value {
        let mut fields = vec![(Value::from("staging_path"), Value::from("/var/lib/kubelet/x"))];
        fields.extend(extra.map(|(k, v)| (Value::from(k), Value::from(v))));
        frame(Value::Map(vec![(Value::from("Unstage"), Value::Map(fields))]))
    }

    #[test]
    fn decodes_a_well_formed_request() {
        let frame: RequestFrame = decode(&encode(&unstage_frame(None))).unwrap();
        assert_eq!(
            frame.request,
            Request::Unstage(UnstageRequest {
                staging_path: "/var/lib/kubelet/x".into()
            })
        );
    }

    #[test]
    fn refuses_unknown_fields_variants_and_bad_volume_ids() {
        let unknown_field = unstage_frame(Some(("lazy", "true")));
        let unknown_kind = frame(Value::from("Format"));
        let bad_volume = frame(Value::Map(vec![(
            Value::from("Expand"),
            Value::Map(vec![
                (Value::from("volume_id"), Value::from("vol-../../etc")),
                (Value::from("device"), Value::from("/dev/nvme1n1")),
                (Value::from("volume_path"), Value::from("/var/lib/kubelet/x")),
            ]),
        )]));
        let staging_source = |extra: Option<(&str, bool)>| {
            let mut fields = vec![
                (Value::from("volume_id"), Value::from("vol-0123456789abcdef0")),
                (Value::from("device"), Value::from("/dev/nvme1n1")),
                (Value::from("staging_path"), Value::from("/var/lib/kubelet/s")),
                (Value::from("mount_flags"), Value::Array(vec![])),
            ];
            fields.extend(extra.map(|(k, v)| (Value::from(k), Value::from(v))));
            frame(Value::Map(vec![(
                Value::from("Publish"),
                Value::Map(vec![
                    (Value::from("target_path"), Value::from("/var/lib/kubelet/t")),
                    (Value::from("readonly"), Value::from(false)),
                    (
                        Value::from("source"),
                        Value::Map(vec![(Value::from("Staging"), Value::Map(fields))]),
                    ),
                ]),
            )]))
        };
        decode::<RequestFrame>(&encode(&staging_source(None))).unwrap();
        let unknown_in_variant = staging_source(Some(("recursive", true)));
        for value in [unknown_field, unknown_kind, bad_volume, unknown_in_variant] {
            let result = decode::<RequestFrame>(&encode(&value));
            assert!(
                matches!(result, Err(FrameError::Decode(_))),
                "{value:?} decoded: {result:?}"
            );
        }
    }
}
