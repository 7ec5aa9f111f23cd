//! A rolling upgrade: the agent of this version against the helper of the
//! previous protocol version (3), built from its commit by `make
//! previous-helper` (`make test` sets `EBS_CSI_PREVIOUS_HELPER`). The other
//! order — an older agent against this helper — is every other helper test:
//! frames of version 3 are what both agents send for those requests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use ebs_csi_helper_client::ClientError;
use ebs_csi_helper_proto::{
    FsType, HelperError, OLDEST_VERSION, PerformanceStatisticsRequest, PublishRequest, PublishSource, Reply, Request,
    UnpublishRequest, UnstageRequest, VolumeId, VolumeStatsRequest, VolumeUsage,
};
use ebs_csi_tests::loopdev::LoopVolume;
use ebs_csi_tests::{Helper, Sandbox, require_root, stage_request, wait_until};

const VOLUME: &str = "vol-0aaaaaaaaaaaaaaa1";

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
#[cfg_attr(no_previous_helper, ignore = "needs EBS_CSI_PREVIOUS_HELPER: make test sets it")]
fn this_agent_is_served_by_the_previous_helper() {
    require_root();
    let previous = PathBuf::from(
        std::env::var_os("EBS_CSI_PREVIOUS_HELPER").expect("EBS_CSI_PREVIOUS_HELPER: built with it, run without"),
    );
    assert!(
        previous.exists(),
        "{} was not built (make previous-helper)",
        previous.display()
    );
    let sandbox = Sandbox::new();
    let helper = Helper::start_program(&previous, sandbox.path(), &[]);
    // That helper binds its socket at its name and only then gives it its
    // group and mode (today's binds at another name and renames it into
    // place): until then the agent's uid cannot connect (EACCES).
    wait_until(
        "the previous helper's socket to get its mode",
        Duration::from_secs(10),
        || std::fs::metadata(&helper.socket).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o660),
    );
    assert_eq!(
        helper.call(Request::Ping).unwrap(),
        Reply::Pong {
            version: OLDEST_VERSION
        }
    );
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 64);
    let staging = sandbox.staging(VOLUME);
    let target = sandbox.target("pod-1", VOLUME, VOLUME);
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let device = path(&volume.device);
    let volume_id = || VolumeId::parse(VOLUME).unwrap();

    // Every request of version 3, as this agent sends it.
    let stage = stage_request(VOLUME, &volume.device, &staging, FsType::Ext4, &[]);
    assert_eq!(helper.call(stage).unwrap(), Reply::Done);
    let publish = Request::Publish(PublishRequest {
        target_path: path(&target),
        readonly: false,
        source: PublishSource::Staging {
            volume_id: volume_id(),
            device: device.clone(),
            staging_path: path(&staging),
            mount_flags: vec![],
        },
    });
    assert_eq!(helper.call(publish).unwrap(), Reply::Done);
    let stats = Request::VolumeStats(VolumeStatsRequest {
        volume_id: volume_id(),
        volume_path: path(&target),
    });
    assert!(matches!(
        helper.call(stats).unwrap(),
        Reply::VolumeStats(VolumeUsage::Filesystem { total_bytes, .. }) if total_bytes > 0
    ));

    // A request added since: refused whole, naming the version, nothing done.
    let statistics = Request::PerformanceStatistics(PerformanceStatisticsRequest {
        volume_id: volume_id(),
        device,
    });
    let refused = helper.call(statistics).unwrap_err();
    assert!(
        matches!(refused, ClientError::Helper(HelperError::UnsupportedVersion(4))),
        "{refused:?}"
    );
    // Fields added since (ext4EncryptionSupport, version 5; the node's
    // --legacy-xfs, version 6): refused, not ignored — the volume is not
    // formatted without what was asked for.
    let blank = LoopVolume::create(sandbox.path(), "vol-0aaaaaaaaaaaaaaa2", 64);
    for (fs_type, version) in [(FsType::Ext4, 5), (FsType::Xfs, 6)] {
        let mut asked = stage_request(
            "vol-0aaaaaaaaaaaaaaa2",
            &blank.device,
            &sandbox.staging("vol-0bbbbbbbbbbbbbbb2"),
            fs_type,
            &[],
        );
        if let Request::Stage(stage) = &mut asked {
            stage.format.ext4_encryption = fs_type == FsType::Ext4;
            stage.format.xfs_legacy = fs_type == FsType::Xfs;
        }
        let refused = helper.call(asked).unwrap_err();
        assert!(
            matches!(refused, ClientError::Helper(HelperError::UnsupportedVersion(v)) if v == version),
            "{refused:?}"
        );
        assert_eq!(blank.signature(), "");
    }

    let unpublish = Request::Unpublish(UnpublishRequest {
        target_path: path(&target),
    });
    assert_eq!(helper.call(unpublish).unwrap(), Reply::Done);
    let unstage = Request::Unstage(UnstageRequest {
        staging_path: path(&staging),
    });
    assert_eq!(helper.call(unstage).unwrap(), Reply::Done);
    assert!(!target.exists());
    assert_eq!(volume.signature(), "TYPE=ext4");
}
