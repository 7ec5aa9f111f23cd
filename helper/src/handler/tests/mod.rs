//! The requests over the fake kernel ([`fake`]), as a normal user: every
//! branch of every request, each refusal with its exact error and no
//! action recorded, and an error injected at every step of a request that
//! leaves nothing half done (`failures`).
//!
//! What these tests assume of their world, and where each assumption is
//! broken: the kernel answers as the fake does — the loop-device suites
//! (`tests/tests/helper_*.rs`, as root) run the same requests against
//! [`crate::kernel::Linux`]; paths are real directories in a temporary
//! directory, with kubelet's shapes (Nomad's where a test says so).

mod binding;
mod expand;
mod failures;
mod fake;
mod publish;
mod stage;
mod stats;
mod unpublish;
mod unstage;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ebs_csi_helper_proto::{
    FormatOptions, FsType, HelperError, PublishRequest, PublishSource, Reply, Request, StageRequest, VolumeId,
};

use self::fake::Fake;
use super::Handler;
use crate::claim::DeviceNumber;
use crate::device::{self, Refusal};
use crate::format::Contents;
use crate::layout::Layout;
use crate::path::AllowedRoots;
use crate::record;

/// The volume every test stages.
const VOLUME: &str = "vol-0123456789abcdef0";
/// Its device, and that device's number.
const DEVICE: &str = "/dev/nvme1n1";
const NUMBER: DeviceNumber = (259, 1);
/// Another volume's device.
const OTHER_DEVICE: &str = "/dev/nvme2n1";
const OTHER_VOLUME: &str = "vol-0fedcba9876543210";
/// Its size, in bytes.
const SIZE: u64 = 1 << 30;
/// The helper's `--max-mounts` by default.
const MAX_MOUNTS: u32 = 4096;

/// A kubelet directory beneath a temporary directory, a helper serving it
/// over the fake, and the volume's device, blank.
struct World {
    _dir: tempfile::TempDir,
    root: PathBuf,
    fake: Arc<Fake>,
    handler: Handler,
}

impl World {
    /// The world in kubelet's layout, with what kubelet makes before it
    /// asks to stage or publish.
    fn new() -> Self {
        Self::limited(MAX_MOUNTS)
    }

    /// [`World::new`] with a helper that makes no mount once `max_mounts`
    /// mount points hold volumes.
    fn limited(max_mounts: u32) -> Self {
        let world = Self::empty(Layout::Kubelet, max_mounts);
        // What kubelet makes before it asks to stage or publish: the
        // staging directory, the targets' parents, its record of the volume
        // beside each (`crate::record`).
        std::fs::create_dir_all(world.staging()).unwrap();
        for record_dir in [
            format!(
                "plugins/kubernetes.io/csi/ebs.csi.aws.com/{}",
                record::sha256_hex(VOLUME)
            ),
            "pods/pod-1/volumes/kubernetes.io~csi/pv-1".to_owned(),
            "plugins/kubernetes.io/csi/volumeDevices/pv-1/data".to_owned(),
        ] {
            world.write_record(&record_dir, "ebs.csi.aws.com", VOLUME);
        }
        std::fs::create_dir_all(world.path("plugins/kubernetes.io/csi/volumeDevices/publish/pv-1")).unwrap();
        world
    }

    /// An empty root directory of `layout`'s paths.
    fn with_layout(layout: Layout) -> Self {
        Self::empty(layout, MAX_MOUNTS)
    }

    fn empty(layout: Layout, max_mounts: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap().join("kubelet");
        std::fs::create_dir(&root).unwrap();
        let fake = Fake::new();
        fake.add_device("nvme1n1", NUMBER, &volume(), SIZE, Contents::Blank);
        fake.add_device(
            "nvme2n1",
            (259, 2),
            &VolumeId::parse(OTHER_VOLUME).unwrap(),
            SIZE,
            Contents::Blank,
        );
        let roots = AllowedRoots::open(std::slice::from_ref(&root), layout).unwrap();
        let handler = Handler::new(roots, max_mounts, Box::new(Arc::clone(&fake)));
        Self {
            _dir: dir,
            root,
            fake,
            handler,
        }
    }

    /// Writes kubelet's record of `volume` of `driver` into `dir` beneath
    /// the kubelet directory (made if missing), as kubelet writes it.
    fn write_record(&self, dir: &str, driver: &str, volume: &str) {
        let dir = self.root.join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        let record = format!(r#"{{"driverName":"{driver}","volumeHandle":"{volume}","specVolID":"pv-1"}}"#);
        std::fs::write(dir.join(crate::layout::RECORD), record).unwrap();
    }

    /// A world whose volume is staged at [`World::staging`] (and the fake's
    /// record cleared of it).
    fn staged() -> Self {
        let world = Self::new();
        world.handle(Request::Stage(world.stage_request())).unwrap();
        world.fake.forget();
        world
    }

    /// Kubelet's staging path of the volume (created by [`World::new`]).
    fn staging(&self) -> String {
        self.path(&format!(
            "plugins/kubernetes.io/csi/ebs.csi.aws.com/{}/globalmount",
            record::sha256_hex(VOLUME)
        ))
    }

    /// Kubelet's target path of the volume in a pod (its parent created by
    /// [`World::new`], itself not).
    fn target(&self) -> String {
        self.path("pods/pod-1/volumes/kubernetes.io~csi/pv-1/mount")
    }

    /// Kubelet's target path of the volume as a raw block device (its
    /// parent created by [`World::new`], itself not).
    fn block_target(&self) -> String {
        self.path("plugins/kubernetes.io/csi/volumeDevices/publish/pv-1/pod-1")
    }

    fn path(&self, below: &str) -> String {
        self.root.join(below).to_str().unwrap().to_owned()
    }

    fn stage_request(&self) -> StageRequest {
        StageRequest {
            volume_id: volume(),
            device: DEVICE.to_owned(),
            staging_path: self.staging(),
            fs_type: FsType::Ext4,
            mount_flags: Vec::new(),
            format: FormatOptions::default(),
        }
    }

    fn publish_request(&self, readonly: bool) -> PublishRequest {
        PublishRequest {
            target_path: self.target(),
            readonly,
            source: PublishSource::Staging {
                volume_id: volume(),
                device: DEVICE.to_owned(),
                staging_path: self.staging(),
                mount_flags: Vec::new(),
            },
        }
    }

    fn block_publish_request(&self) -> PublishRequest {
        PublishRequest {
            target_path: self.block_target(),
            readonly: false,
            source: PublishSource::Device {
                volume_id: volume(),
                device: DEVICE.to_owned(),
            },
        }
    }

    fn handle(&self, request: Request) -> Result<Reply, HelperError> {
        self.handler.handle(&request)
    }

    /// Everything beneath the kubelet directory (path → kind and size) and
    /// what the fake has mounted there, paths relative to the directory.
    fn snapshot(&self) -> Snapshot {
        let mut files = BTreeMap::new();
        walk(&self.root, &self.root, &mut files);
        let prefix = format!("{}/", self.root.to_str().unwrap());
        let mounts = self.fake.mounted().into_iter();
        let mounts = mounts.map(|(point, fs, options)| (point.replace(&prefix, ""), fs, options));
        Snapshot {
            files,
            mounts: mounts.collect(),
        }
    }

    /// Handles `request`, asserts it answers `expected` and that nothing
    /// changed: no action, the same files, the same mounts.
    fn refused(&self, request: Request, expected: &HelperError) {
        let (before, actions) = (self.snapshot(), self.fake.actions());
        assert_eq!(self.handle(request.clone()).as_ref(), Err(expected), "{request:?}");
        assert_eq!(self.fake.actions(), actions, "{request:?} acted");
        assert_eq!(self.snapshot(), before, "{request:?} changed something");
    }
}

/// The files and mounts beneath the kubelet directory.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Snapshot {
    files: BTreeMap<PathBuf, String>,
    mounts: Vec<(String, String, String)>,
}

#[test]
fn ping_answers_the_protocol_version() {
    let world = World::new();
    let pong = ebs_csi_helper_proto::Reply::Pong {
        version: ebs_csi_helper_proto::PROTOCOL_VERSION,
    };
    assert_eq!(world.handle(Request::Ping), Ok(pong));
    assert_eq!(world.fake.calls(), std::collections::HashMap::new());
}

fn walk(root: &Path, dir: &Path, files: &mut BTreeMap<PathBuf, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let kind = if meta.is_dir() {
            "directory".to_owned()
        } else {
            format!("{:?} of {} bytes", meta.file_type(), meta.len())
        };
        files.insert(path.strip_prefix(root).unwrap().to_owned(), kind);
        if meta.is_dir() {
            walk(root, &path, files);
        }
    }
}

fn volume() -> VolumeId {
    VolumeId::parse(VOLUME).unwrap()
}

fn device_refused(device: &str, reason: Refusal) -> HelperError {
    device::refused(device, &volume(), reason)
}
