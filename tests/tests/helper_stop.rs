//! The helper stops on SIGTERM as PID 1 of a PID namespace of its own, as
//! a container's first process is, where the kernel discards a signal whose
//! action is the default (pid_namespaces(7)): before, it ignored the
//! runtime's SIGTERM, and every rollout and drain waited out the grace
//! period and ended in SIGKILL, in the middle of a `mkfs` if one ran.
//!
//! What these tests assume of their world, and where it is broken: the
//! signal comes from outside the namespace (as containerd sends it); the
//! helper is idle, or formats (its `mkfs` held at exec by the gate) while
//! the signal comes, or formats past its stop timeout.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::time::Duration;

use ebs_csi_helper_proto::{FsType, Reply, Request};
use ebs_csi_tests::children::{descendants_named, exited};
use ebs_csi_tests::exec_gate::{ExecGate, MKFS};
use ebs_csi_tests::{Helper, LoopVolume, Sandbox, require_root, spawn, stage_request, wait_until};
use rustix::process::{Pid, Signal, kill_process};

const VOLUME: &str = "vol-0a5a5a5a5a5a5a5a5";

/// The helper as PID 1 of a new PID namespace, with `extra` arguments, and
/// its pid as the test sees it.
fn helper_as_pid_1(sandbox: &Sandbox, extra: &[&str]) -> (Helper, u32) {
    let socket = sandbox.path().join("helper/helper.sock");
    let mut args = vec!["--nested-pid-namespace"];
    args.extend(extra);
    let command = Helper::in_own_pid_namespace(sandbox.path(), &socket, &args);
    let helper = Helper {
        process: spawn("helper", command, sandbox.path().join("helper.log"), &socket),
        socket,
    };
    let pid = *descendants_named(helper.process.pid(), "ebs-csi-helper")
        .first()
        .expect("the helper under unshare");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let namespaced = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert!(namespaced.ends_with("\t1"), "not PID 1 of its namespace: {namespaced}");
    (helper, pid)
}

fn signal(pid: u32, signal: Signal) {
    kill_process(Pid::from_raw(i32::try_from(pid).unwrap()).unwrap(), signal).unwrap();
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn an_idle_helper_as_pid_1_exits_on_sigterm_within_two_seconds() {
    require_root();
    let sandbox = Sandbox::new();
    let (mut helper, pid) = helper_as_pid_1(&sandbox, &[]);
    assert_eq!(
        helper.call(Request::Ping).unwrap(),
        Reply::Pong {
            version: ebs_csi_helper_proto::PROTOCOL_VERSION
        }
    );
    signal(pid, Signal::TERM);
    let status = helper.process.exit_within(Duration::from_secs(2));
    let log = helper.process.log();
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{log}");
    assert!(log.contains("signal=\"SIGTERM\""), "{log}");
    assert!(log.contains("stopped: no request in flight"), "{log}");
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_format_in_flight_at_sigterm_completes_and_the_volume_stages_on_the_next_start() {
    require_root();
    let sandbox = Sandbox::new();
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 320);
    let staging = sandbox.staging(VOLUME);
    let stage = stage_request(VOLUME, &volume.device, &staging, FsType::Ext4, &[]);
    let (mut helper, pid) = helper_as_pid_1(&sandbox, &[]);
    let gate = ExecGate::watch(pid, &MKFS);
    let call = helper.call_in_background(stage.clone());
    let mkfs = gate.caught(Duration::from_secs(20));
    signal(pid, Signal::TERM);
    wait_until("the helper to stop accepting", Duration::from_secs(5), || {
        helper.process.log().contains("stopping: no new connections")
    });
    // Asked to stop, it waits for the format, and serves nobody new.
    let late = helper.call_in_background(Request::Ping);
    assert_eq!(helper.process.exit_within(Duration::from_secs(1)), None);
    signal(mkfs, Signal::CONT);
    assert_eq!(call.join().unwrap().unwrap(), Reply::Done);
    let status = helper.process.exit_within(Duration::from_secs(2));
    let log = helper.process.log();
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{log}");
    assert!(log.contains("stopped: no request in flight"), "{log}");
    assert!(late.join().unwrap().is_err(), "a connection after SIGTERM was served");
    assert_eq!(volume.signature(), "TYPE=ext4");
    let formatted = volume.uuid();
    drop(helper);
    // The next helper stages the same filesystem, formatted once.
    std::fs::remove_file(sandbox.path().join("helper/helper.sock")).unwrap();
    let helper = Helper::start(&sandbox, &[]);
    assert_eq!(helper.call(stage).unwrap(), Reply::Done);
    assert_eq!(volume.uuid(), formatted);
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_format_past_the_stop_timeout_is_killed_before_it_writes_and_formats_on_the_next_start() {
    require_root();
    let sandbox = Sandbox::new();
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 320);
    let staging = sandbox.staging(VOLUME);
    let stage = stage_request(VOLUME, &volume.device, &staging, FsType::Xfs, &[]);
    let (mut helper, pid) = helper_as_pid_1(&sandbox, &["--stop-timeout-seconds", "1"]);
    let gate = ExecGate::watch(pid, &MKFS);
    let call = helper.call_in_background(stage.clone());
    let mkfs = gate.caught(Duration::from_secs(20));
    signal(pid, Signal::TERM);
    let status = helper.process.exit_within(Duration::from_secs(3));
    let log = helper.process.log();
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{log}");
    assert!(
        log.contains("stopped with requests in flight in_flight=1 timeout_seconds=1"),
        "{log}"
    );
    wait_until("mkfs to die with the helper", Duration::from_secs(5), || exited(mkfs));
    assert!(call.join().unwrap().is_err());
    // Held before its first instruction, mkfs wrote nothing.
    assert_eq!((volume.signature(), volume.ends()), (String::new(), vec![0; 2 << 20]));
    drop(helper);
    std::fs::remove_file(sandbox.path().join("helper/helper.sock")).unwrap();
    let helper = Helper::start(&sandbox, &[]);
    assert_eq!(helper.call(stage).unwrap(), Reply::Done);
    assert_eq!(volume.signature(), "TYPE=xfs");
}
