//! The read-only requests, served outside the lock: VolumeStats and
//! PerformanceStatistics (`docs/helper.md`).

use std::os::fd::AsFd;

use ebs_csi_helper_proto::{HelperError, PerformanceStatisticsRequest, Reply, VolumeStatsRequest, VolumeUsage};
use ebs_csi_linux::nvme::LogPage;
use rustix::fs::FileType;

use super::{Handler, MountKind, refuse_foreign_mount};
use crate::error::Operation;
use crate::layout::Role;

impl Handler {
    /// VolumeStats (read-only, so outside the lock): the volume path (a
    /// staging or target path, or kubelet's map of a raw block volume into
    /// a pod) must be the root of a mount of ext2/3/4 or XFS, or a device
    /// node's bind; the disk behind it (the filesystem's device, or
    /// the node's) must prove to be the volume; then statvfs of that same
    /// mount's fd, or the device's size.
    pub(super) fn volume_stats(&self, r: &VolumeStatsRequest) -> Result<Reply, HelperError> {
        let mounts = self.kernel.mounts()?;
        let path = self.roots.check(&r.volume_path, Role::Stats)?;
        let not_mounted = || HelperError::NotMounted {
            path: r.volume_path.clone(),
        };
        let fd = path.open()?.ok_or_else(not_mounted)?;
        let node = self.kernel.inspect(fd.as_fd())?;
        if !node.is_mount_root {
            return Err(not_mounted());
        }
        refuse_foreign_mount(&path, &node, &mounts, MountKind::FilesystemOrDevice)?;
        let is_block = node.file_type == FileType::BlockDevice;
        let number = if is_block { node.rdev } else { node.dev };
        let not_staged = || HelperError::NotStaged {
            path: r.volume_path.clone(),
            volume_id: r.volume_id.to_string(),
        };
        let device = self.verify(
            &r.volume_id,
            &self.kernel.device_path(number).ok_or_else(not_staged)?,
            &mounts,
        )?;
        if device.number != number {
            return Err(not_staged());
        }
        let usage = if is_block {
            VolumeUsage::Block {
                size_bytes: device.size_bytes()?,
            }
        } else {
            let vfs = rustix::fs::fstatvfs(&fd).map_err(|e| Operation::Statvfs.failed(e))?;
            VolumeUsage::Filesystem {
                total_bytes: vfs.f_blocks.saturating_mul(vfs.f_frsize),
                available_bytes: vfs.f_bavail.saturating_mul(vfs.f_frsize),
                used_bytes: vfs.f_blocks.saturating_sub(vfs.f_bfree).saturating_mul(vfs.f_frsize),
                total_inodes: vfs.f_files,
                free_inodes: vfs.f_ffree,
                used_inodes: vfs.f_files.saturating_sub(vfs.f_ffree),
            }
        };
        Ok(Reply::VolumeStats(usage))
    }

    /// PerformanceStatistics (read-only, so outside the lock): the device
    /// must prove to be the volume; then Get Log Page 0xD0 on that same
    /// fd, its bytes returned as they are.
    pub(super) fn performance_statistics(&self, r: &PerformanceStatisticsRequest) -> Result<Reply, HelperError> {
        let mounts = self.kernel.mounts()?;
        let device = self.verify(&r.volume_id, &r.device, &mounts)?;
        match self.kernel.statistics_page(&device)? {
            LogPage::Read(page) => Ok(Reply::PerformanceStatistics(page.to_vec())),
            LogPage::Unavailable(status) => Err(HelperError::StatisticsUnavailable {
                device: device.path(),
                status,
            }),
        }
    }
}
