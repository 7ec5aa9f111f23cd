//! Formats run in parallel up to the helper's limit, outside its lock,
//! and nothing else touches a device while it is being formatted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use ebs_csi_helper_client::ClientError;
use ebs_csi_helper_proto::{
    FsType, HelperError, PublishRequest, PublishSource, Reply, Request, UnstageRequest, VolumeId,
};
use ebs_csi_tests::children::descendants_named;
use ebs_csi_tests::exec_gate::{ExecGate, MKFS};
use ebs_csi_tests::{Helper, LoopVolume, Sandbox, is_mounted, require_root, stage_request};
use rustix::process::{Pid, Signal, kill_process};

fn volume_id(n: u32) -> String {
    format!("vol-0f0000000000000{n:02}")
}

fn stage(sandbox: &Sandbox, volume: &LoopVolume, fs_type: FsType) -> Request {
    let staging = sandbox.staging(&volume.volume_id);
    stage_request(&volume.volume_id, &volume.device, &staging, fs_type, &[])
}

/// The most `mkfs` children of `helper` that existed at once until
/// `finished`. Each new one is stopped as soon as it is seen, so none can
/// end early; the children are counted and the stopped ones go on once
/// `limit` of them exist and no new one has appeared for 300 ms (time for
/// one over the limit to show), or once none has appeared for 5 s with
/// fewer: a loaded machine (the tests run side by side with builds) can
/// take seconds to start the next format, and a quiet spell of 300 ms
/// alone once counted one format where two were on their way.
fn peak_with_formats_frozen(helper: u32, limit: usize, finished: impl Fn() -> bool) -> usize {
    let signal = |pid: u32, signal| {
        let _ = kill_process(Pid::from_raw(i32::try_from(pid).unwrap()).unwrap(), signal);
    };
    let (mut peak, mut seen, mut frozen, mut since) = (0, HashSet::new(), Vec::new(), Instant::now());
    while !finished() {
        let running = descendants_named(helper, "mkfs");
        for &pid in running.iter().filter(|&&pid| seen.insert(pid)) {
            signal(pid, Signal::STOP);
            frozen.push(pid);
            since = Instant::now();
        }
        let quiet = if running.len() >= limit {
            Duration::from_millis(300)
        } else {
            Duration::from_secs(5)
        };
        if !frozen.is_empty() && since.elapsed() > quiet {
            peak = peak.max(running.len());
            for pid in frozen.drain(..) {
                signal(pid, Signal::CONT);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    peak
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn formats_run_in_parallel_up_to_the_limit() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &["--max-parallel-formats", "2"]);
    let volumes: Vec<LoopVolume> = (0..6)
        .map(|n| LoopVolume::create(sandbox.path(), &volume_id(n), 512))
        .collect();
    let peak = std::thread::scope(|scope| {
        let calls: Vec<_> = volumes
            .iter()
            .map(|v| {
                let request = stage(&sandbox, v, FsType::Xfs);
                scope.spawn(|| helper.call(request))
            })
            .collect();
        let peak = peak_with_formats_frozen(helper.process.pid(), 2, || calls.iter().all(|c| c.is_finished()));
        for call in calls {
            assert_eq!(call.join().unwrap().unwrap(), Reply::Done);
        }
        peak
    });
    assert_eq!(
        peak, 2,
        "mkfs processes at once with the limit at 2 and 6 blank volumes"
    );
    for v in &volumes {
        assert!(is_mounted(&sandbox.staging(&v.volume_id)));
    }
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_device_being_formatted_is_refused_until_its_format_ends() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &["--max-parallel-formats", "1"]);
    let volume = LoopVolume::create(sandbox.path(), &volume_id(1), 4096);
    let request = stage(&sandbox, &volume, FsType::Ext4);
    let gate = ExecGate::watch(helper.process.pid(), &MKFS);
    std::thread::scope(|scope| {
        let first = scope.spawn(|| helper.call(request.clone()));
        // Freeze the format as it starts: while it is stopped the device
        // stays claimed, whatever the machine's speed.
        let mkfs = gate.caught(Duration::from_secs(20));
        let status_file = format!("/proc/{mkfs}/status");
        let mkfs = Pid::from_raw(i32::try_from(mkfs).unwrap()).unwrap();
        let status = std::fs::read_to_string(status_file).unwrap();
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).unwrap().trim();
        // CAP_DAC_OVERRIDE (bit 1) alone, to write the root-owned device
        // node as the tools' uid and gid, 991, with no other group.
        for set in ["CapEff:", "CapPrm:", "CapInh:", "CapAmb:"] {
            assert_eq!(field(set), "0000000000000002", "mkfs runs with {set}");
        }
        for ids in ["Uid:", "Gid:"] {
            assert_eq!(
                field(ids).split_whitespace().collect::<Vec<_>>(),
                ["991"; 4],
                "mkfs's {ids}"
            );
        }
        assert_eq!(field("Groups:"), "", "mkfs's groups");
        let seccomp = status.lines().find_map(|l| l.strip_prefix("Seccomp:")).unwrap().trim();
        assert_eq!(seccomp, "2", "mkfs runs without the tools' seccomp filter");
        let in_progress = |result: &Result<Reply, ClientError>| {
            matches!(result, Err(ClientError::Helper(HelperError::InProgress { .. })))
        };
        let again = helper.call(request.clone());
        let publish_block = helper.call(Request::Publish(PublishRequest {
            target_path: sandbox
                .block_target("pod-1", &volume.volume_id, &volume.volume_id)
                .to_string_lossy()
                .into_owned(),
            readonly: false,
            source: PublishSource::Device {
                volume_id: VolumeId::parse(&volume.volume_id).unwrap(),
                device: volume.device.to_string_lossy().into_owned(),
            },
        }));
        kill_process(mkfs, Signal::CONT).unwrap();
        assert!(in_progress(&again), "a second stage during the format: {again:?}");
        assert!(
            in_progress(&publish_block),
            "a block publish during the format: {publish_block:?}"
        );
        assert_eq!(first.join().unwrap().unwrap(), Reply::Done);
    });
    assert!(is_mounted(&sandbox.staging(&volume.volume_id)));
    assert_eq!(
        helper.call(request).unwrap(),
        Reply::Done,
        "staging again once formatted"
    );
    assert!(
        !sandbox
            .block_target("pod-1", &volume.volume_id, &volume.volume_id)
            .exists(),
        "the refused publish created its target"
    );
}

/// The node's `--legacy-xfs` (the Go driver's): XFS for kernels 5.4 and
/// older, without the features they cannot mount, which this machine's
/// mkfs.xfs (xfsprogs 6.1) turns on by default — both read back from the
/// superblocks the real tool wrote (`xfs_db -c version`).
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn legacy_xfs_has_none_of_the_features_old_kernels_cannot_mount() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let features = |legacy: bool, n: u32| {
        let volume = LoopVolume::create(sandbox.path(), &volume_id(n), 320);
        let mut request = stage(&sandbox, &volume, FsType::Xfs);
        if let Request::Stage(stage) = &mut request {
            stage.format.xfs_legacy = legacy;
        }
        assert_eq!(helper.call(request).unwrap(), Reply::Done);
        let staging = sandbox.staging(&volume.volume_id).to_string_lossy().into_owned();
        let unstage = Request::Unstage(UnstageRequest { staging_path: staging });
        assert_eq!(helper.call(unstage).unwrap(), Reply::Done);
        ebs_csi_tests::run("xfs_db", &["-r", "-c", "version", &volume.device.to_string_lossy()])
    };
    let new = ["BIGTIME", "INOBTCNT", "REFLINK"];
    let default = features(false, 11);
    assert!(new.iter().all(|f| default.contains(f)), "{default}");
    let legacy = features(true, 12);
    assert!(new.iter().all(|f| !legacy.contains(f)), "{legacy}");
    assert!(legacy.contains("V5,"), "{legacy}");
}
