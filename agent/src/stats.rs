//! NodeGetVolumeStats: capacity and inode usage, and whether the volume is
//! still healthy (its mounts and its device still there).
//!
//! The agent reads the mount table and sysfs itself; the usage comes from
//! the helper (a read-only request): kubelet makes every directory above a
//! volume path root-owned and 0750, so the unprivileged agent cannot stat it.

use std::path::Path;

use ebs_csi_helper_client::ClientError;
use ebs_csi_helper_proto::{HelperError, VolumeId, VolumeStatsRequest, VolumeUsage as Usage};
use ebs_csi_linux::mountinfo::{self, MountEntry};
use ebs_csi_proto::v1::volume_usage::Unit;
use ebs_csi_proto::v1::{NodeGetVolumeStatsResponse, VolumeCondition, VolumeUsage};

use crate::error::NodeError;
use crate::helper::Helper;

/// The usage of `volume_id` at `volume_path` (a target or staging path)
/// and its condition. Filesystems report bytes and inodes (statvfs(3), read
/// by the helper); raw block volumes report their size in bytes. The
/// condition is abnormal when `staging_path` is no longer a mount point or
/// the device behind the volume has disappeared (hot-unplug, detach); the
/// usage is then left out when it cannot be read.
///
/// # Errors
/// NOT_FOUND when nothing is mounted at `volume_path`, or the helper finds
/// that what is mounted there is not the volume (CSI spec,
/// NodeGetVolumeStats: "volume does not exist on specified volume_path");
/// INTERNAL when the mount table cannot be read; the helper's other errors.
pub async fn volume_stats(
    helper: &Helper,
    volume_id: VolumeId,
    volume_path: &str,
    staging_path: Option<&str>,
    sys_dir: &Path,
) -> Result<NodeGetVolumeStatsResponse, NodeError> {
    let mounts = mountinfo::read().map_err(|e| NodeError::Internal(format!("reading mountinfo: {e}")))?;
    let mounted_at = |path: &str| mounts.iter().rev().find(|m| m.mount_point == path);
    let not_found = || NodeError::NotFound(format!("volume {volume_id} mounted at {volume_path}"));
    let mount = mounted_at(volume_path).ok_or_else(not_found)?;
    let problem = if let Some(staging) = staging_path.filter(|s| !s.is_empty() && mounted_at(s).is_none()) {
        Some(format!("the staging path {staging} is no longer mounted"))
    } else if !device_dir(mount, sys_dir).exists() {
        Some("the volume's block device has disappeared".to_owned())
    } else {
        None
    };
    let request = VolumeStatsRequest {
        volume_id: volume_id.clone(),
        volume_path: volume_path.to_owned(),
    };
    let usage = match helper.volume_stats(request).await {
        Ok(usage) => to_proto(usage),
        Err(NodeError::Helper(ClientError::Helper(
            HelperError::NotMounted { .. } | HelperError::NotStaged { .. } | HelperError::DeviceRefused { .. },
        ))) if problem.is_some() => Vec::new(),
        Err(NodeError::Helper(ClientError::Helper(HelperError::NotMounted { .. } | HelperError::NotStaged { .. }))) => {
            return Err(not_found());
        }
        Err(e) => return Err(e),
    };
    Ok(NodeGetVolumeStatsResponse {
        usage,
        volume_condition: Some(VolumeCondition {
            abnormal: problem.is_some(),
            message: problem.unwrap_or_else(|| "healthy".into()),
        }),
    })
}

/// The sysfs directory of the disk behind `mount`: the filesystem's
/// device, or for a raw block volume (its device node bind-mounted from
/// devtmpfs, whose mount root is `/<kernel name>`) that node's disk.
fn device_dir(mount: &MountEntry, sys_dir: &Path) -> std::path::PathBuf {
    match mount.fs_type.as_str() {
        "devtmpfs" => sys_dir.join("class/block").join(mount.root.trim_start_matches('/')),
        _ => sys_dir.join(format!("dev/block/{}:{}", mount.major, mount.minor)),
    }
}

/// The partition of `disk` mounted at `volume_path` (a volume staged with
/// the `partition` attribute), as `/dev/<kernel name>`, its name
/// `<disk>p<N>` from sysfs; `None` when what is mounted there is not a
/// partition of `disk`.
pub fn mounted_partition(disk: &Path, volume_path: &str, sys_dir: &Path) -> Option<std::path::PathBuf> {
    let mounts = mountinfo::read().ok()?;
    let mount = mounts.iter().rev().find(|m| m.mount_point == volume_path)?;
    let name = std::fs::read_link(device_dir(mount, sys_dir)).ok()?;
    let name = name.file_name()?.to_str()?;
    let number = name.strip_prefix(disk.file_name()?.to_str()?)?.strip_prefix('p')?;
    (!number.is_empty() && number.bytes().all(|b| b.is_ascii_digit())).then(|| disk.with_file_name(name))
}

fn to_proto(usage: Usage) -> Vec<VolumeUsage> {
    match usage {
        Usage::Filesystem {
            total_bytes,
            available_bytes,
            used_bytes,
            total_inodes,
            free_inodes,
            used_inodes,
        } => vec![
            VolumeUsage {
                unit: Unit::Bytes as i32,
                total: to_i64(total_bytes),
                available: to_i64(available_bytes),
                used: to_i64(used_bytes),
            },
            VolumeUsage {
                unit: Unit::Inodes as i32,
                total: to_i64(total_inodes),
                available: to_i64(free_inodes),
                used: to_i64(used_inodes),
            },
        ],
        Usage::Block { size_bytes } => vec![VolumeUsage {
            unit: Unit::Bytes as i32,
            total: to_i64(size_bytes),
            ..VolumeUsage::default()
        }],
    }
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
