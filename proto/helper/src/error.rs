//! The one error type the helper sends over the wire.

use serde::{Deserialize, Serialize};

/// Why the helper refused or failed a request. The agent maps each
/// variant to exactly one gRPC status code.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum HelperError {
    /// The frame's version is outside [`crate::OLDEST_VERSION`]..=
    /// [`crate::PROTOCOL_VERSION`]: from a newer agent, its request is one
    /// this helper does not know.
    #[error("protocol version {0} is not supported")]
    UnsupportedVersion(u16),
    /// A field is malformed (frame decode, bad option value, relative path).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A path is outside the allowed roots, contains `..` or a symlink, or
    /// is of the wrong kind.
    #[error("path {path} refused: {reason}")]
    PathRefused {
        /// The path as the agent sent it.
        path: String,
        /// What check it failed.
        reason: String,
    },
    /// The device is not provably the named EBS volume.
    #[error("device {device} refused for volume {volume_id}: {reason}")]
    DeviceRefused {
        /// The device path as the agent sent it.
        device: String,
        /// The volume the device was supposed to be.
        volume_id: String,
        /// What check it failed.
        reason: String,
    },
    /// A mount option is refused: the option in double quotes and why
    /// (`"suid" refused: set-user-ID files …`).
    #[error("mount option {0}")]
    MountOptionRefused(String),
    /// The device already holds a different filesystem or a partition
    /// table; it is never reformatted.
    #[error("device {device} holds {found}, not {requested}; it is never reformatted")]
    FilesystemMismatch {
        /// The device path.
        device: String,
        /// What `blkid` found on it.
        found: String,
        /// The filesystem asked for.
        requested: String,
    },
    /// Something else, or the same thing incompatibly, is mounted there.
    #[error("{path} is already mounted incompatibly: {detail}")]
    AlreadyMounted {
        /// The staging or target path.
        path: String,
        /// What is mounted there instead.
        detail: String,
    },
    /// The path must be a mount point and is not.
    #[error("{path} is not mounted")]
    NotMounted {
        /// The staging or volume path.
        path: String,
    },
    /// The staging path is mounted, but not with the named volume's
    /// filesystem (another device, or not ext2/3/4 or XFS).
    #[error("{path} is not the staged filesystem of volume {volume_id}")]
    NotStaged {
        /// The staging path.
        path: String,
        /// The volume the request named.
        volume_id: String,
    },
    /// The helper is at its concurrency limit; try again.
    #[error("the helper is busy; try again")]
    Busy,
    /// A Stage or Publish would make a mount, and `limit` mount points
    /// beneath the allowed roots already hold volumes (the helper's
    /// `--max-mounts`; third audit A3). Newer than protocol version 5: an
    /// agent of version 5 or older reads this answer as malformed.
    #[error("{limit} mount points beneath the allowed roots hold volumes already, the helper's limit (--max-mounts)")]
    MountLimit {
        /// The limit.
        limit: u32,
    },
    /// Another request is formatting this device right now, or a read of
    /// it by an earlier request has not ended; try again.
    #[error("device {device} is busy with another request (a format, or a read that has not ended); try again")]
    InProgress {
        /// The device path.
        device: String,
    },
    /// An external tool (mkfs, xfs_growfs, blkid) failed.
    #[error("{tool} failed: {detail}")]
    ToolFailed {
        /// Absolute path of the tool.
        tool: String,
        /// Exit status and the tail of its stderr.
        detail: String,
    },
    /// The device has no EBS performance statistics log page: the
    /// controller completed Get Log Page with a non-zero NVMe status.
    #[error("device {device} has no EBS performance statistics (NVMe status {status:#x})")]
    StatisticsUnavailable {
        /// The device path.
        device: String,
        /// The NVMe status (status code type and status code).
        status: u32,
    },
    /// A system call failed unexpectedly.
    #[error("{operation} failed: {detail}")]
    System {
        /// What the helper was doing.
        operation: String,
        /// The OS error.
        detail: String,
    },
}
