//! Finding the block device of an attached EBS volume, and waiting for it
//! to appear.
//!
//! Three sources, most authoritative first (DESIGN.md §2):
//! 1. sysfs: the NVMe controller whose `serial` is the volume id without
//!    its dash, and its namespace `nvmeNnM` (world-readable on every kernel);
//! 2. the udev link `disk/by-id/nvme-Amazon_Elastic_Block_Store_vol…`;
//! 3. the device name from ControllerPublishVolume's `devicePath` (Xen
//!    instances, or udev rules that create `/dev/xvdX` links).
//!
//! Links may be stale or missing; the helper re-verifies the identity of
//! whatever device is found before touching it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ebs_csi_helper_proto::VolumeId;
use inotify::{Inotify, WatchMask};
use rustix::fs::FileType;
use tokio::time::Instant;
use tokio_stream::StreamExt;

use crate::error::NodeError;

/// The by-id link prefix created by amazon-ec2-utils' udev rules.
const BY_ID_PREFIX: &str = "nvme-Amazon_Elastic_Block_Store_";

/// How often to look again when no event arrives: the fallback for
/// devices whose appearance inotify cannot see (sysfs, missing dirs).
const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Where to look for devices.
#[derive(Clone, Debug)]
pub struct DeviceFinder {
    dev_dir: PathBuf,
    sys_dir: PathBuf,
    watch_events: bool,
}

impl DeviceFinder {
    /// A finder over a device tree (`/dev`) and sysfs (`/sys`); with
    /// `watch_events` false it only polls (file systems without inotify).
    pub fn new(dev_dir: PathBuf, sys_dir: PathBuf, watch_events: bool) -> Self {
        Self {
            dev_dir,
            sys_dir,
            watch_events,
        }
    }

    /// The sysfs root.
    pub fn sys_dir(&self) -> &Path {
        &self.sys_dir
    }

    /// The device of `volume_id` if it is present now, as a canonical path
    /// to a block device.
    pub fn find(&self, volume_id: &VolumeId, device_path: Option<&str>) -> Option<PathBuf> {
        let serial = volume_id.nvme_serial();
        let by_id = self.dev_dir.join("disk/by-id").join(format!("{BY_ID_PREFIX}{serial}"));
        let by_name = device_path
            .and_then(|p| Path::new(p).file_name())
            .map(|name| self.dev_dir.join(name));
        self.nvme_namespace(&serial)
            .into_iter()
            .chain([by_id])
            .chain(by_name)
            .find_map(|candidate| block_device(&candidate))
    }

    /// Waits up to `timeout` for the device of `volume_id`, waking on
    /// inotify events in the device tree and every [`POLL_INTERVAL`].
    ///
    /// # Errors
    /// [`NodeError::DeviceNotFound`] (UNAVAILABLE) at the deadline.
    pub async fn wait(
        &self,
        volume_id: &VolumeId,
        device_path: Option<&str>,
        timeout: Duration,
    ) -> Result<PathBuf, NodeError> {
        // The common case, an attached device, needs no inotify instance.
        if let Some(device) = self.find(volume_id, device_path) {
            return Ok(device);
        }
        let deadline = Instant::now() + timeout;
        let mut events = if self.watch_events { self.watch() } else { None };
        loop {
            if let Some(device) = self.find(volume_id, device_path) {
                return Ok(device);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NodeError::DeviceNotFound {
                    volume_id: volume_id.clone(),
                    waited: timeout,
                });
            }
            let wake = deadline.min(now + POLL_INTERVAL);
            match events.as_mut() {
                Some(stream) => {
                    let _ = tokio::time::timeout_at(wake, stream.next()).await;
                }
                None => tokio::time::sleep_until(wake).await,
            }
        }
    }

    /// The namespace device of the NVMe controller whose serial is `serial`.
    /// `None` while the controller has no namespace yet (hot-plug window)
    /// or its `serial` is not yet readable.
    fn nvme_namespace(&self, serial: &str) -> Option<PathBuf> {
        let namespace = nvme_controllers(&self.sys_dir)
            .find(|c| c.serial == serial)?
            .namespace?;
        Some(self.dev_dir.join(namespace))
    }

    /// An inotify stream over the device tree and its by-id directory;
    /// `None` when inotify is unavailable (the poll still runs).
    fn watch(&self) -> Option<inotify::EventStream<Vec<u8>>> {
        let inotify = Inotify::init().ok()?;
        let mask = WatchMask::CREATE | WatchMask::MOVED_TO | WatchMask::ATTRIB;
        for dir in [
            self.dev_dir.clone(),
            self.dev_dir.join("disk"),
            self.dev_dir.join("disk/by-id"),
        ] {
            if let Err(e) = inotify.watches().add(&dir, mask) {
                tracing::debug!(dir = %dir.display(), error = %e, "not watched");
            }
        }
        inotify.into_event_stream(vec![0u8; 4096]).ok()
    }
}

/// The canonical path of `candidate` if it resolves to a block device.
fn block_device(candidate: &Path) -> Option<PathBuf> {
    let path = std::fs::canonicalize(candidate).ok()?;
    let stat = rustix::fs::stat(&path).ok()?;
    (FileType::from_raw_mode(stat.st_mode) == FileType::BlockDevice).then_some(path)
}

/// An NVMe controller as sysfs shows it (`<sys>/class/nvme/nvmeN`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmeController {
    /// The controller's kernel name, e.g. `nvme1`.
    pub name: String,
    /// Its serial, trimmed: `vol…` for an EBS volume.
    pub serial: String,
    /// Its first namespace's kernel name, e.g. `nvme1n1`; `None` while the
    /// namespace has not appeared.
    pub namespace: Option<String>,
}

/// The NVMe controllers under `sys_dir/class/nvme` whose serial is
/// readable, in directory order. The node finds a volume's disk, and
/// `ebs-csi-agent devices` lists the volumes, from this one walk.
pub fn nvme_controllers(sys_dir: &Path) -> impl Iterator<Item = NvmeController> {
    std::fs::read_dir(sys_dir.join("class/nvme"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|controller| {
            let serial = std::fs::read_to_string(controller.path().join("serial")).ok()?;
            let name = controller.file_name().into_string().ok()?;
            let namespace = std::fs::read_dir(controller.path()).ok()?.flatten().find_map(|entry| {
                let entry = entry.file_name().into_string().ok()?;
                let rest = entry.strip_prefix(&name)?.strip_prefix('n')?;
                rest.bytes().all(|b| b.is_ascii_digit()).then_some(entry)
            });
            Some(NvmeController {
                serial: serial.trim().to_owned(),
                name,
                namespace,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume() -> VolumeId {
        VolumeId::parse("vol-0123456789abcdef0").unwrap()
    }

    /// A fake sysfs and /dev: `nvme1` with the volume's serial and its
    /// namespace, whose /dev node is a symlink to a real block device
    /// (loop0, which the tests that need it require) so the type check
    /// passes.
    fn tree(with_namespace: bool) -> (tempfile::TempDir, DeviceFinder) {
        let dir = tempfile::tempdir().unwrap();
        let (sys, dev) = (dir.path().join("sys"), dir.path().join("dev"));
        std::fs::create_dir_all(sys.join("class/nvme/nvme1")).unwrap();
        std::fs::create_dir_all(sys.join("class/nvme/nvme0")).unwrap();
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(sys.join("class/nvme/nvme0/serial"), "vol0ffffffffffffffff\n").unwrap();
        std::fs::write(sys.join("class/nvme/nvme1/serial"), "vol0123456789abcdef0  \n").unwrap();
        if with_namespace {
            std::fs::create_dir(sys.join("class/nvme/nvme1/nvme1n1")).unwrap();
            std::os::unix::fs::symlink("/dev/loop0", dev.join("nvme1n1")).unwrap();
        }
        (dir, DeviceFinder::new(dev, sys, true))
    }

    /// Fails, never skips, where the block device the fake tree links to
    /// is missing (make test's machines have it).
    fn require_loop0() {
        assert!(Path::new("/dev/loop0").exists(), "this test needs /dev/loop0");
    }

    #[test]
    fn finds_the_namespace_by_serial() {
        require_loop0();
        let (_dir, finder) = tree(true);
        assert_eq!(finder.find(&volume(), None), Some(PathBuf::from("/dev/loop0")));
        let other = VolumeId::parse("vol-0aaaaaaaaaaaaaaa1").unwrap();
        assert_eq!(finder.find(&other, None), None);
    }

    #[test]
    fn waits_through_the_hot_plug_window_then_times_out() {
        let (_dir, finder) = tree(false);
        assert_eq!(finder.find(&volume(), Some("/dev/xvdba")), None);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = runtime
            .block_on(finder.wait(&volume(), None, Duration::from_millis(50)))
            .unwrap_err();
        assert!(err.to_string().contains("vol-0123456789abcdef0"), "{err}");
    }

    #[test]
    fn follows_the_by_id_link_and_the_device_path_name() {
        require_loop0();
        let (dir, finder) = tree(false);
        let dev = dir.path().join("dev");
        std::os::unix::fs::symlink("/dev/loop1", dev.join("xvdba")).unwrap();
        assert_eq!(
            finder.find(&volume(), Some("/dev/xvdba")),
            Some(PathBuf::from("/dev/loop1"))
        );
        std::fs::create_dir_all(dev.join("disk/by-id")).unwrap();
        std::os::unix::fs::symlink(
            "/dev/loop0",
            dev.join("disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0"),
        )
        .unwrap();
        assert_eq!(
            finder.find(&volume(), Some("/dev/xvdba")),
            Some(PathBuf::from("/dev/loop0"))
        );
    }
}
