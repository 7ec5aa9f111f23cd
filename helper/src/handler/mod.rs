//! The requests, each a fixed sequence of checks followed by one change,
//! one file per request (the read-only two share `stats`):
//! `docs/helper.md` lists the same steps in the same order. What the
//! requests share is here: the lock, proving a device, growing a
//! filesystem, and the checks of a path the helper mounts on or unmounts.

mod expand;
mod publish;
mod stage;
mod stats;
mod unpublish;
mod unstage;

#[cfg(test)]
mod tests;

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ebs_csi_helper_proto::{FsType, HelperError, PROTOCOL_VERSION, Reply, Request, VolumeId};
use ebs_csi_linux::mountinfo::MountEntry;
use rustix::fs::{FileType, Mode, OFlags};

use crate::claim::Claims;
use crate::device::VerifiedDevice;
use crate::error::{Operation, PathRefusal};
use crate::grow;
use crate::kernel::Kernel;
use crate::layout::Role;
use crate::mount::Node;
use crate::path::{AllowedRoots, SafePath, open_beneath};

/// Serves requests with a fixed configuration.
///
/// Requests run one at a time under an exclusive lock, so two can never
/// race on the same path or device; the one exception is Stage's probe and
/// `mkfs`, which run outside the lock with their device claimed (see
/// [`crate::claim`]).
#[derive(Debug)]
pub struct Handler {
    roots: AllowedRoots,
    /// Mount points beneath the roots that may hold volumes at once.
    max_mounts: u32,
    kernel: Box<dyn Kernel>,
    exclusive: Mutex<()>,
    claims: Claims,
}

impl Handler {
    /// A handler that acts beneath `roots` through `kernel`
    /// ([`crate::kernel::Linux`] in the helper), making no mount once
    /// `max_mounts` mount points beneath the roots hold volumes.
    pub fn new(roots: AllowedRoots, max_mounts: u32, kernel: Box<dyn Kernel>) -> Self {
        Self {
            roots,
            max_mounts,
            kernel,
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
            // kubelet unstages a raw block volume at a path of its own,
            // where the helper never mounts: nothing to undo, nothing touched.
            Request::Unstage(r) if self.roots.check(&r.staging_path, Role::BlockStaging).is_ok() => Ok(Reply::Done),
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
        let (blocks, block_size) = self.kernel.filesystem_size(device, fs_type)?;
        if fs_type != FsType::Xfs {
            let target = grow::ext_target_blocks(device_bytes, block_size);
            return if target > blocks {
                self.kernel.resize_ext(root.as_fd(), target)
            } else {
                Ok(())
            };
        }
        if !always_xfs && blocks.saturating_add(1).saturating_mul(block_size) > device_bytes {
            return Ok(());
        }
        self.kernel.xfs_growfs(device, root.as_fd())
    }

    /// Proves `device` is `volume_id` and that no format is running on it.
    fn verify(&self, volume_id: &VolumeId, device: &str, mounts: &[MountEntry]) -> Result<VerifiedDevice, HelperError> {
        let verified = self.kernel.verify(volume_id, device, &self.roots, mounts)?;
        self.claims.check(verified.number, &verified.path())?;
        Ok(verified)
    }

    /// Refuses a request that would mount on `path` when `max_mounts`
    /// mount points of volumes' shapes beneath the roots
    /// ([`AllowedRoots::holds_volume`]: this driver's and any other CSI
    /// driver's; each counted once, in however many of `mounts`' tables)
    /// are mounted already, unless `path` is one of them (a repeated
    /// request, answered as before). Third audit A3: without a bound, a
    /// compromised agent publishes one staged volume onto made-up targets
    /// until the node's mount table (`fs.mount-max`) is full.
    ///
    /// # Errors
    /// [`HelperError::MountLimit`].
    fn refuse_at_mount_limit(&self, mounts: &[MountEntry], path: &SafePath<'_>) -> Result<(), HelperError> {
        let mut points: Vec<&str> = mounts
            .iter()
            .map(|m| m.mount_point.as_str())
            .filter(|point| self.roots.holds_volume(point))
            .collect();
        points.sort_unstable();
        points.dedup();
        if points.len() >= self.max_mounts as usize && !points.contains(&path.as_str()) {
            return Err(HelperError::MountLimit { limit: self.max_mounts });
        }
        Ok(())
    }

    /// Opens an existing path and checks its type.
    fn open_existing(&self, path: &SafePath<'_>, file_type: FileType) -> Result<(OwnedFd, Node), HelperError> {
        let fd = path.open()?.ok_or_else(|| PathRefusal::Missing.of(path.as_str()))?;
        let node = self.kernel.inspect(fd.as_fd())?;
        if node.file_type != file_type {
            return Err(PathRefusal::NotOfType(file_type).of(path.as_str()));
        }
        Ok((fd, node))
    }

    fn exclusively<T>(&self, operation: impl FnOnce() -> T) -> T {
        let _exclusive = self.lock();
        operation()
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.exclusive.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

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
        Err(PathRefusal::ForeignMount.of(path.as_str()))
    }
}

/// Refuses a directory with any entry, or a file with any byte, at `path`
/// (`fd`, an `O_PATH` fd of it, `node` as the caller's `statx` found it): a
/// mount over it would hide or replace what is there.
fn refuse_if_not_empty(path: &SafePath<'_>, fd: &OwnedFd, node: &Node) -> Result<(), HelperError> {
    let error = |e| Operation::List(path.as_str().to_owned()).failed(e);
    let holds_something = if node.file_type == FileType::Directory {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let dir = rustix::fs::openat(fd, ".", flags, Mode::empty()).map_err(error)?;
        let mut entries = rustix::fs::Dir::read_from(&dir).map_err(error)?;
        entries.try_fold(false, |any, entry| {
            let name = entry.map_err(error)?.file_name().to_bytes().to_owned();
            Ok::<_, HelperError>(any || (name != b"." && name != b".."))
        })?
    } else {
        node.size != 0
    };
    if holds_something {
        return Err(PathRefusal::NotEmpty.of(path.as_str()));
    }
    Ok(())
}

/// Opens the target's last component in its already opened parent.
fn open_target(parent: &OwnedFd, target: &SafePath<'_>) -> Result<Option<OwnedFd>, HelperError> {
    match open_beneath(parent, target.name()) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            Err(PathRefusal::Symlink.of(target.as_str()))
        }
        Err(e) => Err(Operation::Open(target.as_str().to_owned()).failed(e)),
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
