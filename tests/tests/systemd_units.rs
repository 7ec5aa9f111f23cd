//! Fast pre-checks of the systemd units in `systemd/`, without running
//! systemd: their offline exposure scores, that the helper's unit sets no
//! option that would give it a mount namespace of its own, and that
//! `make install` lays out a tree systemd's tools accept. The proof is
//! `tests/tests/systemd_vm.rs`, which runs the units under real systemd.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ebs_csi_tests::require_root;

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
    assert!(
        Command::new("systemd-analyze").arg("--version").output().is_ok(),
        "systemd-analyze is not installed (make deps installs it)"
    );
    // The helper cannot use the options that create a mount namespace (see
    // the comments in its unit), must be allowed capset (0.1 of its
    // score) to lower its own and its tools' capabilities, and bounds
    // what its tools need (docs/install-systemd.md: 0.6); the others use
    // everything.
    for (name, threshold) in [
        ("ebs-csi-helper.service", 3.8),
        ("ebs-csi-agent.service", 1.5),
        ("ebs-csi-controller.service", 1.5),
        ("ebs-csi-registrar.service", 1.5),
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

/// Runs `program` with `args`; panics with its output unless it succeeds.
fn run_ok(program: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{program} {args:?} failed:\n{text}");
    text
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn make_install_lays_out_a_node_that_systemd_accepts() {
    use std::os::unix::fs::MetadataExt;
    require_root();
    let root = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let destdir = format!("DESTDIR={}", root.path().display());
    run_ok(
        "make",
        &[
            "-C".as_ref(),
            repo.as_os_str(),
            "--no-print-directory".as_ref(),
            "install".as_ref(),
            "PROFILE=dev".as_ref(),
            destdir.as_ref(),
        ],
    );
    let usr = root.path().join("usr");
    for name in ["ebs-csi-agent", "ebs-csi-helper", "ebs-csi-controller"] {
        let mode = std::fs::metadata(usr.join("bin").join(name)).unwrap().mode();
        assert_eq!(mode & 0o777, 0o755, "{name}");
    }
    let units: Vec<PathBuf> = std::fs::read_dir(usr.join("lib/systemd/system"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(units.len(), 6, "{units:?}");
    assert!(usr.join("lib/udev/rules.d/90-ebs-csi-nvme.rules").is_file());

    // The users and directories, made by systemd's own tools in the tree.
    std::fs::create_dir_all(root.path().join("etc")).unwrap();
    let root_flag = format!("--root={}", root.path().display());
    run_ok("systemd-sysusers", &[root_flag.as_ref()]);
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd")).unwrap();
    assert!(
        passwd.contains(&format!("ebs-csi-agent:x:{AGENT_UID_ON_NODES}:{AGENT_UID_ON_NODES}:")),
        "{passwd}"
    );
    let group = std::fs::read_to_string(root.path().join("etc/group")).unwrap();
    assert!(
        group.contains(&format!("ebs-csi:x:{AGENT_UID_ON_NODES}:ebs-csi-agent")),
        "{group}"
    );
    // The helper's tools' uid and gid (its --tool-uid and --tool-gid).
    assert!(passwd.contains("ebs-csi-tools:x:991:991:"), "{passwd}");
    assert!(group.contains("ebs-csi-tools:x:991:"), "{group}");
    run_ok("systemd-tmpfiles", &["--create".as_ref(), root_flag.as_ref()]);
    assert!(root.path().join("run/ebs-csi").is_dir());

    // Every unit, with the binaries it names in the tree and the host's
    // standard units (targets, slices) beside it; a warning fails too.
    // node-driver-registrar is the operator's to install: an executable
    // file stands for it.
    let registrar = usr.join("bin/csi-node-driver-registrar");
    std::fs::write(&registrar, "").unwrap();
    std::fs::set_permissions(&registrar, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let host_units = root.path().join("etc/systemd/system");
    std::fs::create_dir_all(&host_units).unwrap();
    run_ok(
        "cp",
        &["-a".as_ref(), "/lib/systemd/system/.".as_ref(), host_units.as_os_str()],
    );
    let mut args: Vec<&std::ffi::OsStr> = vec!["verify".as_ref(), root_flag.as_ref()];
    args.extend(units.iter().map(|u| u.as_os_str()));
    let warnings = run_ok("systemd-analyze", &args);
    assert!(warnings.trim().is_empty(), "systemd-analyze verify:\n{warnings}");

    // What the RPM's %post enables: `systemctl preset` with the shipped
    // preset, beside the "disable *" that Fedora and Amazon Linux 2023 ship
    // as 99-default-disable.preset: the helper's socket, nothing else.
    let presets = usr.join("lib/systemd/system-preset");
    std::fs::write(presets.join("99-default-disable.preset"), "disable *\n").unwrap();
    let names: Vec<String> = units
        .iter()
        .map(|u| u.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut preset: Vec<&str> = vec!["preset", root_flag.as_str()];
    preset.extend(names.iter().map(String::as_str));
    run_ok(
        "systemctl",
        &preset.iter().map(AsRef::as_ref).collect::<Vec<&std::ffi::OsStr>>(),
    );
    let enabled: Vec<String> = ["sockets.target.wants", "multi-user.target.wants"]
        .iter()
        .filter_map(|wants| std::fs::read_dir(host_units.join(wants)).ok())
        .flatten()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("ebs-csi"))
        .collect();
    assert_eq!(enabled, ["ebs-csi-helper.socket"], "enabled by the preset");
}

/// On a node where uid and gid 990 are another account's, systemd-sysusers
/// gives the agent other ids (it only warns, measured with systemd 252)
/// but never another account's group: the primary group is `ebs-csi`.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_taken_990_never_puts_the_agent_in_a_foreign_group() {
    require_root();
    let root = tempfile::tempdir().unwrap();
    let etc = root.path().join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(etc.join("passwd"), "other:x:990:990::/:/usr/sbin/nologin\n").unwrap();
    std::fs::write(etc.join("group"), "other:x:990:\n").unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/ebs-csi.sysusers");
    let root_flag = format!("--root={}", root.path().display());
    let output = run_ok("systemd-sysusers", &[root_flag.as_ref(), config.as_os_str()]);
    let field = |file: &str, name: &str, index: usize| -> String {
        let text = std::fs::read_to_string(etc.join(file)).unwrap();
        let line = text.lines().find(|l| l.starts_with(&format!("{name}:"))).unwrap();
        line.split(':').nth(index).unwrap().to_owned()
    };
    let group_gid = field("group", "ebs-csi", 2);
    assert_ne!(group_gid, "990", "{output}");
    assert_eq!(field("passwd", "ebs-csi-agent", 3), group_gid, "{output}");
    assert_ne!(field("passwd", "ebs-csi-agent", 2), "990", "{output}");
}

/// The agent's uid and the ebs-csi group's gid on installed nodes
/// (`systemd/ebs-csi.sysusers`, the helper unit's `--allowed-uid`).
const AGENT_UID_ON_NODES: u32 = 990;
