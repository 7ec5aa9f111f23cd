//! The helper refuses every request it cannot prove safe, and changes
//! nothing when it does: no mount, no format, device signature intact.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;

use ebs_csi_helper_client::{ClientError, read_response};
use ebs_csi_helper_proto::{
    FsType, HelperError, MAX_FRAME_BYTES, PROTOCOL_VERSION, PerformanceStatisticsRequest, PublishRequest,
    PublishSource, Request, RequestFrame, Response, VolumeId, write_frame,
};
use ebs_csi_tests::run;
use ebs_csi_tests::{AGENT_UID, Helper, LoopVolume, Sandbox, mounts_under, require_root, run_as, stage_request};

const VOLUME: &str = "vol-0aaaaaaaaaaaaaaa1";

/// Asserts `request` is refused with an error `expected` accepts, and that
/// neither the mount table nor `volume`'s signature changed.
fn assert_refused(helper: &Helper, volume: &LoopVolume, request: Request, expected: fn(&HelperError) -> bool) {
    let sandbox = volume.file.parent().unwrap();
    let (mounts, signature) = (mounts_under(sandbox), volume.signature());
    match helper.call(request.clone()) {
        Err(ClientError::Helper(e)) => assert!(expected(&e), "{request:?}: unexpected error {e}"),
        other => panic!("{request:?}: expected a refusal, got {other:?}"),
    }
    assert_eq!(mounts_under(sandbox), mounts, "{request:?} changed the mount table");
    assert_eq!(volume.signature(), signature, "{request:?} changed the device");
}

fn path_refused(e: &HelperError) -> bool {
    matches!(e, HelperError::PathRefused { .. })
}

fn device_refused(e: &HelperError) -> bool {
    matches!(e, HelperError::DeviceRefused { .. })
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn refuses_unsafe_paths() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 64);
    let kubelet = sandbox.kubelet();
    let outside = sandbox.mkdir("outside");
    // Symlinks where kubelet's shapes put a volume's last component, and
    // where they put its directory (kubelet's record of the volume in
    // place, so that the symlink is what refuses the path).
    let staging = ebs_csi_tests::kubelet_staging(&kubelet, VOLUME);
    let volume_dir = staging.parent().unwrap().to_owned();
    std::fs::remove_dir(&staging).unwrap();
    std::os::unix::fs::symlink(&outside, &staging).unwrap();
    let devices = sandbox.mkdir("kubelet/plugins/kubernetes.io/csi/volumeDevices/publish");
    std::os::unix::fs::symlink(&outside, devices.join("link")).unwrap();
    let link_data = kubelet.join("plugins/kubernetes.io/csi/volumeDevices/link/data");
    ebs_csi_tests::write_kubelet_record(&ebs_csi_tests::make_dir(&link_data), VOLUME);
    let stage = |staging: &Path| stage_request(VOLUME, &volume.device, staging, FsType::Ext4, &[]);
    for staging in [
        outside.clone(),
        volume_dir.join("../../../../../outside/globalmount"),
        staging.clone(),
        Path::new("relative/staging").to_path_buf(),
        kubelet.clone(),
    ] {
        assert_refused(&helper, &volume, stage(&staging), path_refused);
    }
    std::fs::remove_file(&staging).unwrap();
    std::fs::rename(&volume_dir, sandbox.path().join("volume-dir")).unwrap();
    std::os::unix::fs::symlink(sandbox.path().join("volume-dir"), &volume_dir).unwrap();
    assert_refused(&helper, &volume, stage(&staging), path_refused);
    let publish = |target: &Path| {
        Request::Publish(PublishRequest {
            target_path: target.to_string_lossy().into_owned(),
            readonly: false,
            source: PublishSource::Device {
                volume_id: VolumeId::parse(VOLUME).unwrap(),
                device: volume.device.to_string_lossy().into_owned(),
            },
        })
    };
    for target in [
        devices.join("link/pod"),
        outside.join("target"),
        Path::new("/etc/target").to_path_buf(),
    ] {
        assert_refused(&helper, &volume, publish(&target), path_refused);
    }
    assert!(!outside.join("pod").exists() && !outside.join("target").exists());
    assert_eq!(volume.signature(), "", "a refused request formatted the device");
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn refuses_devices_that_are_not_the_volume() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let staging = sandbox.staging(VOLUME);
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 64);
    let other = LoopVolume::create(sandbox.path(), "vol-0bbbbbbbbbbbbbbb2", 64);
    // Identity mismatch: another volume's device.
    assert_refused(
        &helper,
        &volume,
        stage_request(VOLUME, &other.device, &staging, FsType::Ext4, &[]),
        device_refused,
    );
    assert_eq!(other.signature(), "");
    // Not a block device, not under /dev, a character device.
    for device in [
        volume.file.as_path(),
        Path::new("/dev/null"),
        Path::new("/dev/../etc/passwd"),
        Path::new("/dev/zero"),
    ] {
        assert_refused(
            &helper,
            &volume,
            stage_request(VOLUME, device, &staging, FsType::Ext4, &[]),
            device_refused,
        );
    }
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn refuses_without_loop_permission_and_never_reformats() {
    require_root();
    let sandbox = Sandbox::new();
    let staging = sandbox.staging(VOLUME);
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 320);
    run("mkfs.xfs", &["-q", &volume.device.to_string_lossy()]);
    let strict = Helper::start(&sandbox, &[]);
    assert_refused(
        &strict,
        &volume,
        stage_request(VOLUME, &volume.device, &staging, FsType::Xfs, &["suid"]),
        |e| matches!(e, HelperError::MountOptionRefused(_)),
    );
    assert_refused(
        &strict,
        &volume,
        stage_request(VOLUME, &volume.device, &staging, FsType::Ext4, &[]),
        |e| matches!(e, HelperError::FilesystemMismatch { .. }),
    );
    assert!(volume.signature().contains("TYPE=xfs"));
    drop(strict);
    let sandbox2 = Sandbox::new();
    let socket = sandbox2.path().join("h.sock");
    let mut no_loop = std::process::Command::new(ebs_csi_tests::binary("ebs-csi-helper"))
        .arg("--socket")
        .arg(&socket)
        .args(["--socket-group", "65534", "--allowed-uid", "65534", "--allowed-root"])
        .arg(sandbox.kubelet())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    ebs_csi_tests::wait_until("socket", std::time::Duration::from_secs(10), || {
        ebs_csi_tests::is_ready(&socket, no_loop.id())
    });
    let mounts = mounts_under(sandbox.path());
    let result = run_as(AGENT_UID, {
        let (socket, request) = (
            socket.clone(),
            stage_request(VOLUME, &volume.device, &staging, FsType::Xfs, &[]),
        );
        move || ebs_csi_helper_client::HelperClient::new(socket, std::time::Duration::from_secs(10)).call(request)
    });
    no_loop.kill().unwrap();
    no_loop.wait().unwrap();
    assert!(
        matches!(result, Err(ClientError::Helper(HelperError::DeviceRefused { .. }))),
        "{result:?}"
    );
    assert_eq!(mounts_under(sandbox.path()), mounts);
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn refuses_unknown_peers_and_bad_frames() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let staging = sandbox.staging(VOLUME);
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 64);
    // Root is not on the allowed list: disconnected before anything is read.
    let result = helper.call_as(0, stage_request(VOLUME, &volume.device, &staging, FsType::Ext4, &[]));
    assert!(matches!(result, Err(ClientError::Frame(_))), "{result:?}");
    assert!(helper.process.log().contains("refused peer"));
    assert_eq!(volume.signature(), "");
    let exchange = |bytes: Vec<u8>| {
        let socket = helper.socket.clone();
        run_as(AGENT_UID, move || {
            let mut stream = UnixStream::connect(socket).unwrap();
            stream.write_all(&bytes).unwrap();
            stream.shutdown(std::net::Shutdown::Write).unwrap();
            read_response(&mut stream).unwrap()
        })
    };
    let invalid = |response: Response| matches!(response, Response::Err(HelperError::InvalidRequest(_)));
    // Oversized length, truncated frame, garbage, unknown request kind.
    assert!(invalid(exchange((MAX_FRAME_BYTES + 1).to_be_bytes().to_vec())));
    assert!(invalid(exchange(vec![0, 0, 1, 0, 0xa2])));
    assert!(invalid(exchange([4u32.to_be_bytes().to_vec(), vec![0xff; 4]].concat())));
    let mut unknown = Vec::new();
    let value = ciborium::Value::Map(vec![
        ("version".into(), PROTOCOL_VERSION.into()),
        ("request".into(), "Format".into()),
    ]);
    write_frame(&mut unknown, &value).unwrap();
    assert!(invalid(exchange(unknown)));
    let mut other_version = Vec::new();
    write_frame(
        &mut other_version,
        &RequestFrame {
            version: PROTOCOL_VERSION + 1,
            request: Request::Ping,
        },
    )
    .unwrap();
    assert_eq!(
        exchange(other_version),
        Response::Err(HelperError::UnsupportedVersion(PROTOCOL_VERSION + 1))
    );
    assert_eq!(volume.signature(), "");
    // Still serving.
    assert!(helper.call(Request::Ping).is_ok());
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_symlink_swapped_in_mid_call_never_redirects_a_mount() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 16);
    let outside = sandbox.mkdir("outside");
    // Block targets are `…/volumeDevices/publish/<pv>/<pod>`: the agent's
    // swap exchanges two `<pv>` directories.
    let race = sandbox.mkdir("kubelet/plugins/kubernetes.io/csi/volumeDevices/publish");
    ebs_csi_tests::make_dir(&race.join("dir"));
    let dir_data = sandbox.mkdir("kubelet/plugins/kubernetes.io/csi/volumeDevices/dir/data");
    ebs_csi_tests::write_kubelet_record(&dir_data, VOLUME);
    std::os::unix::fs::symlink(&outside, race.join("swap")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = std::thread::spawn({
        let (race, stop) = (race.clone(), stop.clone());
        move || {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    race.join("dir"),
                    rustix::fs::CWD,
                    race.join("swap"),
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps += 1;
            }
            swaps
        }
    });
    let target = race.join("dir/target");
    let (mut published, mut refused) = (0, 0);
    for _ in 0..60 {
        let request = Request::Publish(PublishRequest {
            target_path: target.to_string_lossy().into_owned(),
            readonly: false,
            source: PublishSource::Device {
                volume_id: VolumeId::parse(VOLUME).unwrap(),
                device: volume.device.to_string_lossy().into_owned(),
            },
        });
        match helper.call(request) {
            Ok(_) => {
                published += 1;
                let unpublish = Request::Unpublish(ebs_csi_helper_proto::UnpublishRequest {
                    target_path: target.to_string_lossy().into_owned(),
                });
                // The swap may hide the real directory right now: retry until it is unpublished.
                ebs_csi_tests::wait_until("unpublish", std::time::Duration::from_secs(10), || {
                    helper.call(unpublish.clone()).is_ok() && mounts_under(&race).is_empty()
                });
            }
            Err(ClientError::Helper(HelperError::PathRefused { .. })) => refused += 1,
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(
            std::fs::read_dir(&outside).unwrap().next().is_none(),
            "something was created outside the root"
        );
        assert!(mounts_under(&outside).is_empty(), "a mount escaped the root");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    eprintln!("{published} published, {refused} refused, {swaps} swaps");
    assert!(
        swaps > 60 && refused > 0,
        "the race did not happen: {swaps} swaps, {refused} refused"
    );
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn performance_statistics_are_read_only_from_the_proven_volume() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 64);
    let other = LoopVolume::create(sandbox.path(), "vol-0bbbbbbbbbbbbbbb2", 64);
    let request = |device: &Path| {
        Request::PerformanceStatistics(PerformanceStatisticsRequest {
            volume_id: VolumeId::parse(VOLUME).unwrap(),
            device: device.display().to_string(),
        })
    };
    assert_refused(&helper, &volume, request(&other.device), |e| {
        matches!(e, HelperError::DeviceRefused { volume_id, reason, .. }
                if volume_id == VOLUME && reason == "the loop device's backing file does not name the volume")
    });
    // The volume's own device is asked on the verified fd: a loop device
    // is no NVMe controller, and the loop driver answers an ioctl it does
    // not know with EINVAL (drivers/block/loop.c, lo_simple_ioctl).
    let own = volume.device.display().to_string();
    match helper.call(request(&volume.device)) {
        Err(ClientError::Helper(HelperError::System { operation, detail })) => {
            assert_eq!(operation, format!("Get Log Page on {own}"));
            assert_eq!(detail, "Invalid argument (os error 22)");
        }
        other => panic!("PerformanceStatistics on {own}: {other:?}"),
    }
    assert_eq!(volume.signature(), "");
}

/// A path's form is judged before the helper's lock (docs/helper.md,
/// Unstage, Unpublish, Expand): while an Expand holds the lock (its
/// `xfs_growfs` held at exec), malformed Unstage, Unpublish and Expand
/// requests are refused at once, the Expand for its path before its device
/// (here not the volume either) is looked at. Before, they waited for the
/// lock, and the Expand was refused for its device.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_malformed_path_is_refused_without_waiting_for_the_lock() {
    use ebs_csi_helper_proto::{ExpandRequest, UnpublishRequest, UnstageRequest};
    use ebs_csi_tests::exec_gate::{ExecGate, XFS_GROWFS};
    use std::time::{Duration, Instant};
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 320);
    let other = LoopVolume::create(sandbox.path(), "vol-0bbbbbbbbbbbbbbb2", 64);
    let staging = sandbox.staging(VOLUME);
    assert_eq!(
        helper
            .call(stage_request(VOLUME, &volume.device, &staging, FsType::Xfs, &[]))
            .unwrap(),
        ebs_csi_helper_proto::Reply::Done
    );
    volume.grow(640);
    let gate = ExecGate::watch(helper.process.pid(), &XFS_GROWFS);
    let expand = |device: &Path, volume_path: &str| {
        Request::Expand(ExpandRequest {
            volume_id: VolumeId::parse(VOLUME).unwrap(),
            device: device.to_string_lossy().into_owned(),
            volume_path: volume_path.to_owned(),
        })
    };
    let holding = helper.call_in_background(expand(&volume.device, &staging.to_string_lossy()));
    let growfs = gate.caught(Duration::from_secs(20));
    let malformed = "/etc/../etc/shadow";
    for request in [
        Request::Unstage(UnstageRequest {
            staging_path: malformed.into(),
        }),
        Request::Unpublish(UnpublishRequest {
            target_path: malformed.into(),
        }),
        expand(&other.device, malformed),
    ] {
        let started = Instant::now();
        let refused = HelperError::PathRefused {
            path: malformed.into(),
            reason: "has an empty, '.' or '..' component".into(),
        };
        match helper.call(request.clone()) {
            Err(ClientError::Helper(e)) => assert_eq!(e, refused, "{request:?}"),
            other => panic!("{request:?}: {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{request:?} waited for the lock"
        );
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(growfs).unwrap()).unwrap(),
        rustix::process::Signal::CONT,
    )
    .unwrap();
    assert_eq!(
        holding.join().unwrap().unwrap(),
        ebs_csi_helper_proto::Reply::Expanded { size_bytes: 640 << 20 }
    );
}
