//! The systemd units in `systemd/`: their exposure scores, and that the
//! helper's unit keeps the host's mount namespace.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ebs_csi_helper_proto::{FormatOptions, FsType, Request, StageRequest, UnstageRequest, VolumeId};
use ebs_csi_tests::{AGENT_UID, LoopVolume, Sandbox, binary, require_root, run_as, spawn};

fn unit(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../systemd")
        .join(name)
        .canonicalize()
        .unwrap()
}

/// `systemd-analyze security --offline=true`'s overall exposure (0–10).
fn exposure(name: &str) -> Option<f64> {
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true"])
        .arg(unit(name))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("Overall exposure level"))?;
    line.split(':').nth(1)?.split_whitespace().next()?.parse().ok()
}

#[test]
fn units_score_within_their_thresholds() {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        return eprintln!("skipped: systemd-analyze is not installed");
    }
    // The helper cannot use the options that create a mount namespace (see
    // the comments in its unit); the others use everything.
    for (name, threshold) in [
        ("ebs-csi-helper.service", 3.0),
        ("ebs-csi-agent.service", 1.5),
        ("ebs-csi-controller.service", 1.5),
    ] {
        let score = exposure(name).unwrap_or_else(|| panic!("no score for {name}"));
        eprintln!("{name}: exposure {score}");
        assert!(score <= threshold, "{name} scores {score}, above {threshold}");
    }
}

/// Options that would give the helper a mount namespace of its own (or
/// take its mount capability away), so that kubelet and Nomad never see
/// its mounts.
const NAMESPACING: [&str; 15] = [
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "PrivateMounts",
    "PrivateUsers",
    "ReadOnlyPaths",
    "ReadWritePaths",
    "InaccessiblePaths",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectProc",
    "ProcSubset",
];

#[test]
fn the_helper_unit_keeps_the_host_mount_namespace() {
    let text = std::fs::read_to_string(unit("ebs-csi-helper.service")).unwrap();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if NAMESPACING.contains(&key) {
            assert!(matches!(value, "no" | "false" | ""), "the helper unit sets {line}");
        }
    }
    assert!(text.contains("\nPrivateNetwork=yes") && text.contains("\nProtectHostname=yes"));
}

#[test]
fn a_mount_made_by_the_helper_as_configured_is_visible_to_the_host() {
    if !require_root() {
        return;
    }
    // The namespaces the unit does create: network (PrivateNetwork=) and
    // UTS (ProtectHostname=).
    if Command::new("unshare")
        .args(["--net", "--uts", "true"])
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        return eprintln!("skipped: cannot create network and UTS namespaces here");
    }
    let sandbox = Sandbox::new();
    let socket = sandbox.path().join("helper.sock");
    let mut command = Command::new("unshare");
    command
        .args(["--net", "--uts", "--"])
        .arg(binary("ebs-csi-helper"))
        .args(ebs_csi_tests::Helper::args(sandbox.path(), &socket))
        .stdin(Stdio::null());
    let _helper = spawn("helper", command, sandbox.path().join("helper.log"), &socket);
    let volume = LoopVolume::create(sandbox.path(), "vol-0aaaaaaaaaaaaaaa1", 64);
    let staging = sandbox.mkdir("kubelet/staging");
    let request = Request::Stage(StageRequest {
        volume_id: VolumeId::parse("vol-0aaaaaaaaaaaaaaa1").unwrap(),
        device: volume.device.to_string_lossy().into_owned(),
        staging_path: staging.to_string_lossy().into_owned(),
        fs_type: FsType::Ext4,
        mount_flags: vec![],
        format: FormatOptions::default(),
    });
    let call = |request: Request| {
        let socket = socket.clone();
        run_as(AGENT_UID, move || {
            ebs_csi_helper_proto::HelperClient::new(socket, std::time::Duration::from_secs(60)).call(request)
        })
    };
    call(request).unwrap();
    // PID 1's view is the host's mount namespace.
    let host = std::fs::read_to_string("/proc/1/mountinfo").unwrap();
    assert!(
        host.lines()
            .any(|l| l.split(' ').nth(4) == Some(&*staging.to_string_lossy())),
        "the host does not see the mount"
    );
    call(Request::Unstage(UnstageRequest {
        staging_path: staging.to_string_lossy().into_owned(),
    }))
    .unwrap();
}
