//! Publish (`docs/helper.md`, "Publish").

use std::os::fd::{AsFd, OwnedFd};

use ebs_csi_helper_proto::{FsType, HelperError, PublishRequest, PublishSource, Reply, VolumeId};
use ebs_csi_linux::mountinfo::MountEntry;
use rustix::fs::{AtFlags, FileType};
use rustix::mount::MountFlags;

use super::{Handler, already_mounted, find_mount, open_target, refuse_if_not_empty};
use crate::device;
use crate::error::{Operation, PathRefusal};
use crate::layout::Role;
use crate::mount::Node;
use crate::options;

/// What Publish bind-mounts: the staged filesystem's root, or a raw block
/// volume's device node.
struct Source {
    fd: OwnedFd,
    node: Node,
    /// The per-mount flags the request asked for.
    flags: MountFlags,
    /// A directory (a filesystem) or a regular file (a device node) is
    /// its target.
    target_type: FileType,
}

impl Source {
    /// Whether `node`, a mount's root, shows this source.
    fn shows(&self, node: &Node) -> bool {
        match self.target_type {
            FileType::Directory => (node.dev, node.ino) == (self.node.dev, self.node.ino),
            _ => node.file_type == FileType::BlockDevice && node.rdev == self.node.rdev,
        }
    }
}

impl Handler {
    /// Publish: the source proved; the target resolved and proved the
    /// volume's (kubelet's record beside it); the mount limit; its parents
    /// created where the layout says so; an identical existing mount accepted, else the target
    /// checked or created, the source bind-mounted onto it. A refusal after
    /// the target was created removes it again.
    pub(super) fn publish(&self, r: &PublishRequest) -> Result<Reply, HelperError> {
        let mounts = self.kernel.mounts()?;
        let (source, volume_id) = match &r.source {
            PublishSource::Staging {
                volume_id,
                device,
                staging_path,
                mount_flags,
            } => (
                self.staged_source(volume_id, device, staging_path, mount_flags, &mounts)?,
                volume_id,
            ),
            PublishSource::Device { volume_id, device } => (self.device_source(volume_id, device, &mounts)?, volume_id),
        };
        let flags = source.flags
            | MountFlags::NOSUID
            | if r.readonly {
                MountFlags::RDONLY
            } else {
                MountFlags::empty()
            };
        let role = if source.target_type == FileType::Directory {
            Role::Target
        } else {
            Role::BlockTarget
        };
        let target = self.roots.check(&r.target_path, role)?;
        target.check_bound(volume_id)?;
        if let PublishSource::Staging { staging_path, .. } = &r.source
            && !target.publishes_from(&self.roots.check(staging_path, Role::Staging)?)
        {
            return Err(PathRefusal::OtherVolumesTarget.of(&r.target_path));
        }
        self.refuse_at_mount_limit(&mounts, &target)?;
        let parent = target.open_parent(target.creates_parents())?;
        if let Some(existing) = open_target(&parent, &target)? {
            let node = self.kernel.inspect(existing.as_fd())?;
            if node.is_mount_root {
                let read_only = find_mount(&mounts, node.mount_id).is_some_and(MountEntry::is_read_only);
                return if source.shows(&node) && read_only == r.readonly {
                    Ok(Reply::Done)
                } else {
                    Err(already_mounted(&target, &node))
                };
            }
            if node.file_type != source.target_type {
                return Err(PathRefusal::ExistsOfOtherType(source.target_type).of(&r.target_path));
            }
            refuse_if_not_empty(&target, &existing, &node)?;
            return self.bind_checked(&source, &existing, flags);
        }
        self.kernel
            .create_mount_point(parent.as_fd(), &target, source.target_type)?;
        open_target(&parent, &target)
            .and_then(|created| created.ok_or_else(|| Operation::OpenNewTarget.failed("vanished")))
            .and_then(|created| {
                // Reopened by name (a directory cannot be created and
                // opened in one call): what is there now must still be
                // what was created, of its type and empty.
                let node = self.kernel.inspect(created.as_fd())?;
                if node.file_type != source.target_type {
                    return Err(Operation::OpenNewTarget.failed("replaced during the request"));
                }
                refuse_if_not_empty(&target, &created, &node)?;
                Ok(created)
            })
            .and_then(|created| self.bind_checked(&source, &created, flags))
            .inspect_err(|_| {
                let flags = if source.target_type == FileType::Directory {
                    AtFlags::REMOVEDIR
                } else {
                    AtFlags::empty()
                };
                let _ = rustix::fs::unlinkat(&parent, target.name(), flags);
            })
    }

    /// A staged volume: options judged, the device proved, the staging
    /// path a mount point of that device's ext2/3/4 or XFS filesystem.
    fn staged_source(
        &self,
        volume_id: &VolumeId,
        device: &str,
        staging_path: &str,
        mount_flags: &[String],
        mounts: &[MountEntry],
    ) -> Result<Source, HelperError> {
        let flags = options::parse(None, mount_flags)?.flags | MountFlags::NODEV;
        let device = self.verify(volume_id, device, mounts)?;
        let staging = self.roots.check(staging_path, Role::Staging)?;
        staging.check_bound(volume_id)?;
        let not_mounted = || HelperError::NotMounted {
            path: staging_path.to_owned(),
        };
        let fd = staging.open()?.ok_or_else(not_mounted)?;
        let node = self.kernel.inspect(fd.as_fd())?;
        if !node.is_mount_root {
            return Err(not_mounted());
        }
        let is_filesystem = find_mount(mounts, node.mount_id).is_some_and(|m| FsType::from_name(&m.fs_type).is_some());
        if node.dev != device.number || !is_filesystem {
            return Err(HelperError::NotStaged {
                path: staging_path.to_owned(),
                volume_id: volume_id.to_string(),
            });
        }
        Ok(Source {
            fd,
            node,
            flags,
            target_type: FileType::Directory,
        })
    }

    /// A raw block volume: the device proved, neither it nor a partition
    /// mounted anywhere.
    fn device_source(&self, volume_id: &VolumeId, device: &str, mounts: &[MountEntry]) -> Result<Source, HelperError> {
        let device = self.verify(volume_id, device, mounts)?;
        device::refuse_if_mounted(&device, &self.kernel.device_numbers(&device), mounts)?;
        let fd = rustix::io::fcntl_dupfd_cloexec(device.fd(), 0).map_err(|e| Operation::DuplicateDevice.failed(e))?;
        let node = self.kernel.inspect(fd.as_fd())?;
        Ok(Source {
            fd,
            node,
            flags: MountFlags::empty(),
            target_type: FileType::RegularFile,
        })
    }

    /// Bind-mounts the source onto `target_fd`, the target the helper
    /// opened: the new mount is checked to be the source and given `flags`
    /// while detached, and only then attached, so that it is never seen
    /// with fewer (read-write where read-only was asked: third audit A9).
    fn bind_checked(&self, source: &Source, target_fd: &OwnedFd, flags: MountFlags) -> Result<Reply, HelperError> {
        let mount = self.kernel.bind(source.fd.as_fd())?;
        if !source.shows(&self.kernel.inspect(mount.fd())?) {
            return Err(Operation::CheckBind.failed("the source changed during the request"));
        }
        self.kernel.set_attributes(&mount, flags)?;
        self.kernel.attach(mount, target_fd.as_fd())?;
        Ok(Reply::Done)
    }
}
