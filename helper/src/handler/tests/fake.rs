//! A recording fake of the kernel seam ([`Kernel`]), for the requests'
//! unit tests, which run as a normal user.
//!
//! It stands in for block devices and mounts, and for nothing else: paths
//! are real directories and files in a temporary directory, resolved and
//! created by the real calls. A device is a sparse file of the volume's
//! size with scripted contents. A mount is an entry in the fake's table,
//! keyed by the real (device, inode) of its mount point; `inspect` reports
//! such a directory as a mount root showing what was mounted, as `statx`
//! does, and `mounts` lists the entries as mountinfo would. It stands in
//! for root, too: what the test's own uid owns, it reports as root's, as
//! what the helper creates is. Every change
//! is recorded as an [`Action`]; the n-th call of any [`Step`] can be made
//! to fail ([`Fake::fail`]).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ebs_csi_helper_proto::{FormatOptions, FsType, HelperError, VolumeId};
use ebs_csi_linux::mountinfo::MountEntry;
use ebs_csi_linux::nvme::{LOG_PAGE_LEN, LogPage};
use rustix::fs::{FileType, Mode, OFlags};
use rustix::mount::MountFlags;

use crate::claim::DeviceNumber;
use crate::device::{self, Refusal, VerifiedDevice};
use crate::error::Operation;
use crate::format::Contents;
use crate::kernel::Kernel;
use crate::mount::{self, Detached, Node};
use crate::options::MountOptions;
use crate::path::{AllowedRoots, SafePath};

/// devtmpfs's device number, which a device node's `statx` reports.
const DEVTMPFS: DeviceNumber = (0, 6);

/// The inode of an ext2/3/4 filesystem's root directory.
const ROOT_INODE: u64 = 2;

/// The steps of the seam, one per method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    Mounts,
    Inspect,
    Verify,
    Reverify,
    Probe,
    Format,
    Mount,
    Bind,
    Attach,
    SetAttributes,
    CreateMountPoint,
    Unmount,
    FilesystemSize,
    ResizeExt,
    XfsGrowfs,
    StatisticsPage,
}

/// A change the fake was asked to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// `mkfs` of `fs` on `device`.
    Format { device: String, fs: FsType },
    /// A detached mount of `device`'s filesystem with these flags and data
    /// options.
    Mount {
        device: String,
        fs: FsType,
        flags: MountFlags,
        options: Vec<String>,
    },
    /// A detached bind mount of what `source` (a path or a device) shows.
    Bind { source: String },
    /// The detached mount given exactly `flags`.
    SetAttributes { flags: MountFlags },
    /// A detached mount attached at `target`.
    Attach { target: String },
    /// The mount at `target` removed.
    Unmount { target: String },
    /// The ext filesystem mounted at `target` grown to `blocks`.
    ResizeExt { target: String, blocks: u64 },
    /// The XFS filesystem mounted at `target` grown to its device's size.
    XfsGrowfs { target: String },
}

/// A device the fake stands in for.
#[derive(Debug)]
pub struct Device {
    /// `/dev/<name>`.
    pub path: String,
    pub volume_id: VolumeId,
    pub number: DeviceNumber,
    /// What a probe finds.
    pub contents: Contents,
    /// The filesystem's size as its superblock says: (blocks, block size);
    /// at first as large as the device.
    pub filesystem: Option<(u64, u64)>,
    /// Whether it proves to be another disk when verified again.
    pub changed: bool,
    /// The disk whose filesystem a mount of its name gets: another's when
    /// the name was made to point elsewhere.
    pub mounts_as: DeviceNumber,
    /// What Get Log Page 0xD0 answers: the page, or the NVMe status.
    pub statistics: Result<u8, u32>,
    file: File,
    identity: (DeviceNumber, u64),
}

/// A mount: attached (its point a real directory or file) or detached
/// (its point the fake's own directory for it).
#[derive(Clone, Debug)]
struct Mount {
    point: (DeviceNumber, u64),
    path: String,
    /// What its root shows.
    root: Node,
    entry: MountEntry,
}

/// What happens on the node meanwhile: another request, a racing agent,
/// a disk unplugged.
type Meanwhile = Box<dyn FnOnce(&Fake) + Send>;

#[derive(Default)]
struct State {
    devices: Vec<Device>,
    mounts: Vec<Mount>,
    detached: Vec<Mount>,
    next_mount_id: u64,
    actions: Vec<Action>,
    calls: HashMap<Step, usize>,
    failures: Vec<(Step, usize, HelperError)>,
    meanwhile: Vec<(Step, usize, Meanwhile)>,
    afterwards: Vec<(Step, usize, Meanwhile)>,
    owners: Vec<((DeviceNumber, u64), u32)>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("mounts", &self.mounts)
            .field("actions", &self.actions)
            .finish_non_exhaustive()
    }
}

/// The fake kernel.
#[derive(Debug)]
pub struct Fake {
    scratch: tempfile::TempDir,
    state: Mutex<State>,
}

impl Fake {
    /// A fake with no device and no mount.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            scratch: tempfile::tempdir().unwrap(),
            state: Mutex::new(State {
                next_mount_id: 1000,
                ..State::default()
            }),
        })
    }

    /// Adds a device `/dev/<name>` of `size` bytes that proves to be
    /// `volume_id` and holds `contents`.
    pub fn add_device(&self, name: &str, number: DeviceNumber, volume_id: &VolumeId, size: u64, contents: Contents) {
        let file = tempfile::tempfile_in(self.scratch.path()).unwrap();
        file.set_len(size).unwrap();
        let real = mount::inspect(file.as_fd()).unwrap();
        self.lock().devices.push(Device {
            path: format!("/dev/{name}"),
            volume_id: volume_id.clone(),
            number,
            contents,
            filesystem: Some((size / 4096, 4096)),
            changed: false,
            mounts_as: number,
            statistics: Ok(0xEB),
            file,
            identity: (real.dev, real.ino),
        });
    }

    /// Changes the device at `path`.
    pub fn device(&self, path: &str, change: impl FnOnce(&mut Device)) {
        let mut state = self.lock();
        change(state.devices.iter_mut().find(|d| d.path == path).unwrap());
    }

    /// Runs `meanwhile` right before the `nth` call (from 0) of `step`.
    pub fn before(&self, step: Step, nth: usize, meanwhile: impl FnOnce(&Self) + Send + 'static) {
        self.lock().meanwhile.push((step, nth, Box::new(meanwhile)));
    }

    /// Runs `meanwhile` right after the `nth` call (from 0) of `step` has
    /// made its change, before the helper goes on.
    pub fn after(&self, step: Step, nth: usize, meanwhile: impl FnOnce(&Self) + Send + 'static) {
        self.lock().afterwards.push((step, nth, Box::new(meanwhile)));
    }

    /// Makes `path` owned by `uid` in what `inspect` answers.
    pub fn chown(&self, path: &std::path::Path, uid: u32) {
        let real = std::fs::symlink_metadata(path).unwrap();
        let dev = (rustix::fs::major(real.dev()), rustix::fs::minor(real.dev()));
        self.lock().owners.push(((dev, real.ino()), uid));
    }

    /// Makes the `nth` call (from 0) of `step` fail with `error`.
    pub fn fail(&self, step: Step, nth: usize, error: HelperError) {
        self.lock().failures.push((step, nth, error));
    }

    /// Forgets the actions and calls so far.
    pub fn forget(&self) {
        let mut state = self.lock();
        state.actions.clear();
        state.calls.clear();
    }

    /// How often each step was called.
    pub fn calls(&self) -> HashMap<Step, usize> {
        self.lock().calls.clone()
    }

    /// The changes made, in order.
    pub fn actions(&self) -> Vec<Action> {
        self.lock().actions.clone()
    }

    /// The attached mounts: (mount point, filesystem type, per-mount options).
    pub fn mounted(&self) -> Vec<(String, String, String)> {
        let state = self.lock();
        let entry = |m: &Mount| (m.path.clone(), m.entry.fs_type.clone(), m.entry.mount_options.clone());
        state.mounts.iter().map(entry).collect()
    }

    /// Adds a mount of `fs_type` from device `number` at `path`, made by
    /// someone else; its root is the directory or file there.
    pub fn mount_foreign(&self, path: &std::path::Path, fs_type: &str, number: DeviceNumber) {
        let fd = rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).unwrap();
        let real = mount::inspect(fd.as_fd()).unwrap();
        let mut state = self.lock();
        let entry = state.entry(fs_type, number, "/", path.to_str().unwrap());
        state.mounts.push(Mount {
            point: (real.dev, real.ino),
            path: entry.mount_point.clone(),
            root: Node { dev: number, ..real },
            entry,
        });
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a call of `step`, running what happens meanwhile first; its
    /// scripted failure, if any, or the state to change, with what happens
    /// afterwards run once the call lets it go.
    fn call(&self, step: Step) -> Result<Call<'_>, HelperError> {
        let (nth, meanwhile, afterwards) = {
            let mut state = self.lock();
            let count = state.calls.entry(step).or_default();
            let nth = *count;
            *count += 1;
            let at = |hooks: &[(Step, usize, Meanwhile)]| hooks.iter().position(|(s, n, _)| *s == step && *n == nth);
            let meanwhile = at(&state.meanwhile).map(|i| state.meanwhile.remove(i).2);
            let afterwards = at(&state.afterwards).map(|i| state.afterwards.remove(i).2);
            (nth, meanwhile, afterwards)
        };
        if let Some(meanwhile) = meanwhile {
            meanwhile(self);
        }
        let mut state = self.lock();
        match state.failures.iter().position(|(s, n, _)| *s == step && *n == nth) {
            Some(i) => Err(state.failures.remove(i).2),
            None => Ok(Call {
                fake: self,
                state: Some(state),
                afterwards,
            }),
        }
    }
}

/// A call of the seam in progress: the fake's state, locked, and what
/// happens once the call is done with it ([`Fake::after`]).
struct Call<'a> {
    fake: &'a Fake,
    state: Option<MutexGuard<'a, State>>,
    afterwards: Option<Meanwhile>,
}

impl std::ops::Deref for Call<'_> {
    type Target = State;

    fn deref(&self) -> &State {
        self.state.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for Call<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.state.as_mut().expect("held until dropped")
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        drop(self.state.take());
        if let Some(afterwards) = self.afterwards.take() {
            afterwards(self.fake);
        }
    }
}

impl State {
    fn entry(&mut self, fs_type: &str, (major, minor): DeviceNumber, root: &str, point: &str) -> MountEntry {
        self.next_mount_id += 1;
        MountEntry {
            mount_id: self.next_mount_id,
            major,
            minor,
            root: root.to_owned(),
            mount_point: point.to_owned(),
            mount_options: "rw,nosuid,nodev".to_owned(),
            fs_type: fs_type.to_owned(),
        }
    }

    /// What `statx` of `fd` would say: a mount's root, a device node, or
    /// the real file.
    fn node(&self, fd: BorrowedFd<'_>) -> Result<Node, HelperError> {
        let mut real = mount::inspect(fd)?;
        let identity = (real.dev, real.ino);
        if let Some((_, uid)) = self.owners.iter().find(|(file, _)| *file == identity) {
            real.uid = *uid;
        } else if real.uid == rustix::process::geteuid().as_raw() {
            real.uid = 0;
        }
        if let Some(m) = self
            .mounts
            .iter()
            .rev()
            .chain(&self.detached)
            .find(|m| m.point == identity)
        {
            return Ok(Node {
                is_mount_root: true,
                mount_id: m.entry.mount_id,
                ..m.root
            });
        }
        if let Some(d) = self.devices.iter().find(|d| d.identity == identity) {
            return Ok(Node {
                dev: DEVTMPFS,
                rdev: d.number,
                file_type: FileType::BlockDevice,
                ..real
            });
        }
        Ok(real)
    }

    fn device(&mut self, number: DeviceNumber) -> &mut Device {
        self.devices.iter_mut().find(|d| d.number == number).unwrap()
    }

    fn attached(&mut self, root: BorrowedFd<'_>) -> Result<&mut Mount, HelperError> {
        let real = mount::inspect(root)?;
        self.mounts
            .iter_mut()
            .rev()
            .find(|m| m.point == (real.dev, real.ino))
            .ok_or_else(|| Operation::Attach.failed("the fake: not a mount's root"))
    }

    /// A detached mount whose root shows `root`, listed as `entry`.
    fn detach(&mut self, scratch: &std::path::Path, root: Node, entry: MountEntry) -> Detached {
        let dir = scratch.join(format!("mount-{}", entry.mount_id));
        std::fs::create_dir(&dir).unwrap();
        let fd = rustix::fs::open(&dir, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).unwrap();
        let real = mount::inspect(fd.as_fd()).unwrap();
        self.detached.push(Mount {
            point: (real.dev, real.ino),
            path: String::new(),
            root,
            entry,
        });
        Detached(fd)
    }
}

/// The real path of an fd.
fn path_of(fd: BorrowedFd<'_>) -> String {
    std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

impl Kernel for Arc<Fake> {
    fn mounts(&self) -> Result<Vec<MountEntry>, HelperError> {
        Ok(self
            .call(Step::Mounts)?
            .mounts
            .iter()
            .map(|m| m.entry.clone())
            .collect())
    }

    fn inspect(&self, fd: BorrowedFd<'_>) -> Result<Node, HelperError> {
        self.call(Step::Inspect)?.node(fd)
    }

    fn verify(
        &self,
        volume_id: &VolumeId,
        path: &str,
        roots: &AllowedRoots,
        mounts: &[MountEntry],
    ) -> Result<VerifiedDevice, HelperError> {
        let state = self.call(Step::Verify)?;
        let refuse = |reason| device::refused(path, volume_id, reason);
        let name = device::kernel_name_of(path).ok_or_else(|| refuse(Refusal::NotKernelName))?;
        let found = state.devices.iter().find(|d| d.path == path);
        let device = found.ok_or_else(|| refuse(Refusal::NotBlockDevice))?;
        if device.volume_id != *volume_id {
            return Err(refuse(Refusal::OtherVolume));
        }
        let number = device.number;
        if mounts
            .iter()
            .any(|m| (m.major, m.minor) == number && !roots.holds_volume(&m.mount_point))
        {
            return Err(refuse(Refusal::MountedOutside));
        }
        let file = device.file.as_fd().try_clone_to_owned().unwrap();
        Ok(VerifiedDevice::stand_in(volume_id.clone(), name, number, file))
    }

    fn reverify(&self, device: &VerifiedDevice) -> Result<(), HelperError> {
        let mut state = self.call(Step::Reverify)?;
        if state.device(device.number).changed {
            return Err(device.refusal(Refusal::Changed));
        }
        Ok(())
    }

    fn device_numbers(&self, device: &VerifiedDevice) -> Vec<DeviceNumber> {
        vec![device.number]
    }

    fn device_path(&self, number: DeviceNumber) -> Option<String> {
        let state = self.lock();
        state
            .devices
            .iter()
            .find(|d| d.number == number)
            .map(|d| d.path.clone())
    }

    fn probe(&self, device: &VerifiedDevice) -> Result<Contents, HelperError> {
        Ok(self.call(Step::Probe)?.device(device.number).contents.clone())
    }

    fn format(&self, fs: FsType, _: &FormatOptions, device: &VerifiedDevice) -> Result<(), HelperError> {
        let mut state = self.call(Step::Format)?;
        state.actions.push(Action::Format {
            device: device.path(),
            fs,
        });
        let formatted = state.device(device.number);
        let size = formatted.file.metadata().unwrap().len();
        formatted.contents = Contents::Filesystem(fs.name().to_owned());
        formatted.filesystem = Some((size / 4096, 4096));
        Ok(())
    }

    fn mount_filesystem(
        &self,
        device: &VerifiedDevice,
        fs: FsType,
        options: &MountOptions,
    ) -> Result<Detached, HelperError> {
        let mut state = self.call(Step::Mount)?;
        state.actions.push(Action::Mount {
            device: device.path(),
            fs,
            flags: options.flags,
            options: options.data.clone(),
        });
        let number = state.device(device.number).mounts_as;
        let entry = state.entry(fs.name(), number, "/", "");
        let root = Node {
            dev: number,
            rdev: (0, 0),
            ino: ROOT_INODE,
            mount_id: entry.mount_id,
            is_mount_root: true,
            file_type: FileType::Directory,
            uid: 0,
            size: 4096,
        };
        Ok(state.detach(self.scratch.path(), root, entry))
    }

    fn bind(&self, source: BorrowedFd<'_>) -> Result<Detached, HelperError> {
        let mut state = self.call(Step::Bind)?;
        let root = state.node(source)?;
        let real = mount::inspect(source)?;
        let (fs_type, number, within, shown) = match state.devices.iter().find(|d| d.identity == (real.dev, real.ino)) {
            Some(d) => (
                "devtmpfs".to_owned(),
                DEVTMPFS,
                format!("/{}", &d.path[5..]),
                d.path.clone(),
            ),
            None => {
                let m = state.mounts.iter().rev().find(|m| m.point == (real.dev, real.ino));
                let m = m.ok_or_else(|| Operation::Bind.failed("the fake binds only mounts and devices"))?;
                (
                    m.entry.fs_type.clone(),
                    (m.entry.major, m.entry.minor),
                    m.entry.root.clone(),
                    m.path.clone(),
                )
            }
        };
        state.actions.push(Action::Bind { source: shown });
        let entry = state.entry(&fs_type, number, &within, "");
        Ok(state.detach(self.scratch.path(), root, entry))
    }

    fn attach(&self, mount: Detached, target: BorrowedFd<'_>) -> Result<OwnedFd, HelperError> {
        let mut state = self.call(Step::Attach)?;
        let made = mount::inspect(mount.fd())?;
        let at = state
            .detached
            .iter()
            .position(|m| m.point == (made.dev, made.ino))
            .unwrap();
        let mut attached = state.detached.remove(at);
        let real = mount::inspect(target)?;
        attached.point = (real.dev, real.ino);
        attached.path = path_of(target);
        attached.entry.mount_point.clone_from(&attached.path);
        state.actions.push(Action::Attach {
            target: attached.path.clone(),
        });
        state.mounts.push(attached);
        Ok(target.try_clone_to_owned().unwrap())
    }

    fn set_attributes(&self, mount: &Detached, flags: MountFlags) -> Result<(), HelperError> {
        let mut state = self.call(Step::SetAttributes)?;
        let made = mount::inspect(mount.fd())?;
        let detached = state
            .detached
            .iter_mut()
            .find(|m| m.point == (made.dev, made.ino))
            .unwrap();
        let access = if flags.contains(MountFlags::RDONLY) { "ro" } else { "rw" };
        detached.entry.mount_options = format!("{access},nosuid,nodev");
        state.actions.push(Action::SetAttributes { flags });
        Ok(())
    }

    fn create_mount_point(
        &self,
        parent: BorrowedFd<'_>,
        target: &SafePath<'_>,
        file_type: FileType,
    ) -> Result<(), HelperError> {
        let _call = self.call(Step::CreateMountPoint)?;
        mount::create_mount_point(parent, target, file_type)
    }

    fn unmount(&self, parent: BorrowedFd<'_>, name: &str) -> Result<(), HelperError> {
        let mut state = self.call(Step::Unmount)?;
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let point = rustix::fs::openat(parent, name, flags, Mode::empty())
            .map_err(|e| Operation::Unmount(name.to_owned()).failed(e))?;
        let real = mount::inspect(point.as_fd())?;
        let Some(at) = state.mounts.iter().rposition(|m| m.point == (real.dev, real.ino)) else {
            return Err(Operation::Unmount(name.to_owned()).failed(rustix::io::Errno::INVAL));
        };
        let target = state.mounts.remove(at).path;
        state.actions.push(Action::Unmount { target });
        Ok(())
    }

    fn filesystem_size(&self, device: &VerifiedDevice, fs: FsType) -> Result<(u64, u64), HelperError> {
        let mut state = self.call(Step::FilesystemSize)?;
        let superblock = state.device(device.number).filesystem;
        superblock
            .ok_or_else(|| Operation::ReadSuperblock(device.path()).failed(format!("no {} superblock", fs.name())))
    }

    fn resize_ext(&self, root: BorrowedFd<'_>, blocks: u64) -> Result<(), HelperError> {
        let mut state = self.call(Step::ResizeExt)?;
        let mount = state.attached(root)?;
        let (target, number) = (mount.path.clone(), mount.root.dev);
        state.actions.push(Action::ResizeExt { target, blocks });
        let grown = state.device(number);
        grown.filesystem = grown.filesystem.map(|(_, block_size)| (blocks, block_size));
        Ok(())
    }

    fn xfs_growfs(&self, device: &VerifiedDevice, root: BorrowedFd<'_>) -> Result<(), HelperError> {
        let mut state = self.call(Step::XfsGrowfs)?;
        let target = state.attached(root)?.path.clone();
        state.actions.push(Action::XfsGrowfs { target });
        let grown = state.device(device.number);
        let size = grown.file.metadata().unwrap().len();
        grown.filesystem = grown.filesystem.map(|(_, block_size)| (size / block_size, block_size));
        Ok(())
    }

    fn statistics_page(&self, device: &VerifiedDevice) -> Result<LogPage, HelperError> {
        let mut state = self.call(Step::StatisticsPage)?;
        Ok(match state.device(device.number).statistics {
            Ok(byte) => LogPage::Read(Box::new([byte; LOG_PAGE_LEN])),
            Err(status) => LogPage::Unavailable(status),
        })
    }
}
