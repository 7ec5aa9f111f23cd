//! What the guest drivers of the test VMs share (`ebs-csi-vm-guest` in the
//! NVMe VM, `ebs-csi-vm-systemd` in the systemd VMs): the instance they
//! are, reporting a scenario to the host (the tests' `ebs_csi_tests::qemu`
//! reads it), finding an emulated EBS disk by its NVMe serial, and reading
//! mounts.
#![allow(clippy::unwrap_used, reason = "test support: a failed step fails the test")]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ebs_csi_proto::v1::node_client::NodeClient;
use ebs_csi_proto::v1::volume_capability::access_mode::Mode;
use ebs_csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use ebs_csi_proto::v1::{NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, VolumeCapability};
use tonic::transport::Channel;

/// The instance id the test VMs' SMBIOS board asset tag carries, as a
/// Nitro instance's does.
pub const INSTANCE_ID: &str = "i-0a1b2c3d4e5f60718";

/// The instance type the test VMs' SMBIOS product name carries.
pub const INSTANCE_TYPE: &str = "m5.large";

/// A single-node-writer filesystem capability of type `fs_type`.
pub fn mount_capability(fs_type: &str) -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            ..Default::default()
        })),
    })
}

/// NodeGetVolumeStats of `volume_id` at `path`; panics if the call fails.
pub async fn volume_stats(node: &mut NodeClient<Channel>, volume_id: &str, path: &Path) -> NodeGetVolumeStatsResponse {
    node.node_get_volume_stats(NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: path.display().to_string(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

/// Tells the host scenario `scenario` passed, with `detail`.
pub fn report(scenario: u32, detail: &str) {
    println!("@@SCENARIO {scenario} ok: {detail}");
}

/// The NVMe serial EBS gives `volume_id`: the id without its dash.
pub fn serial(volume_id: &str) -> String {
    volume_id.replace('-', "")
}

/// The sysfs directory of the NVMe controller whose serial is `serial`.
pub fn find_controller(serial: &str) -> Option<PathBuf> {
    std::fs::read_dir("/sys/class/nvme")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|c| std::fs::read_to_string(c.join("serial")).is_ok_and(|s| s.trim() == serial))
}

/// The `/dev` nodes of the controller and first namespace with `serial`,
/// once the namespace's node is the disk sysfs names (its device number)
/// and opens, polling every millisecond up to `timeout`. Its node existing
/// is not enough: the kernel shows a disk in sysfs before it can be opened
/// (`add_disk`: `device_add`, then `bdev_add`; an open between them is
/// ENXIO), and a hot-plugged controller can take a name whose old node is
/// not gone yet.
pub fn wait_for_disk(serial: &str, timeout: Duration) -> Option<(PathBuf, PathBuf)> {
    let deadline = Instant::now() + timeout;
    let is_ready = |name: &str, namespace: &Path| {
        let sysfs = std::fs::read_to_string(format!("/sys/block/{name}n1/dev")).ok();
        let node = device_number(namespace).map(|(major, minor)| format!("{major}:{minor}"));
        sysfs.is_some_and(|number| Some(number.trim().to_owned()) == node) && std::fs::File::open(namespace).is_ok()
    };
    loop {
        let found = find_controller(serial).and_then(|sys| {
            let name = sys.file_name()?.to_str()?.to_owned();
            let namespace = PathBuf::from(format!("/dev/{name}n1"));
            is_ready(&name, &namespace).then(|| (PathBuf::from(format!("/dev/{name}")), namespace))
        });
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The device number of the block device `path`.
pub fn device_number(path: &Path) -> Option<(u32, u32)> {
    let stat = rustix::fs::stat(path).ok()?;
    Some((rustix::fs::major(stat.st_rdev), rustix::fs::minor(stat.st_rdev)))
}

/// The device number mounted at `path`, from `/proc/self/mountinfo`.
pub fn mounted_device(path: &Path) -> Option<(u32, u32)> {
    mounted_device_in(Path::new("/proc/self/mountinfo"), path)
}

/// The device number mounted at `path` in the mount table `mountinfo`
/// (`/proc/<pid>/mountinfo`).
pub fn mounted_device_in(mountinfo: &Path, path: &Path) -> Option<(u32, u32)> {
    mountinfo_field(mountinfo, path, |fields| {
        let (major, minor) = fields.get(2)?.split_once(':')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    })
}

/// The filesystem type mounted at `path`.
pub fn mount_type(path: &Path) -> String {
    mount_field(path, |fields| {
        let dash = fields.iter().position(|f| *f == "-")?;
        fields.get(dash + 1).map(|s| (*s).to_owned())
    })
    .unwrap_or_default()
}

/// The super options (filesystem-specific, comma-separated) of the mount
/// at `path`.
pub fn super_options(path: &Path) -> String {
    mount_field(path, |fields| {
        let dash = fields.iter().position(|f| *f == "-")?;
        fields.get(dash + 3).map(|s| (*s).to_owned())
    })
    .unwrap_or_default()
}

fn mount_field<T>(path: &Path, field: impl Fn(&[&str]) -> Option<T>) -> Option<T> {
    mountinfo_field(Path::new("/proc/self/mountinfo"), path, field)
}

/// `field` of the last mount at `path` in the mount table `mountinfo`
/// (`/proc/<pid>/mountinfo`; its fields split at spaces).
fn mountinfo_field<T>(mountinfo: &Path, path: &Path, field: impl Fn(&[&str]) -> Option<T>) -> Option<T> {
    let mountinfo = std::fs::read_to_string(mountinfo).ok()?;
    let path = path.display().to_string();
    mountinfo.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        (fields.get(4) == Some(&path.as_str()))
            .then(|| field(&fields))
            .flatten()
    })
}
