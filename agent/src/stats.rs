//! NodeGetVolumeStats: capacity and inode usage, and whether the volume is
//! still healthy (its mounts and its device still there).

use std::io;
use std::path::Path;

use ebs_csi_linux::mountinfo::{self, MountEntry};
use ebs_csi_proto::v1::volume_usage::Unit;
use ebs_csi_proto::v1::{NodeGetVolumeStatsResponse, VolumeCondition, VolumeUsage};
use rustix::fs::FileType;

use crate::error::NodeError;

/// Reads the usage of the volume at `volume_path` (a target or staging
/// path) and its condition. Filesystems report bytes and inodes
/// (statvfs(3)); block volumes report their size in bytes. The condition is
/// abnormal when `volume_path` or `staging_path` is no longer a mount point
/// or the device behind it has disappeared (hot-unplug, detach).
///
/// # Errors
/// NOT_FOUND when `volume_path` does not exist; INTERNAL when it cannot be
/// read.
pub fn volume_stats(
    volume_path: &str,
    staging_path: Option<&str>,
    sys_dir: &Path,
) -> Result<NodeGetVolumeStatsResponse, NodeError> {
    let stat = rustix::fs::stat(volume_path).map_err(|e| match io::Error::from(e) {
        e if e.kind() == io::ErrorKind::NotFound => NodeError::NotFound(volume_path.to_owned()),
        e if e.kind() == io::ErrorKind::PermissionDenied => NodeError::Internal(format!(
            "stat {volume_path}: {e}; the agent's user needs search permission on every parent directory"
        )),
        e => NodeError::Internal(format!("stat {volume_path}: {e}")),
    })?;
    let mounts = mountinfo::read().map_err(|e| NodeError::Internal(format!("reading mountinfo: {e}")))?;
    let mounted_at = |path: &str| mounts.iter().rev().find(|m| m.mount_point == path);
    let is_block = FileType::from_raw_mode(stat.st_mode) == FileType::BlockDevice;
    let device = if is_block {
        Some((rustix::fs::major(stat.st_rdev), rustix::fs::minor(stat.st_rdev)))
    } else {
        mounted_at(volume_path).map(|m: &MountEntry| (m.major, m.minor))
    };
    let device_dir = device.map(|(major, minor)| sys_dir.join(format!("dev/block/{major}:{minor}")));
    let problem = if mounted_at(volume_path).is_none() {
        Some(format!("{volume_path} is not mounted"))
    } else if let Some(staging) = staging_path.filter(|s| !s.is_empty() && mounted_at(s).is_none()) {
        Some(format!("the staging path {staging} is no longer mounted"))
    } else if device_dir.as_ref().is_some_and(|dir| !dir.exists()) {
        Some("the volume's block device has disappeared".to_owned())
    } else {
        None
    };
    let usage = if is_block {
        block_usage(device_dir.as_deref()).into_iter().collect()
    } else {
        filesystem_usage(volume_path)?
    };
    Ok(NodeGetVolumeStatsResponse {
        usage,
        volume_condition: Some(VolumeCondition {
            abnormal: problem.is_some(),
            message: problem.unwrap_or_else(|| "healthy".into()),
        }),
    })
}

fn filesystem_usage(path: &str) -> Result<Vec<VolumeUsage>, NodeError> {
    let vfs = rustix::fs::statvfs(path).map_err(|e| NodeError::Internal(format!("statvfs {path}: {e}")))?;
    let bytes = |blocks: u64| to_i64(blocks.saturating_mul(vfs.f_frsize));
    Ok(vec![
        VolumeUsage {
            unit: Unit::Bytes as i32,
            total: bytes(vfs.f_blocks),
            available: bytes(vfs.f_bavail),
            used: bytes(vfs.f_blocks.saturating_sub(vfs.f_bfree)),
        },
        VolumeUsage {
            unit: Unit::Inodes as i32,
            total: to_i64(vfs.f_files),
            available: to_i64(vfs.f_ffree),
            used: to_i64(vfs.f_files.saturating_sub(vfs.f_ffree)),
        },
    ])
}

fn block_usage(device_dir: Option<&Path>) -> Option<VolumeUsage> {
    Some(VolumeUsage {
        unit: Unit::Bytes as i32,
        total: to_i64(sysfs_size_bytes(device_dir?)?),
        ..VolumeUsage::default()
    })
}

/// Size in bytes of the block device at `device` (a path to the device
/// node), from sysfs; `None` when it cannot be read.
pub fn block_device_size(device: &Path, sys_dir: &Path) -> Option<u64> {
    let rdev = rustix::fs::stat(device).ok()?.st_rdev;
    sysfs_size_bytes(&sys_dir.join(format!(
        "dev/block/{}:{}",
        rustix::fs::major(rdev),
        rustix::fs::minor(rdev)
    )))
}

/// sysfs `size` is in 512-byte sectors whatever the logical block size.
fn sysfs_size_bytes(device_dir: &Path) -> Option<u64> {
    let sectors: u64 = std::fs::read_to_string(device_dir.join("size"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(sectors.saturating_mul(512))
}

/// Converts a count to the proto's `int64`, saturating.
pub fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
