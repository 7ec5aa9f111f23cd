//! The requests, each a fixed sequence of checks followed by one change.
//! `docs/helper.md` lists the same steps in the same order.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ebs_csi_helper_proto::{
    ExpandRequest, FsType, HelperError, PROTOCOL_VERSION, PerformanceStatisticsRequest, PublishRequest, PublishSource,
    Reply, Request, StageRequest, VolumeId, VolumeStatsRequest, VolumeUsage,
};
use ebs_csi_linux::nvme::{self, LogPage};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::mount::MountFlags;

use crate::claim::Claims;
use crate::device::{self, IdentityPolicy, Refusal, VerifiedDevice};
use crate::error::system;
use crate::exec::{DEVICE_ARG, Executor, Tool, ToolTarget};
use crate::format::{self, Contents};
use crate::grow::{self, Grower};
use crate::layout::Role;
use crate::mount::{self, Node};
use crate::mounts::MountTables;
use crate::options::{self, MountOptions};
use crate::path::{AllowedRoots, SYMLINK, SafePath, open_beneath};
use ebs_csi_linux::mountinfo::MountEntry;

/// Serves requests with a fixed configuration.
///
/// Requests run one at a time under an exclusive lock, so two can never
/// race on the same path or device; the one exception is `mkfs`, which
/// runs outside the lock with its device claimed (see [`crate::claim`]).
#[derive(Debug)]
pub struct Handler {
    roots: AllowedRoots,
    mounts: MountTables,
    policy: IdentityPolicy,
    tools: Executor,
    formatter: Executor,
    grower: Grower,
    exclusive: Mutex<()>,
    claims: Claims,
}

impl Handler {
    /// A handler that acts beneath `roots` on devices `policy` accepts,
    /// checking them against `mounts`,
    /// running `mkfs` on `formatter` (its thread count is the number of
    /// formats at once) and every other tool on `tools`, growing ext
    /// filesystems on `grower`.
    pub fn new(
        roots: AllowedRoots,
        mounts: MountTables,
        policy: IdentityPolicy,
        tools: Executor,
        formatter: Executor,
        grower: Grower,
    ) -> Self {
        Self {
            roots,
            mounts,
            policy,
            tools,
            formatter,
            grower,
            exclusive: Mutex::new(()),
            claims: Claims::default(),
        }
    }

    /// Performs `request`.
    ///
    /// # Errors
    /// The [`HelperError`] of the first check that fails; nothing has been
    /// changed then, except where a variant's documentation says so.
    pub fn handle(&self, request: &Request) -> Result<Reply, HelperError> {
        match request {
            Request::Ping => Ok(Reply::Pong {
                version: PROTOCOL_VERSION,
            }),
            Request::Stage(r) => self.stage(r),
            // A path's form is judged before the lock is taken: a malformed
            // request never waits for another.
            Request::Unstage(r) => {
                let staging = self.roots.check(&r.staging_path, Role::Staging)?;
                self.exclusively(|| self.unstage(&staging))
            }
            Request::Publish(r) => self.exclusively(|| self.publish(r)),
            Request::Unpublish(r) => {
                let target = self.roots.check(&r.target_path, Role::AnyTarget)?;
                self.exclusively(|| self.unpublish(&target))
            }
            Request::Expand(r) => {
                let volume_path = self.roots.check(&r.volume_path, Role::Volume)?;
                self.exclusively(|| self.expand(r, &volume_path))
            }
            Request::VolumeStats(r) => self.volume_stats(r),
            Request::PerformanceStatistics(r) => self.performance_statistics(r),
        }
    }

    /// Stage: validate options; under the lock, check and probe (see
    /// [`Handler::stage_checked`]). A blank device is claimed and formatted
    /// outside the lock (verified again right before and after `mkfs`);
    /// then, under the lock again, the same verified device is checked
    /// once more and its new filesystem mounted.
    fn stage(&self, r: &StageRequest) -> Result<Reply, HelperError> {
        r.format.validate(r.fs_type).map_err(HelperError::InvalidRequest)?;
        let options = options::parse(Some(r.fs_type), &r.mount_flags)?;
        let exclusive = self.lock();
        let Some(device) = self.stage_checked(r, &options, None)? else {
            return Ok(Reply::Done);
        };
        let claim = self.claims.claim(device.number, &device.path())?;
        drop(exclusive);
        tracing::info!(volume_id = %r.volume_id, device = ?device.path(), fs_type = r.fs_type.name(), "format");
        format::format(&self.formatter, r.fs_type, &r.format, &device)?;
        let _exclusive = self.lock();
        drop(claim);
        self.stage_checked(r, &options, Some(device)).map(|_| Reply::Done)
    }

    /// Resolves the staging directory, verifies the device (or, after a
    /// format, verifies the `formatted` device again), accepts an identical
    /// existing mount, refuses a device in use as a raw block volume,
    /// probes (unless just formatted), and mounts a filesystem of the
    /// requested type, checked to be that device before it is attached onto
    /// the staging directory's fd; grows an existing one. Returns the device
    /// when it is blank (never when `formatted`).
    fn stage_checked(
        &self,
        r: &StageRequest,
        options: &MountOptions,
        formatted: Option<VerifiedDevice>,
    ) -> Result<Option<VerifiedDevice>, HelperError> {
        let staging = self.roots.check(&r.staging_path, Role::Staging)?;
        let (fd, node) = open_existing(&staging, FileType::Directory)?;
        let mounts = self.mounts.read()?;
        let just_formatted = formatted.is_some();
        let device = match formatted {
            Some(device) => {
                device.reverify()?;
                device
            }
            None => self.verify(&r.volume_id, &r.device, &mounts)?,
        };
        if node.is_mount_root {
            return if node.dev == device.number {
                Ok(None)
            } else {
                Err(already_mounted(&staging, &node))
            };
        }
        refuse_if_not_empty(&staging, &fd, node.file_type)?;
        device::refuse_if_published_raw(&device, &mounts)?;
        let contents = if just_formatted {
            Contents::Filesystem(r.fs_type.name().to_owned())
        } else {
            format::probe(&self.tools, &device)?
        };
        match contents {
            Contents::Blank => return Ok(Some(device)),
            Contents::Filesystem(found) if found == r.fs_type.name() => {}
            Contents::Filesystem(found) | Contents::Other(found) => {
                return Err(HelperError::FilesystemMismatch {
                    device: device.path(),
                    found,
                    requested: r.fs_type.name().to_owned(),
                });
            }
        }
        // The kernel mounts what `/dev/<name>` names when it mounts: that
        // must still be the verified device, checked on the new mount
        // before it is attached anywhere (dropped, it leaves nothing).
        let mount = mount::mount_filesystem(&device, r.fs_type, options)?;
        if mount.node()?.dev != device.number || device.reverify().is_err() {
            return Err(device.refusal(Refusal::Changed));
        }
        let root = mount.attach(&fd)?;
        drop(fd);
        if !just_formatted {
            // A filesystem smaller than its device (a snapshot restored, or a
            // volume cloned, into a larger one) is grown, as the Go driver does
            // at NodeStage, on the attached mount's root. On failure the
            // mount is undone, so that a retried Stage grows it again.
            if let Err(e) = self.grow(r.fs_type, &device, &root, false) {
                drop(root);
                mount::unmount(&staging.open_parent(false)?, staging.name())?;
                return Err(e);
            }
        }
        Ok(None)
    }

    /// Unstage: resolve the staging path; unmount it if it is a mount the
    /// helper makes (ext2/3/4 or XFS). Nothing is removed: the CO owns the
    /// staging directory.
    fn unstage(&self, staging: &SafePath<'_>) -> Result<Reply, HelperError> {
        let Some(fd) = staging.open()? else {
            return Ok(Reply::Done);
        };
        let node = mount::inspect(&fd)?;
        drop(fd);
        if node.is_mount_root {
            refuse_foreign_mount(staging, &node, &self.mounts.read()?, MountKind::Filesystem)?;
            mount::unmount(&staging.open_parent(false)?, staging.name())?;
        }
        Ok(Reply::Done)
    }

    /// Publish: validate options, verify the source's device and, for a
    /// staged volume, that the staging mount is that device's filesystem;
    /// accept an identical existing mount, create the target, bind-mount,
    /// check the new mount, apply flags. A refusal after the target was
    /// created removes it again.
    fn publish(&self, r: &PublishRequest) -> Result<Reply, HelperError> {
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

    /// Unpublish: resolve the target; unmount it if it is a mount the
    /// helper makes (a bind of an ext2/3/4 or XFS filesystem, or of a
    /// device node); then remove what is left only if it is an empty
    /// directory or empty regular file owned by root, as the helper creates
    /// them. Anything else is refused and left as it is.
    fn unpublish(&self, target: &SafePath<'_>) -> Result<Reply, HelperError> {
        let Some(fd) = target.open()? else {
            return Ok(Reply::Done);
        };
        let parent = target.open_parent(false)?;
        let node = mount::inspect(&fd)?;
        drop(fd);
        if node.is_mount_root {
            refuse_foreign_mount(target, &node, &self.mounts.read()?, MountKind::FilesystemOrDevice)?;
            mount::unmount(&parent, target.name())?;
        }
        let Some(fd) = open_target(&parent, target)? else {
            return Ok(Reply::Done);
        };
        let left = rustix::fs::fstat(&fd).map_err(|e| system("fstat", e))?;
        drop(fd);
        let not_ours = || HelperError::PathRefused {
            path: target.as_str().to_owned(),
            reason: NOT_A_MOUNT_POINT.to_owned(),
        };
        let flags = match FileType::from_raw_mode(left.st_mode) {
            FileType::Directory if left.st_uid == 0 => AtFlags::REMOVEDIR,
            FileType::RegularFile if left.st_uid == 0 && left.st_size == 0 => AtFlags::empty(),
            _ => return Err(not_ours()),
        };
        tracing::info!(target = ?target.as_str(), "remove mount point");
        rustix::fs::unlinkat(&parent, target.name(), flags).map_err(|e| match e {
            rustix::io::Errno::NOTEMPTY => not_ours(),
            e => system(format!("removing {}", target.as_str()), e),
        })?;
        Ok(Reply::Done)
    }

    /// Expand (the volume path's form already judged): verify the device,
    /// check it is what is mounted at the volume path, grow the filesystem
    /// online (the tool gets the device, or for XFS the mount's root, as
    /// its fd 3), report the device size.
    fn expand(&self, r: &ExpandRequest, path: &SafePath<'_>) -> Result<Reply, HelperError> {
        let mounts = self.mounts.read()?;
        let device = self.verify(&r.volume_id, &r.device, &mounts)?;
        let not_mounted = || HelperError::NotMounted {
            path: r.volume_path.clone(),
        };
        let (fd, node) = open_existing(path, FileType::Directory).map_err(|_| not_mounted())?;
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

    /// VolumeStats (read-only, so outside the lock): the volume path must
    /// be the root of a mount the helper makes (ext2/3/4 or XFS, or a
    /// device node's bind); the disk behind it (the filesystem's device, or
    /// the node's) must prove to be the volume; then statvfs of that same
    /// mount's fd, or the device's size.
    fn volume_stats(&self, r: &VolumeStatsRequest) -> Result<Reply, HelperError> {
        let mounts = self.mounts.read()?;
        let path = self.roots.check(&r.volume_path, Role::Volume)?;
        let not_mounted = || HelperError::NotMounted {
            path: r.volume_path.clone(),
        };
        let fd = path.open()?.ok_or_else(not_mounted)?;
        let node = mount::inspect(&fd)?;
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
        let device = self.verify(&r.volume_id, &device::path_of(number).ok_or_else(not_staged)?, &mounts)?;
        if device.number != number {
            return Err(not_staged());
        }
        let usage = if is_block {
            VolumeUsage::Block {
                size_bytes: device.size_bytes()?,
            }
        } else {
            let vfs = rustix::fs::fstatvfs(&fd).map_err(|e| system("statvfs", e))?;
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
    fn performance_statistics(&self, r: &PerformanceStatisticsRequest) -> Result<Reply, HelperError> {
        let mounts = self.mounts.read()?;
        let device = self.verify(&r.volume_id, &r.device, &mounts)?;
        match nvme::get_log_page(device.fd(), nvme::EBS_STATISTICS_LOG_PAGE) {
            Ok(LogPage::Read(page)) => Ok(Reply::PerformanceStatistics(page.to_vec())),
            Ok(LogPage::Unavailable(status)) => Err(HelperError::StatisticsUnavailable {
                device: device.path(),
                status,
            }),
            Err(e) => Err(system(format!("Get Log Page on {}", device.path()), e)),
        }
    }

    /// Grows the `fs_type` filesystem on `device`, mounted with its root at
    /// `root`, to the device's size, online (see [`crate::grow`]), when its
    /// superblock says it is smaller: ext2/3/4 by the kernel on that root;
    /// XFS by `xfs_growfs` with that root as fd 3 (the device verified
    /// again right before the exec), which with `always_xfs` (Expand) runs
    /// whatever the superblock says.
    fn grow(
        &self,
        fs_type: FsType,
        device: &VerifiedDevice,
        root: &OwnedFd,
        always_xfs: bool,
    ) -> Result<(), HelperError> {
        let device_bytes = device.size_bytes()?;
        let (blocks, block_size) = grow::filesystem_size(device, fs_type)?;
        if fs_type != FsType::Xfs {
            let target = grow::ext_target_blocks(device_bytes, block_size);
            return if target > blocks {
                self.grower.resize_ext(root.as_fd(), target)
            } else {
                Ok(())
            };
        }
        if !always_xfs && blocks.saturating_add(1).saturating_mul(block_size) > device_bytes {
            return Ok(());
        }
        self.tools
            .run_checked(
                Tool::XfsGrowfs,
                &[DEVICE_ARG],
                ToolTarget::MountOf(device, root.as_fd()),
            )
            .map(drop)
    }

    /// Proves `device` is `volume_id` and that no format is running on it.
    fn verify(&self, volume_id: &VolumeId, device: &str, mounts: &[MountEntry]) -> Result<VerifiedDevice, HelperError> {
        let verified = device::verify(volume_id, device, &self.policy, &self.roots, mounts)?;
        self.claims.check(verified.number, &verified.path())?;
        Ok(verified)
    }

    fn exclusively<T>(&self, operation: impl FnOnce() -> T) -> T {
        let _exclusive = self.lock();
        operation()
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.exclusive.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The reason Unpublish gives for a path it will not remove.
pub const NOT_A_MOUNT_POINT: &str = "is neither a mount the helper made nor an empty mount point it could have created";

/// The reason Unstage and Unpublish give for a mount the helper does not make.
pub const FOREIGN_MOUNT: &str = "is a mount the helper does not make";

/// The mounts Unstage and Unpublish may remove.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MountKind {
    /// ext2/3/4 or XFS (a staging mount, or a bind of one).
    Filesystem,
    /// That, or a device node (a raw block volume's bind).
    FilesystemOrDevice,
}

/// Refuses to unmount what the helper never mounts there: another pod's
/// secret, an emptyDir, a host mount beneath the root.
fn refuse_foreign_mount(
    path: &SafePath<'_>,
    node: &Node,
    mounts: &[MountEntry],
    kind: MountKind,
) -> Result<(), HelperError> {
    let fs_type = find_mount(mounts, node.mount_id).map(|m| m.fs_type.as_str());
    let ours = fs_type.and_then(FsType::from_name).is_some()
        || (kind == MountKind::FilesystemOrDevice && node.file_type == FileType::BlockDevice);
    if ours {
        Ok(())
    } else {
        Err(HelperError::PathRefused {
            path: path.as_str().to_owned(),
            reason: FOREIGN_MOUNT.to_owned(),
        })
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

/// The reason of [`HelperError::PathRefused`] for a staging or target path
/// that holds something: another pod's configMap directory, its
/// `etc-hosts`, kubelet's `pods/` — nothing the orchestrator prepares for a
/// CSI volume holds anything before the volume is mounted there.
pub const NOT_EMPTY: &str = "holds files; only an empty directory or an empty file is mounted over";

/// Refuses a directory with any entry, or a file with any byte, at `path`
/// (`fd`, an `O_PATH` fd of it, of `file_type` as the caller's `statx`
/// found): a mount over it would hide or replace what is there.
fn refuse_if_not_empty(path: &SafePath<'_>, fd: &OwnedFd, file_type: FileType) -> Result<(), HelperError> {
    let error = |e| system(format!("listing {}", path.as_str()), e);
    let mut holds_something = false;
    if file_type == FileType::Directory {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let dir = rustix::fs::openat(fd, ".", flags, Mode::empty()).map_err(error)?;
        for entry in rustix::fs::Dir::read_from(&dir).map_err(error)? {
            let name = entry.map_err(error)?.file_name().to_bytes().to_owned();
            holds_something |= name != b"." && name != b"..";
        }
    } else {
        holds_something = rustix::fs::fstat(fd).map_err(error)?.st_size != 0;
    }
    if holds_something {
        return Err(HelperError::PathRefused {
            path: path.as_str().to_owned(),
            reason: NOT_EMPTY.to_owned(),
        });
    }
    Ok(())
}

/// Opens an existing path and checks its type.
fn open_existing(path: &SafePath<'_>, file_type: FileType) -> Result<(OwnedFd, Node), HelperError> {
    let refuse = |reason: &str| HelperError::PathRefused {
        path: path.as_str().to_owned(),
        reason: reason.to_owned(),
    };
    let fd = path.open()?.ok_or_else(|| refuse("does not exist"))?;
    let node = mount::inspect(&fd)?;
    if node.file_type != file_type {
        return Err(refuse(&format!("is not a {file_type:?}")));
    }
    Ok((fd, node))
}

/// Opens the target's last component in its already opened parent.
fn open_target(parent: &OwnedFd, target: &SafePath<'_>) -> Result<Option<OwnedFd>, HelperError> {
    match open_beneath(parent, target.name()) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => Err(HelperError::PathRefused {
            path: target.as_str().to_owned(),
            reason: SYMLINK.into(),
        }),
        Err(e) => Err(system(format!("opening {}", target.as_str()), e)),
    }
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

fn find_mount(mounts: &[MountEntry], mount_id: u64) -> Option<&MountEntry> {
    mounts.iter().find(|m| m.mount_id == mount_id)
}

fn already_mounted(path: &SafePath<'_>, node: &Node) -> HelperError {
    HelperError::AlreadyMounted {
        path: path.as_str().to_owned(),
        detail: format!("a filesystem on device {}:{}", node.dev.0, node.dev.1),
    }
}
