//! Unstage (`docs/helper.md`, "Unstage").

use std::os::fd::AsFd;

use ebs_csi_helper_proto::{HelperError, Reply};

use super::{Handler, MountKind, refuse_foreign_mount};
use crate::path::SafePath;

impl Handler {
    /// Unstage: resolve the staging path; unmount it if it is a mount the
    /// helper makes (ext2/3/4 or XFS). Nothing is removed: the CO owns the
    /// staging directory.
    pub(super) fn unstage(&self, staging: &SafePath<'_>) -> Result<Reply, HelperError> {
        let Some(fd) = staging.open()? else {
            return Ok(Reply::Done);
        };
        let node = self.kernel.inspect(fd.as_fd())?;
        drop(fd);
        if node.is_mount_root {
            refuse_foreign_mount(staging, &node, &self.kernel.mounts()?, MountKind::Filesystem)?;
            self.kernel
                .unmount(staging.open_parent(false)?.as_fd(), staging.name())?;
        }
        Ok(Reply::Done)
    }
}
