//! Expand (`docs/helper.md`, "Expand").

use ebs_csi_helper_proto::{ExpandRequest, FsType, HelperError, Reply};
use rustix::fs::FileType;

use super::{Handler, find_mount};
use crate::path::SafePath;

impl Handler {
    /// Expand (the volume path's form already judged): verify the device,
    /// check it is what is mounted at the volume path, grow the filesystem
    /// online (the tool gets the device, or for XFS the mount's root, as
    /// its fd 3), report the device size.
    pub(super) fn expand(&self, r: &ExpandRequest, path: &SafePath<'_>) -> Result<Reply, HelperError> {
        let mounts = self.kernel.mounts()?;
        let device = self.verify(&r.volume_id, &r.device, &mounts)?;
        let not_mounted = || HelperError::NotMounted {
            path: r.volume_path.clone(),
        };
        let (fd, node) = self
            .open_existing(path, FileType::Directory)
            .map_err(|_| not_mounted())?;
        if !node.is_mount_root || node.dev != device.number {
            return Err(not_mounted());
        }
        let fs_type = find_mount(&mounts, node.mount_id)
            .and_then(|m| FsType::from_name(&m.fs_type))
            .ok_or_else(not_mounted)?;
        tracing::info!(volume_id = %r.volume_id, device = ?device.path(), volume_path = ?r.volume_path, "grow filesystem");
        self.grow(fs_type, &device, &fd, true)?;
        Ok(Reply::Expanded {
            size_bytes: device.size_bytes()?,
        })
    }
}
