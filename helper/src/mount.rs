//! The mount-table changes the helper makes, each on an fd the helper
//! resolved itself (`/proc/self/fd/N`), never on a path the agent sent.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use ebs_csi_helper_proto::{FsType, HelperError};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, StatxAttributes, StatxFlags};
use rustix::mount::{
    FsMountFlags, FsOpenFlags, MountAttrFlags, MountFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags,
};

use crate::device::VerifiedDevice;
use crate::error::Operation;
use crate::options::MountOptions;
use crate::path::{SafePath, fd_path};
use crate::sys;

/// What `statx` says about an opened path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    /// Device number (major, minor) of the filesystem holding the file.
    pub dev: (u32, u32),
    /// For device files, the device number (major, minor) they stand for.
    pub rdev: (u32, u32),
    /// Inode number.
    pub ino: u64,
    /// Id of the mount the file is on (matches mountinfo's first field).
    pub mount_id: u64,
    /// Whether the file is the root of its mount, i.e. the path is a mount
    /// point (`STATX_ATTR_MOUNT_ROOT`, Linux ≥ 5.8).
    pub is_mount_root: bool,
    /// Directory, regular file, block device, …
    pub file_type: FileType,
    /// The owner's uid.
    pub uid: u32,
    /// The size in bytes.
    pub size: u64,
}

/// Reads [`Node`] for an fd.
///
/// # Errors
/// [`HelperError::System`] when `statx` fails or the kernel does not
/// report `STATX_ATTR_MOUNT_ROOT`.
pub fn inspect(fd: BorrowedFd<'_>) -> Result<Node, HelperError> {
    let stx = rustix::fs::statx(
        fd,
        "",
        AtFlags::EMPTY_PATH,
        StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
    )
    .map_err(|e| Operation::Statx.failed(e))?;
    if !stx.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT) {
        return Err(Operation::Statx.failed("the kernel does not report STATX_ATTR_MOUNT_ROOT (needs Linux 5.8)"));
    }
    Ok(Node {
        dev: (stx.stx_dev_major, stx.stx_dev_minor),
        rdev: (stx.stx_rdev_major, stx.stx_rdev_minor),
        ino: stx.stx_ino,
        mount_id: stx.stx_mnt_id,
        is_mount_root: stx.stx_attributes.contains(StatxAttributes::MOUNT_ROOT),
        file_type: FileType::from_raw_mode(u32::from(stx.stx_mode)),
        uid: stx.stx_uid,
        size: stx.stx_size,
    })
}

/// The error behaviour ext2/3/4 are mounted with unless the request asks
/// `errors=continue` (the only other one allowed, see [`crate::options`]).
pub const EXT_ERRORS_DEFAULT: &str = "errors=remount-ro";

/// A mount made with the new mount API (`fsmount(2)`, `open_tree(2)`) and
/// not attached anywhere yet: it is checked through its own fd, then
/// attached onto the fd of the directory or file the helper resolved
/// (`move_mount(2)`), never onto a name; dropped unattached, it is gone
/// without a trace.
#[derive(Debug)]
pub struct Detached(pub(crate) OwnedFd);

impl Detached {
    /// The new mount's root.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Attaches `mount` onto `target`, the fd of the directory (or file, for a
/// device node) the helper resolved, and returns the fd of the attached
/// mount's root.
///
/// # Errors
/// [`HelperError::System`] when `move_mount(2)` fails.
pub fn attach(mount: Detached, target: BorrowedFd<'_>) -> Result<OwnedFd, HelperError> {
    tracing::info!(mount = %fd_path(&mount.0), target = %fd_path(&target), "attach mount");
    let flags = MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH;
    rustix::mount::move_mount(&mount.0, "", target, "", flags).map_err(|e| Operation::Attach.failed(e))?;
    Ok(mount.0)
}

/// `options` as a staging mount of `fs` always has them: `nosuid,nodev`;
/// XFS `nouuid`, so a copy restored from a snapshot mounts beside its
/// source; ext2/3/4 [`EXT_ERRORS_DEFAULT`] unless the request gives
/// `errors=`.
pub fn staging_options(fs: FsType, options: &MountOptions) -> MountOptions {
    let mut data = options.data.clone();
    if fs == FsType::Xfs && !data.iter().any(|o| o == "nouuid") {
        data.push("nouuid".to_owned());
    }
    if fs != FsType::Xfs && !data.iter().any(|o| o.starts_with("errors=")) {
        // ext* takes its error behaviour from the superblock unless the
        // mount gives one (ext4(5), "errors="): an image made with
        // `tune2fs -e panic` would panic the node on the first
        // inconsistency the kernel finds in it.
        data.push(EXT_ERRORS_DEFAULT.to_owned());
    }
    MountOptions {
        flags: options.flags | MountFlags::NOSUID | MountFlags::NODEV,
        data,
    }
}

/// Makes a detached mount of the filesystem on `device` (`fsopen(2)`,
/// `fsconfig(2)`, `fsmount(2)`) with `options` ([`staging_options`]). The
/// source is the kernel's name for the device ([`VerifiedDevice::path`],
/// see [`crate::device`] for why not the fd), verified again right before;
/// the caller checks the mount before attaching it.
///
/// # Errors
/// [`HelperError::DeviceRefused`] when the device changed,
/// [`HelperError::System`] when a call of the mount API fails (the
/// filesystem's own message is in the kernel log).
pub fn mount_filesystem(device: &VerifiedDevice, fs: FsType, options: &MountOptions) -> Result<Detached, HelperError> {
    let mut data = options.data.clone();
    if data.iter().any(|o| o.starts_with("context=")) && !selinux_enabled() {
        // The kernel refuses a label it has no LSM for (EINVAL); mount(8)
        // drops it (libmount), and so does this, for the same classes.
        tracing::info!("SELinux is not enabled: the context= option is left out");
        data.retain(|o| !o.starts_with("context="));
    }
    // [`staging_options`] adds these too; set here as well, a filesystem
    // of a volume is never mounted with set-uid files or device nodes that
    // work, whatever a caller passes.
    let flags = options.flags | MountFlags::NOSUID | MountFlags::NODEV;
    let source = device.path();
    device.reverify()?;
    tracing::info!(device = ?source, fs_type = fs.name(), ?flags, ?data, "mount");
    let error = |e| Operation::Mount(source.clone()).failed(e);
    let context = rustix::mount::fsopen(fs.name(), FsOpenFlags::FSOPEN_CLOEXEC).map_err(error)?;
    rustix::mount::fsconfig_set_string(&context, "source", source.as_str()).map_err(error)?;
    for option in &data {
        match option.split_once('=') {
            // A value in double quotes (an SELinux level with commas) is
            // one string to fsconfig, without them.
            Some((key, value)) => rustix::mount::fsconfig_set_string(&context, key, value.trim_matches('"')),
            None => rustix::mount::fsconfig_set_flag(&context, option.as_str()),
        }
        .map_err(error)?;
    }
    for (flag, key) in SUPERBLOCK_FLAGS {
        if flags.contains(flag) {
            rustix::mount::fsconfig_set_flag(&context, key).map_err(error)?;
        }
    }
    rustix::mount::fsconfig_create(&context).map_err(error)?;
    let mount =
        rustix::mount::fsmount(&context, FsMountFlags::FSMOUNT_CLOEXEC, mount_attributes(flags)).map_err(error)?;
    Ok(Detached(mount))
}

/// The `mount(2)` flags that belong to the filesystem (its superblock),
/// and their `fsconfig(2)` keys.
const SUPERBLOCK_FLAGS: [(MountFlags, &str); 4] = [
    (MountFlags::RDONLY, "ro"),
    (MountFlags::SYNCHRONOUS, "sync"),
    (MountFlags::DIRSYNC, "dirsync"),
    (MountFlags::LAZYTIME, "lazytime"),
];

/// The `mount(2)` flags that belong to the mount, as `fsmount(2)`
/// attributes (`MOUNT_ATTR_*`; relatime is the default, 0).
fn mount_attributes(flags: MountFlags) -> MountAttrFlags {
    [
        (MountFlags::RDONLY, MountAttrFlags::MOUNT_ATTR_RDONLY),
        (MountFlags::NOSUID, MountAttrFlags::MOUNT_ATTR_NOSUID),
        (MountFlags::NODEV, MountAttrFlags::MOUNT_ATTR_NODEV),
        (MountFlags::NOEXEC, MountAttrFlags::MOUNT_ATTR_NOEXEC),
        (MountFlags::NOATIME, MountAttrFlags::MOUNT_ATTR_NOATIME),
        (MountFlags::STRICTATIME, MountAttrFlags::MOUNT_ATTR_STRICTATIME),
        (MountFlags::NODIRATIME, MountAttrFlags::MOUNT_ATTR_NODIRATIME),
        (MountFlags::NOSYMFOLLOW, MountAttrFlags::MOUNT_ATTR_NOSYMFOLLOW),
    ]
    .into_iter()
    .filter(|(flag, _)| flags.contains(*flag))
    .fold(MountAttrFlags::empty(), |attributes, (_, attribute)| {
        attributes | attribute
    })
}

/// Whether SELinux is enabled: its filesystem is mounted (libselinux's
/// `is_selinux_enabled` test), or, in a container that has a sysfs of its
/// own without it, the process has an SELinux context (the kernel answers
/// `/proc/self/attr/selinux/current` only while SELinux is active; the
/// per-module directories of `/proc/PID/attr` are in Linux 5.1 and later).
fn selinux_enabled() -> bool {
    std::path::Path::new("/sys/fs/selinux/enforce").exists()
        || std::fs::read("/proc/self/attr/selinux/current").is_ok_and(|context| !context.is_empty())
}

/// A detached bind mount of `source` (`open_tree(2)` with
/// `OPEN_TREE_CLONE`, not recursive): the staged filesystem's root, or a
/// device node.
///
/// # Errors
/// [`HelperError::System`] when `open_tree(2)` fails.
pub fn bind(source: BorrowedFd<'_>) -> Result<Detached, HelperError> {
    tracing::info!(source = %fd_path(&source), "bind mount");
    let flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_EMPTY_PATH;
    rustix::mount::open_tree(source, "", flags)
        .map(Detached)
        .map_err(|e| Operation::Bind.failed(e))
}

/// Gives the detached `mount` exactly the per-mount `flags` (read-only,
/// `nosuid`, `nodev`, `noexec`, the atime mode, `nosymfollow`; every other
/// of these cleared) before it is attached anywhere (`mount_setattr(2)`,
/// Linux ≥ 5.12), so that it is never visible with fewer (third audit A9).
///
/// # Errors
/// [`HelperError::System`] when `mount_setattr(2)` fails.
pub fn set_attributes(mount: &Detached, flags: MountFlags) -> Result<(), HelperError> {
    tracing::info!(mount = %fd_path(&mount.0), ?flags, "set mount attributes");
    let per_mount = MountAttrFlags::MOUNT_ATTR_RDONLY
        | MountAttrFlags::MOUNT_ATTR_NOSUID
        | MountAttrFlags::MOUNT_ATTR_NODEV
        | MountAttrFlags::MOUNT_ATTR_NOEXEC
        | MountAttrFlags::MOUNT_ATTR__ATIME
        | MountAttrFlags::MOUNT_ATTR_NODIRATIME
        | MountAttrFlags::MOUNT_ATTR_NOSYMFOLLOW;
    sys::mount_setattr(
        mount.fd(),
        mount_attributes(flags).bits().into(),
        per_mount.bits().into(),
    )
    .map_err(|e| Operation::SetAttributes.failed(e))
}

/// Creates the mount point `target` in its opened parent `parent`: a
/// directory, mode 0755 (a filesystem volume's target), or else an empty
/// regular file, mode 0640 (a block volume's, a mount point for the device
/// node), never following a symlink or taking an existing file.
///
/// # Errors
/// [`HelperError::System`] when `mkdirat(2)` or `openat(2)` fails
/// (`EEXIST` when something is there already).
pub fn create_mount_point(
    parent: BorrowedFd<'_>,
    target: &SafePath<'_>,
    file_type: FileType,
) -> Result<(), HelperError> {
    let error = |e| Operation::Create(target.as_str().to_owned()).failed(e);
    tracing::info!(target = ?target.as_str(), ?file_type, "create mount point");
    if file_type == FileType::Directory {
        rustix::fs::mkdirat(parent, target.name(), Mode::from_raw_mode(0o755)).map_err(error)
    } else {
        let flags = OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        rustix::fs::openat(parent, target.name(), flags, Mode::from_raw_mode(0o640))
            .map(drop)
            .map_err(error)
    }
}

/// Unmounts the mount at `name` in the directory `parent`, without
/// following a symlink in the last component (`UMOUNT_NOFOLLOW`). The
/// caller must not hold an fd inside the mount, or it stays busy.
///
/// # Errors
/// [`HelperError::System`] when `umount2(2)` fails (`EBUSY` while in use).
pub fn unmount(parent: BorrowedFd<'_>, name: &str) -> Result<(), HelperError> {
    let target = format!("{}/{name}", fd_path(&parent));
    tracing::info!(?target, "unmount");
    rustix::mount::unmount(target.as_str(), UnmountFlags::NOFOLLOW)
        .map_err(|e| Operation::Unmount(name.to_owned()).failed(e))
}
