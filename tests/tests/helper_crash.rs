//! The helper killed (`SIGKILL`) at each step of Stage, Publish and Expand, and the
//! agent killed while the helper formats, over loop devices: a helper's
//! tool dies with it, a retry through a new helper or agent succeeds, no
//! device is formatted twice, and data written before the crash is intact.
//! Runs per step: `EBS_CSI_CRASH_RUNS` (20 by default, as in `make test`;
//! `make crash` runs 100).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::path::Path;
use std::time::Duration;

use ebs_csi_helper_proto::{
    ExpandRequest, FsType, PublishRequest, PublishSource, Reply, Request, UnpublishRequest, UnstageRequest, VolumeId,
};
use ebs_csi_proto::v1::volume_capability::access_mode::Mode;
use ebs_csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use ebs_csi_proto::v1::{NodeStageVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability};
use ebs_csi_tests::children::exited;
use ebs_csi_tests::exec_gate::{ExecGate, MKFS, XFS_GROWFS};
use ebs_csi_tests::{Agent, Helper, LoopVolume, Sandbox, is_mounted, require_root, stage_request, wait_until};
use rustix::process::{Pid, Signal, kill_process};

const VOLUME: &str = "vol-0aaaaaaaaaaaaaaa1";

/// Where the helper is killed.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// While `mkfs` runs (stopped, so the kill lands inside it).
    DuringMkfs,
    /// Right after `mkfs` exits, before or while the helper mounts.
    AfterMkfs,
    /// While `xfs_growfs` runs on a staged volume holding data.
    DuringGrowth,
    /// After Stage mounted the volume, before Publish binds it.
    BetweenMountAndBind,
}

fn runs() -> usize {
    std::env::var("EBS_CSI_CRASH_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20)
}

fn signal(pid: u32, signal: Signal) {
    let _ = kill_process(Pid::from_raw(i32::try_from(pid).unwrap()).unwrap(), signal);
}

/// Kills `helper` and waits until its running `tool` (a pid), if any, has
/// died too.
fn crash(helper: Helper, tool: Option<u32>) {
    signal(helper.process.pid(), Signal::KILL);
    let socket = helper.socket.clone();
    drop(helper);
    if let Some(tool) = tool {
        wait_until("the tool to die with the helper", Duration::from_secs(10), || {
            exited(tool)
        });
    }
    std::fs::remove_file(socket).unwrap();
}

fn unstage(helper: &Helper, staging: &Path) {
    let request = Request::Unstage(UnstageRequest {
        staging_path: staging.to_string_lossy().into_owned(),
    });
    assert_eq!(helper.call(request).unwrap(), Reply::Done);
}

/// One run: kill the helper at `step`, retry with a new one, and check.
fn crash_at(step: Step) {
    let sandbox = Sandbox::new();
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 320);
    let staging = sandbox.staging(VOLUME);
    let fs = if matches!(step, Step::DuringGrowth) {
        FsType::Xfs
    } else {
        FsType::Ext4
    };
    let stage = stage_request(VOLUME, &volume.device, &staging, fs, &[]);
    let helper = Helper::start(&sandbox, &[]);
    let marker = staging.join("written-before-the-crash");
    let helper = match step {
        Step::DuringMkfs | Step::AfterMkfs => {
            let gate = ExecGate::watch(helper.process.pid(), &MKFS);
            let call = helper.call_in_background(stage.clone());
            let mkfs = gate.caught(Duration::from_secs(20));
            if matches!(step, Step::AfterMkfs) {
                signal(mkfs, Signal::CONT);
                wait_until("mkfs to exit", Duration::from_secs(20), || exited(mkfs));
            }
            crash(helper, Some(mkfs));
            // The stage either failed with the helper or had mounted.
            let _ = call.join().unwrap();
            Helper::start(&sandbox, &[])
        }
        Step::DuringGrowth => {
            assert_eq!(helper.call(stage.clone()).unwrap(), Reply::Done);
            std::fs::write(&marker, "intact").unwrap();
            volume.grow(640);
            let expand = Request::Expand(ExpandRequest {
                volume_id: VolumeId::parse(VOLUME).unwrap(),
                device: volume.device.to_string_lossy().into_owned(),
                volume_path: staging.to_string_lossy().into_owned(),
            });
            let gate = ExecGate::watch(helper.process.pid(), &XFS_GROWFS);
            let call = helper.call_in_background(expand.clone());
            let growfs = gate.caught(Duration::from_secs(20));
            crash(helper, Some(growfs));
            let _ = call.join().unwrap();
            let helper = Helper::start(&sandbox, &[]);
            let grown = helper.call(expand).unwrap();
            assert_eq!(grown, Reply::Expanded { size_bytes: 640 << 20 });
            helper
        }
        Step::BetweenMountAndBind => {
            assert_eq!(helper.call(stage.clone()).unwrap(), Reply::Done);
            std::fs::write(&marker, "intact").unwrap();
            crash(helper, None);
            let helper = Helper::start(&sandbox, &[]);
            let target = sandbox.target("p", "pv", VOLUME);
            let publish = Request::Publish(PublishRequest {
                target_path: target.to_string_lossy().into_owned(),
                readonly: false,
                source: PublishSource::Staging {
                    volume_id: VolumeId::parse(VOLUME).unwrap(),
                    device: volume.device.to_string_lossy().into_owned(),
                    staging_path: staging.to_string_lossy().into_owned(),
                    mount_flags: vec![],
                },
            });
            assert_eq!(helper.call(publish).unwrap(), Reply::Done);
            let published = std::fs::read_to_string(target.join("written-before-the-crash")).unwrap();
            assert_eq!(published, "intact");
            let unpublish = Request::Unpublish(UnpublishRequest {
                target_path: target.to_string_lossy().into_owned(),
            });
            assert_eq!(helper.call(unpublish).unwrap(), Reply::Done);
            helper
        }
    };
    // The retry succeeds and mounts the volume exactly once.
    assert_eq!(helper.call(stage.clone()).unwrap(), Reply::Done, "{step:?}: retry");
    assert!(is_mounted(&staging));
    assert_eq!(sandbox.mounts().len(), 1, "{step:?}: mounted more than once");
    if matches!(step, Step::DuringMkfs | Step::AfterMkfs) {
        std::fs::write(&marker, "intact").unwrap();
    }
    // Staged again from scratch: the same filesystem, not a new one.
    let formatted = volume.uuid();
    unstage(&helper, &staging);
    assert_eq!(helper.call(stage).unwrap(), Reply::Done);
    assert_eq!(volume.uuid(), formatted, "{step:?}: formatted twice");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "intact",
        "{step:?}: data lost"
    );
    unstage(&helper, &staging);
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_helper_killed_at_any_step_leaves_a_retry_that_works() {
    require_root();
    let runs = runs();
    for step in [
        Step::DuringMkfs,
        Step::AfterMkfs,
        Step::DuringGrowth,
        Step::BetweenMountAndBind,
    ] {
        for _ in 0..runs {
            crash_at(step);
        }
        eprintln!("{step:?}: {runs} runs, each retried successfully with no second format and data intact");
    }
}

/// The agent killed while the helper formats its volume: the helper
/// finishes on its own; NodeStage retried through a new agent is ABORTED
/// while the format still runs (CSI: an operation pending for the volume)
/// and succeeds once it is done, with the one filesystem the first call made.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn an_agent_killed_mid_stage_leaves_a_retry_that_works() {
    require_root();
    let runs = runs();
    for _ in 0..runs {
        let sandbox = Sandbox::new();
        let helper = Helper::start(&sandbox, &[]);
        let volume = LoopVolume::create(sandbox.path(), VOLUME, 320);
        sandbox.link_ebs_device(&volume);
        let staging = sandbox.staging(VOLUME);
        let request = NodeStageVolumeRequest {
            volume_id: VOLUME.into(),
            staging_target_path: staging.to_string_lossy().into_owned(),
            volume_capability: Some(VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(AccessType::Mount(MountVolume {
                    fs_type: "ext4".into(),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        };
        let agent = Agent::start(&sandbox, &helper);
        let mut client = agent.node().await;
        let gate = ExecGate::watch(helper.process.pid(), &MKFS);
        let first = tokio::spawn({
            let request = request.clone();
            async move { client.node_stage_volume(request).await }
        });
        let mkfs = tokio::task::block_in_place(|| gate.caught(Duration::from_secs(20)));
        signal(agent.process.pid(), Signal::KILL);
        drop(agent);
        assert!(first.await.unwrap().is_err(), "the killed agent answered");
        let agent = Agent::start(&sandbox, &helper);
        let mut client = agent.node().await;
        let pending = client.node_stage_volume(request.clone()).await.unwrap_err();
        assert_eq!(pending.code(), tonic::Code::Aborted, "{pending:?}");
        signal(mkfs, Signal::CONT);
        let staged = staging.clone();
        tokio::task::spawn_blocking(move || {
            wait_until("the helper to finish the first stage", Duration::from_secs(20), || {
                is_mounted(&staged)
            });
        })
        .await
        .unwrap();
        client.node_stage_volume(request.clone()).await.unwrap();
        assert_eq!(sandbox.mounts().len(), 1, "mounted more than once");
        let marker = staging.join("written-after-the-crash");
        std::fs::write(&marker, "intact").unwrap();
        let formatted = volume.uuid();
        let unstage = NodeUnstageVolumeRequest {
            volume_id: VOLUME.into(),
            staging_target_path: staging.to_string_lossy().into_owned(),
        };
        client.node_unstage_volume(unstage.clone()).await.unwrap();
        client.node_stage_volume(request).await.unwrap();
        assert_eq!(volume.uuid(), formatted, "formatted twice");
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "intact");
        client.node_unstage_volume(unstage).await.unwrap();
    }
    eprintln!("agent killed mid-stage: {runs} runs, each retried successfully with no second format");
}
