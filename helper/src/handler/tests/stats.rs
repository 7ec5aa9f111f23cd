//! VolumeStats and PerformanceStatistics over the fake (`handler/stats.rs`).

use ebs_csi_helper_proto::{
    HelperError, PerformanceStatisticsRequest, Reply, Request, VolumeStatsRequest, VolumeUsage,
};

use super::fake::Step;
use super::{DEVICE, OTHER_DEVICE, SIZE, World, device_refused, volume};
use crate::device::Refusal;
use crate::error::PathRefusal;

fn stats(path: &str) -> Request {
    Request::VolumeStats(VolumeStatsRequest {
        volume_id: volume(),
        volume_path: path.into(),
    })
}

#[test]
fn a_filesystem_answers_statvfs_of_its_mount_and_a_device_its_size() {
    let world = World::staged();
    let vfs = rustix::fs::statvfs(world.staging().as_str()).unwrap();
    // The staging directory is in a filesystem other tests write to: its
    // sizes, not its use, are compared.
    let Ok(Reply::VolumeStats(VolumeUsage::Filesystem {
        total_bytes,
        total_inodes,
        ..
    })) = world.handle(stats(&world.staging()))
    else {
        panic!("not a filesystem's usage");
    };
    assert_eq!((total_bytes, total_inodes), (vfs.f_blocks * vfs.f_frsize, vfs.f_files));
    let world = World::new();
    world.handle(Request::Publish(world.block_publish_request())).unwrap();
    assert_eq!(
        world.handle(stats(&world.block_target())),
        Ok(Reply::VolumeStats(VolumeUsage::Block { size_bytes: SIZE }))
    );
    assert_eq!(world.fake.actions().len(), 3, "only the publish acted");
}

#[test]
fn only_a_mount_of_the_volume_is_measured() {
    let world = World::new();
    world.refused(
        stats(&world.staging()),
        &HelperError::NotMounted { path: world.staging() },
    );
    world.fake.mount_foreign(world.staging().as_ref(), "tmpfs", (0, 99));
    world.refused(stats(&world.staging()), &PathRefusal::ForeignMount.of(&world.staging()));
    let world = World::new();
    world.fake.mount_foreign(world.staging().as_ref(), "ext4", (259, 7));
    let not_staged = HelperError::NotStaged {
        path: world.staging(),
        volume_id: super::VOLUME.into(),
    };
    world.refused(stats(&world.staging()), &not_staged);
    let world = World::new();
    world.fake.mount_foreign(world.staging().as_ref(), "ext4", (259, 2));
    let other = HelperError::DeviceRefused {
        device: OTHER_DEVICE.into(),
        volume_id: super::VOLUME.into(),
        reason: Refusal::OtherVolume.to_string(),
    };
    world.refused(stats(&world.staging()), &other);
}

#[test]
fn a_disk_replaced_between_its_name_and_its_proof_is_not_measured() {
    let world = World::staged();
    world
        .fake
        .before(Step::Verify, 0, |fake| fake.device(DEVICE, |d| d.number = (259, 9)));
    let not_staged = HelperError::NotStaged {
        path: world.staging(),
        volume_id: super::VOLUME.into(),
    };
    world.refused(stats(&world.staging()), &not_staged);
}

fn statistics(device: &str) -> Request {
    Request::PerformanceStatistics(PerformanceStatisticsRequest {
        volume_id: volume(),
        device: device.into(),
    })
}

#[test]
fn performance_statistics_are_the_volumes_log_page_as_read() {
    let world = World::new();
    assert_eq!(
        world.handle(statistics(DEVICE)),
        Ok(Reply::PerformanceStatistics(vec![0xEB; 4096]))
    );
    world.fake.device(DEVICE, |d| d.statistics = Err(0x4002));
    let unavailable = HelperError::StatisticsUnavailable {
        device: DEVICE.into(),
        status: 0x4002,
    };
    world.refused(statistics(DEVICE), &unavailable);
    let failure = HelperError::System {
        operation: format!("Get Log Page on {DEVICE}"),
        detail: "EACCES".into(),
    };
    world.fake.fail(Step::StatisticsPage, 2, failure.clone());
    world.refused(statistics(DEVICE), &failure);
    world.refused(
        statistics(OTHER_DEVICE),
        &device_refused(OTHER_DEVICE, Refusal::OtherVolume),
    );
}
