//! The mount-table changes the helper makes, each on an fd the helper
//! resolved itself (`/proc/self/fd/N`), never on a path the agent sent.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use ebs_csi_helper_proto::{FsType, HelperError};
use rustix::fs::{AtFlags, FileType, StatxAttributes, StatxFlags};
use rustix::mount::{MountFlags, UnmountFlags};

use crate::device::VerifiedDevice;
use crate::error::system;
use crate::options::MountOptions;
use crate::path::fd_path;

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
}

/// Reads [`Node`] for an fd.
///
/// # Errors
/// [`HelperError::System`] when `statx` fails or the kernel does not
/// report `STATX_ATTR_MOUNT_ROOT`.
pub fn inspect(fd: &OwnedFd) -> Result<Node, HelperError> {
    let stx = rustix::fs::statx(
        fd,
        "",
        AtFlags::EMPTY_PATH,
        StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
    )
    .map_err(|e| system("statx", e))?;
    if !stx.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT) {
        return Err(system(
            "statx",
            "the kernel does not report STATX_ATTR_MOUNT_ROOT (needs Linux 5.8)",
        ));
    }
    Ok(Node {
        dev: (stx.stx_dev_major, stx.stx_dev_minor),
        rdev: (stx.stx_rdev_major, stx.stx_rdev_minor),
        ino: stx.stx_ino,
        mount_id: stx.stx_mnt_id,
        is_mount_root: stx.stx_attributes.contains(StatxAttributes::MOUNT_ROOT),
        file_type: FileType::from_raw_mode(u32::from(stx.stx_mode)),
    })
}

/// The error behaviour ext2/3/4 are mounted with unless the request asks
/// `errors=continue` (the only other one allowed, see [`crate::options`]).
pub const EXT_ERRORS_DEFAULT: &str = "errors=remount-ro";

/// Mounts the filesystem on `device` at the directory `target` with
/// `mount(2)`. The source is the kernel's name for the device
/// ([`VerifiedDevice::path`], see [`crate::device`] for why not the fd),
/// verified again right before the call; the caller checks the new mount
/// right after. Always `nosuid,nodev`; XFS always `nouuid`, so a copy
/// restored from a snapshot mounts beside its source; ext2/3/4
/// [`EXT_ERRORS_DEFAULT`] unless the request gives `errors=`.
///
/// # Errors
/// [`HelperError::DeviceRefused`] when the device changed,
/// [`HelperError::System`] when `mount(2)` fails.
pub fn mount_filesystem(
    device: &VerifiedDevice,
    target: &OwnedFd,
    fs: FsType,
    options: &MountOptions,
) -> Result<(), HelperError> {
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
    if !selinux_enabled() && data.iter().any(|o| o.starts_with("context=")) {
        // The kernel refuses a label it has no LSM for (EINVAL); mount(8)
        // drops it (libmount), and so does this, for the same classes.
        tracing::info!("SELinux is not enabled: the context= option is left out");
        data.retain(|o| !o.starts_with("context="));
    }
    let data = CString::new(data.join(",")).map_err(|e| system("mount data", e))?;
    let flags = options.flags | MountFlags::NOSUID | MountFlags::NODEV;
    let source = device.path();
    device.reverify()?;
    tracing::info!(device = ?source, target = %fd_path(target), fs_type = fs.name(), ?flags, ?data, "mount");
    rustix::mount::mount(
        source.as_str(),
        fd_path(target).as_str(),
        fs.name(),
        flags,
        Some(data.as_c_str()),
    )
    .map_err(|e| system(format!("mounting {source}"), e))
}

/// Whether SELinux is enabled: its filesystem is mounted (libselinux's
/// `is_selinux_enabled` test).
fn selinux_enabled() -> bool {
    std::path::Path::new("/sys/fs/selinux/enforce").exists()
}

/// Bind-mounts `source` onto `target` (`MS_BIND`, not recursive).
///
/// # Errors
/// [`HelperError::System`] when `mount(2)` fails.
pub fn bind(source: &impl AsFd, target: &OwnedFd) -> Result<(), HelperError> {
    let source = fd_path(&source.as_fd().as_raw_fd());
    tracing::info!(%source, target = %fd_path(target), "bind mount");
    rustix::mount::mount_bind(source.as_str(), fd_path(target).as_str()).map_err(|e| system("bind mount", e))
}

/// Applies per-mount `flags` to the bind mount whose root is `mount_root`
/// (`MS_REMOUNT | MS_BIND`).
///
/// # Errors
/// [`HelperError::System`] when `mount(2)` fails.
pub fn remount_bind(mount_root: &OwnedFd, flags: MountFlags) -> Result<(), HelperError> {
    tracing::info!(target = %fd_path(mount_root), ?flags, "remount bind");
    rustix::mount::mount_remount(fd_path(mount_root).as_str(), MountFlags::BIND | flags, "")
        .map_err(|e| system("remount", e))
}

/// Unmounts the mount at `name` in the directory `parent`, without
/// following a symlink in the last component (`UMOUNT_NOFOLLOW`). The
/// caller must not hold an fd inside the mount, or it stays busy.
///
/// # Errors
/// [`HelperError::System`] when `umount2(2)` fails (`EBUSY` while in use).
pub fn unmount(parent: &OwnedFd, name: &str) -> Result<(), HelperError> {
    let target = format!("{}/{name}", fd_path(parent));
    tracing::info!(?target, "unmount");
    rustix::mount::unmount(target.as_str(), UnmountFlags::NOFOLLOW).map_err(|e| system(format!("unmounting {name}"), e))
}
