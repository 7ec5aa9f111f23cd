//! The helper's own errors, each mapped once to the wire's
//! [`HelperError`]: why a path is refused ([`PathRefusal`]; a device's
//! refusals are [`crate::device::Refusal`]) and which operation of the
//! system failed ([`Operation`]). Together with the variants the requests
//! answer directly, they are every answer but `Done`.

use std::fmt::Display;

use ebs_csi_helper_proto::HelperError;
use rustix::fs::FileType;

/// The reason of [`HelperError::PathRefused`] for a path that is not where
/// the orchestrator puts a CSI volume's staging or target path of the
/// request's kind (`--allowed-layout`).
pub const NOT_ITS_SHAPE: &str = "is not where the orchestrator stages or publishes a CSI volume of this kind";

/// The reason of [`HelperError::PathRefused`] for a path whose parents
/// cross a mount point (or leave their root).
pub const CROSSES_MOUNT: &str = "a parent crosses a mount point or leaves its root";

/// The reason of [`HelperError::PathRefused`] for a symlink anywhere in
/// the path.
pub const SYMLINK: &str = "a component is a symlink";

/// The reason Unpublish gives for a path it will not remove.
pub const NOT_A_MOUNT_POINT: &str = "is neither a mount the helper made nor an empty mount point it could have created";

/// The reason Unstage and Unpublish give for a mount the helper does not make.
pub const FOREIGN_MOUNT: &str = "is a mount the helper does not make";

/// The reason of [`HelperError::PathRefused`] for a staging or target path
/// that holds something: another pod's configMap directory, its
/// `etc-hosts`, kubelet's `pods/` — nothing the orchestrator prepares for a
/// CSI volume holds anything before the volume is mounted there.
pub const NOT_EMPTY: &str = "holds files; only an empty directory or an empty file is mounted over";

/// The reason of [`HelperError::PathRefused`] for a staging path named by
/// another volume's hash (kubelet's is sha256 of the volume handle).
pub const OTHER_VOLUMES_HASH: &str = "is named by another volume's hash (kubelet's is sha256 of the volume id)";

/// The reason of [`HelperError::PathRefused`] for a path without kubelet's
/// record of its volume, or with one kubelet did not write.
pub const NO_VOLUME_RECORD: &str = "has no record of its volume from kubelet beside it (vol_data.json: a file of the \
     helper's user, written by no one else, a JSON object of at most 64 KiB)";

/// The reason of [`HelperError::PathRefused`] for a Nomad target whose
/// volume id and usage are not its staging path's.
pub const OTHER_VOLUMES_TARGET: &str =
    "is not a target of the volume staged at the staging path (Nomad's volume id and usage in both)";

/// The reason of [`HelperError::PathRefused`] for a path whose kubelet
/// record names another driver or another volume.
pub const OTHER_VOLUMES_RECORD: &str = "is another driver's or another volume's, as kubelet's record beside it says";

/// Why a path is refused: the `reason` of [`HelperError::PathRefused`], one
/// variant per check, in the order of `docs/helper.md` ("Paths", then the
/// requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathRefusal {
    /// Longer than `PATH_MAX`, or a NUL in it.
    #[error("too long or contains NUL")]
    TooLong,
    /// Relative.
    #[error("not absolute")]
    NotAbsolute,
    /// An empty, `.` or `..` component.
    #[error("has an empty, '.' or '..' component")]
    NotCanonical,
    /// Not strictly beneath one of the allowed roots.
    #[error("not beneath an allowed root")]
    OutsideRoots,
    /// Not where the orchestrator puts a CSI volume's path of its kind.
    #[error("{}", NOT_ITS_SHAPE)]
    NotItsShape,
    /// A symlink anywhere in the path.
    #[error("{}", SYMLINK)]
    Symlink,
    /// A parent is a mount point, or leaves its root.
    #[error("{}", CROSSES_MOUNT)]
    CrossesMount,
    /// A staging path named by another volume's hash.
    #[error("{}", OTHER_VOLUMES_HASH)]
    OtherVolumesHash,
    /// No record of the volume from kubelet beside the path.
    #[error("{}", NO_VOLUME_RECORD)]
    NoVolumeRecord,
    /// kubelet's record beside the path names another driver or volume.
    #[error("{}", OTHER_VOLUMES_RECORD)]
    OtherVolumesRecord,
    /// A Nomad target of another volume or usage than its staging path.
    #[error("{}", OTHER_VOLUMES_TARGET)]
    OtherVolumesTarget,
    /// A parent is not a directory.
    #[error("a parent component is not a directory")]
    ParentNotDirectory,
    /// A parent is missing (and is not to be created).
    #[error("a parent directory does not exist")]
    ParentMissing,
    /// The path itself is missing.
    #[error("does not exist")]
    Missing,
    /// The path is not of the type the request needs.
    #[error("is not a {0:?}")]
    NotOfType(FileType),
    /// A target that exists is not of the type the source needs.
    #[error("exists and is not a {0:?}")]
    ExistsOfOtherType(FileType),
    /// A directory with an entry, or a file with a byte.
    #[error("{}", NOT_EMPTY)]
    NotEmpty,
    /// A mount point the helper does not make.
    #[error("{}", FOREIGN_MOUNT)]
    ForeignMount,
    /// What Unpublish does not remove.
    #[error("{}", NOT_A_MOUNT_POINT)]
    NotAMountPoint,
}

impl PathRefusal {
    /// The wire error refusing `path` for this reason.
    pub fn of(self, path: &str) -> HelperError {
        HelperError::PathRefused {
            path: path.to_owned(),
            reason: self.to_string(),
        }
    }
}

/// An operation of the system the helper needs and that failed: the
/// `operation` of [`HelperError::System`], whose `detail` is the cause (an
/// errno's text, mostly).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Operation {
    /// Reading the helper's mountinfo.
    #[error("reading mountinfo")]
    ReadMountinfo,
    /// Reading PID 1's mountinfo.
    #[error("reading PID 1's mountinfo")]
    ReadHostMountinfo,
    /// Resolving a path beneath its root.
    #[error("resolving {0}")]
    Resolve(String),
    /// `statx` of an fd.
    #[error("statx")]
    Statx,
    /// Opening a target in its parent.
    #[error("opening {0}")]
    Open(String),
    /// Listing a directory to prove it empty.
    #[error("listing {0}")]
    List(String),
    /// Creating a target.
    #[error("creating {0}")]
    Create(String),
    /// Reopening a target the request created.
    #[error("opening the new target")]
    OpenNewTarget,
    /// Removing a target.
    #[error("removing {0}")]
    Remove(String),
    /// Duplicating a device's fd.
    #[error("duplicating the device fd")]
    DuplicateDevice,
    /// Reading a device's size.
    #[error("reading the size of {0}")]
    ReadSize(String),
    /// Proving a device blank.
    #[error("proving volume {0} blank")]
    ProveBlank(String),
    /// Finding a tool.
    #[error("finding {0}")]
    FindTool(&'static str),
    /// Handing a job to the runner process and taking its answer.
    #[error("exec")]
    Exec,
    /// Confining a tool with Landlock.
    #[error("confining {0}")]
    Confine(String),
    /// Starting a tool.
    #[error("starting {0}")]
    Start(String),
    /// Waiting for a tool.
    #[error("waiting for {0}")]
    Wait(String),
    /// Mounting a device's filesystem (detached).
    #[error("mounting {0}")]
    Mount(String),
    /// Making a detached bind mount.
    #[error("bind mount")]
    Bind,
    /// Checking a new bind mount before attaching it.
    #[error("checking the new bind mount")]
    CheckBind,
    /// Attaching a detached mount.
    #[error("attaching the mount")]
    Attach,
    /// Giving a detached bind mount its flags.
    #[error("setting a mount's attributes")]
    SetAttributes,
    /// Unmounting a name in its parent.
    #[error("unmounting {0}")]
    Unmount(String),
    /// Reading a filesystem's superblock.
    #[error("reading the superblock of {0}")]
    ReadSuperblock(String),
    /// Growing an ext filesystem in the kernel.
    #[error("growing the filesystem at {0} to {1} blocks")]
    Grow(String, u64),
    /// `fstatvfs` of a mount.
    #[error("statvfs")]
    Statvfs,
    /// NVMe Get Log Page on a device.
    #[error("Get Log Page on {0}")]
    StatisticsPage(String),
}

impl Operation {
    /// The wire error of this operation failing for `cause`.
    pub fn failed(self, cause: impl Display) -> HelperError {
        HelperError::System {
            operation: self.to_string(),
            detail: cause.to_string(),
        }
    }
}
