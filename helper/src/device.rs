//! Proving that a block device is the EBS volume a request names.
//!
//! The helper re-derives the device's identity from the device itself:
//! it opens the path, takes the device number from the open fd, finds the
//! kernel's name for it in sysfs, and for an NVMe namespace reads Identify
//! Controller through the fd. udev links and names are never trusted (a
//! stale link once made another driver mount the wrong volume).

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use ebs_csi_helper_proto::{HelperError, VolumeId};
use rustix::fs::FileType;

use crate::error::system;
use crate::mountinfo::MountEntry;
use crate::nvme::{self, EBS_MODEL, EBS_VENDOR_ID};
use crate::path::AllowedRoots;

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

/// A whole-disk block device proved to be a given volume, held open.
#[derive(Debug)]
pub struct VerifiedDevice {
    /// The volume the device proved to be.
    pub volume_id: VolumeId,
    /// The open device (read-only); keeps the device number from being
    /// reused while the helper works.
    pub file: File,
    /// The device path as the agent sent it.
    pub path: String,
    /// The kernel's name for it, e.g. `nvme1n1` or `loop3`.
    pub name: String,
    /// Device number, major part.
    pub major: u32,
    /// Device number, minor part.
    pub minor: u32,
}

impl VerifiedDevice {
    /// The device's size in bytes, from sysfs `size` (always in 512-byte
    /// sectors, whatever the logical block size).
    ///
    /// # Errors
    /// [`HelperError::System`] when sysfs cannot be read.
    pub fn size_bytes(&self) -> Result<u64, HelperError> {
        let path = self.sysfs_dir().join("size");
        let sectors = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| system(format!("reading {}", path.display()), "unreadable"))?;
        Ok(sectors * 512)
    }

    /// Checks that the device path still names this device, just before a
    /// tool or `mount(2)` is given the path rather than the fd.
    ///
    /// # Errors
    /// [`HelperError::DeviceRefused`] when it does not.
    pub fn recheck(&self) -> Result<(), HelperError> {
        let same = rustix::fs::stat(self.path.as_str())
            .is_ok_and(|st| (rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev)) == (self.major, self.minor));
        if same {
            Ok(())
        } else {
            Err(HelperError::DeviceRefused {
                device: self.path.clone(),
                volume_id: self.volume_id.to_string(),
                reason: "the path changed to another device during the request".into(),
            })
        }
    }

    fn sysfs_dir(&self) -> PathBuf {
        sysfs_dir(self.major, self.minor)
    }
}

/// Opens `device` and proves it is `volume_id`:
///
/// 1. the path starts with `/dev/` and has no `..`;
/// 2. it opens, and the open fd is a block device;
/// 3. sysfs says the device is a whole disk, not a partition;
/// 4. an NVMe namespace's Identify Controller has EBS's vendor id and model
///    and the volume id (without dash) as serial; a loop device (only with
///    `allow_loop_devices`) has a backing file whose name contains the id;
///    anything else is refused;
/// 5. neither the device nor any of its partitions is mounted outside the
///    allowed roots, and no device-mapper or md device holds it.
///
/// # Errors
/// [`HelperError::DeviceRefused`] naming the failed check.
pub fn verify(
    volume_id: &VolumeId,
    device: &str,
    policy: &IdentityPolicy,
    roots: &AllowedRoots,
    mounts: &[MountEntry],
) -> Result<VerifiedDevice, HelperError> {
    let refuse = |reason: String| HelperError::DeviceRefused {
        device: device.to_owned(),
        volume_id: volume_id.to_string(),
        reason,
    };
    if !device.starts_with("/dev/") || device.split('/').any(|c| c == "..") {
        return Err(refuse("not a path under /dev".into()));
    }
    let file = File::open(device).map_err(|e| refuse(format!("cannot open: {e}")))?;
    let stat = rustix::fs::fstat(&file).map_err(|e| refuse(format!("cannot stat: {e}")))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::BlockDevice {
        return Err(refuse("not a block device".into()));
    }
    let (major, minor) = (rustix::fs::major(stat.st_rdev), rustix::fs::minor(stat.st_rdev));
    let sysfs = sysfs_dir(major, minor);
    if sysfs.join("partition").exists() {
        return Err(refuse("is a partition, not a whole disk".into()));
    }
    let name = std::fs::canonicalize(&sysfs)
        .ok()
        .and_then(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
        .ok_or_else(|| refuse("no sysfs entry".into()))?;
    let kind = DeviceKind::of(&name)
        .ok_or_else(|| refuse(format!("{name} is neither an NVMe namespace nor a loop device")))?;
    match kind {
        DeviceKind::NvmeNamespace => {
            let id = nvme::identify_controller(file.as_fd())
                .map_err(|e| refuse(format!("NVMe Identify Controller failed: {e}")))?;
            if id.vendor_id != policy.nvme_vendor_id || id.model != policy.nvme_model {
                return Err(refuse(format!(
                    "controller is {:?} (vendor {:#06x}), not an EBS volume",
                    id.model, id.vendor_id
                )));
            }
            if id.serial != volume_id.nvme_serial() {
                return Err(refuse(format!("serial is {:?}", id.serial)));
            }
        }
        DeviceKind::Loop if policy.allow_loop_devices => {
            let backing = std::fs::read_to_string(sysfs.join("loop/backing_file"))
                .map_err(|e| refuse(format!("no backing file: {e}")))?;
            let file_name = Path::new(backing.trim_end())
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            if !file_name.contains(volume_id.as_str()) {
                return Err(refuse(format!(
                    "backing file {:?} does not name the volume",
                    backing.trim_end()
                )));
            }
        }
        DeviceKind::Loop => {
            return Err(refuse("loop devices are not allowed (--allow-loop-devices)".into()));
        }
    }
    if has_holders(&sysfs) {
        return Err(refuse("held by another block device (device-mapper, md)".into()));
    }
    let mut numbers = partitions(&sysfs);
    numbers.push((major, minor));
    if let Some(entry) = mounts
        .iter()
        .find(|m| numbers.contains(&(m.major, m.minor)) && !roots.contains(&m.mount_point))
    {
        return Err(refuse(format!("in use by the host: mounted at {}", entry.mount_point)));
    }
    Ok(VerifiedDevice {
        volume_id: volume_id.clone(),
        file,
        path: device.to_owned(),
        name,
        major,
        minor,
    })
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

fn sysfs_dir(major: u32, minor: u32) -> PathBuf {
    PathBuf::from(format!("/sys/dev/block/{major}:{minor}"))
}

fn has_holders(sysfs: &Path) -> bool {
    std::fs::read_dir(sysfs.join("holders")).is_ok_and(|mut d| d.next().is_some())
}

/// Device numbers of the partitions of the disk at `sysfs`.
fn partitions(sysfs: &Path) -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir(sysfs) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().join("partition").exists())
        .filter_map(|e| parse_dev(&std::fs::read_to_string(e.path().join("dev")).ok()?))
        .collect()
}

fn parse_dev(text: &str) -> Option<(u32, u32)> {
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
}
