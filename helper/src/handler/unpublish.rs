//! Unpublish (`docs/helper.md`, "Unpublish").

use std::os::fd::AsFd;

use ebs_csi_helper_proto::{HelperError, Reply};
use rustix::fs::{AtFlags, FileType};

use super::{Handler, MountKind, open_target, refuse_foreign_mount};
use crate::error::{Operation, PathRefusal};
use crate::path::SafePath;

impl Handler {
    /// Unpublish: resolve the target; unmount it if it is a mount the
    /// helper makes (a bind of an ext2/3/4 or XFS filesystem, or of a
    /// device node); then remove what is left only if it is an empty
    /// directory or empty regular file owned by root, as the helper creates
    /// them. Anything else is refused and left as it is.
    pub(super) fn unpublish(&self, target: &SafePath<'_>) -> Result<Reply, HelperError> {
        let Some(fd) = target.open()? else {
            return Ok(Reply::Done);
        };
        let parent = target.open_parent(false)?;
        let node = self.kernel.inspect(fd.as_fd())?;
        drop(fd);
        if node.is_mount_root {
            refuse_foreign_mount(target, &node, &self.kernel.mounts()?, MountKind::FilesystemOrDevice)?;
            self.kernel.unmount(parent.as_fd(), target.name())?;
        }
        let Some(fd) = open_target(&parent, target)? else {
            return Ok(Reply::Done);
        };
        let left = self.kernel.inspect(fd.as_fd())?;
        drop(fd);
        let not_ours = || PathRefusal::NotAMountPoint.of(target.as_str());
        let ours = left.uid == 0;
        let flags = match left.file_type {
            FileType::Directory if ours => AtFlags::REMOVEDIR,
            FileType::RegularFile if ours && left.size == 0 => AtFlags::empty(),
            _ => return Err(not_ours()),
        };
        tracing::info!(target = ?target.as_str(), "remove mount point");
        rustix::fs::unlinkat(&parent, target.name(), flags).map_err(|e| match e {
            rustix::io::Errno::NOTEMPTY => not_ours(),
            e => Operation::Remove(target.as_str().to_owned()).failed(e),
        })?;
        Ok(Reply::Done)
    }
}
