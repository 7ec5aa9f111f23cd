//! Loop devices over sparse files named after volume ids: the stand-in
//! for attached EBS volumes on a machine without NVMe.
#![allow(clippy::expect_used, reason = "test support")]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::run;

/// A sparse backing file `<dir>/<volume_id>.img` and a loop device over
/// it, detached on drop.
pub struct LoopVolume {
    /// The volume id the backing file is named after.
    pub volume_id: String,
    /// The backing file.
    pub file: PathBuf,
    /// The loop device, e.g. `/dev/loop3`.
    pub device: PathBuf,
}

impl LoopVolume {
    /// Creates a `size_mib` MiB sparse file and attaches a loop device.
    pub fn create(dir: &Path, volume_id: &str, size_mib: u64) -> Self {
        let file = dir.join(format!("{volume_id}.img"));
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(size_mib << 20))
            .expect("backing file");
        let device = attach(&file, &[]);
        Self {
            volume_id: volume_id.to_owned(),
            file,
            device,
        }
    }

    /// Creates a `size_mib` MiB sparse file holding a GPT with one
    /// partition of each of `partitions_mib` MiB (from the first MiB on,
    /// `sfdisk` writing the file) and attaches a loop device that scans it
    /// (`losetup -P`): the volume and, once the kernel made them, its
    /// partitions' nodes `<device>p1`, `<device>p2`, ….
    pub fn partitioned(dir: &Path, volume_id: &str, size_mib: u64, partitions_mib: &[u64]) -> (Self, Vec<PathBuf>) {
        let file = dir.join(format!("{volume_id}.img"));
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(size_mib << 20))
            .expect("backing file");
        let table: String = partitions_mib.iter().map(|mib| format!(",{mib}M\n")).collect();
        let mut sfdisk = Command::new("sfdisk")
            .arg("-q")
            .arg(&file)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("sfdisk");
        std::io::Write::write_all(
            &mut sfdisk.stdin.take().expect("stdin"),
            format!("label: gpt\n{table}").as_bytes(),
        )
        .expect("the partition table");
        assert!(sfdisk.wait().expect("sfdisk").success(), "sfdisk");
        let device = attach(&file, &["-P"]);
        let partitions: Vec<PathBuf> = (1..=partitions_mib.len())
            .map(|n| PathBuf::from(format!("{}p{n}", device.display())))
            .collect();
        if !partitions.iter().all(|p| p.exists()) {
            // A kernel without partition parsers (this machine's) scans
            // nothing at attach: add them explicitly.
            let _ = Command::new("partx").arg("-a").arg(&device).status();
        }
        crate::wait_until("the partitions' nodes", std::time::Duration::from_secs(5), || {
            partitions.iter().all(|p| p.exists())
        });
        let volume = Self {
            volume_id: volume_id.to_owned(),
            file,
            device,
        };
        (volume, partitions)
    }

    /// Attaches a loop device over an existing backing file.
    pub fn attach_file(volume_id: &str, file: &Path) -> Self {
        Self {
            volume_id: volume_id.to_owned(),
            file: file.to_owned(),
            device: attach(file, &[]),
        }
    }

    /// Attaches a second loop device over a file, with extra `losetup` args.
    pub fn attach_extra(&self, args: &[&str]) -> PathBuf {
        attach(&self.file, args)
    }

    /// Grows the backing file to `size_mib` MiB and tells the loop driver
    /// (`losetup -c`).
    pub fn grow(&self, size_mib: u64) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.file)
            .and_then(|f| f.set_len(size_mib << 20))
            .expect("grow");
        run("losetup", &["-c", &self.device.to_string_lossy()]);
    }

    /// Writes `bytes` at `offset` of the device, synced.
    pub fn write_at(&self, bytes: &[u8], offset: u64) {
        use std::os::unix::fs::FileExt;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.device)
            .and_then(|f| f.write_all_at(bytes, offset).and_then(|()| f.sync_all()))
            .expect("writing to the device");
    }

    /// Writes, 3 MiB into the device (where no prober's magic lies), the
    /// bytes of an image that would take over the tool that parses it, as
    /// the audits' hostile images: the helper asks `blkid` about such a
    /// volume, never about one it proved blank.
    pub fn hold_hostile_image(&self) {
        self.write_at(b"an image that takes its parser over", 3 << 20);
    }

    /// The device's size in bytes (sysfs).
    pub fn size_bytes(&self) -> u64 {
        let name = self.device.file_name().expect("name").to_string_lossy().into_owned();
        let sectors: u64 = std::fs::read_to_string(format!("/sys/block/{name}/size"))
            .expect("size")
            .trim()
            .parse()
            .expect("number");
        sectors * 512
    }

    /// What `blkid -p` says the device holds (`TYPE=…` / `PTTYPE=…`), or
    /// empty when blank.
    pub fn signature(&self) -> String {
        signature(&self.device)
    }

    /// The UUID of the filesystem on the device (`blkid -p`): the same
    /// before and after a request means it was not formatted again.
    pub fn uuid(&self) -> String {
        run(
            "blkid",
            &["-p", "-s", "UUID", "-o", "value", &self.device.to_string_lossy()],
        )
        .trim()
        .to_owned()
    }

    /// The device's first and last MiB, read through the device: equal
    /// before and after a request means the request wrote nothing where
    /// filesystems and partition tables keep their signatures.
    pub fn ends(&self) -> Vec<u8> {
        use std::io::{Read, Seek, SeekFrom};
        let mut device = std::fs::File::open(&self.device).expect("open device");
        let size = self.size_bytes();
        let mut bytes = vec![0u8; 2 << 20];
        let (head, tail) = bytes.split_at_mut(1 << 20);
        device.read_exact(head).expect("read head");
        device.seek(SeekFrom::Start(size - (1 << 20))).expect("seek");
        device.read_exact(tail).expect("read tail");
        bytes
    }
}

/// What `blkid -p` says a device holds, or empty when blank.
pub fn signature(device: &Path) -> String {
    let out = Command::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(device)
        .output()
        .expect("blkid");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("TYPE=") || l.starts_with("PTTYPE="))
        .collect::<Vec<_>>()
        .join(",")
}

impl Drop for LoopVolume {
    /// Detaches the device, once no mount of its node is left. The tests
    /// share the machine's loop devices: the number freed here is another
    /// test's next one, and a bind of this node left behind (a raw block
    /// publish a failed or killed test did not undo, until its sandbox
    /// goes) would be a bind of that test's new volume, which its helper
    /// rightly refuses as published raw (`device::refuse_if_published_raw`,
    /// seen in a CI run: `is published as a raw block device`).
    fn drop(&mut self) {
        unmount_binds_of(&self.device);
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

/// Unmounts (lazily) every bind of the device node `device` or of a
/// partition's (`<device>pN`) in this mount namespace: a mount of a
/// devtmpfs or tmpfs whose root is `/<name>`, as the helper finds them.
fn unmount_binds_of(device: &Path) {
    let Some(name) = device.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let root = format!("/{name}");
    let is_this_device = |m: &ebs_csi_linux::mountinfo::MountEntry| {
        m.root == root
            || m.root
                .strip_prefix(&format!("{root}p"))
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
    };
    for bind in ebs_csi_linux::mountinfo::read()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| matches!(m.fs_type.as_str(), "devtmpfs" | "tmpfs") && is_this_device(m))
    {
        let _ = rustix::mount::unmount(bind.mount_point.as_str(), rustix::mount::UnmountFlags::DETACH);
    }
}

fn attach(file: &Path, args: &[&str]) -> PathBuf {
    let out = Command::new("losetup")
        .args(["--find", "--show"])
        .args(args)
        .arg(file)
        .output()
        .expect("losetup");
    assert!(
        out.status.success(),
        "losetup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Detaches every loop device whose backing file lies beneath `dir`
/// (clean-up after a failed or interrupted run).
pub fn detach_under(dir: &Path) {
    let Ok(devices) = std::fs::read_dir("/sys/block") else {
        return;
    };
    for device in devices.flatten() {
        let backing = std::fs::read_to_string(device.path().join("loop/backing_file")).unwrap_or_default();
        if !backing.is_empty() && Path::new(backing.trim_end().trim_end_matches(" (deleted)")).starts_with(dir) {
            let _ = Command::new("losetup")
                .arg("-d")
                .arg(Path::new("/dev").join(device.file_name()))
                .status();
        }
    }
}
