//! The kernel seam: every question the requests ask the kernel about
//! devices and mounts, and every change they make to them, behind one
//! trait. [`Linux`] is the helper's implementation, made of the modules
//! that make the calls (`device`, `mount`, `mounts`, `format`, `grow`,
//! `exec`); the requests' unit tests run over a recording fake instead
//! (`handler/tests/fake.rs`), as a normal user, and assert what would have
//! been done.
//!
//! Resolving paths beneath the allowed roots (`openat2`, `unlinkat`,
//! reading a directory, `fstatvfs`) stays outside the seam: it needs no
//! privilege beneath a directory the caller owns, so the unit tests make
//! those calls for real, in a temporary directory. Creating a mount point
//! is a step of the seam (the fake creates it for real too), so that a
//! test can make it fail or change what was created before it is reopened.

use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};

use ebs_csi_helper_proto::{FormatOptions, FsType, HelperError, VolumeId};
use ebs_csi_linux::mountinfo::MountEntry;
use ebs_csi_linux::nvme::{self, LogPage};
use rustix::fs::FileType;
use rustix::mount::MountFlags;

use crate::claim::DeviceNumber;
use crate::device::{self, IdentityPolicy, VerifiedDevice};
use crate::error::Operation;
use crate::exec::{DEVICE_ARG, Executor, Tool, ToolTarget};
use crate::format::{self, Contents};
use crate::grow;
use crate::mount::{self, Detached, Node};
use crate::mounts::MountTables;
use crate::options::MountOptions;
use crate::path::{AllowedRoots, SafePath};
use crate::runner::Runner;

/// What the requests ask of the kernel. Each method is one step of
/// `docs/helper.md`; its errors are the [`HelperError`]s that step answers.
/// A provided method is the kernel's own call, needing nothing of
/// [`Linux`]'s; the requests' fake overrides every method.
pub trait Kernel: fmt::Debug + Send + Sync {
    /// The mount tables every check reads: the helper's own and the node's
    /// ([`MountTables::read`]).
    fn mounts(&self) -> Result<Vec<MountEntry>, HelperError>;

    /// What `statx` says of `fd` ([`mount::inspect`]).
    fn inspect(&self, fd: BorrowedFd<'_>) -> Result<Node, HelperError> {
        mount::inspect(fd)
    }

    /// Opens `device` and proves it is `volume_id`, not in use outside
    /// `roots` ([`device::verify`]).
    fn verify(
        &self,
        volume_id: &VolumeId,
        device: &str,
        roots: &AllowedRoots,
        mounts: &[MountEntry],
    ) -> Result<VerifiedDevice, HelperError>;

    /// Proves again that `device` is the disk it was
    /// ([`VerifiedDevice::reverify`]).
    fn reverify(&self, device: &VerifiedDevice) -> Result<(), HelperError> {
        device.reverify()
    }

    /// The device numbers of `device` and of its partitions.
    fn device_numbers(&self, device: &VerifiedDevice) -> Vec<DeviceNumber> {
        device::numbers_of(device)
    }

    /// `/dev/<name>` of the disk numbered `number` now; `None` for none
    /// ([`device::path_of`]).
    fn device_path(&self, number: DeviceNumber) -> Option<String> {
        device::path_of(number)
    }

    /// What `device` holds ([`format::probe`]).
    fn probe(&self, device: &VerifiedDevice) -> Result<Contents, HelperError>;

    /// Makes an `fs` filesystem on `device` ([`format::format`]).
    fn format(&self, fs: FsType, options: &FormatOptions, device: &VerifiedDevice) -> Result<(), HelperError>;

    /// A detached mount of the `fs` filesystem on `device`
    /// ([`mount::mount_filesystem`]).
    fn mount_filesystem(
        &self,
        device: &VerifiedDevice,
        fs: FsType,
        options: &MountOptions,
    ) -> Result<Detached, HelperError> {
        mount::mount_filesystem(device, fs, options)
    }

    /// A detached bind mount of `source` ([`mount::bind`]).
    fn bind(&self, source: BorrowedFd<'_>) -> Result<Detached, HelperError> {
        mount::bind(source)
    }

    /// Attaches `mount` onto `target`; the attached mount's root
    /// ([`mount::attach`]).
    fn attach(&self, mount: Detached, target: BorrowedFd<'_>) -> Result<OwnedFd, HelperError> {
        mount::attach(mount, target)
    }

    /// Gives the detached `mount` exactly the per-mount `flags`
    /// ([`mount::set_attributes`]).
    fn set_attributes(&self, mount: &Detached, flags: MountFlags) -> Result<(), HelperError> {
        mount::set_attributes(mount, flags)
    }

    /// Creates the mount point `target` in `parent`, a directory or an
    /// empty file as `file_type` says ([`mount::create_mount_point`]).
    fn create_mount_point(
        &self,
        parent: BorrowedFd<'_>,
        target: &SafePath<'_>,
        file_type: FileType,
    ) -> Result<(), HelperError> {
        mount::create_mount_point(parent, target, file_type)
    }

    /// Unmounts `name` in `parent` ([`mount::unmount`]).
    fn unmount(&self, parent: BorrowedFd<'_>, name: &str) -> Result<(), HelperError> {
        mount::unmount(parent, name)
    }

    /// The `fs` filesystem's size on `device` as its superblock says:
    /// (blocks, block size in bytes) ([`grow::filesystem_size`]).
    fn filesystem_size(&self, device: &VerifiedDevice, fs: FsType) -> Result<(u64, u64), HelperError> {
        grow::filesystem_size(device, fs)
    }

    /// Grows the ext filesystem mounted with its root at `root` to
    /// `blocks` ([`grow::resize_ext`]).
    fn resize_ext(&self, root: BorrowedFd<'_>, blocks: u64) -> Result<(), HelperError>;

    /// Grows the XFS filesystem of `device` mounted with its root at
    /// `root` to the device's size (`xfs_growfs`).
    fn xfs_growfs(&self, device: &VerifiedDevice, root: BorrowedFd<'_>) -> Result<(), HelperError>;

    /// EBS's performance statistics log page of `device`
    /// ([`nvme::get_log_page`]).
    fn statistics_page(&self, device: &VerifiedDevice) -> Result<LogPage, HelperError> {
        nvme::get_log_page(device.fd(), nvme::EBS_STATISTICS_LOG_PAGE)
            .map_err(|e| Operation::StatisticsPage(device.path()).failed(e))
    }
}

/// The kernel itself.
#[derive(Debug)]
pub struct Linux {
    mounts: MountTables,
    policy: IdentityPolicy,
    tools: Executor,
    runner: Runner,
}

impl Linux {
    /// Reads `mounts`, accepts the devices `policy` accepts, runs tools
    /// on `tools` and grows ext filesystems in `runner`.
    pub fn new(mounts: MountTables, policy: IdentityPolicy, tools: Executor, runner: Runner) -> Self {
        Self {
            mounts,
            policy,
            tools,
            runner,
        }
    }
}

impl Kernel for Linux {
    fn mounts(&self) -> Result<Vec<MountEntry>, HelperError> {
        self.mounts.read()
    }

    fn verify(
        &self,
        volume_id: &VolumeId,
        device: &str,
        roots: &AllowedRoots,
        mounts: &[MountEntry],
    ) -> Result<VerifiedDevice, HelperError> {
        device::verify(volume_id, device, &self.policy, roots, mounts, &self.tools.stalled)
    }

    fn probe(&self, device: &VerifiedDevice) -> Result<Contents, HelperError> {
        format::probe(&self.tools, device)
    }

    fn format(&self, fs: FsType, options: &FormatOptions, device: &VerifiedDevice) -> Result<(), HelperError> {
        format::format(&self.tools, fs, options, device)
    }

    fn resize_ext(&self, root: BorrowedFd<'_>, blocks: u64) -> Result<(), HelperError> {
        grow::resize_ext(&self.runner, root, blocks)
    }

    fn xfs_growfs(&self, device: &VerifiedDevice, root: BorrowedFd<'_>) -> Result<(), HelperError> {
        self.tools
            .run_checked(Tool::XfsGrowfs, &[DEVICE_ARG], ToolTarget::MountOf(device, root))
            .map(drop)
    }
}
