//! A partition of a volume (the Go driver's `partition` volume
//! attribute): proved by its disk's identity, it is staged, published,
//! measured and grown on itself alone, and refused where its disk is not
//! the volume or it is not there. Loop devices stand in for EBS volumes
//! (the NVMe VM's scenario 11 stages an NVMe partition through the agent;
//! its scenario 12 refuses partitions that share sectors, which this
//! machine's kernel, without partition parsers, cannot make).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::path::Path;

use ebs_csi_helper::device::Refusal;
use ebs_csi_helper_client::ClientError;
use ebs_csi_helper_proto::{
    ExpandRequest, FsType, HelperError, Reply, Request, UnpublishRequest, UnstageRequest, VolumeId, VolumeStatsRequest,
    VolumeUsage,
};
use ebs_csi_tests::guest::{device_number, mounted_device};
use ebs_csi_tests::loopdev::signature;
use ebs_csi_tests::{
    Helper, LoopVolume, Sandbox, mounts_under, publish_device, publish_staged, require_root, stage_request,
};

const VOLUME: &str = "vol-0ccccccccccccccc3";

fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Asserts that `helper` refuses `request` with exactly `expected`, and
/// that nothing under the sandbox was mounted or unmounted meanwhile.
fn assert_refused(helper: &Helper, sandbox: &Sandbox, request: Request, expected: HelperError) {
    let mounts = mounts_under(sandbox.path());
    match helper.call(request.clone()) {
        Err(ClientError::Helper(e)) => assert_eq!(e, expected, "{request:?}"),
        other => panic!("{request:?}: expected {expected}, got {other:?}"),
    }
    assert_eq!(
        mounts_under(sandbox.path()),
        mounts,
        "{request:?} changed the mount table"
    );
}

fn unpublish(helper: &Helper, target: &Path) {
    let request = Request::Unpublish(UnpublishRequest {
        target_path: text(target),
    });
    assert_eq!(helper.call(request).unwrap(), Reply::Done);
}

fn refused(device: &Path, volume_id: &str, reason: Refusal) -> HelperError {
    HelperError::DeviceRefused {
        device: text(device),
        volume_id: volume_id.to_owned(),
        reason: reason.to_string(),
    }
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_partition_of_the_volume_is_staged_published_and_grown_alone() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let (volume, partitions) = LoopVolume::partitioned(sandbox.path(), VOLUME, 64, &[32, 16]);
    let (first, second) = (&partitions[0], &partitions[1]);
    let staging = sandbox.staging(VOLUME);
    let volume_id = VolumeId::parse(VOLUME).unwrap();

    // Not while the whole disk is published raw: a pod may write anywhere
    // on it.
    let raw_disk = sandbox.block_target("pod", "pv-disk", VOLUME);
    assert_eq!(
        helper.call(publish_device(VOLUME, &volume.device, &raw_disk)).unwrap(),
        Reply::Done
    );
    let stage = stage_request(VOLUME, first, &staging, FsType::Ext4, &[]);
    assert_refused(&helper, &sandbox, stage, refused(first, VOLUME, Refusal::PublishedRaw));
    unpublish(&helper, &raw_disk);

    // Staged (twice: the second finds it staged): partition 1 formatted
    // and mounted, the table and partition 2 as they were.
    for _ in 0..2 {
        let stage = stage_request(VOLUME, first, &staging, FsType::Ext4, &[]);
        assert_eq!(helper.call(stage).unwrap(), Reply::Done);
    }
    assert_eq!(mounted_device(&staging), device_number(first));
    assert_eq!(signature(first), "TYPE=ext4");
    assert_eq!(signature(second), "");
    assert_eq!(volume.signature(), "PTTYPE=gpt");

    // Published from the staging path, measured and grown: the partition's
    // size, not the disk's.
    let target = sandbox.target("pod", "pv-partition", VOLUME);
    assert_eq!(
        helper.call(publish_staged(VOLUME, first, &staging, &target)).unwrap(),
        Reply::Done
    );
    let stats = helper.call(Request::VolumeStats(VolumeStatsRequest {
        volume_id: volume_id.clone(),
        volume_path: text(&target),
    }));
    let Ok(Reply::VolumeStats(VolumeUsage::Filesystem { total_bytes, .. })) = stats else {
        panic!("VolumeStats: {stats:?}");
    };
    assert!((24 << 20..=32 << 20).contains(&total_bytes), "{total_bytes}");
    let expand = Request::Expand(ExpandRequest {
        volume_id: volume_id.clone(),
        device: text(first),
        volume_path: text(&staging),
    });
    assert_eq!(helper.call(expand).unwrap(), Reply::Expanded { size_bytes: 32 << 20 });

    // Partition 2 published raw beside it; neither the staged partition nor
    // the whole disk, whose filesystem is mounted.
    let raw = sandbox.block_target("pod", "pv-raw", VOLUME);
    assert_eq!(helper.call(publish_device(VOLUME, second, &raw)).unwrap(), Reply::Done);
    let elsewhere = sandbox.block_target("pod", "pv-other", VOLUME);
    for device in [first, &volume.device] {
        let publish = publish_device(VOLUME, device, &elsewhere);
        assert_refused(
            &helper,
            &sandbox,
            publish,
            refused(device, VOLUME, Refusal::FilesystemMounted),
        );
    }

    // A partition that is not there, and another volume's partition.
    let missing = Path::new(&format!("{}p9", volume.device.display())).to_owned();
    let (other, other_partitions) = LoopVolume::partitioned(sandbox.path(), "vol-0bbbbbbbbbbbbbbb2", 64, &[32]);
    for (device, reason) in [
        (&missing, Refusal::NotBlockDevice),
        (&other_partitions[0], Refusal::LoopNotNamed),
    ] {
        let stage = stage_request(VOLUME, device, &staging, FsType::Ext4, &[]);
        assert_refused(&helper, &sandbox, stage, refused(device, VOLUME, reason));
    }
    assert_eq!(signature(&other_partitions[0]), "");
    assert_eq!(other.signature(), "PTTYPE=gpt");

    unpublish(&helper, &raw);
    unpublish(&helper, &target);
    let unstage = Request::Unstage(UnstageRequest {
        staging_path: text(&staging),
    });
    assert_eq!(helper.call(unstage).unwrap(), Reply::Done);
    assert_eq!(mounted_device(&staging), None);
}
