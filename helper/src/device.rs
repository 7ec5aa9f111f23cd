//! Proving that a block device is the EBS volume a request names, and
//! keeping that proof bound to the one kernel object the helper then uses.
//!
//! The request must name the device as `/dev/<kernel name>`: a whole disk,
//! or a partition of one (the Go driver's `partition` volume attribute),
//! which is proved by its disk's identity. The helper
//! opens that name without following any symlink (`O_PATH`), learns its
//! type from the fd before any blocking open, reopens the same inode
//! through `/proc/self/fd/N` (`O_RDONLY | O_NONBLOCK | O_NOCTTY`), and
//! proves identity on that fd: the NVMe Identify Controller data read
//! through it, or (tests only) a loop device's backing file. From then on
//! tools get the device only as this fd (their fd 3). `mount(2)` gets the
//! kernel's name for it, `/dev/<name>` as read back from sysfs, because
//! e2fsprogs and xfsprogs find a mounted filesystem by the device path
//! recorded in the mount table (a `/proc/self/fd/N` source makes
//! `resize2fs` try an offline resize and `xfs_growfs` refuse); only root
//! can change what that name in devtmpfs points to. udev links are never
//! trusted (a stale link once made another driver mount the wrong volume).
//!
//! A device number can be reused after a hot-unplug, and `mount(2)` or a
//! tool resolves a node to its device number again. So
//! [`VerifiedDevice::reverify`] runs right before every tool and mount and
//! after a format: the name must still be a node of the same device
//! number, the disk sequence number (`BLKGETDISKSEQ`, unique per disk
//! since boot) of the fd and of the disk the device number names now must
//! both be the one seen at the proof, and the identity must hold again.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ebs_csi_helper_proto::{HelperError, VolumeId};
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use serde::{Deserialize, Serialize};

use crate::claim::{Claims, DeviceNumber};
use crate::error::Operation;
use crate::path::{AllowedRoots, fd_path};
use crate::sys;
use ebs_csi_linux::mountinfo::MountEntry;
use ebs_csi_linux::nvme::{self, EBS_MODEL, EBS_VENDOR_ID};

/// Which devices may stand for an EBS volume.
#[derive(Clone, Debug)]
pub struct IdentityPolicy {
    /// The PCI vendor id Identify Controller must report: Amazon's
    /// ([`EBS_VENDOR_ID`]) except in tests on emulated controllers
    /// (`--nvme-vendor-id`).
    pub nvme_vendor_id: u16,
    /// The model number Identify Controller must report: EBS's
    /// ([`EBS_MODEL`]) except in tests (`--nvme-model`).
    pub nvme_model: String,
    /// Also accept a loop device whose backing file's name contains the
    /// volume id (demos and tests only: `--allow-loop-devices`).
    pub allow_loop_devices: bool,
}

impl Default for IdentityPolicy {
    /// EBS volumes only.
    fn default() -> Self {
        Self {
            nvme_vendor_id: EBS_VENDOR_ID,
            nvme_model: EBS_MODEL.to_owned(),
            allow_loop_devices: false,
        }
    }
}

/// Why a device is refused: the `reason` of [`HelperError::DeviceRefused`],
/// one variant per check of [`verify`], in its order. The texts name no
/// other volume's serial and no host path (they reach pod events).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Step 1: the name is not `/dev/<nvmeXnY or loopN>`.
    #[error("is not /dev/<kernel name> of an NVMe namespace or a loop device")]
    NotKernelName,
    /// Step 2: missing, a symlink, or not a block device node. One text for
    /// all, so the answer tells nothing about what else is there.
    #[error("is not a block device node")]
    NotBlockDevice,
    /// Step 3: the node's device number belongs to another kernel name,
    /// or a partition's to another disk.
    #[error("the node is not the kernel's device of that name")]
    NameMismatch,
    /// Step 3: a partition that shares sectors with another of its disk's
    /// (a table made so that writing one writes the other).
    #[error("overlaps another partition of its disk")]
    Overlapping,
    /// Step 4: an NVMe controller that is not an EBS volume.
    #[error("the NVMe controller is not an EBS volume")]
    NotEbs,
    /// Step 4: Identify Controller failed.
    #[error("NVMe Identify Controller failed")]
    IdentifyFailed,
    /// Step 4: an EBS volume, but another one.
    #[error("is another volume")]
    OtherVolume,
    /// Step 4: a loop device whose backing file does not name the volume.
    #[error("the loop device's backing file does not name the volume")]
    LoopNotNamed,
    /// Step 4: a loop device without `--allow-loop-devices`.
    #[error("loop devices are not allowed (--allow-loop-devices)")]
    LoopNotAllowed,
    /// Step 5: a device-mapper or md device holds the disk or a partition.
    #[error("held by another block device (device-mapper, md)")]
    Held,
    /// Step 5: the disk or a partition is active swap.
    #[error("in use as swap")]
    Swap,
    /// Step 5: the disk or a partition is mounted where no volume of the
    /// layout is: outside the allowed roots, at a root itself, or beneath
    /// one at no staging or target path.
    #[error("in use by the host: mounted outside the volumes' staging and target paths")]
    MountedOutside,
    /// Step 5: no mount the helper can see explains it, yet the disk
    /// cannot be opened exclusively: it is mounted in a mount namespace the
    /// helper cannot see, or another program holds it exclusively.
    #[error("in use where the helper cannot see: mounted in another mount namespace, or held exclusively")]
    HeldUnseen,
    /// The device node is bind-mounted somewhere: a raw block volume in use.
    #[error("is published as a raw block device")]
    PublishedRaw,
    /// A raw block publish of a device whose filesystem is mounted.
    #[error("its filesystem is mounted")]
    FilesystemMounted,
    /// [`VerifiedDevice::reverify`]: the device number now names another
    /// disk, or the disk's identity changed.
    #[error("the device changed during the request")]
    Changed,
}

/// A block device proved to be a given volume (the whole disk, or a
/// partition of the disk proved), held open. Clones share the one open
/// file.
#[derive(Clone, Debug)]
pub struct VerifiedDevice {
    /// The volume the device proved to be.
    pub volume_id: VolumeId,
    /// The kernel's name for it, e.g. `nvme1n1`, `loop3` or `nvme1n1p2`.
    pub name: String,
    /// Its device number.
    pub number: DeviceNumber,
    file: Arc<OwnedFd>,
    disk_sequence: Option<u64>,
    policy: IdentityPolicy,
}

impl VerifiedDevice {
    /// The open device (`O_RDONLY | O_NONBLOCK`): the one object every
    /// check and action refers to.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// `/dev/<name>`: the kernel's name, as sysfs gave it for the verified
    /// device number (for logs, errors and `mount(2)`'s source).
    pub fn path(&self) -> String {
        format!("/dev/{}", self.name)
    }

    /// The device's size in bytes (`lseek(SEEK_END)` on the fd).
    ///
    /// # Errors
    /// [`HelperError::System`] when the seek fails.
    pub fn size_bytes(&self) -> Result<u64, HelperError> {
        rustix::fs::seek(self.fd(), rustix::fs::SeekFrom::End(0))
            .map_err(|e| Operation::ReadSize(self.path()).failed(e))
    }

    /// Proves again that the fd is the volume and that its device number
    /// still names the disk the fd was opened on: run right before every
    /// tool and `mount(2)`, and after a format.
    ///
    /// # Errors
    /// [`HelperError::DeviceRefused`] with [`Refusal::Changed`].
    pub fn reverify(&self) -> Result<(), HelperError> {
        let sysfs = sysfs_dir(self.number);
        let same_device = block_node(&self.path()).is_some_and(|(_, number)| number == self.number)
            && sys::disk_sequence(self.fd()).is_ok_and(|seq| seq == self.disk_sequence)
            && kernel_name(&sysfs).as_deref() == Some(self.name.as_str());
        let disk = disk_of(&self.name).unwrap_or(&self.name);
        match disk_dir(&sysfs, &self.name).filter(|d| same_device && sysfs_disk_sequence(d) == self.disk_sequence) {
            Some(d) if prove_identity(&self.volume_id, disk, self.fd(), &d, &self.policy).is_ok() => Ok(()),
            _ => Err(self.refusal(Refusal::Changed)),
        }
    }

    /// Whether this is the last handle on the open device: its drop then
    /// closes the device.
    pub fn is_last_handle(&self) -> bool {
        Arc::strong_count(&self.file) == 1
    }

    /// The error refusing this device for `reason`.
    pub fn refusal(&self, reason: Refusal) -> HelperError {
        refused(&self.path(), &self.volume_id, reason)
    }

    /// What the proof found, for the runner ([`crate::runner`]), which is
    /// given the open device by `SCM_RIGHTS` and proves it again.
    pub fn facts(&self) -> DeviceFacts {
        DeviceFacts {
            volume_id: self.volume_id.clone(),
            name: self.name.clone(),
            number: self.number,
            disk_sequence: self.disk_sequence,
        }
    }

    /// In the runner: the device the helper proved, `file` being the open
    /// device it passed (the same open file) and `facts` what its proof
    /// found; [`VerifiedDevice::reverify`] proves it again before each
    /// tool.
    ///
    /// # Errors
    /// [`HelperError::DeviceRefused`] with [`Refusal::Changed`] when `file`
    /// is not a block device of that device number.
    pub fn adopt(facts: DeviceFacts, file: OwnedFd, policy: &IdentityPolicy) -> Result<Self, HelperError> {
        if block_number(&file) != Some(facts.number) {
            return Err(refused(
                &format!("/dev/{}", facts.name),
                &facts.volume_id,
                Refusal::Changed,
            ));
        }
        Ok(Self {
            volume_id: facts.volume_id,
            name: facts.name,
            number: facts.number,
            file: Arc::new(file),
            disk_sequence: facts.disk_sequence,
            policy: policy.clone(),
        })
    }
}

/// A [`VerifiedDevice`] without its open file: what the helper tells the
/// runner of a device it passes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceFacts {
    volume_id: VolumeId,
    name: String,
    number: DeviceNumber,
    disk_sequence: Option<u64>,
}

#[cfg(test)]
impl VerifiedDevice {
    /// A device the requests' fake kernel stands in for, `file` playing the
    /// disk (`handler/tests/fake.rs`).
    pub(crate) fn stand_in(volume_id: VolumeId, name: &str, number: DeviceNumber, file: OwnedFd) -> Self {
        Self {
            volume_id,
            name: name.to_owned(),
            number,
            file: Arc::new(file),
            disk_sequence: None,
            policy: IdentityPolicy::default(),
        }
    }
}

/// How long [`verify`] waits for a device in its `stalled` set to leave
/// it: the helper closes the device of a tool past its time limit within
/// milliseconds of the request's end unless a read of it has stalled.
const STALLED_WAIT: Duration = Duration::from_secs(1);

/// Opens `device` and proves it is `volume_id` (docs/helper.md, "Device
/// checks"):
///
/// 1. `device` is `/dev/<name>` with `name` an NVMe namespace (`nvmeXnY`)
///    or loop device (`loopN`) name, or a partition's of one of them
///    (`<disk>pN`, [`disk_of`]);
/// 2. it opens with no symlink anywhere (`O_PATH`, `RESOLVE_NO_SYMLINKS`)
///    as a block device node; unless its number is in `stalled` for more
///    than [`STALLED_WAIT`] (a read of it outlived its request, and its
///    last close, which holds the disk's open mutex, waits for that read:
///    an open would wait as long), it is then opened for reading, through the same inode (`O_RDONLY |
///    O_NONBLOCK | O_NOCTTY`);
/// 3. sysfs says the device number's kernel name is `name`, and a
///    partition's directory lies in its disk's;
/// 4. an NVMe namespace's Identify Controller, read through the fd (a
///    partition's reaches its disk's controller), has the policy's vendor
///    id and model and the volume id (without dash) as serial; a loop
///    device (only with `allow_loop_devices`) has a backing file whose
///    name contains the id; a partition's disk sequence number
///    (`BLKGETDISKSEQ` on its fd) is its disk's;
/// 5. no device-mapper or md device holds the disk or a partition of it,
///    none of them is swap, and none is mounted where no volume of the
///    layout is (`mounts` holds every mount namespace the helper can see);
///    where none is mounted at all, the device opens exclusively (`O_EXCL`:
///    not mounted in a namespace the helper cannot see, third audit A5; a
///    partition does not while its disk is held).
///
/// # Errors
/// [`HelperError::DeviceRefused`] with the [`Refusal`] of the failed step,
/// [`HelperError::InProgress`] when the device is in `stalled`.
pub fn verify(
    volume_id: &VolumeId,
    device: &str,
    policy: &IdentityPolicy,
    roots: &AllowedRoots,
    mounts: &[MountEntry],
    stalled: &Claims,
) -> Result<VerifiedDevice, HelperError> {
    let refuse = |reason| refused(device, volume_id, reason);
    let name = kernel_name_of(device).ok_or_else(|| refuse(Refusal::NotKernelName))?;
    let (node, number) = block_node(device).ok_or_else(|| refuse(Refusal::NotBlockDevice))?;
    stalled.check_within(number, device, STALLED_WAIT)?;
    let file = open_node(&node, number).ok_or_else(|| refuse(Refusal::NotBlockDevice))?;
    let sysfs = sysfs_dir(number);
    let disk = disk_of(name).unwrap_or(name);
    let disk_sysfs = disk_dir(&sysfs, name)
        .filter(|_| kernel_name(&sysfs).as_deref() == Some(name))
        .ok_or_else(|| refuse(Refusal::NameMismatch))?;
    let disk_sequence = sys::disk_sequence(file.as_fd()).map_err(|_| refuse(Refusal::NotBlockDevice))?;
    if sysfs_disk_sequence(&disk_sysfs) != disk_sequence {
        return Err(refuse(Refusal::NameMismatch));
    }
    if disk != name && overlaps_another(&sysfs, &disk_sysfs) {
        return Err(refuse(Refusal::Overlapping));
    }
    prove_identity(volume_id, disk, file.as_fd(), &disk_sysfs, policy).map_err(refuse)?;
    let in_use = InUse::of(disk, &disk_sysfs);
    if let Some(reason) = in_use.by_the_host(roots, mounts) {
        return Err(refuse(reason));
    }
    if !in_use.mounted(mounts) && !claimable(&file) {
        return Err(refuse(Refusal::HeldUnseen));
    }
    Ok(VerifiedDevice {
        volume_id: volume_id.clone(),
        name: name.to_owned(),
        number,
        file: Arc::new(file),
        disk_sequence,
        policy: policy.clone(),
    })
}

/// Step 1: the kernel name in `device` when it is `/dev/<name>` with
/// `name` an NVMe namespace (`nvme<N>n<M>`) or loop device (`loop<N>`)
/// name; `None` for any other string.
pub fn kernel_name_of(device: &str) -> Option<&str> {
    device
        .strip_prefix("/dev/")
        .filter(|name| DeviceKind::of(disk_of(name).unwrap_or(name)).is_some())
}

/// The disk's name in `name` when `name` is a partition's: `nvme1n1` in
/// `nvme1n1p2`, `None` in `loop3`. The kernel names partition N of a disk
/// whose name ends in a digit `<disk>p<N>`, N from 1 without a leading zero
/// (`block/partitions/core.c`, `add_partition`).
pub fn disk_of(name: &str) -> Option<&str> {
    let (disk, number) = name.rsplit_once('p')?;
    let canonical = !number.starts_with(['0', '+']) && number.parse::<u32>().is_ok();
    (canonical && DeviceKind::of(disk).is_some()).then_some(disk)
}

/// Refuses a device that is published as a raw block device (or whose
/// disk is, for a partition): its node bind-mounted onto a file (a mount of `/dev`'s devtmpfs, or a
/// container's tmpfs `/dev`, whose root is `/<name>`).
/// Formatting it could destroy what a pod writes there.
///
/// # Errors
/// [`HelperError::DeviceRefused`] with [`Refusal::PublishedRaw`].
pub fn refuse_if_published_raw(device: &VerifiedDevice, mounts: &[MountEntry]) -> Result<(), HelperError> {
    let disk = disk_of(&device.name).unwrap_or(&device.name);
    let roots = [&device.name, disk].map(|name| format!("/{name}"));
    if mounts
        .iter()
        .any(|m| matches!(m.fs_type.as_str(), "devtmpfs" | "tmpfs") && roots.contains(&m.root))
    {
        return Err(device.refusal(Refusal::PublishedRaw));
    }
    Ok(())
}

/// Refuses a raw block publish of a device whose filesystem (or a
/// partition's) is mounted anywhere: a pod must never write to the block
/// device of a filesystem the kernel has mounted. `numbers` are the
/// device's and its partitions' ([`numbers_of`]).
///
/// # Errors
/// [`HelperError::DeviceRefused`] with [`Refusal::FilesystemMounted`].
pub fn refuse_if_mounted(
    device: &VerifiedDevice,
    numbers: &[DeviceNumber],
    mounts: &[MountEntry],
) -> Result<(), HelperError> {
    if mounts.iter().any(|m| numbers.contains(&(m.major, m.minor))) {
        return Err(device.refusal(Refusal::FilesystemMounted));
    }
    Ok(())
}

/// The device numbers of the block devices whose sectors `device`'s are
/// (from sysfs): a disk's and its partitions', or a partition's and its
/// disk's (a disk's own comes twice).
pub fn numbers_of(device: &VerifiedDevice) -> Vec<DeviceNumber> {
    let sysfs = sysfs_dir(device.number);
    let mut numbers = InUse::of(&device.name, &sysfs).numbers;
    numbers.extend(disk_dir(&sysfs, &device.name).and_then(|disk| device_number(&disk)));
    numbers
}

/// [`HelperError::DeviceRefused`] of `device` for `volume_id`, for `reason`.
pub(crate) fn refused(device: &str, volume_id: &VolumeId, reason: Refusal) -> HelperError {
    HelperError::DeviceRefused {
        device: device.to_owned(),
        volume_id: volume_id.to_string(),
        reason: reason.to_string(),
    }
}

/// How long [`open_node`] waits for a disk the kernel is still adding.
/// `device_add_disk` (block/genhd.c) makes the disk's device, and with it
/// its devtmpfs node and sysfs directory, before `bdev_add` makes it
/// openable; in between an open fails with `ENXIO`. The agent hands over a
/// hot-plugged disk as soon as its node appears (an attach is a PCIe
/// hot-plug of an NVMe controller); the window lasts microseconds on
/// hardware and was seen to last long enough to be hit under emulation.
const APPEARING_WAIT: Duration = Duration::from_secs(2);

/// Step 2: the block device node [`block_node`] found, opened for reading
/// through its `O_PATH` fd (the same inode, still device `number`), so no
/// FIFO, tty or watchdog is ever opened for I/O and nothing can be swapped
/// in between. An open that fails with `ENXIO` (a disk still being added)
/// is tried again every 10 ms for [`APPEARING_WAIT`].
fn open_node(node: &OwnedFd, number: DeviceNumber) -> Option<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let deadline = std::time::Instant::now() + APPEARING_WAIT;
    let open = || rustix::fs::openat(rustix::fs::CWD, fd_path(node).as_str(), flags, Mode::empty());
    let mut opened = open();
    while matches!(opened, Err(rustix::io::Errno::NXIO)) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        opened = open();
    }
    let file = opened.ok()?;
    (block_number(&file)? == number).then_some(file)
}

/// The node at `device`, opened `O_PATH` without following any symlink,
/// and its device number when it is a block device node. Nothing is
/// opened for I/O.
fn block_node(device: &str) -> Option<(OwnedFd, DeviceNumber)> {
    let node = rustix::fs::openat2(
        rustix::fs::CWD,
        device,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .ok()?;
    let number = block_number(&node)?;
    Some((node, number))
}

/// Whether the block device `file` is open on can be opened exclusively
/// (`O_EXCL` without `O_CREAT`, through its `/proc/self/fd` link; open(2):
/// `EBUSY` when the device is in use by the system, e.g. mounted, in any
/// mount namespace). The exclusive open is closed at once: mkfs opens the
/// device exclusively itself.
fn claimable(file: &OwnedFd) -> bool {
    let flags = OFlags::RDONLY | OFlags::EXCL | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    rustix::fs::openat(rustix::fs::CWD, fd_path(file).as_str(), flags, Mode::empty()).is_ok()
}

fn block_number(fd: &OwnedFd) -> Option<DeviceNumber> {
    rustix::fs::fstat(fd)
        .ok()
        .filter(|st| FileType::from_raw_mode(st.st_mode) == FileType::BlockDevice)
        .map(|st| (rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev)))
}

/// Step 4, on the open fd.
fn prove_identity(
    volume_id: &VolumeId,
    name: &str,
    fd: BorrowedFd<'_>,
    sysfs: &Path,
    policy: &IdentityPolicy,
) -> Result<(), Refusal> {
    match DeviceKind::of(name) {
        Some(DeviceKind::NvmeNamespace) => {
            let id = nvme::identify_controller(fd).map_err(|_| Refusal::IdentifyFailed)?;
            if id.vendor_id != policy.nvme_vendor_id || id.model != policy.nvme_model {
                Err(Refusal::NotEbs)
            } else if id.serial != volume_id.nvme_serial() {
                Err(Refusal::OtherVolume)
            } else {
                Ok(())
            }
        }
        Some(DeviceKind::Loop) if policy.allow_loop_devices => {
            let backing =
                std::fs::read_to_string(sysfs.join("loop/backing_file")).map_err(|_| Refusal::LoopNotNamed)?;
            let named = Path::new(backing.trim_end())
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(volume_id.as_str()));
            if named { Ok(()) } else { Err(Refusal::LoopNotNamed) }
        }
        Some(DeviceKind::Loop) => Err(Refusal::LoopNotAllowed),
        None => Err(Refusal::NotKernelName),
    }
}

/// The block devices a disk stands for (itself and its partitions), for
/// the in-use checks of step 5.
struct InUse {
    names: Vec<String>,
    numbers: Vec<DeviceNumber>,
    holders: bool,
}

impl InUse {
    fn of(name: &str, sysfs: &Path) -> Self {
        let mut in_use = Self {
            names: vec![name.to_owned()],
            numbers: device_number(sysfs).into_iter().collect(),
            holders: has_holders(sysfs),
        };
        for partition in partitions(sysfs) {
            in_use.holders |= has_holders(&partition);
            in_use.numbers.extend(device_number(&partition));
            in_use
                .names
                .extend(partition.file_name().and_then(|n| n.to_str()).map(str::to_owned));
        }
        in_use
    }

    fn by_the_host(&self, roots: &AllowedRoots, mounts: &[MountEntry]) -> Option<Refusal> {
        if self.holders {
            return Some(Refusal::Held);
        }
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        let swap_devices: Vec<&str> = swaps
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        if self
            .names
            .iter()
            .any(|n| swap_devices.contains(&format!("/dev/{n}").as_str()))
        {
            return Some(Refusal::Swap);
        }
        mounts
            .iter()
            .any(|m| self.numbers.contains(&(m.major, m.minor)) && !roots.holds_volume(&m.mount_point))
            .then_some(Refusal::MountedOutside)
    }

    /// Whether the disk or a partition is mounted in a namespace the
    /// helper sees.
    fn mounted(&self, mounts: &[MountEntry]) -> bool {
        mounts.iter().any(|m| self.numbers.contains(&(m.major, m.minor)))
    }
}

enum DeviceKind {
    NvmeNamespace,
    Loop,
}

impl DeviceKind {
    /// Classifies a kernel block device name: `nvme<N>n<M>` or `loop<N>`.
    fn of(name: &str) -> Option<Self> {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if let Some((ctrl, ns)) = name.strip_prefix("nvme").and_then(|r| r.split_once('n')) {
            return (digits(ctrl) && digits(ns)).then_some(Self::NvmeNamespace);
        }
        name.strip_prefix("loop").filter(|n| digits(n)).map(|_| Self::Loop)
    }
}

/// `/dev/<kernel name>` of the block device numbered `number` now (from
/// sysfs); `None` when there is none. The name still has to be verified.
pub fn path_of(number: DeviceNumber) -> Option<String> {
    kernel_name(&sysfs_dir(number)).map(|name| format!("/dev/{name}"))
}

fn sysfs_dir((major, minor): DeviceNumber) -> PathBuf {
    PathBuf::from(format!("/sys/dev/block/{major}:{minor}"))
}

/// The kernel's name of the disk at `sysfs` (the link's target's last
/// component).
fn kernel_name(sysfs: &Path) -> Option<String> {
    let target = std::fs::read_link(sysfs).ok()?;
    target.file_name()?.to_str().map(str::to_owned)
}

/// The sysfs directory of the disk of the device `name` whose directory is
/// `sysfs`: `sysfs` itself for a whole disk, the directory it lies in for
/// a partition (`/sys/block/<disk>/<partition>`), which must be the disk's
/// that `name` names.
fn disk_dir(sysfs: &Path, name: &str) -> Option<PathBuf> {
    let Some(disk) = disk_of(name) else {
        return Some(sysfs.to_owned());
    };
    let real = std::fs::canonicalize(sysfs).ok()?;
    let parent = real.parent()?;
    (parent.file_name()? == disk).then(|| parent.to_owned())
}

/// Whether the partition whose sysfs directory is `sysfs` shares a sector
/// with another partition of the disk at `disk_sysfs` (their `start` and
/// `size`, in 512-byte sectors, block/partitions/core.c); unreadable
/// counts as shared.
fn overlaps_another(sysfs: &Path, disk_sysfs: &Path) -> bool {
    let sectors = |dir: &Path| {
        let read = |name| std::fs::read_to_string(dir.join(name)).ok()?.trim().parse::<u64>().ok();
        let start = read("start")?;
        Some(start..start.checked_add(read("size")?)?)
    };
    let (own, number) = (sectors(sysfs), device_number(sysfs));
    partitions(disk_sysfs)
        .iter()
        .filter(|p| device_number(p) != number)
        .any(|other| match (&own, sectors(other)) {
            (Some(own), Some(other)) => own.start < other.end && other.start < own.end,
            _ => true,
        })
}

/// The device number sysfs gives in `<dir>/dev`.
fn device_number(sysfs: &Path) -> Option<DeviceNumber> {
    parse_dev(&std::fs::read_to_string(sysfs.join("dev")).ok()?)
}

/// sysfs `diskseq` of the disk the device number names now; `None` where
/// the kernel has none (before 5.15), matching `BLKGETDISKSEQ`'s `None`.
fn sysfs_disk_sequence(sysfs: &Path) -> Option<u64> {
    std::fs::read_to_string(sysfs.join("diskseq")).ok()?.trim().parse().ok()
}

fn has_holders(sysfs: &Path) -> bool {
    std::fs::read_dir(sysfs.join("holders")).is_ok_and(|mut d| d.next().is_some())
}

/// The sysfs directories of the partitions of the disk at `sysfs`.
fn partitions(sysfs: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(sysfs) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("partition").exists())
        .collect()
}

fn parse_dev(text: &str) -> Option<DeviceNumber> {
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_kernel_names() {
        for (name, nvme, looped) in [
            ("nvme0n1", true, false),
            ("nvme12n3", true, false),
            ("nvme0n1p1", false, false),
            ("nvme0", false, false),
            ("nvme0c1n1", false, false),
            ("loop7", false, true),
            ("loop7p1", false, false),
            ("sda", false, false),
            ("dm-0", false, false),
        ] {
            let kind = DeviceKind::of(name);
            assert_eq!(matches!(kind, Some(DeviceKind::NvmeNamespace)), nvme, "{name}");
            assert_eq!(matches!(kind, Some(DeviceKind::Loop)), looped, "{name}");
        }
    }

    /// A partition's name is its disk's with `p<N>`, N from 1 without a
    /// leading zero, as the kernel writes it; anything else is a whole
    /// name (and refused unless it is a disk's).
    #[test]
    fn names_a_partitions_disk() {
        for (name, disk) in [
            ("nvme1n1p2", Some("nvme1n1")),
            ("loop7p15", Some("loop7")),
            ("nvme1n1", None),
            ("loop7", None),
            ("loop7p0", None),
            ("loop7p01", None),
            ("loop7p+1", None),
            ("nvme1n1p", None),
            ("sdap1", None),
            ("nvme1n1p2p3", None),
        ] {
            assert_eq!(disk_of(name), disk, "{name}");
        }
    }

    /// The runner takes a descriptor for the device the helper proved only
    /// when it is a block device of the proved number.
    #[test]
    fn the_runner_adopts_only_a_device_of_the_number_proved() {
        let volume = VolumeId::parse("vol-0123456789abcdef0").unwrap();
        let file = || OwnedFd::from(tempfile::tempfile().unwrap());
        let proved = VerifiedDevice::stand_in(volume.clone(), "loop3", (7, 3), file());
        let error = VerifiedDevice::adopt(proved.facts(), file(), &IdentityPolicy::default()).unwrap_err();
        assert_eq!(error, refused("/dev/loop3", &volume, Refusal::Changed));
    }

    /// A node whose disk the kernel has not (yet) made openable answers
    /// `ENXIO` (`mknod` of a block device number no disk has, as a
    /// hot-plugged disk's node is between `device_add` and `bdev_add`):
    /// the open is tried again until [`APPEARING_WAIT`], then refused.
    #[test]
    fn waits_for_a_disk_still_being_added_then_gives_up() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("nvme99n1");
        let no_disk = rustix::fs::makedev(259, 1_048_575);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            FileType::BlockDevice,
            Mode::from_raw_mode(0o600),
            no_disk,
        )
        .expect("mknod (the helper's tests run as root)");
        let (node, number) = block_node(&path.to_string_lossy()).unwrap();
        let started = std::time::Instant::now();
        assert!(open_node(&node, number).is_none());
        assert!(started.elapsed() >= APPEARING_WAIT, "{:?}", started.elapsed());
    }

    /// Every device string that is not a present `/dev/<kernel name>`
    /// block device is refused before anything is opened for I/O, with
    /// one answer for a missing node and for a non-device.
    #[test]
    fn refuses_names_and_nodes_before_any_io() {
        let tmp = tempfile::tempdir().unwrap();
        let roots = AllowedRoots::open(&[tmp.path().to_owned()], crate::layout::Layout::Kubelet).unwrap();
        let volume = VolumeId::parse("vol-0123456789abcdef0").unwrap();
        let policy = IdentityPolicy {
            allow_loop_devices: true,
            ..IdentityPolicy::default()
        };
        for (device, reason) in [
            ("/dev/shm/link", Refusal::NotKernelName),
            (
                "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0",
                Refusal::NotKernelName,
            ),
            ("/dev/../dev/loop0", Refusal::NotKernelName),
            ("/dev/null", Refusal::NotKernelName),
            ("/dev/sda", Refusal::NotKernelName),
            ("/dev/loop0p0", Refusal::NotKernelName),
            ("/dev/loop0p01", Refusal::NotKernelName),
            ("/dev/nvme0n1p", Refusal::NotKernelName),
            ("dev/loop0", Refusal::NotKernelName),
            ("/dev/loop987654", Refusal::NotBlockDevice),
            ("/dev/loop987654p1", Refusal::NotBlockDevice),
            ("/dev/nvme98n1", Refusal::NotBlockDevice),
            ("/dev/nvme98n1p2", Refusal::NotBlockDevice),
        ] {
            let error = verify(&volume, device, &policy, &roots, &[], &Claims::default()).unwrap_err();
            assert_eq!(error, refused(device, &volume, reason), "{device}");
        }
    }
}
