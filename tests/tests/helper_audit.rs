//! The hostile cases of the helper audit (shared/reviews/helper-audit.md,
//! §4 T1–T19), each against the real helper over loop devices: every
//! refusal is the exact `HelperError`, and nothing changed afterwards (the
//! mount table, the volumes' first and last MiB, the files around).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ebs_csi_helper::device::Refusal;
use ebs_csi_helper::error::{CROSSES_MOUNT, FOREIGN_MOUNT, NOT_A_MOUNT_POINT, NOT_ITS_SHAPE, OTHER_VOLUMES_HASH};
use ebs_csi_helper::exec::Tool;
use ebs_csi_helper_client::{ClientError, read_response};
use ebs_csi_helper_proto::{
    ExpandRequest, FsType, HelperError, PROTOCOL_VERSION, Reply, Request, Response, UnpublishRequest, UnstageRequest,
    VolumeId, write_frame,
};
use ebs_csi_tests::children::exited;
use ebs_csi_tests::exec_gate::{ExecGate, MKFS};
use ebs_csi_tests::run;
use ebs_csi_tests::{
    AGENT_UID, Helper, LoopVolume, SLAVE_NAMESPACE, Sandbox, binary, ebs_csi_mounts, is_mounted, is_the_hosts,
    mounts_under, publish_device, publish_staged, require_root, run_as, spawn, stage_request, wait_until,
};
use rustix::process::{Pid, Signal, kill_process};

const A: &str = "vol-0aaaaaaaaaaaaaaa1";
const B: &str = "vol-0bbbbbbbbbbbbbbb2";

/// What must not change: this sandbox's mounts, PID 1's mount points, and
/// the ends and signature of each volume.
struct Unchanged<'a> {
    sandbox: &'a Path,
    mounts: Vec<String>,
    host: Vec<String>,
    volumes: Vec<(&'a LoopVolume, Vec<u8>, String)>,
}

impl<'a> Unchanged<'a> {
    fn record(sandbox: &'a Sandbox, volumes: &[&'a LoopVolume]) -> Self {
        Self {
            sandbox: sandbox.path(),
            mounts: mounts_under(sandbox.path()),
            host: host_mounts(),
            volumes: volumes.iter().map(|v| (*v, v.ends(), v.signature())).collect(),
        }
    }

    fn assert(&self, what: &str) {
        assert_eq!(
            mounts_under(self.sandbox),
            self.mounts,
            "{what}: the sandbox's mounts changed"
        );
        assert_eq!(host_mounts(), self.host, "{what}: PID 1's mount table changed");
        for (volume, ends, signature) in &self.volumes {
            assert_eq!(
                &volume.signature(),
                signature,
                "{what}: {} changed its signature",
                volume.volume_id
            );
            assert!(&volume.ends() == ends, "{what}: {} was written to", volume.volume_id);
        }
    }
}

/// PID 1's mount points.
fn pid1_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/1/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .collect()
}

/// PID 1's mount points that are the host's ([`is_the_hosts`]).
fn host_mounts() -> Vec<String> {
    let mut mounts = pid1_mounts();
    mounts.retain(|m| is_the_hosts(m));
    mounts
}

fn device_refused(device: &str, volume: &str, reason: Refusal) -> HelperError {
    HelperError::DeviceRefused {
        device: device.to_owned(),
        volume_id: volume.to_owned(),
        reason: reason.to_string(),
    }
}

fn path_refused(path: &Path, reason: &str) -> HelperError {
    HelperError::PathRefused {
        path: path.to_string_lossy().into_owned(),
        reason: reason.to_owned(),
    }
}

/// Sends `request` and asserts it is refused with exactly `expected`.
fn expect_refused(helper: &Helper, request: Request, expected: &HelperError) {
    match helper.call(request.clone()) {
        Err(ClientError::Helper(e)) => assert_eq!(&e, expected, "{request:?}"),
        other => panic!("{request:?}: expected {expected}, got {other:?}"),
    }
}

fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

fn stage(volume: &str, device: &Path, staging: &Path) -> Request {
    stage_request(volume, device, staging, FsType::Ext4, &[])
}

fn unpublish(target: &Path) -> Request {
    Request::Unpublish(UnpublishRequest {
        target_path: text(target),
    })
}

fn mount_tmpfs(path: &Path) {
    std::fs::create_dir_all(path).unwrap();
    run("mount", &["-t", "tmpfs", "tmpfs", &text(path)]);
}

/// Nodes this test makes directly in `/dev` under names the helper would
/// accept (`nvme9XnY`, `loop9XXXX`: no such devices here), removed on drop.
struct DevNodes(Vec<PathBuf>);

impl DevNodes {
    fn path(&mut self, name: &str) -> PathBuf {
        let path = Path::new("/dev").join(name);
        let _ = std::fs::remove_file(&path);
        self.0.push(path.clone());
        path
    }
}

impl Drop for DevNodes {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// T2, T3, T19: a device named by a symlink, however it flips, is refused
/// before anything opens it: a path that is not `/dev/<kernel name>` by its
/// form, a symlink carrying a kernel name as not a block device node, with
/// the same answer as a missing node or one pointing at a host file.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn symlinked_devices_are_refused_whatever_they_point_to() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let a = LoopVolume::create(sandbox.path(), A, 64);
    let b = LoopVolume::create(sandbox.path(), B, 64);
    run("mkfs.ext4", &["-q", &text(&b.device)]);
    let staging = sandbox.staging(B);
    let block_target = sandbox.block_target("pod-b", B, B);
    let unchanged = Unchanged::record(&sandbox, &[&a, &b]);
    let shm = sandbox.mkdir("shm-links");
    let mut nodes = DevNodes(Vec::new());
    let (kernel_named, missing, to_shadow) = (
        nodes.path("loop98761"),
        nodes.path("loop98762"),
        nodes.path("loop98763"),
    );
    std::os::unix::fs::symlink(&b.device, &kernel_named).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", &to_shadow).unwrap();
    std::os::unix::fs::symlink(&a.device, shm.join("l1")).unwrap();
    std::os::unix::fs::symlink(&b.device, shm.join("l2")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = std::thread::spawn({
        let (shm, stop) = (shm.clone(), stop.clone());
        move || {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (l1, l2) = (shm.join("l1"), shm.join("l2"));
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    &l1,
                    rustix::fs::CWD,
                    &l2,
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps += 1;
            }
            swaps
        }
    });
    let staging_a = sandbox.staging(A);
    for _ in 0..200 {
        let link = shm.join("l1");
        expect_refused(
            &helper,
            stage(A, &link, &staging_a),
            &device_refused(&text(&link), A, Refusal::NotKernelName),
        );
        assert!(!is_mounted(&staging_a), "a symlinked device was mounted");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        swapper.join().unwrap() > 200,
        "the links did not flip while the requests ran"
    );
    for device in [&kernel_named, &missing, &to_shadow] {
        let expected = device_refused(&text(device), B, Refusal::NotBlockDevice);
        expect_refused(&helper, stage(B, device, &staging), &expected);
        expect_refused(&helper, publish_device(B, device, &block_target), &expected);
    }
    unchanged.assert("symlinked devices");
    assert!(!block_target.exists());
}

/// T1 and T20 on loop devices: a format is queued behind a frozen `mkfs`;
/// meanwhile the device's name is made to point at another volume's device
/// number (what a hot-unplug and re-attach under the same name does). When
/// the queued format's turn comes, the re-verification right before the
/// exec refuses it, and neither volume is written.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_device_renamed_while_its_format_waits_is_never_formatted() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &["--max-parallel-formats", "1"]);
    let blocker = LoopVolume::create(sandbox.path(), "vol-0ccccccccccccccc3", 512);
    let a = LoopVolume::create(sandbox.path(), A, 64);
    let b = LoopVolume::create(sandbox.path(), B, 64);
    std::fs::write(&b.file, vec![0x5a; 64 << 20]).unwrap();
    let mut nodes = DevNodes(Vec::new());
    let moved_aside = nodes.path(&format!("{}-aside", a.device.file_name().unwrap().to_string_lossy()));
    let (staging_blocker, staging_a) = (sandbox.staging("vol-0ccccccccccccccc3"), sandbox.staging(A));
    let unchanged = Unchanged::record(&sandbox, &[&a, &b]);
    let (stage_blocker, stage_a) = (
        stage("vol-0ccccccccccccccc3", &blocker.device, &staging_blocker),
        stage(A, &a.device, &staging_a),
    );
    let gate = ExecGate::watch(helper.process.pid(), &MKFS);
    std::thread::scope(|scope| {
        let first = scope.spawn(|| helper.call(stage_blocker));
        let mkfs = Pid::from_raw(i32::try_from(gate.caught(Duration::from_secs(20))).unwrap()).unwrap();
        let queued = scope.spawn(|| helper.call(stage_a));
        // The queued Stage has passed its checks once it waits for the
        // formatter: its device is claimed, which an Expand (harmless
        // either way: nothing is mounted) is told.
        let probe = Request::Expand(ExpandRequest {
            volume_id: VolumeId::parse(A).unwrap(),
            device: text(&a.device),
            volume_path: text(&staging_a),
        });
        wait_until("the format of A to queue", Duration::from_secs(20), || {
            matches!(
                helper.call(probe.clone()),
                Err(ClientError::Helper(HelperError::InProgress { .. }))
            )
        });
        std::fs::rename(&a.device, &moved_aside).unwrap();
        let st = rustix::fs::stat(&b.device).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &a.device,
            rustix::fs::FileType::BlockDevice,
            rustix::fs::Mode::from_raw_mode(0o600),
            st.st_rdev,
        )
        .unwrap();
        kill_process(mkfs, Signal::CONT).unwrap();
        let refused = queued.join().unwrap();
        std::fs::rename(&moved_aside, &a.device).unwrap();
        assert_eq!(first.join().unwrap().unwrap(), Reply::Done);
        match refused {
            Err(ClientError::Helper(e)) => assert_eq!(e, device_refused(&text(&a.device), A, Refusal::Changed)),
            other => panic!("the renamed device's format went on: {other:?}"),
        }
    });
    assert!(!is_mounted(&staging_a));
    let unstage = Request::Unstage(UnstageRequest {
        staging_path: text(&staging_blocker),
    });
    assert_eq!(helper.call(unstage).unwrap(), Reply::Done);
    unchanged.assert("a renamed device");
}

/// T5: Unpublish removes only an empty mount point the helper could have
/// made; files, sockets and other pods' data stay.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn unpublish_removes_only_empty_mount_points() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let kubelet = sandbox.kubelet();
    // Each at a path of a target's shape, so that the checks beyond the
    // shape are what refuses it.
    let notes = sandbox.target("p1", "pv-notes", A);
    std::fs::write(&notes, "a pod's file").unwrap();
    let socket_path = sandbox.block_target("p1", "pv-socket", A);
    let _listener = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    let agents_empty = sandbox.target("p1", "pv-agent", A);
    std::fs::write(&agents_empty, "").unwrap();
    std::os::unix::fs::chown(&agents_empty, Some(AGENT_UID), Some(AGENT_UID)).unwrap();
    let volume = sandbox.target("p2", "pv-tmpfs", A);
    mount_tmpfs(&volume);
    std::fs::write(volume.join("data.db"), "another pod's data").unwrap();
    let p3_volumes = kubelet.join("pods/p3/volumes");
    mount_tmpfs(&p3_volumes);
    let through_a_mount = p3_volumes.join("kubernetes.io~csi/pv/mount");
    std::fs::create_dir_all(&through_a_mount).unwrap();
    let unchanged = Unchanged::record(&sandbox, &[]);
    for (target, reason) in [
        (notes.clone(), NOT_A_MOUNT_POINT),
        (socket_path.clone(), NOT_A_MOUNT_POINT),
        (agents_empty.clone(), NOT_A_MOUNT_POINT),
        (through_a_mount.clone(), CROSSES_MOUNT),
        (volume.join("data.db"), NOT_ITS_SHAPE),
        (kubelet.join("config.yaml"), NOT_ITS_SHAPE),
    ] {
        expect_refused(&helper, unpublish(&target), &path_refused(&target, reason));
    }
    expect_refused(&helper, unpublish(&volume), &path_refused(&volume, FOREIGN_MOUNT));
    unchanged.assert("unpublish of what is not a mount");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "a pod's file");
    assert!(socket_path.exists() && agents_empty.exists() && through_a_mount.exists());
    assert_eq!(
        std::fs::read_to_string(volume.join("data.db")).unwrap(),
        "another pod's data"
    );
    let leftover = sandbox.target("p1", "pv", A);
    ebs_csi_tests::make_dir(&leftover);
    assert_eq!(helper.call(unpublish(&leftover)).unwrap(), Reply::Done);
    assert!(!leftover.exists(), "an empty mount point the helper made stays behind");
}

/// T6, T7: Publish binds only the named volume's staged filesystem, and no
/// path leads through another mount.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn publish_binds_only_the_volumes_staged_filesystem() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let a = LoopVolume::create(sandbox.path(), A, 64);
    let b = LoopVolume::create(sandbox.path(), B, 64);
    let kubelet = sandbox.kubelet();
    let secret = kubelet.join("pods/victim/volumes/kubernetes.io~secret/s");
    mount_tmpfs(&secret);
    std::fs::write(secret.join("token"), "victim's token").unwrap();
    // Another driver's volume, staged where kubelet staged every driver's
    // before Kubernetes 1.24 (a shape the helper no longer accepts: A10).
    let foreign = kubelet.join("plugins/kubernetes.io/csi/pv/pv-other/globalmount");
    mount_tmpfs(&foreign);
    std::fs::write(foreign.join("data"), "another driver's volume").unwrap();
    let staging_b = sandbox.staging(B);
    assert_eq!(helper.call(stage(B, &b.device, &staging_b)).unwrap(), Reply::Done);
    // Mounts a path of every shape would cross on its way.
    let other_pod = kubelet.join("pods/p2");
    mount_tmpfs(&other_pod);
    let other_target = other_pod.join("volumes/kubernetes.io~csi/pv/mount");
    std::fs::create_dir_all(&other_target).unwrap();
    std::fs::write(other_target.join("file"), "p2's file").unwrap();
    let other_devices = kubelet.join("plugins/kubernetes.io/csi/volumeDevices/publish/pv-2");
    mount_tmpfs(&other_devices);
    let devices_data = kubelet.join("plugins/kubernetes.io/csi/volumeDevices/pv-2/data");
    ebs_csi_tests::write_kubelet_record(&ebs_csi_tests::make_dir(&devices_data), A);
    let other_staging = ebs_csi_tests::kubelet_staging(&kubelet, A);
    let other_staging = other_staging.parent().unwrap().to_owned();
    mount_tmpfs(&other_staging);
    std::fs::create_dir(other_staging.join("globalmount")).unwrap();
    // B is mounted: ext4's lazy inode-table initialisation writes to it on
    // its own, so only the blank A's bytes are compared.
    let unchanged = Unchanged::record(&sandbox, &[&a]);
    let leak = sandbox.target("p-leak", "pv-leak", A);
    expect_refused(
        &helper,
        publish_staged(A, &a.device, &secret, &leak),
        &path_refused(&secret, NOT_ITS_SHAPE),
    );
    for (staging, refusal) in [
        (&foreign, path_refused(&foreign, NOT_ITS_SHAPE)),
        (&staging_b, path_refused(&staging_b, OTHER_VOLUMES_HASH)),
    ] {
        expect_refused(&helper, publish_staged(A, &a.device, staging, &leak), &refusal);
    }
    let cases = [
        (
            publish_device(A, &a.device, &other_devices.join("p2")),
            other_devices.join("p2"),
        ),
        (
            stage(A, &a.device, &other_staging.join("globalmount")),
            other_staging.join("globalmount"),
        ),
        (unpublish(&other_target), other_target.clone()),
    ];
    for (request, path) in cases {
        expect_refused(&helper, request, &path_refused(&path, CROSSES_MOUNT));
    }
    unchanged.assert("binds of what is not the volume");
    assert!(!leak.exists() && !other_devices.join("p2").exists());
    assert_eq!(std::fs::read_to_string(other_target.join("file")).unwrap(), "p2's file");
    let target = sandbox.target("p1", "pv", B);
    assert_eq!(
        helper.call(publish_staged(B, &b.device, &staging_b, &target)).unwrap(),
        Reply::Done
    );
    assert!(is_mounted(&target));
    assert_eq!(helper.call(unpublish(&target)).unwrap(), Reply::Done);
    let unstage = |path: &Path| {
        Request::Unstage(UnstageRequest {
            staging_path: text(path),
        })
    };
    assert_eq!(helper.call(unstage(&staging_b)).unwrap(), Reply::Done);
    expect_refused(&helper, unstage(&foreign), &path_refused(&foreign, NOT_ITS_SHAPE));
    expect_refused(&helper, unstage(&secret), &path_refused(&secret, NOT_ITS_SHAPE));
    assert!(
        is_mounted(&secret) && is_mounted(&foreign),
        "another pod's secret or another driver's volume was unmounted"
    );
}

/// T8, T19: nodes that are not block devices, under names the helper
/// accepts, are refused from their type alone, at once: a FIFO never
/// blocks the helper, a tty never becomes its terminal.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn fifos_and_ttys_are_refused_without_being_opened() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let staging = sandbox.staging(A);
    let mut nodes = DevNodes(Vec::new());
    let (fifo, tty) = (nodes.path("nvme97n1"), nodes.path("nvme96n1"));
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let ttys0 = rustix::fs::makedev(4, 64);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &tty,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o600),
        ttys0,
    )
    .unwrap();
    std::thread::scope(|scope| {
        let staged = scope.spawn(|| helper.call(stage(A, &fifo, &staging)));
        let missing = sandbox.target("p-missing", "pv", A);
        assert_eq!(
            helper.call(unpublish(&missing)).unwrap(),
            Reply::Done,
            "a FIFO stalled the helper"
        );
        match staged.join().unwrap() {
            Err(ClientError::Helper(e)) => assert_eq!(e, device_refused(&text(&fifo), A, Refusal::NotBlockDevice)),
            other => panic!("{other:?}"),
        }
    });
    expect_refused(
        &helper,
        stage(A, &tty, &staging),
        &device_refused(&text(&tty), A, Refusal::NotBlockDevice),
    );
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", helper.process.pid())).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    assert_eq!(
        after_comm.split(' ').nth(4),
        Some("0"),
        "the helper acquired a controlling terminal"
    );
    assert!(!is_mounted(&staging));
}

/// T12, T13, T14: a raw block volume in use is never staged (formatted), a
/// staged volume is never published raw, and a disk mounted at an allowed
/// root itself is the host's.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn devices_in_use_are_neither_staged_nor_published_raw() {
    require_root();
    let sandbox = Sandbox::new();
    let host_disk = LoopVolume::create(sandbox.path(), "vol-0ddddddddddddddd4", 64);
    run("mkfs.ext4", &["-q", &text(&host_disk.device)]);
    let host_root = sandbox.mkdir("host-root");
    run("mount", &[&text(&host_disk.device), &text(&host_root)]);
    let helper = Helper::start(&sandbox, &["--allowed-root", &text(&host_root)]);
    let raw = LoopVolume::create(sandbox.path(), A, 64);
    let staged = LoopVolume::create(sandbox.path(), B, 64);
    let block_target = sandbox.block_target("a", A, A);
    assert_eq!(
        helper.call(publish_device(A, &raw.device, &block_target)).unwrap(),
        Reply::Done
    );
    let pattern = ebs_csi_tests::data_pattern(1 << 20);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&block_target)
        .unwrap()
        .write_all(&pattern)
        .unwrap();
    let staging = sandbox.staging(B);
    assert_eq!(helper.call(stage(B, &staged.device, &staging)).unwrap(), Reply::Done);
    // The mounted disks change on their own (ext4 lazy init): their
    // signatures are compared, the raw volume's bytes.
    let unchanged = Unchanged::record(&sandbox, &[&raw]);
    let signatures = (staged.signature(), host_disk.signature());
    let raw_staging = sandbox.staging(A);
    expect_refused(
        &helper,
        stage(A, &raw.device, &raw_staging),
        &device_refused(&text(&raw.device), A, Refusal::PublishedRaw),
    );
    expect_refused(
        &helper,
        publish_device(B, &staged.device, &sandbox.block_target("b", B, B)),
        &device_refused(&text(&staged.device), B, Refusal::FilesystemMounted),
    );
    expect_refused(
        &helper,
        publish_device("vol-0ddddddddddddddd4", &host_disk.device, &host_root.join("x")),
        &device_refused(
            &text(&host_disk.device),
            "vol-0ddddddddddddddd4",
            Refusal::MountedOutside,
        ),
    );
    unchanged.assert("devices in use");
    assert_eq!((staged.signature(), host_disk.signature()), signatures);
    let mut written = vec![0u8; 1 << 20];
    std::fs::File::open(&raw.device)
        .unwrap()
        .read_exact(&mut written)
        .unwrap();
    assert!(written == pattern, "the raw volume's data changed");
    assert!(!sandbox.block_target("b", B, B).exists() && !host_root.join("x").exists());
    assert_eq!(helper.call(unpublish(&block_target)).unwrap(), Reply::Done);
}

/// T14, second half: a helper in a mount namespace of its own (as in a
/// container; its copy of the sandbox private, so that the host's mounts
/// there do not reach it) still sees a disk mounted only in the host's
/// (PID 1's), and refuses it.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_disk_mounted_only_in_the_hosts_namespace_is_in_use() {
    require_root();
    let sandbox = Sandbox::new();
    let socket = sandbox.path().join("helper/helper.sock");
    let mut command = std::process::Command::new("unshare");
    command
        .args(SLAVE_NAMESPACE)
        .args(["sh", "-c", "mount --make-private \"$0\" && exec \"$@\""])
        .arg(sandbox.path())
        .arg(binary("ebs-csi-helper"))
        .args(Helper::args(sandbox.path(), &socket));
    let helper = Helper {
        process: spawn("helper", command, sandbox.path().join("helper.log"), &socket),
        socket,
    };
    let disk = LoopVolume::create(sandbox.path(), A, 64);
    run("mkfs.ext4", &["-q", &text(&disk.device)]);
    let host_only = sandbox.mkdir("host-only");
    run("mount", &[&text(&disk.device), &text(&host_only)]);
    assert!(
        pid1_mounts().contains(&text(&host_only)),
        "this test's mount namespace must be PID 1's"
    );
    let target = sandbox.block_target("a", A, A);
    expect_refused(
        &helper,
        publish_device(A, &disk.device, &target),
        &device_refused(&text(&disk.device), A, Refusal::MountedOutside),
    );
    assert!(!target.exists());
    run("umount", &[&text(&host_only)]);
}

/// Third audit A4 (E-F9b): a disk with a host's file, mounted beneath the
/// allowed root at a path of no CSI shape, is the host's: neither staged
/// (and so not published into a pod) nor published raw.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_disk_mounted_beneath_a_root_at_no_volumes_path_is_the_hosts() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let disk = LoopVolume::create(sandbox.path(), A, 64);
    run("mkfs.ext4", &["-q", &text(&disk.device)]);
    let data = sandbox.mkdir("kubelet/data");
    run("mount", &[&text(&disk.device), &text(&data)]);
    std::fs::write(data.join("secret.txt"), b"host secret").unwrap();
    neither_staged_nor_published_raw(&sandbox, &helper, &disk, Refusal::MountedOutside);
    run("umount", &[&text(&data)]);
}

/// Third audit A5 (E-NS): a disk mounted only in a mount namespace the
/// helper cannot see (a process of its own, standing in for a privileged
/// container or a `PrivateMounts=` service) shows in no mount table the
/// helper reads, but cannot be opened exclusively: neither staged (which
/// would mount the same filesystem a second time) nor published raw.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_disk_mounted_in_a_namespace_the_helper_cannot_see_is_in_use() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let disk = LoopVolume::create(sandbox.path(), A, 64);
    run("mkfs.ext4", &["-q", &text(&disk.device)]);
    let hidden = sandbox.mkdir("hidden");
    let mut holder = std::process::Command::new("unshare");
    holder
        .args(SLAVE_NAMESPACE)
        .args(["sh", "-c", "mount \"$0\" \"$1\" && echo mounted && exec sleep 120"])
        .args([text(&disk.device), text(&hidden)])
        .stdout(std::process::Stdio::piped());
    let mut holder = ebs_csi_tests::children::Killed(holder.spawn().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.0.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line, "mounted\n");
    assert!(!pid1_mounts().contains(&text(&hidden)));
    neither_staged_nor_published_raw(&sandbox, &helper, &disk, Refusal::HeldUnseen);
}

/// The tests' world (tests/src/lib.rs, `Sandbox`): a mount namespace
/// made while a volume is staged (as a test running beside this one may
/// make one) holds a copy of the staging mount only while the host does.
/// Unstaged, the volume stages again, rather than being refused as held
/// where the helper cannot see, as it would be were the namespace private.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_namespace_made_beside_a_staged_volume_lets_it_go() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let volume = LoopVolume::create(sandbox.path(), A, 64);
    let staging = sandbox.staging(A);
    let unstage = || {
        let request = Request::Unstage(UnstageRequest {
            staging_path: text(&staging),
        });
        assert_eq!(helper.call(request).unwrap(), Reply::Done);
    };
    assert_eq!(helper.call(stage(A, &volume.device, &staging)).unwrap(), Reply::Done);
    let mut holder = std::process::Command::new("unshare");
    holder
        .args(SLAVE_NAMESPACE)
        .args(["sh", "-c", "echo ready && exec sleep 120"])
        .stdout(std::process::Stdio::piped());
    let mut holder = ebs_csi_tests::children::Killed(holder.spawn().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.0.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line, "ready\n");
    let holds_a_copy = || {
        std::fs::read_to_string(format!("/proc/{}/mountinfo", holder.0.id()))
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(text(&staging).as_str()))
    };
    assert!(holds_a_copy(), "the namespace was made without the staging mount");
    unstage();
    assert!(!holds_a_copy(), "the unmount did not reach the namespace's copy");
    assert_eq!(helper.call(stage(A, &volume.device, &staging)).unwrap(), Reply::Done);
    unstage();
}

/// Asserts that a Stage and a raw block Publish of `disk` (volume A) are
/// both refused for `reason`, and that neither mounted nor made anything.
fn neither_staged_nor_published_raw(sandbox: &Sandbox, helper: &Helper, disk: &LoopVolume, reason: Refusal) {
    let staging = sandbox.staging(A);
    let target = sandbox.block_target("a", A, A);
    for request in [
        stage(A, &disk.device, &staging),
        publish_device(A, &disk.device, &target),
    ] {
        expect_refused(helper, request, &device_refused(&text(&disk.device), A, reason));
    }
    assert!(!is_mounted(&staging) && !target.exists());
}

/// Third audit A3 (E-M): the helper makes no mount past `--max-mounts`. With
/// the volume staged and published to one pod (two mount points of
/// volumes' shapes, the limit), a Publish to another pod is refused with
/// the limit, making neither its target nor a mount; the repeated Publish
/// of the first pod is still answered.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn no_mount_is_made_past_the_mount_limit() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &["--max-mounts", "2"]);
    let volume = LoopVolume::create(sandbox.path(), A, 64);
    let staging = sandbox.staging(A);
    assert_eq!(helper.call(stage(A, &volume.device, &staging)).unwrap(), Reply::Done);
    let first = sandbox.target("a", "pv-a", A);
    let publish_first = publish_staged(A, &volume.device, &staging, &first);
    assert_eq!(helper.call(publish_first.clone()).unwrap(), Reply::Done);
    let second = sandbox.target("b", "pv-a", A);
    let mounts = sandbox.mounts();
    expect_refused(
        &helper,
        publish_staged(A, &volume.device, &staging, &second),
        &HelperError::MountLimit { limit: 2 },
    );
    assert!(!second.exists());
    assert_eq!(sandbox.mounts(), mounts);
    assert_eq!(helper.call(publish_first).unwrap(), Reply::Done);
    assert_eq!(helper.call(unpublish(&first)).unwrap(), Reply::Done);
}

/// T9, with a stopped tool standing in for a hung one: a tool still
/// running at `--tool-timeout-seconds` is killed, the request fails with
/// `ToolFailed`, nothing is mounted, and the next request works.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_tool_past_its_time_limit_is_killed() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &["--tool-timeout-seconds", "1"]);
    let volume = LoopVolume::create(sandbox.path(), A, 512);
    let staging = sandbox.staging(A);
    let gate = ExecGate::watch(helper.process.pid(), &MKFS);
    let (result, mkfs) = std::thread::scope(|scope| {
        let call = scope.spawn(|| helper.call(stage(A, &volume.device, &staging)));
        let mkfs = gate.caught(Duration::from_secs(20));
        (call.join().unwrap(), mkfs)
    });
    let expected = HelperError::ToolFailed {
        tool: Tool::MkfsExt4.path().unwrap(),
        detail: "still running after 1 s; killed".into(),
    };
    assert!(
        matches!(&result, Err(ClientError::Helper(e)) if *e == expected),
        "{result:?}"
    );
    wait_until("the stopped mkfs killed", Duration::from_secs(5), || exited(mkfs));
    assert!(!is_mounted(&staging));
    assert_eq!(helper.call(stage(A, &volume.device, &staging)).unwrap(), Reply::Done);
    assert!(is_mounted(&staging));
}

/// Active swap (the disk or a partition) is in use by the host.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_swap_device_is_in_use() {
    require_root();
    struct Swap<'a>(&'a Path);
    impl Drop for Swap<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("swapoff").arg(self.0).status();
        }
    }
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let volume = LoopVolume::create(sandbox.path(), A, 64);
    run("mkswap", &["-q", &text(&volume.device)]);
    run("swapon", &[&text(&volume.device)]);
    let _swap = Swap(&volume.device);
    let unchanged = Unchanged::record(&sandbox, &[&volume]);
    expect_refused(
        &helper,
        stage(A, &volume.device, &sandbox.staging(A)),
        &device_refused(&text(&volume.device), A, Refusal::Swap),
    );
    unchanged.assert("a swap device");
}

/// T10: the deadline is per frame: a peer trickling a byte at a time is
/// cut off when its second is up, and sixteen of them cannot keep the
/// helper from answering.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn trickling_peers_are_cut_off_at_the_frame_deadline() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &["--io-timeout-seconds", "1"]);
    let trickle = |socket: PathBuf| {
        run_as(AGENT_UID, move || {
            let mut stream = UnixStream::connect(socket).unwrap();
            let started = Instant::now();
            let mut sent = 0;
            for byte in [65_536u32.to_be_bytes().to_vec(), vec![0xa0; 60]].concat() {
                if stream.write_all(&[byte]).is_err() || started.elapsed() > Duration::from_secs(20) {
                    break;
                }
                sent += 1;
                std::thread::sleep(Duration::from_millis(250));
            }
            (started.elapsed(), sent)
        })
    };
    let (held, sent) = trickle(helper.socket.clone());
    assert!(
        sent < 20,
        "a trickling peer sent {sent} bytes over {held:?} with a 1 s deadline"
    );
    let peers: Vec<_> = (0..16)
        .map(|_| {
            let socket = helper.socket.clone();
            std::thread::spawn(move || trickle(socket))
        })
        .collect();
    // While all sixteen slots are taken a ping is told Busy; it is answered
    // as soon as the first trickling peers are cut off.
    wait_until("a ping answered among trickling peers", Duration::from_secs(5), || {
        matches!(
            helper.call(Request::Ping),
            Ok(Reply::Pong {
                version: PROTOCOL_VERSION
            })
        )
    });
    for peer in peers {
        let (_, sent) = peer.join().unwrap();
        assert!(sent < 20, "a trickling peer among sixteen sent {sent} bytes");
    }
}

/// T15, T18: frames that are not exactly this protocol are refused whole,
/// and no request string can forge a line of the helper's log.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn malformed_frames_and_control_characters_change_nothing() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let root = text(&sandbox.kubelet());
    use ciborium::Value;
    let map = |pairs: Vec<(&str, Value)>| Value::Map(pairs.into_iter().map(|(k, v)| (Value::from(k), v)).collect());
    let unstage = |path: Value| map(vec![("Unstage", map(vec![("staging_path", path)]))]);
    // 100,000 one-element arrays around a null, written out byte by byte
    // (a `Value` that deep would overflow this test's own stack).
    let nested_under_x = {
        let request = map(vec![
            ("version", PROTOCOL_VERSION.into()),
            ("request", unstage(format!("{root}/a").into())),
        ]);
        let mut payload = cbor(&request);
        payload[0] += 1; // the same map with one more entry: "x"
        payload.extend(cbor(&Value::from("x")));
        payload.extend(std::iter::repeat_n(0x81, 100_000));
        payload.push(0xf6);
        [u32::try_from(payload.len()).unwrap().to_be_bytes().to_vec(), payload].concat()
    };
    let frames: Vec<(&str, Vec<u8>)> = vec![
        (
            "a float version",
            frame(&map(vec![("version", Value::Float(2.0)), ("request", "Ping".into())])),
        ),
        (
            "a negative version",
            frame(&map(vec![("version", (-1).into()), ("request", "Ping".into())])),
        ),
        (
            "a duplicate staging_path",
            frame(&map(vec![
                ("version", PROTOCOL_VERSION.into()),
                (
                    "request",
                    Value::Map(vec![(
                        "Unstage".into(),
                        Value::Map(vec![
                            ("staging_path".into(), format!("{root}/a").into()),
                            ("staging_path".into(), format!("{root}/b").into()),
                        ]),
                    )]),
                ),
            ])),
        ),
        (
            "a device with an offset",
            frame(&map(vec![
                ("version", PROTOCOL_VERSION.into()),
                (
                    "request",
                    map(vec![(
                        "Publish",
                        map(vec![
                            ("target_path", format!("{root}/t").into()),
                            ("readonly", false.into()),
                            (
                                "source",
                                map(vec![(
                                    "Device",
                                    map(vec![
                                        ("volume_id", A.into()),
                                        ("device", "/dev/loop0".into()),
                                        ("offset", 0.into()),
                                    ]),
                                )]),
                            ),
                        ]),
                    )]),
                ),
            ])),
        ),
        (
            "a text header of 2^63 bytes",
            [
                16u32.to_be_bytes().to_vec(),
                vec![0x7b, 0x80, 0, 0, 0, 0, 0, 0, 0],
                vec![0x61; 7],
            ]
            .concat(),
        ),
        ("100,000 nested arrays under an unknown key", nested_under_x),
    ];
    for (what, bytes) in frames {
        let socket = helper.socket.clone();
        let response = run_as(AGENT_UID, move || {
            let mut stream = UnixStream::connect(socket).unwrap();
            let _ = stream.write_all(&bytes);
            read_response(&mut stream)
        });
        assert!(
            matches!(response, Ok(Response::Err(HelperError::InvalidRequest(_)))),
            "{what}: {response:?}"
        );
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", helper.process.pid())).unwrap();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(rss_kib < 20 * 1024, "the helper's RSS grew to {rss_kib} KiB");
    let forged = [
        stage(A, Path::new("/dev/x\nFORGED mount ok"), &sandbox.staging(A)),
        unpublish(Path::new(&format!("{root}/a\nFORGED unmount ok"))),
        Request::Expand(ExpandRequest {
            volume_id: VolumeId::parse(A).unwrap(),
            device: "/dev/loop0\rFORGED".into(),
            volume_path: format!("{root}/\rFORGED"),
        }),
    ];
    for request in forged {
        let _ = helper.call(request);
    }
    assert_eq!(
        helper.call(Request::Ping).unwrap(),
        Reply::Pong {
            version: PROTOCOL_VERSION
        }
    );
    let log = helper.process.log();
    assert!(log.contains("FORGED"), "the requests were not logged at all");
    assert!(
        !log.split(['\n', '\r']).any(|line| line.starts_with("FORGED")),
        "a request forged a log line:\n{log}"
    );
    assert!(sandbox.mounts().is_empty());
    assert!(ebs_csi_mounts().iter().all(|m| !m.contains("FORGED")));
}

fn frame(value: &ciborium::Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(&mut out, value).unwrap();
    out
}

fn cbor(value: &ciborium::Value) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::into_writer(value, &mut out).unwrap();
    out
}
