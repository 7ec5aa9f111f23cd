//! `ebs-csi-vm-systemd`: the scenarios of a systemd test VM
//! (`tests/tests/systemd_vm.rs`), run as root by the payload's `run` once
//! ebs-csi's Debian packages are installed (the node's of the previous
//! commit, which scenario 6 upgrades first) and its units started: systemd is PID 1,
//! systemd-udevd makes the device links, the helper and the agent run as
//! the shipped units (with the VM's drop-ins for QEMU's NVMe identity and
//! the missing instance metadata).
//!
//! It speaks the console protocol of the tests' `ebs_csi_tests::qemu` on stdout.
//! Any failed check panics, and the payload reports a non-zero `@@EXIT`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test driver: a failed step fails the suite"
)]

use std::collections::HashMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ebs_csi_helper_client::{ClientError, HelperClient};
use ebs_csi_helper_proto::{FrameError, Request};
use ebs_csi_proto::v1::identity_client::IdentityClient;
use ebs_csi_proto::v1::node_client::NodeClient;
use ebs_csi_proto::v1::volume_usage::Unit;
use ebs_csi_proto::v1::{
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest,
    ProbeRequest,
};
use ebs_csi_test_guest::guest::{
    device_number, mount_capability, mounted_device_in, report, serial, volume_stats, wait_for_disk,
};
use ebs_csi_test_guest::run;
use ebs_csi_test_guest::{channel, wait_until};
use rustix::process::{Gid, Uid};
use tonic::transport::Channel;

const HELPER: &str = "ebs-csi-helper.service";
const AGENT: &str = "ebs-csi-agent.service";
const CONTROLLER: &str = "ebs-csi-controller.service";
/// The Debian packages the payload's `run` installed (`make deb`).
const NODE_PACKAGE: &str = "ebs-csi-node";
const CONTROLLER_PACKAGE: &str = "ebs-csi-controller";
const CSI_SOCKET: &str = "/var/lib/kubelet/plugins/ebs.csi.aws.com/csi.sock";
const HELPER_SOCKET: &str = "/run/ebs-csi/helper.sock";
/// The agent's user and group (systemd/ebs-csi.sysusers).
const AGENT_UID: u32 = 990;
/// Plugged at start: A is staged and published, B only ever refused.
const VOLUME_A: &str = "vol-0aaaaaaaaaaaaaaa1";
const VOLUME_B: &str = "vol-0bbbbbbbbbbbbbbb2";
/// Hot-plugged while NodeStage waits for it.
const VOLUME_C: &str = "vol-0ccccccccccccccc3";
/// Capabilities as bits of a `/proc` capability mask
/// (include/uapi/linux/capability.h).
const CAP_DAC_OVERRIDE: u64 = 1 << 1;
const CAP_DAC_READ_SEARCH: u64 = 1 << 2;
const CAP_KILL: u64 = 1 << 5;
const CAP_SETGID: u64 = 1 << 6;
const CAP_SETUID: u64 = 1 << 7;
const CAP_SYS_ADMIN: u64 = 1 << 21;
const CAP_SYS_RESOURCE: u64 = 1 << 24;
/// `systemd-analyze security` ceilings of the running units: the agent's
/// goal, and the helper's measured score (docs/install-systemd.md says why
/// a daemon whose mounts must reach the host cannot score lower).
const AGENT_EXPOSURE_MAX: f64 = 1.5;
const HELPER_EXPOSURE_MAX: f64 = 3.8;

#[tokio::main]
async fn main() {
    let suite = std::fs::read_to_string("/etc/os-release").unwrap();
    let version = run("systemctl", &["--version"]);
    println!("@@INFO {}", version.lines().next().unwrap_or_default());
    let systemd: u32 = version.split_whitespace().nth(1).unwrap().parse().unwrap();
    println!(
        "@@INFO {}",
        suite.lines().find(|l| l.starts_with("PRETTY_NAME")).unwrap_or_default()
    );
    println!("@@PLUG a {}", serial(VOLUME_A));
    println!("@@PLUG b {}", serial(VOLUME_B));
    let mut node = NodeClient::new(channel(Path::new(CSI_SOCKET)).await);
    upgraded_from_the_previous_package(&mut node).await;
    uptime("scenario 6");
    units_run_sandboxed().await;
    uptime("scenario 1");
    visible_mounts_under_kubelet_modes(&mut node).await;
    uptime("scenario 2");
    udev_links_and_hot_plug(&mut node).await;
    uptime("scenario 3");
    agent_unprivileged_and_other_peers_refused();
    uptime("scenario 4");
    regressed_units_fail_these_checks(&mut node, systemd).await;
    uptime("scenario 5");
    purged_with_a_volume_staged(&mut node).await;
    uptime("scenario 7");
}

/// Reports the guest's uptime (seconds, /proc/uptime) at the end of
/// `step`, for the suite's timeline in its report.
fn uptime(step: &str) {
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap();
    println!(
        "@@TIME {step} done at {} s",
        uptime.split_whitespace().next().unwrap_or_default()
    );
}

/// 1. Socket activation starts the helper on the agent's first call (the
///    agent's own socket is systemd's too); the sandbox is in force as
///    `systemctl show` and `/proc` report it; exposure recorded.
async fn units_run_sandboxed() {
    assert_eq!(
        show(HELPER, &["ActiveState"])["ActiveState"],
        "inactive",
        "started before use"
    );
    let mut identity = IdentityClient::new(channel(Path::new(CSI_SOCKET)).await);
    let ready = identity.probe(ProbeRequest {}).await.unwrap().into_inner().ready;
    assert_eq!(ready, Some(true), "the agent's Probe reached no helper");
    let helper = helper_running().unwrap();
    let sandbox = show(
        HELPER,
        &[
            "NoNewPrivileges",
            "CapabilityBoundingSet",
            "AmbientCapabilities",
            "PrivateMounts",
            "PrivateNetwork",
            "ProtectSystem",
            "RestrictNamespaces",
            "DevicePolicy",
            "SystemCallFilter",
        ],
    );
    let expected = [
        ("NoNewPrivileges", "yes"),
        (
            "CapabilityBoundingSet",
            "cap_dac_override cap_dac_read_search cap_kill cap_setgid cap_setuid cap_sys_admin cap_sys_resource",
        ),
        ("AmbientCapabilities", ""),
        ("PrivateMounts", "no"),
        ("PrivateNetwork", "yes"),
        ("ProtectSystem", "no"),
        ("RestrictNamespaces", "yes"),
        ("DevicePolicy", "closed"),
    ];
    for (property, value) in expected {
        assert_eq!(sandbox[property], value, "{HELPER} {property}");
    }
    let filter: Vec<&str> = sandbox["SystemCallFilter"].split(' ').collect();
    assert!(filter.contains(&"capset") && filter.contains(&"mount"), "{filter:?}");
    assert!(
        !filter.contains(&"reboot") && !filter.contains(&"init_module"),
        "{filter:?}"
    );
    // Every thread of the helper and of its runner: bounded to the unit's
    // seven, no_new_privs and seccomp on (systemd's filter binds the runner
    // too); the helper's threads hold CAP_SYS_ADMIN alone, not even
    // permitted more, and the runner, a process of its own, the seven (the
    // tools' capabilities are effective only in their children).
    let seven =
        CAP_SYS_ADMIN | CAP_SYS_RESOURCE | CAP_DAC_READ_SEARCH | CAP_DAC_OVERRIDE | CAP_SETUID | CAP_SETGID | CAP_KILL;
    let mut runners = Vec::new();
    wait_until("the helper's runner", Duration::from_secs(10), || {
        runners = ebs_csi_test_guest::children::descendants_named(helper, "ebs-csi-runner");
        !runners.is_empty()
    });
    assert_eq!(runners.len(), 1, "one runner: {runners:?}");
    for (pid, held) in [(helper, CAP_SYS_ADMIN), (runners[0], seven)] {
        for status in thread_statuses(pid) {
            assert_eq!(field(&status, "CapBnd"), seven, "{status}");
            assert_eq!(
                (field(&status, "CapEff"), field(&status, "CapPrm")),
                (held, held),
                "{status}"
            );
            assert_eq!((field(&status, "CapInh"), field(&status, "CapAmb")), (0, 0), "{status}");
            assert_eq!(decimal(&status, "NoNewPrivs"), 1, "{status}");
            assert_eq!(decimal(&status, "Seccomp"), 2, "{status}");
        }
    }
    let helper_exposure = exposure(HELPER);
    let agent_exposure = exposure(AGENT);
    assert!(
        helper_exposure <= HELPER_EXPOSURE_MAX,
        "helper exposure {helper_exposure}"
    );
    assert!(agent_exposure <= AGENT_EXPOSURE_MAX, "agent exposure {agent_exposure}");
    let units = [HELPER, "ebs-csi-helper.socket", AGENT, "ebs-csi-agent.socket"];
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .args(units.map(|u| format!("/usr/lib/systemd/system/{u}")))
        .output()
        .unwrap();
    let warnings = String::from_utf8_lossy(&verify.stderr);
    assert!(verify.status.success() && !warnings.contains("ebs-csi"), "{warnings}");
    report(
        1,
        &format!(
            "helper socket-activated (pid {helper}), sandbox in force; exposure: helper {helper_exposure}, \
             agent {agent_exposure}; systemd-analyze verify clean"
        ),
    );
}

/// 2. On kubelet's 0750 root-owned directories, NodeStage, NodePublish and
///    NodeGetVolumeStats work through the agent's socket; both mounts are
///    in PID 1's mount table and seen by a process outside both units; a
///    file written through the target lands on the disk; the mounts
///    survive a helper restart and the next requests work.
async fn visible_mounts_under_kubelet_modes(node: &mut NodeClient<Channel>) {
    let (_, namespace) = wait_for_disk(&serial(VOLUME_A), Duration::from_secs(20)).unwrap();
    let (staging, target) = kubelet_paths(VOLUME_A);
    stage(node, VOLUME_A, &staging).await.unwrap();
    publish(node, VOLUME_A, &staging, &target).await;
    let device = device_number(&namespace);
    for path in [&staging, &target] {
        visible_on_the_host(path, device).unwrap();
    }
    let usage = stats(node, VOLUME_A, &target).await;
    let marker = format!("written through {} by a pod", target.display());
    std::fs::write(target.join("proof"), marker.repeat(64)).unwrap();
    let before = helper_running().unwrap();
    run("systemctl", &["restart", HELPER]);
    for path in [&staging, &target] {
        visible_on_the_host(path, device).unwrap();
    }
    stats(node, VOLUME_A, &target).await;
    let after = helper_running().unwrap();
    assert_ne!(before, after, "the helper did not restart");
    unpublish(node, VOLUME_A, &target).await;
    unstage(node, VOLUME_A, &staging).await;
    let disk = std::fs::read(&namespace).unwrap();
    assert!(
        disk.windows(marker.len()).any(|w| w == marker.as_bytes()),
        "the file written through the target is not on {}",
        namespace.display()
    );
    report(
        2,
        &format!(
            "staged and published under 0750 kubelet directories, visible in /proc/1/mountinfo and to a \
             transient unit; {usage}; data on {}; mounts kept across a helper restart (pid {before} → {after})",
            namespace.display()
        ),
    );
}

/// 3. udev (the distribution's rules and the project's) links the disks by
///    id and gives the ebs-csi group the controller; a disk hot-plugged while
///    NodeStage waits is staged (its ext4, half the disk's size, grown
///    online), and the agent's `devices` lists the same device; unplugged,
///    its link goes.
async fn udev_links_and_hot_plug(node: &mut NodeClient<Channel>) {
    let (controller, namespace) = wait_for_disk(&serial(VOLUME_A), Duration::ZERO).unwrap();
    assert_eq!(
        by_id(VOLUME_A).map(|l| l.canonicalize().unwrap()),
        Some(namespace.clone())
    );
    let meta = rustix::fs::stat(&controller).unwrap();
    let group = run("getent", &["group", "ebs-csi"]);
    assert_eq!(
        (meta.st_mode & 0o777, meta.st_gid.to_string()),
        (0o640, group.split(':').nth(2).unwrap().to_owned()),
        "{} is not the ebs-csi group's",
        controller.display()
    );
    let (staging, _) = kubelet_paths(VOLUME_C);
    let mut client = node.clone();
    let waiting = staging.clone();
    let stage_call = tokio::spawn(async move { stage(&mut client, VOLUME_C, &waiting).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !stage_call.is_finished(),
        "NodeStage of {VOLUME_C} returned before its disk existed"
    );
    let plugged = Instant::now();
    println!("@@PLUG c {} ext4-half", serial(VOLUME_C));
    stage_call.await.unwrap().unwrap();
    let took = plugged.elapsed();
    // Its ext4 filled half the disk (a snapshot restored into a larger
    // volume); NodeStage grew it online.
    let grown = rustix::fs::statvfs(&staging).unwrap();
    let size_mib = (grown.f_blocks * grown.f_frsize) >> 20;
    assert!(size_mib > 400, "the filesystem was not grown at stage: {size_mib} MiB");
    let (_, namespace) = wait_for_disk(&serial(VOLUME_C), Duration::ZERO).unwrap();
    visible_on_the_host(&staging, device_number(&namespace)).unwrap();
    wait_until(
        "the by-id link of the hot-plugged disk",
        Duration::from_secs(10),
        || by_id(VOLUME_C).is_some(),
    );
    let listed = agent_devices();
    assert_eq!(
        listed.get(VOLUME_C),
        Some(&namespace.display().to_string()),
        "devices: {listed:?}"
    );
    unstage(node, VOLUME_C, &staging).await;
    println!("@@UNPLUG c");
    wait_until("the unplugged disk's link to go", Duration::from_secs(20), || {
        by_id(VOLUME_C).is_none()
    });
    assert_eq!(agent_devices().get(VOLUME_C), None);
    report(
        3,
        &format!(
            "by-id links and group ebs-csi from udev; {VOLUME_C} hot-plugged during NodeStage, staged after \
             {took:?} on {}, its ext4 grown to {size_mib} MiB, as `ebs-csi-agent devices` lists it; link removed \
             on unplug",
            namespace.display()
        ),
    );
}

/// 4. The agent runs as its own user with no capabilities and cannot read
///    a raw device; the helper answers no uid but the agent's: root and a
///    member of the ebs-csi group are disconnected unanswered, anyone else
///    cannot connect; the disk they named is untouched.
fn agent_unprivileged_and_other_peers_refused() {
    let agent = main_pid(AGENT);
    for status in thread_statuses(agent) {
        let uids: Vec<u32> = status_line(&status, "Uid")
            .split_whitespace()
            .map(|u| u.parse().unwrap())
            .collect();
        assert_eq!(uids, [AGENT_UID; 4], "{status}");
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(field(&status, set), 0, "{set}: {status}");
        }
    }
    let (_, namespace) = wait_for_disk(&serial(VOLUME_B), Duration::from_secs(20)).unwrap();
    let read = Command::new("systemd-run")
        .args([
            "--wait",
            "--pipe",
            "--quiet",
            "-p",
            "User=ebs-csi-agent",
            "-p",
            "Group=ebs-csi",
        ])
        .args(["/usr/bin/head", "-c", "1"])
        .arg(&namespace)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&read.stderr);
    assert!(
        !read.status.success() && stderr.contains("Permission denied"),
        "{stderr}"
    );
    let (staging, _) = kubelet_paths(VOLUME_B);
    let stage =
        || ebs_csi_test_guest::stage_request(VOLUME_B, &namespace, &staging, ebs_csi_helper_proto::FsType::Ext4, &[]);
    let call = |uid: u32, gid: u32, request: Request| {
        std::thread::spawn(move || {
            let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
            rustix::thread::set_thread_res_gid(gid, gid, gid).unwrap();
            rustix::thread::set_thread_res_uid(uid, uid, uid).unwrap();
            HelperClient::new(HELPER_SOCKET, Duration::from_secs(10)).call(request)
        })
        .join()
        .unwrap()
    };
    for (uid, gid) in [(0, 0), (AGENT_UID + 1, AGENT_UID)] {
        // Closed unanswered: the write fails (EPIPE, or ECONNRESET with the
        // request unread) or the read finds the end of the stream,
        // depending on which side was first.
        match call(uid, gid, stage()) {
            Err(ClientError::Frame(FrameError::Truncated)) => {}
            Err(ClientError::Frame(FrameError::Io(e)))
                if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {}
            other => panic!("uid {uid} was answered: {other:?}"),
        }
        let log = run("journalctl", &["-u", HELPER, "-o", "cat", "--no-pager"]);
        assert!(log.contains(&format!("refused peer peer_uid={uid}")), "{log}");
    }
    match call(65534, 65534, stage()) {
        Err(ClientError::Connect { source, .. }) if source.kind() == ErrorKind::PermissionDenied => {}
        other => panic!("uid 65534 connected: {other:?}"),
    }
    let probe = Command::new("blkid").arg("-p").arg(&namespace).output().unwrap();
    assert_eq!(
        probe.status.code(),
        Some(2),
        "{} is no longer blank: {probe:?}",
        namespace.display()
    );
    assert_eq!(mounted_on_host(&staging), None);
    assert_eq!(
        show(HELPER, &["NRestarts"])["NRestarts"],
        "0",
        "the helper restarted on its own"
    );
    report(
        4,
        &format!(
            "agent uid {AGENT_UID} with no capabilities, cannot read {}; the helper disconnected uid 0 and \
             {} unanswered, uid 65534 could not connect; the disk is blank",
            namespace.display(),
            AGENT_UID + 1
        ),
    );
}

/// 5. The checks above catch both failures of audit finding F3: with
///    `~@privileged` the helper cannot lower its capabilities and never
///    stays up; with a private mount namespace its mounts are invisible to
///    the host. `PrivateMounts=` unset lets `PrivateNetwork=yes` imply one
///    on systemd ≥ 254 (not on 252); `PrivateMounts=yes` is one anywhere.
///    Each regression is a drop-in, then removed.
async fn regressed_units_fail_these_checks(node: &mut NodeClient<Channel>, systemd: u32) {
    let dropin = Path::new("/etc/systemd/system/ebs-csi-helper.service.d/zz-regression.conf");
    regress(dropin, "SystemCallFilter=~@privileged");
    let _ = Command::new("systemctl").args(["restart", HELPER]).output().unwrap();
    let capset = helper_given_up().unwrap();
    let log = run("journalctl", &["-u", HELPER, "-o", "cat", "--no-pager", "-n", "20"]);
    assert!(log.contains("reducing capabilities"), "{log}");
    run("systemctl", &["reset-failed", HELPER]);
    let (_, namespace) = wait_for_disk(&serial(VOLUME_A), Duration::ZERO).unwrap();
    let (staging, _) = kubelet_paths(VOLUME_A);
    let mut seen = Vec::new();
    for (setting, private) in [("PrivateMounts=", systemd >= 254), ("PrivateMounts=yes", true)] {
        regress(dropin, setting);
        run("systemctl", &["restart", HELPER]);
        stage(node, VOLUME_A, &staging).await.unwrap();
        let visible = visible_on_the_host(&staging, device_number(&namespace));
        assert_eq!(visible.is_err(), private, "{setting} on systemd {systemd}: {visible:?}");
        seen.push(format!(
            "with {setting}: {}",
            visible.err().unwrap_or_else(|| "visible".into())
        ));
        // Restarting the helper ends a private namespace and its mount.
        run("systemctl", &["restart", HELPER]);
        unstage(node, VOLUME_A, &staging).await;
    }
    std::fs::remove_file(dropin).unwrap();
    run("systemctl", &["daemon-reload"]);
    run("systemctl", &["restart", HELPER]);
    helper_running().unwrap();
    report(
        5,
        &format!(
            "with ~@privileged: {capset}; {}; shipped unit restored",
            seen.join("; ")
        ),
    );
}

/// Writes the drop-in `path` with one `[Service]` setting and reloads.
/// 6. Upgraded by apt from the previous commit's package (`make
///    previous-package`), which the payload's `run` installed, with a
///    volume staged and published by that package's helper and agent: dpkg
///    runs the old package's `prerm upgrade` and this one's `postinst
///    configure <old version>`, which restarts the helper and the agent;
///    the mounts and their data stay, and the new helper and agent
///    unpublish and unstage the volume. Then, as installed: the helper's
///    socket enabled as the preset says, every other unit disabled, the
///    controller never started, every file as packaged (`dpkg --verify`).
///    Runs first, so that the other scenarios test this build, and stops
///    the helper, as a boot would leave it, for scenario 1.
async fn upgraded_from_the_previous_package(node: &mut NodeClient<Channel>) {
    let previous = installed_version(NODE_PACKAGE);
    let package = package_file(NODE_PACKAGE);
    let version = run("dpkg-deb", &["--field", &package, "Version"]).trim().to_owned();
    let older = Command::new("dpkg")
        .args(["--compare-versions", &previous, "lt", &version])
        .status()
        .unwrap();
    assert!(older.success(), "{previous} does not precede {version}");
    let (_, namespace) = wait_for_disk(&serial(VOLUME_A), Duration::ZERO).unwrap();
    let (staging, target) = kubelet_paths(VOLUME_A);
    stage(node, VOLUME_A, &staging).await.unwrap();
    publish(node, VOLUME_A, &staging, &target).await;
    std::fs::write(target.join("upgraded"), "written before the upgrade").unwrap();
    let (helper, agent) = (helper_running().unwrap(), main_pid(AGENT));
    apt(&["install", &package]);
    assert_eq!(installed_version(NODE_PACKAGE), version);
    let device = device_number(&namespace);
    for path in [&staging, &target] {
        visible_on_the_host(path, device).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(target.join("upgraded")).unwrap(),
        "written before the upgrade"
    );
    let (new_helper, new_agent) = (helper_running().unwrap(), main_pid(AGENT));
    assert!(
        new_helper != helper && new_agent != agent,
        "not restarted by the upgrade"
    );
    // The VM's drop-ins (the payload's `run`) were made from the previous
    // package's units: they must still run what this one's units run.
    for unit in [HELPER, AGENT] {
        let shipped = std::fs::read_to_string(format!("/usr/lib/systemd/system/{unit}")).unwrap();
        let shipped = shipped.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap();
        let dropin = std::fs::read_to_string(format!("/etc/systemd/system/{unit}.d/vm.conf")).unwrap();
        assert!(
            dropin.contains(&format!("ExecStart={shipped} ")),
            "{unit}: the VM's drop-in runs other than {shipped}"
        );
    }
    *node = NodeClient::new(channel(Path::new(CSI_SOCKET)).await);
    unpublish(node, VOLUME_A, &target).await;
    unstage(node, VOLUME_A, &staging).await;
    let enabled = [
        ("ebs-csi-helper.socket", "enabled"),
        ("ebs-csi-agent.socket", "disabled"),
        (AGENT, "disabled"),
        ("ebs-csi-registrar.service", "disabled"),
        (CONTROLLER, "disabled"),
    ];
    for (unit, state) in enabled {
        assert_eq!(is_enabled(unit), state, "{unit}");
    }
    let controller = show(CONTROLLER, &["ActiveState", "InactiveExitTimestampMonotonic"]);
    assert_eq!(
        (
            controller["ActiveState"].as_str(),
            controller["InactiveExitTimestampMonotonic"].as_str()
        ),
        ("inactive", "0"),
        "the controller was started"
    );
    // The VM's image keeps no documentation (dpkg's path-exclude of
    // /usr/share/doc, tests/vm/build-systemd-image.sh): dpkg reports those
    // files missing, as it would on any such minimal image.
    let verify = run("dpkg", &["--verify", NODE_PACKAGE, CONTROLLER_PACKAGE]);
    let differ: Vec<&str> = verify.lines().filter(|l| !l.contains(" /usr/share/doc/")).collect();
    assert_eq!(differ, Vec::<&str>::new(), "installed files differ from the packages'");
    run("systemctl", &["stop", HELPER]);
    report(
        6,
        &format!(
            "upgraded by apt from {previous} to {version} with {VOLUME_A} staged and published: helper \
             {helper} → {new_helper}, agent {agent} → {new_agent}, mounts and data kept, unpublished and \
             unstaged by the new ones; only the helper's socket enabled, the controller never started, \
             dpkg --verify clean"
        ),
    );
}

/// 7. Purged by apt with a volume staged: the units stopped and gone,
///    nothing of ebs-csi running, its sockets, programs, enablement and
///    deb-systemd-helper's records removed; the volume stays mounted with
///    its data (removal unmounts nothing), and the users stay, as Debian
///    leaves every system user a package made.
async fn purged_with_a_volume_staged(node: &mut NodeClient<Channel>) {
    let (_, namespace) = wait_for_disk(&serial(VOLUME_A), Duration::ZERO).unwrap();
    let (staging, _) = kubelet_paths(VOLUME_A);
    stage(node, VOLUME_A, &staging).await.unwrap();
    std::fs::write(staging.join("purged"), "written before the purge").unwrap();
    apt(&["purge", NODE_PACKAGE, CONTROLLER_PACKAGE]);
    let units = [
        HELPER,
        "ebs-csi-helper.socket",
        AGENT,
        "ebs-csi-agent.socket",
        "ebs-csi-registrar.service",
        CONTROLLER,
    ];
    for unit in units {
        assert_eq!(show(unit, &["LoadState"])["LoadState"], "not-found", "{unit}");
    }
    let running: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.starts_with("ebs-csi-") && !comm.starts_with("ebs-csi-vm"))
        .collect();
    assert_eq!(running, Vec::<String>::new(), "still running after the purge");
    let gone = [
        HELPER_SOCKET,
        "/run/ebs-csi",
        CSI_SOCKET,
        "/usr/bin/ebs-csi-helper",
        "/usr/bin/ebs-csi-agent",
        "/usr/bin/ebs-csi-controller",
        "/etc/systemd/system/sockets.target.wants/ebs-csi-helper.socket",
    ];
    for path in gone {
        assert!(!Path::new(path).exists(), "{path} is left after the purge");
    }
    for unit in units {
        let recorded = Command::new("deb-systemd-helper")
            .args(["debian-installed", unit])
            .status()
            .unwrap();
        assert!(!recorded.success(), "deb-systemd-helper still records {unit}");
    }
    let listed = Command::new("dpkg-query").args(["-W", NODE_PACKAGE]).output().unwrap();
    assert!(!listed.status.success(), "{NODE_PACKAGE} is still known to dpkg");
    visible_on_the_host(&staging, device_number(&namespace)).unwrap();
    assert_eq!(
        std::fs::read_to_string(staging.join("purged")).unwrap(),
        "written before the purge"
    );
    assert_eq!(run("id", &["-u", "ebs-csi-agent"]).trim(), AGENT_UID.to_string());
    run("umount", &[&staging.display().to_string()]);
    report(
        7,
        &format!(
            "purged by apt with {VOLUME_A} staged: units, sockets, programs and enablement gone, nothing \
             running; the volume still mounted with its data; user ebs-csi-agent kept"
        ),
    );
}

/// The version of PACKAGE dpkg has installed.
fn installed_version(package: &str) -> String {
    run("dpkg-query", &["-W", "-f", "${Version}", package])
}

/// `systemctl is-enabled UNIT`'s answer (it exits 1 for `disabled`).
fn is_enabled(unit: &str) -> String {
    let out = Command::new("systemctl").args(["is-enabled", unit]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// apt-get with ARGS, quiet and non-interactive; fails the scenario on
/// failure.
fn apt(args: &[&str]) {
    let out = Command::new("apt-get")
        .args(["-y", "-qq", "--no-install-recommends"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "apt-get {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The path of PACKAGE's .deb on the payload disk (beside this program).
fn package_file(package: &str) -> String {
    let payload = std::env::current_exe().unwrap().parent().unwrap().to_owned();
    let prefix = format!("{package}_");
    let deb = std::fs::read_dir(&payload)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {package} package in {}", payload.display()));
    deb.display().to_string()
}

fn regress(path: &Path, setting: &str) {
    std::fs::write(path, format!("[Service]\n{setting}\n")).unwrap();
    run("systemctl", &["daemon-reload"]);
}

/// The helper's pid once it is active and has stayed so for a second.
fn helper_running() -> Result<u32, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = show(HELPER, &["ActiveState", "SubState", "MainPID"]);
        let pid: u32 = state["MainPID"].parse().unwrap_or(0);
        if state["ActiveState"] == "active" && pid != 0 {
            std::thread::sleep(Duration::from_secs(1));
            if main_pid(HELPER) == pid {
                return Ok(pid);
            }
        }
        if Instant::now() >= deadline {
            return Err(format!("{HELPER} is {}/{}", state["ActiveState"], state["SubState"]));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The helper's state once systemd has given up restarting it (its start
/// limit: `StartLimitBurst=` 5 starts in `StartLimitIntervalSec=` 10 s, the
/// defaults, systemd.unit(5)), as `<unit> is failed/failed`; an error
/// naming its state if it has not failed 30 s on.
fn helper_given_up() -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = show(HELPER, &["ActiveState", "SubState"]);
        let described = format!("{HELPER} is {}/{}", state["ActiveState"], state["SubState"]);
        if state["ActiveState"] == "failed" {
            return Ok(described);
        }
        if Instant::now() >= deadline {
            return Err(described);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether `path` is mounted from `device` in PID 1's mount table and in
/// that of a process started as its own transient unit.
fn visible_on_the_host(path: &Path, device: Option<(u32, u32)>) -> Result<(), String> {
    if mounted_on_host(path) != device {
        return Err(format!("{} is not in /proc/1/mountinfo", path.display()));
    }
    let outside = run(
        "systemd-run",
        &["--wait", "--pipe", "--quiet", "/bin/cat", "/proc/self/mountinfo"],
    );
    let point = format!(" {} ", path.display());
    if !outside.lines().any(|l| l.contains(&point)) {
        return Err(format!("{} is not seen by a transient unit", path.display()));
    }
    Ok(())
}

fn mounted_on_host(path: &Path) -> Option<(u32, u32)> {
    mounted_device_in(Path::new("/proc/1/mountinfo"), path)
}

/// kubelet's staging and target paths for `volume_id`, their parents made
/// as kubelet makes them (root, 0750 at each level, its record of the
/// volume beside each).
fn kubelet_paths(volume_id: &str) -> (PathBuf, PathBuf) {
    let staging = ebs_csi_test_guest::kubelet_staging(Path::new("/var/lib/kubelet"), volume_id);
    let pv = PathBuf::from(format!(
        "/var/lib/kubelet/pods/{}/volumes/kubernetes.io~csi/pv-{volume_id}",
        serial(volume_id)
    ));
    for dir in [&staging, &pv] {
        std::fs::create_dir_all(dir).unwrap();
        let mut level = dir.as_path();
        while level != Path::new("/var/lib/kubelet") {
            rustix::fs::chmod(level, rustix::fs::Mode::from_raw_mode(0o750)).unwrap();
            level = level.parent().unwrap();
        }
    }
    ebs_csi_test_guest::write_kubelet_record(&pv, volume_id);
    (staging, pv.join("mount"))
}

async fn stage(node: &mut NodeClient<Channel>, volume_id: &str, staging: &Path) -> Result<(), tonic::Status> {
    node.node_stage_volume(NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: mount_capability("ext4"),
        ..Default::default()
    })
    .await
    .map(drop)
}

async fn publish(node: &mut NodeClient<Channel>, volume_id: &str, staging: &Path, target: &Path) {
    node.node_publish_volume(NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: mount_capability("ext4"),
        ..Default::default()
    })
    .await
    .unwrap();
}

async fn unpublish(node: &mut NodeClient<Channel>, volume_id: &str, target: &Path) {
    node.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap();
    assert_eq!(mounted_on_host(target), None);
}

async fn unstage(node: &mut NodeClient<Channel>, volume_id: &str, staging: &Path) {
    node.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    assert_eq!(mounted_on_host(staging), None);
}

/// NodeGetVolumeStats of a healthy volume, summarised.
async fn stats(node: &mut NodeClient<Channel>, volume_id: &str, path: &Path) -> String {
    let stats = volume_stats(node, volume_id, path).await;
    assert!(!stats.volume_condition.as_ref().unwrap().abnormal, "{stats:?}");
    let bytes = stats.usage.iter().find(|u| u.unit == Unit::Bytes as i32).unwrap();
    let inodes = stats.usage.iter().find(|u| u.unit == Unit::Inodes as i32).unwrap();
    assert!(
        bytes.total > 400 << 20 && bytes.used > 0 && inodes.used > 0,
        "{stats:?}"
    );
    format!("stats {} of {} bytes used", bytes.used, bytes.total)
}

/// The udev link `/dev/disk/by-id/nvme-<model>_<serial>` of `volume_id`.
fn by_id(volume_id: &str) -> Option<PathBuf> {
    let link = PathBuf::from(format!("/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_{}", serial(volume_id)));
    link.exists().then_some(link)
}

/// `ebs-csi-agent devices`, run as the agent's user: volume id → device.
fn agent_devices() -> HashMap<String, String> {
    run(
        "systemd-run",
        &[
            "--wait",
            "--pipe",
            "--quiet",
            "-p",
            "User=ebs-csi-agent",
            "/usr/bin/ebs-csi-agent",
            "devices",
        ],
    )
    .lines()
    .skip(1)
    .filter_map(|line| {
        let mut words = line.split_whitespace();
        Some((words.next()?.to_owned(), words.next()?.to_owned()))
    })
    .collect()
}

/// `systemctl show` of `properties`.
fn show(unit: &str, properties: &[&str]) -> HashMap<String, String> {
    let out = run("systemctl", &["show", unit, "-p", &properties.join(",")]);
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn main_pid(unit: &str) -> u32 {
    show(unit, &["MainPID"])["MainPID"].parse().unwrap()
}

/// The overall exposure `systemd-analyze security` gives a running unit.
fn exposure(unit: &str) -> f64 {
    let out = run("systemd-analyze", &["security", "--no-pager", unit]);
    let line = out.lines().find(|l| l.contains("Overall exposure level")).unwrap();
    line.split(": ")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap()
}

/// `/proc/<pid>/task/*/status` of every thread of `pid`.
fn thread_statuses(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| std::fs::read_to_string(t.unwrap().path().join("status")).unwrap())
        .collect()
}

fn status_line<'s>(status: &'s str, name: &str) -> &'s str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .unwrap_or_else(|| panic!("no {name} in {status}"))
        .trim()
}

/// A hexadecimal field of a status file (the capability masks).
fn field(status: &str, name: &str) -> u64 {
    u64::from_str_radix(status_line(status, name), 16).unwrap()
}

fn decimal(status: &str, name: &str) -> u64 {
    status_line(status, name).parse().unwrap()
}
