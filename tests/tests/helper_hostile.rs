//! More than 200 hostile requests against a running helper: each is
//! refused, nothing on the system changes, and the helper keeps serving.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use ebs_csi_helper::device::Refusal;
use ebs_csi_helper::error::NOT_ITS_SHAPE;
use ebs_csi_helper_client::{HelperClient, frame, read_response};
use ebs_csi_helper_proto::{
    ExpandRequest, FsType, HelperError, MAX_FRAME_BYTES, OLDEST_VERSION, PROTOCOL_VERSION, PublishRequest,
    PublishSource, Reply, Request, Response, UnpublishRequest, UnstageRequest, VolumeId, write_frame,
};
use ebs_csi_tests::{
    AGENT_UID, Helper, LoopVolume, Sandbox, ebs_csi_mounts, is_the_hosts, require_root, run_as, stage_request,
};

const VOLUME: &str = "vol-0aaaaaaaaaaaaaaa1";

/// The host's mount points ([`is_the_hosts`]): what a hostile request
/// must never change.
fn host_mounts() -> BTreeSet<String> {
    ebs_csi_mounts().into_iter().filter(|m| is_the_hosts(m)).collect()
}

fn volume_id() -> VolumeId {
    VolumeId::parse(VOLUME).unwrap()
}

fn stage(device: &str, staging: &str, flags: &[&str]) -> Request {
    stage_request(VOLUME, Path::new(device), Path::new(staging), FsType::Ext4, flags)
}

fn publish(target: &str, source: PublishSource) -> Request {
    Request::Publish(PublishRequest {
        target_path: target.into(),
        readonly: false,
        source,
    })
}

/// Sends raw bytes as the agent's uid; the decoded answer, or `None` when
/// the helper closed the connection without one.
fn raw_exchange(socket: &Path, bytes: Vec<u8>, uid: u32) -> Option<Response> {
    let socket = socket.to_owned();
    run_as(uid, move || {
        let mut stream = UnixStream::connect(socket).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        let _ = stream.write_all(&bytes);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        read_response(&mut stream).ok()
    })
}

/// One frame carrying an arbitrary CBOR value.
fn cbor_frame(value: &ciborium::Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(&mut out, value).unwrap();
    out
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn two_hundred_hostile_requests_change_nothing() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &["--io-timeout-seconds", "1"]);
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 64);
    let other = LoopVolume::create(sandbox.path(), "vol-0bbbbbbbbbbbbbbb2", 64);
    let kubelet = sandbox.kubelet();
    let root = kubelet.to_string_lossy().into_owned();
    let outside = sandbox.mkdir("outside");
    std::fs::write(outside.join("secret"), "untouched").unwrap();
    std::os::unix::fs::symlink("/etc", kubelet.join("link-to-etc")).unwrap();
    std::os::unix::fs::symlink(&outside, kubelet.join("link-out")).unwrap();
    let staging = sandbox.staging(VOLUME).to_string_lossy().into_owned();
    let device = volume.device.to_string_lossy().into_owned();
    let (mounts_before, host_before) = (ebs_csi_tests::mounts_under(sandbox.path()), host_mounts());

    let long = format!("{root}/{}", "a".repeat(5000));
    let (dots, outside_roots) = ("has an empty, '.' or '..' component", "not beneath an allowed root");
    let hostile_paths: Vec<(String, &str)> = vec![
        ("/".into(), dots),
        ("/etc".into(), outside_roots),
        ("/etc/passwd".into(), outside_roots),
        ("/proc".into(), outside_roots),
        ("/proc/self/fd/3".into(), outside_roots),
        ("/proc/1/root".into(), outside_roots),
        ("/sys".into(), outside_roots),
        ("/dev".into(), outside_roots),
        ("/dev/shm".into(), outside_roots),
        ("/root".into(), outside_roots),
        ("/tmp".into(), outside_roots),
        ("/var/lib".into(), outside_roots),
        ("/boot".into(), outside_roots),
        ("/var/lib/kubelet/../../etc".into(), dots),
        (format!("{root}/../.."), dots),
        (format!("{root}/staging/../../outside"), dots),
        (format!("{root}/./staging"), dots),
        (format!("{root}//staging"), dots),
        (format!("{root}/staging/"), dots),
        ("relative/path".into(), "not absolute"),
        (String::new(), "not absolute"),
        (root.clone(), outside_roots),
        (format!("{root}x/staging"), outside_roots),
        // Symlinks where no kubelet path goes are refused for that alone
        // (helper_refusals.rs puts them where kubelet's paths go).
        (format!("{root}/link-to-etc"), NOT_ITS_SHAPE),
        (format!("{root}/link-to-etc/passwd"), NOT_ITS_SHAPE),
        (format!("{root}/link-out/secret"), NOT_ITS_SHAPE),
        (format!("{root}/link-out/new"), NOT_ITS_SHAPE),
        (format!("{root}/nul\0byte"), "too long or contains NUL"),
        (long, "too long or contains NUL"),
        (outside.to_string_lossy().into_owned(), outside_roots),
        (format!("{root}/pki/x"), NOT_ITS_SHAPE),
        (format!("{root}/pods"), NOT_ITS_SHAPE),
        (format!("{root}/pods/uid/etc-hosts"), NOT_ITS_SHAPE),
    ];
    let mut requests: Vec<(String, Request, HelperError)> = Vec::new();
    for (path, reason) in &hostile_paths {
        let refused = HelperError::PathRefused {
            path: path.clone(),
            reason: (*reason).to_owned(),
        };
        let mut push = |what: String, request| requests.push((what, request, refused.clone()));
        push(format!("stage at {path:?}"), stage(&device, path, &[]));
        let unstage = UnstageRequest {
            staging_path: path.clone(),
        };
        push(format!("unstage {path:?}"), Request::Unstage(unstage));
        let unpublish = UnpublishRequest {
            target_path: path.clone(),
        };
        push(format!("unpublish {path:?}"), Request::Unpublish(unpublish));
        let device_source = PublishSource::Device {
            volume_id: volume_id(),
            device: device.clone(),
        };
        push(format!("publish block onto {path:?}"), publish(path, device_source));
        let bind_source = PublishSource::Staging {
            volume_id: volume_id(),
            device: device.clone(),
            staging_path: path.clone(),
            mount_flags: vec![],
        };
        push(
            format!("bind {path:?} into the root"),
            publish(&format!("{root}/target"), bind_source),
        );
    }
    let other_device = other.device.to_string_lossy().into_owned();
    let hostile_devices = [
        ("/dev/vda", Refusal::NotKernelName),
        ("/dev/vda1", Refusal::NotKernelName),
        ("/dev/null", Refusal::NotKernelName),
        ("/dev/zero", Refusal::NotKernelName),
        ("/dev/random", Refusal::NotKernelName),
        ("/dev/mem", Refusal::NotKernelName),
        ("/dev/kmsg", Refusal::NotKernelName),
        ("/dev/tty", Refusal::NotKernelName),
        ("/dev/../etc/passwd", Refusal::NotKernelName),
        ("/etc/passwd", Refusal::NotKernelName),
        ("/proc/self/fd/0", Refusal::NotKernelName),
        ("", Refusal::NotKernelName),
        ("relative", Refusal::NotKernelName),
        ("/dev/loop-control", Refusal::NotKernelName),
        (&other_device, Refusal::LoopNotNamed),
        ("/dev/disk/by-id/../../vda", Refusal::NotKernelName),
        ("/dev/nvme0n1", Refusal::NotBlockDevice),
        ("/dev/nvme0", Refusal::NotKernelName),
        ("/dev/sda", Refusal::NotKernelName),
        ("/dev/dm-0", Refusal::NotKernelName),
    ];
    for (bad, reason) in hostile_devices {
        let refused = HelperError::DeviceRefused {
            device: bad.to_owned(),
            volume_id: VOLUME.to_owned(),
            reason: reason.to_string(),
        };
        requests.push((
            format!("stage device {bad:?}"),
            stage(bad, &staging, &[]),
            refused.clone(),
        ));
        let source = PublishSource::Device {
            volume_id: volume_id(),
            device: bad.to_owned(),
        };
        requests.push((
            format!("publish device {bad:?}"),
            publish(&format!("{root}/block"), source),
            refused.clone(),
        ));
        // A volume path of kubelet's shape: its form is judged first.
        let expand = ExpandRequest {
            volume_id: volume_id(),
            device: bad.to_owned(),
            volume_path: staging.clone(),
        };
        requests.push((format!("expand device {bad:?}"), Request::Expand(expand), refused));
    }
    // Each flag, and the option in it that is refused first (the reasons
    // are `helper/src/options_tests.rs`'s).
    let hostile_flags = [
        ("suid", "suid"),
        ("dev", "dev"),
        ("bind", "bind"),
        ("rbind", "rbind"),
        ("remount", "remount"),
        ("move", "move"),
        ("shared", "shared"),
        ("rshared", "rshared"),
        (
            "context=system_u:object_r:etc_t:s0",
            "context=system_u:object_r:etc_t:s0",
        ),
        ("uid=0", "uid=0"),
        ("gid=0", "gid=0"),
        ("mode=4777", "mode=4777"),
        ("nosuid,suid", "suid"),
        ("noatime,dev", "dev"),
        ("loop", "loop"),
        ("defaults,user", "user"),
        ("owner", "owner"),
        ("rw,suid", "suid"),
        ("journal_path=/etc/passwd", "journal_path=/etc/passwd"),
        ("errors=panic", "errors=panic"),
        ("\0", "\0"),
        ("noatime\0suid", "noatime\0suid"),
        ("a=b", "a=b"),
        ("commit=1e3", "commit=1e3"),
        ("suid,nouuid", "suid"),
        ("usrjquota=/etc/passwd", "usrjquota=/etc/passwd"),
        ("logdev=/dev/sda", "logdev=/dev/sda"),
        ("rtdev=/dev/sda", "rtdev=/dev/sda"),
        ("journal_dev=2049", "journal_dev=2049"),
        ("abort", "abort"),
        ("nofail,errors=panic", "errors=panic"),
        ("context=\"system_u:object_r:container_file_t:s0\",dev", "dev"),
    ];
    for (flag, first_refused) in hostile_flags {
        let refused = HelperError::MountOptionRefused(format!("{first_refused:?} refused: "));
        requests.push((
            format!("stage with {flag:?}"),
            stage(&device, &format!("{root}/staging"), &[flag]),
            refused.clone(),
        ));
        let source = PublishSource::Staging {
            volume_id: volume_id(),
            device: device.clone(),
            staging_path: format!("{root}/staging"),
            mount_flags: vec![flag.to_owned()],
        };
        requests.push((
            format!("publish with {flag:?}"),
            publish(&format!("{root}/target"), source),
            refused,
        ));
    }
    assert!(requests.len() >= 200, "{} requests", requests.len());
    for (what, request, expected) in &requests {
        match helper.call(request.clone()) {
            Err(ebs_csi_helper_client::ClientError::Helper(e)) => assert!(same_refusal(&e, expected), "{what}: {e:?}"),
            other => panic!("{what}: not refused: {other:?}"),
        }
    }

    // Frames: sizes, truncation, garbage, unknown kinds, versions, types.
    let mut frames: Vec<(String, Vec<u8>)> = vec![
        ("length 2^32-1".into(), u32::MAX.to_be_bytes().to_vec()),
        (
            "length just over the limit".into(),
            (MAX_FRAME_BYTES + 1).to_be_bytes().to_vec(),
        ),
        ("empty".into(), vec![]),
        ("half a length".into(), vec![0, 0]),
        ("length, no payload".into(), 10u32.to_be_bytes().to_vec()),
        ("zero-length payload".into(), 0u32.to_be_bytes().to_vec()),
    ];
    for seed in 0..20u32 {
        let junk: Vec<u8> = (0..64u32)
            .map(|i| (seed.wrapping_mul(2_654_435_761).wrapping_add(i * 40_503) >> 13).to_le_bytes()[0])
            .collect();
        frames.push((format!("garbage {seed}"), [64u32.to_be_bytes().to_vec(), junk].concat()));
    }
    let mut good = Vec::new();
    write_frame(
        &mut good,
        &frame(Request::Unstage(UnstageRequest {
            staging_path: format!("{root}/staging"),
        })),
    )
    .unwrap();
    for cut in [5, 10, good.len() / 2, good.len() - 1] {
        frames.push((format!("truncated at {cut}"), good[..cut].to_vec()));
    }
    use ciborium::Value;
    let map = |pairs: Vec<(&str, Value)>| Value::Map(pairs.into_iter().map(|(k, v)| (Value::from(k), v)).collect());
    for (name, value) in [
        (
            "unknown kind Format",
            map(vec![("version", PROTOCOL_VERSION.into()), ("request", "Format".into())]),
        ),
        (
            "unknown kind Exec",
            map(vec![
                ("version", PROTOCOL_VERSION.into()),
                ("request", map(vec![("Exec", map(vec![("argv", "sh".into())]))])),
            ]),
        ),
        (
            "version 0",
            map(vec![("version", 0.into()), ("request", "Ping".into())]),
        ),
        (
            "the version before the oldest",
            map(vec![
                ("version", (OLDEST_VERSION - 1).into()),
                ("request", "Ping".into()),
            ]),
        ),
        (
            "the next version",
            map(vec![
                ("version", (PROTOCOL_VERSION + 1).into()),
                ("request", "Ping".into()),
            ]),
        ),
        (
            "version 65535",
            map(vec![("version", 65535.into()), ("request", "Ping".into())]),
        ),
        (
            "version as text",
            map(vec![("version", "1".into()), ("request", "Ping".into())]),
        ),
        ("no version", map(vec![("request", "Ping".into())])),
        (
            "extra field",
            map(vec![
                ("version", PROTOCOL_VERSION.into()),
                ("request", "Ping".into()),
                ("sudo", true.into()),
            ]),
        ),
        ("array instead of map", Value::Array(vec![1.into(), "Ping".into()])),
        (
            "bad volume id",
            map(vec![
                ("version", PROTOCOL_VERSION.into()),
                (
                    "request",
                    map(vec![(
                        "Expand",
                        map(vec![
                            ("volume_id", "vol-../../etc".into()),
                            ("device", "/dev/loop0".into()),
                            ("volume_path", "/".into()),
                        ]),
                    )]),
                ),
            ]),
        ),
        (
            "unstage with extra field",
            map(vec![
                ("version", PROTOCOL_VERSION.into()),
                (
                    "request",
                    map(vec![(
                        "Unstage",
                        map(vec![
                            ("staging_path", format!("{root}/staging").into()),
                            ("force", true.into()),
                        ]),
                    )]),
                ),
            ]),
        ),
    ] {
        frames.push((name.to_owned(), cbor_frame(&value)));
    }
    // Another version is UnsupportedVersion naming it; everything else that
    // is not exactly a frame of this version is InvalidRequest.
    for (what, bytes) in frames {
        let other_version = match what.as_str() {
            "version 0" => Some(0),
            "the version before the oldest" => Some(OLDEST_VERSION - 1),
            "the next version" => Some(PROTOCOL_VERSION + 1),
            "version 65535" => Some(u16::MAX),
            _ => None,
        };
        match (raw_exchange(&helper.socket, bytes, AGENT_UID), other_version) {
            (Some(Response::Err(HelperError::UnsupportedVersion(v))), Some(expected)) => {
                assert_eq!(v, expected, "{what}");
            }
            (Some(Response::Err(HelperError::InvalidRequest(_))), None) => {}
            (other, _) => panic!("{what}: {other:?}"),
        }
    }

    // Peers with other uids are disconnected before anything is read.
    for uid in [0, 1, 1000, 12345, 65533] {
        let ping = frame(Request::Ping);
        let mut bytes = Vec::new();
        write_frame(&mut bytes, &ping).unwrap();
        assert_eq!(raw_exchange(&helper.socket, bytes, uid), None, "uid {uid} was answered");
    }

    // A slow peer is dropped after the deadline, and others are served meanwhile.
    let slow = run_as(AGENT_UID, {
        let socket = helper.socket.clone();
        move || {
            let mut stream = UnixStream::connect(socket).unwrap();
            stream.write_all(&[0, 0]).unwrap();
            let started = Instant::now();
            let mut buf = [0u8; 1];
            let _ = stream.read(&mut buf);
            started.elapsed()
        }
    });
    assert!(
        slow < Duration::from_secs(5),
        "the slow peer held its connection for {slow:?}"
    );

    let client = HelperClient::new(helper.socket.clone(), Duration::from_secs(10));
    let pong = run_as(AGENT_UID, move || client.call(Request::Ping));
    assert!(
        matches!(pong, Ok(Reply::Pong { .. })),
        "the helper stopped serving: {pong:?}"
    );
    assert_eq!(
        ebs_csi_tests::mounts_under(sandbox.path()),
        mounts_before,
        "a mount appeared"
    );
    assert_eq!(host_mounts(), host_before, "the host's mount table changed");
    assert_eq!(volume.signature(), "", "the volume was formatted");
    assert_eq!(other.signature(), "", "another volume was formatted");
    assert_eq!(std::fs::read_to_string(outside.join("secret")).unwrap(), "untouched");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        1,
        "something was created outside the root"
    );
    assert!(!kubelet.join("target").exists() && !kubelet.join("block").exists());
    assert!(Path::new("/etc/passwd").exists());
}

/// Whether `e` is `expected`; a refused mount option is expected as the
/// start of its message (the option), followed by a reason.
fn same_refusal(e: &HelperError, expected: &HelperError) -> bool {
    match (e, expected) {
        (HelperError::MountOptionRefused(message), HelperError::MountOptionRefused(start)) => message
            .strip_prefix(start.as_str())
            .is_some_and(|reason| !reason.is_empty()),
        _ => e == expected,
    }
}
