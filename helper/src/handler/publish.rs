//! Publish (`docs/helper.md`, "Publish").

use std::os::fd::OwnedFd;

use ebs_csi_helper_proto::{FsType, HelperError, PublishRequest, PublishSource, Reply};
use ebs_csi_linux::mountinfo::MountEntry;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::mount::MountFlags;

use super::{Handler, already_mounted, find_mount, open_target, refuse_if_not_empty};
use crate::device;
use crate::error::system;
use crate::layout::Role;
use crate::mount::{self, Node};
use crate::options;
use crate::path::SafePath;

impl Handler {
    /// Publish: validate options, verify the source's device and, for a
    /// staged volume, that the staging mount is that device's filesystem;
    /// accept an identical existing mount, create the target, bind-mount,
    /// check the new mount, apply flags. A refusal after the target was
    /// created removes it again.
    pub(super) fn publish(&self, r: &PublishRequest) -> Result<Reply, HelperError> {
        let mounts = self.mounts.read()?;
        let (source, source_node, user_flags, want_type) = match &r.source {
            PublishSource::Staging {
                volume_id,
                device,
                staging_path,
                mount_flags,
            } => {
                let flags = options::parse(None, mount_flags)?.flags | MountFlags::NODEV;
                let device = self.verify(volume_id, device, &mounts)?;
                let staging = self.roots.check(staging_path, Role::Staging)?;
                let (fd, node) = staging
                    .open()?
                    .map(|fd| mount::inspect(&fd).map(|n| (fd, n)))
                    .transpose()?
                    .filter(|(_, node)| node.is_mount_root)
                    .ok_or_else(|| HelperError::NotMounted {
                        path: staging_path.clone(),
                    })?;
                let is_filesystem =
                    find_mount(&mounts, node.mount_id).is_some_and(|m| FsType::from_name(&m.fs_type).is_some());
                if node.dev != device.number || !is_filesystem {
                    return Err(HelperError::NotStaged {
                        path: staging_path.clone(),
                        volume_id: volume_id.to_string(),
                    });
                }
                (fd, node, flags, FileType::Directory)
            }
            PublishSource::Device { volume_id, device } => {
                let device = self.verify(volume_id, device, &mounts)?;
                device::refuse_if_mounted(&device, &mounts)?;
                let fd = rustix::io::fcntl_dupfd_cloexec(device.fd(), 0)
                    .map_err(|e| system("duplicating the device fd", e))?;
                let node = mount::inspect(&fd)?;
                (fd, node, MountFlags::empty(), FileType::RegularFile)
            }
        };
        let flags = user_flags
            | MountFlags::NOSUID
            | if r.readonly {
                MountFlags::RDONLY
            } else {
                MountFlags::empty()
            };
        let role = if want_type == FileType::Directory {
            Role::Target
        } else {
            Role::BlockTarget
        };
        let target = self.roots.check(&r.target_path, role)?;
        let parent = target.open_parent(true)?;
        let same_source = |node: &Node| match want_type {
            FileType::Directory => (node.dev, node.ino) == (source_node.dev, source_node.ino),
            _ => node.file_type == FileType::BlockDevice && node.rdev == source_node.rdev,
        };
        if let Some(existing) = open_target(&parent, &target)? {
            let node = mount::inspect(&existing)?;
            if node.is_mount_root {
                let read_only = find_mount(&mounts, node.mount_id).is_some_and(MountEntry::is_read_only);
                return if same_source(&node) && read_only == r.readonly {
                    Ok(Reply::Done)
                } else {
                    Err(already_mounted(&target, &node))
                };
            }
            if node.file_type != want_type {
                return Err(HelperError::PathRefused {
                    path: r.target_path.clone(),
                    reason: format!("exists and is not a {want_type:?}"),
                });
            }
            refuse_if_not_empty(&target, &existing, node.file_type)?;
            bind_checked(&source, existing, &parent, &target, flags, same_source)
        } else {
            create_target(&parent, &target, want_type)?;
            open_target(&parent, &target)
                .and_then(|created| created.ok_or_else(|| system("opening the new target", "vanished")))
                .and_then(|created| {
                    // Reopened by name (a directory cannot be created and
                    // opened in one call): what is there now must still be
                    // what was created, of its type and empty.
                    if mount::inspect(&created)?.file_type != want_type {
                        return Err(system("opening the new target", "replaced during the request"));
                    }
                    refuse_if_not_empty(&target, &created, want_type)?;
                    Ok(created)
                })
                .and_then(|created| bind_checked(&source, created, &parent, &target, flags, same_source))
                .inspect_err(|_| {
                    let flags = if want_type == FileType::Directory {
                        AtFlags::REMOVEDIR
                    } else {
                        AtFlags::empty()
                    };
                    let _ = rustix::fs::unlinkat(&parent, target.name(), flags);
                })
        }
    }
}

/// Bind-mounts `source` onto `target_fd`, the target the helper opened:
/// the new mount is checked to be the source before it is attached, then
/// given `flags`; if that fails it is unmounted again.
fn bind_checked(
    source: &OwnedFd,
    target_fd: OwnedFd,
    parent: &OwnedFd,
    target: &SafePath<'_>,
    flags: MountFlags,
    same_source: impl Fn(&Node) -> bool,
) -> Result<Reply, HelperError> {
    let mount = mount::bind(source)?;
    if !same_source(&mount.node()?) {
        return Err(system(
            "checking the new bind mount",
            "the source changed during the request",
        ));
    }
    let root = mount.attach(&target_fd)?;
    drop(target_fd);
    if let Err(e) = mount::remount_bind(&root, flags) {
        drop(root);
        mount::unmount(parent, target.name())?;
        return Err(e);
    }
    Ok(Reply::Done)
}

/// Creates the target: a directory (filesystem volumes) or an empty file
/// (block volumes, a mount point for the device node).
fn create_target(parent: &OwnedFd, target: &SafePath<'_>, file_type: FileType) -> Result<(), HelperError> {
    let error = |e| system(format!("creating {}", target.as_str()), e);
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
