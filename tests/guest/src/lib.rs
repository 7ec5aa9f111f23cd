//! What the tests share with the drivers of the test VMs, which run inside
//! them: `ebs-csi-vm-guest` (the NVMe VM, `tests/tests/nvme_vm.rs`) and
//! `ebs-csi-vm-systemd` (the systemd VMs, `tests/tests/systemd_vm.rs`).
//! kubelet's paths and records, helper requests, a CSI channel over a unix
//! socket, the VMs' identity and console reports, watching the helper's
//! tools. A package of its own so that the release builds of the VMs'
//! drivers (`make static`, in three copies on a new machine) compile this
//! and the node's crates, not every test's support and the AWS SDK the
//! controller's tests drive (docs/testing.md).
#![allow(
    clippy::expect_used,
    reason = "test support: a failed set-up step should stop the test"
)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ebs_csi_helper_proto::{FormatOptions, FsType, PublishRequest, PublishSource, Request, StageRequest, VolumeId};
use sha2::Digest;
use tonic::transport::{Channel, Endpoint};

pub mod children;
pub mod exec_gate;
pub mod guest;

/// The unprivileged uid the agent runs as in tests (`nobody`).
pub const AGENT_UID: u32 = 65534;

/// Waits until `condition` holds, polling every 10 ms, or panics after
/// `deadline` with `what`.
pub fn wait_until(what: &str, deadline: Duration, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The directory kubelet stages the CSI volume `volume_id` beneath: its
/// SHA-256 in hex (`pkg/volume/csi/csi_attacher.go`, `MakeDeviceMountPath`).
pub fn kubelet_staging_hash(volume_id: &str) -> String {
    sha256_hex(volume_id)
}

/// The SHA-256 of `text` in lowercase hex, as kubelet names what it makes
/// for a volume (Go's `%x` of `sha256.Sum256`).
pub fn sha256_hex(text: &str) -> String {
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// kubelet's staging path of the volume `volume_id` beneath its root
/// `kubelet`, made as kubelet makes it before NodeStageVolume (kubernetes
/// `pkg/volume/csi/csi_attacher.go`, `MountDevice`): an empty directory
/// `plugins/kubernetes.io/csi/ebs.csi.aws.com/<sha256 of the volume
/// handle>/globalmount` (`MakeDeviceMountPath`) and kubelet's record of
/// the volume beside it ([`write_kubelet_record`]).
pub fn kubelet_staging(kubelet: &Path, volume_id: &str) -> PathBuf {
    let hash = kubelet_staging_hash(volume_id);
    let dir = make_dir(&kubelet.join(format!("plugins/kubernetes.io/csi/ebs.csi.aws.com/{hash}")));
    write_kubelet_record(&dir, volume_id);
    make_dir(&dir.join("globalmount"))
}

/// kubelet's target path of the volume `volume_id` as the PV `pv` in pod
/// `pod` beneath its root `kubelet`, made as kubelet makes it before
/// NodePublishVolume (`csi_mounter.go`, `SetUpAt`): the directory
/// `pods/<pod>/volumes/kubernetes.io~csi/<pv>` with kubelet's record of the
/// volume in it; the target, `mount` in it, is the plugin's to create.
pub fn kubelet_target(kubelet: &Path, pod: &str, pv: &str, volume_id: &str) -> PathBuf {
    let dir = make_dir(&kubelet.join(format!("pods/{pod}/volumes/kubernetes.io~csi/{pv}")));
    write_kubelet_record(&dir, volume_id);
    dir.join("mount")
}

/// kubelet's raw block target of the volume `volume_id` as the PV `pv` in
/// pod `pod` beneath its root `kubelet`, made as kubelet makes it
/// (`csi_block.go`, `SetUpDevice` and `publishVolumeForBlock`): its record
/// of the volume in `plugins/kubernetes.io/csi/volumeDevices/<pv>/data`,
/// the directory `volumeDevices/publish/<pv>`; the target, `<pod>` in it,
/// is the plugin's to create.
pub fn kubelet_block_target(kubelet: &Path, pod: &str, pv: &str, volume_id: &str) -> PathBuf {
    let devices = kubelet.join("plugins/kubernetes.io/csi/volumeDevices");
    write_kubelet_record(&make_dir(&devices.join(pv).join("data")), volume_id);
    make_dir(&devices.join("publish").join(pv)).join(pod)
}

/// Writes kubelet's record of the volume `volume_id` of this driver,
/// `vol_data.json`, into `dir`, as kubelet writes it (kubernetes
/// `pkg/volume/csi/csi_util.go`, `saveVolumeData`: a JSON object of
/// strings, root's, mode 0644); the helper publishes and stages only
/// where it names the volume.
pub fn write_kubelet_record(dir: &Path, volume_id: &str) {
    let record = format!(
        r#"{{"driverName":"ebs.csi.aws.com","volumeHandle":"{volume_id}","specVolID":"pv-{volume_id}","volumeLifecycleMode":"Persistent"}}"#
    );
    let path = dir.join("vol_data.json");
    std::fs::write(&path, record).expect("vol_data.json");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
}

/// Creates `path` (and parents), mode 0755, and returns it.
pub fn make_dir(path: &Path) -> PathBuf {
    std::fs::create_dir_all(path).expect("mkdir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path.to_owned()
}

/// Whether `path` is ready: it exists and, when it is a unix socket, its
/// server (process `server`) listens on it. A socket's file appears at
/// `bind(2)`, before `listen(2)`; a client connecting in between is
/// refused, so existence alone is not readiness. A listening socket is
/// listed in the `net/unix` table of its network namespace (unix(7)) with
/// the `__SO_ACCEPTCON` flag, 0x10000; the server's own
/// `/proc/<pid>/net/unix` is that namespace's (a server may run in another,
/// as under `unshare --net`). The helper's socket must also have its owner
/// and mode by then, or a peer of another uid is refused (`EACCES`).
pub fn is_ready(path: &Path, server: u32) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        return false;
    };
    if !metadata.file_type().is_socket() {
        return true;
    }
    // The table lists the name a socket was bound at: the helper binds at
    // `<path>.binding` and renames the socket to `path` once it has its
    // owner and mode, so `path` exists only then.
    let names = [path.to_path_buf(), path.with_extension("binding")];
    std::fs::read_to_string(format!("/proc/{server}/net/unix"))
        .unwrap_or_default()
        .lines()
        .any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let name = fields.get(7).map(Path::new);
            name.is_some_and(|n| names.iter().any(|m| m == n)) && fields.get(3) == Some(&"00010000")
        })
}

/// A helper Stage request: `device` as `volume_id` onto `staging`, with
/// `mount_flags` and default format options. Panics on a malformed
/// volume id (the helper's own parsing is tested on the wire).
pub fn stage_request(volume_id: &str, device: &Path, staging: &Path, fs_type: FsType, mount_flags: &[&str]) -> Request {
    Request::Stage(StageRequest {
        volume_id: VolumeId::parse(volume_id).expect("volume id"),
        device: device.to_string_lossy().into_owned(),
        staging_path: staging.to_string_lossy().into_owned(),
        fs_type,
        mount_flags: mount_flags.iter().map(|f| (*f).to_owned()).collect(),
        format: FormatOptions::default(),
    })
}

/// A helper Publish request of the filesystem `volume_id` has staged (on
/// `device`) at `staging`, onto `target`, read-write.
pub fn publish_staged(volume_id: &str, device: &Path, staging: &Path, target: &Path) -> Request {
    Request::Publish(PublishRequest {
        target_path: target.to_string_lossy().into_owned(),
        readonly: false,
        source: PublishSource::Staging {
            volume_id: VolumeId::parse(volume_id).expect("volume id"),
            device: device.to_string_lossy().into_owned(),
            staging_path: staging.to_string_lossy().into_owned(),
            mount_flags: vec![],
        },
    })
}

/// A helper Publish request of `device` as the raw block volume
/// `volume_id` onto `target`, read-write.
pub fn publish_device(volume_id: &str, device: &Path, target: &Path) -> Request {
    Request::Publish(PublishRequest {
        target_path: target.to_string_lossy().into_owned(),
        readonly: false,
        source: PublishSource::Device {
            volume_id: VolumeId::parse(volume_id).expect("volume id"),
            device: device.to_string_lossy().into_owned(),
        },
    })
}

/// Runs `f` on a thread whose uid and gid are switched to `id` (Linux
/// credentials are per thread at the syscall level), then returns its
/// result.
pub fn run_as<T: Send + 'static>(id: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let gid = rustix::process::Gid::from_raw(id);
        rustix::thread::set_thread_res_gid(gid, gid, gid).expect("setresgid");
        let uid = rustix::process::Uid::from_raw(id);
        rustix::thread::set_thread_res_uid(uid, uid, uid).expect("setresuid");
        f()
    })
    .join()
    .expect("thread")
}

/// A gRPC channel over a unix socket.
pub async fn channel(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    Endpoint::try_from("http://[::]:50051")
        .expect("endpoint")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .expect("connect")
}

/// Runs a command and asserts it succeeds; returns stdout.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
