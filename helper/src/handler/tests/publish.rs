//! Publish over the fake: a staged filesystem or a raw block device, each
//! branch of `handler/publish.rs` in its order.

use ebs_csi_helper_proto::{HelperError, PublishRequest, PublishSource, Reply, Request};
use rustix::fs::FileType;
use rustix::mount::MountFlags;

use super::fake::{Action, Step};
use super::{DEVICE, NUMBER, World, device_refused};
use crate::device::Refusal;
use crate::error::PathRefusal;

fn bound(source: &str, target: &str, flags: MountFlags) -> [Action; 3] {
    [
        Action::Bind { source: source.into() },
        Action::SetAttributes { flags },
        Action::Attach { target: target.into() },
    ]
}

#[test]
fn a_staged_filesystem_is_bound_nosuid_nodev_and_read_only_when_asked() {
    for (readonly, flags, options) in [
        (false, MountFlags::NODEV | MountFlags::NOSUID, "rw,nosuid,nodev"),
        (
            true,
            MountFlags::NODEV | MountFlags::NOSUID | MountFlags::RDONLY,
            "ro,nosuid,nodev",
        ),
    ] {
        let world = World::staged();
        let request = Request::Publish(world.publish_request(readonly));
        assert_eq!(world.handle(request.clone()), Ok(Reply::Done));
        assert_eq!(world.fake.actions(), bound(&world.staging(), &world.target(), flags));
        assert_eq!(world.fake.mounted()[1], (world.target(), "ext4".into(), options.into()));
        // Again, the same: done, nothing done.
        world.fake.forget();
        assert_eq!(world.handle(request), Ok(Reply::Done));
        assert_eq!(world.fake.actions(), []);
        // Again, the other read-only state: refused.
        let expected = HelperError::AlreadyMounted {
            path: world.target(),
            detail: "a filesystem on device 259:1".into(),
        };
        world.refused(Request::Publish(world.publish_request(!readonly)), &expected);
    }
}

#[test]
fn the_source_must_be_the_volumes_staged_filesystem() {
    let world = World::new();
    let not_mounted = HelperError::NotMounted { path: world.staging() };
    world.refused(Request::Publish(world.publish_request(false)), &not_mounted);
    for (fs_type, number) in [("tmpfs", NUMBER), ("ext4", (259, 2))] {
        let world = World::new();
        world.fake.mount_foreign(world.staging().as_ref(), fs_type, number);
        let not_staged = HelperError::NotStaged {
            path: world.staging(),
            volume_id: super::VOLUME.into(),
        };
        world.refused(Request::Publish(world.publish_request(false)), &not_staged);
    }

    let world = World::staged();
    let mut request = world.publish_request(false);
    let PublishSource::Staging { device, .. } = &mut request.source else {
        unreachable!()
    };
    *device = super::OTHER_DEVICE.into();
    let other = HelperError::DeviceRefused {
        device: super::OTHER_DEVICE.into(),
        volume_id: super::VOLUME.into(),
        reason: Refusal::OtherVolume.to_string(),
    };
    world.refused(Request::Publish(request), &other);
}

#[test]
fn a_target_of_another_shape_or_through_a_symlink_is_refused() {
    let world = World::staged();
    let mut request = world.publish_request(false);
    request.target_path = world.block_target();
    world.refused(
        Request::Publish(request),
        &PathRefusal::NotItsShape.of(&world.block_target()),
    );
    std::fs::remove_dir_all(world.path("pods/pod-1/volumes/kubernetes.io~csi")).unwrap();
    let elsewhere = world.root.parent().unwrap().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, world.path("pods/pod-1/volumes/kubernetes.io~csi")).unwrap();
    world.refused(
        Request::Publish(world.publish_request(false)),
        &PathRefusal::Symlink.of(&world.target()),
    );
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
}

#[test]
fn an_existing_target_must_be_an_empty_directory() {
    let world = World::staged();
    let target = world.target();
    std::fs::create_dir_all(std::path::Path::new(&target).parent().unwrap()).unwrap();
    std::fs::write(&target, b"").unwrap();
    let wrong = PathRefusal::ExistsOfOtherType(FileType::Directory).of(&target);
    world.refused(Request::Publish(world.publish_request(false)), &wrong);
    std::fs::remove_file(&target).unwrap();
    std::fs::create_dir(&target).unwrap();
    std::fs::write(format!("{target}/secret"), b"x").unwrap();
    world.refused(
        Request::Publish(world.publish_request(false)),
        &PathRefusal::NotEmpty.of(&target),
    );
    std::fs::remove_file(format!("{target}/secret")).unwrap();
    assert_eq!(
        world.handle(Request::Publish(world.publish_request(false))),
        Ok(Reply::Done)
    );
    assert_eq!(world.fake.mounted()[1].0, target);
}

#[test]
fn a_bind_whose_flags_fail_is_never_attached_and_the_target_it_created_goes() {
    let world = World::staged();
    let failure = HelperError::System {
        operation: "setting a mount's attributes".into(),
        detail: "EPERM".into(),
    };
    world.fake.fail(Step::SetAttributes, 0, failure.clone());
    assert_eq!(
        world.handle(Request::Publish(world.publish_request(false))),
        Err(failure)
    );
    let expected = bound(&world.staging(), &world.target(), MountFlags::empty())[..1].to_vec();
    assert_eq!(world.fake.actions(), expected);
    assert_eq!(world.fake.mounted().len(), 1);
    assert!(!std::path::Path::new(&world.target()).exists());
}

#[test]
fn a_raw_block_volume_is_bound_onto_a_new_empty_file() {
    let world = World::new();
    assert_eq!(
        world.handle(Request::Publish(world.block_publish_request())),
        Ok(Reply::Done)
    );
    assert_eq!(
        world.fake.actions(),
        bound(DEVICE, &world.block_target(), MountFlags::NOSUID)
    );
    assert_eq!(
        world.fake.mounted(),
        [(world.block_target(), "devtmpfs".into(), "rw,nosuid,nodev".into())]
    );
    assert_eq!(std::fs::metadata(world.block_target()).unwrap().len(), 0);
    world.fake.forget();
    assert_eq!(
        world.handle(Request::Publish(world.block_publish_request())),
        Ok(Reply::Done)
    );
    assert_eq!(world.fake.actions(), []);
}

#[test]
fn a_device_whose_filesystem_is_mounted_is_never_published_raw() {
    let world = World::staged();
    world.refused(
        Request::Publish(world.block_publish_request()),
        &device_refused(DEVICE, Refusal::FilesystemMounted),
    );
}

#[test]
fn a_target_that_is_a_symlink_is_refused() {
    let world = World::staged();
    let target = world.target();
    std::fs::create_dir_all(std::path::Path::new(&target).parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/etc", &target).unwrap();
    world.refused(
        Request::Publish(world.publish_request(false)),
        &PathRefusal::Symlink.of(&target),
    );
}

#[test]
fn a_bind_that_shows_another_source_is_dropped_unattached() {
    let world = World::staged();
    let staging = world.staging();
    // The staging mount replaced by another volume's between the proof of
    // the source and its bind.
    world.fake.before(Step::Bind, 0, move |fake| {
        fake.mount_foreign(staging.as_ref(), "ext4", (259, 2));
    });
    let changed = HelperError::System {
        operation: "checking the new bind mount".into(),
        detail: "the source changed during the request".into(),
    };
    assert_eq!(
        world.handle(Request::Publish(world.publish_request(false))),
        Err(changed)
    );
    assert_eq!(
        world.fake.actions(),
        [Action::Bind {
            source: world.staging()
        }]
    );
    assert!(!std::path::Path::new(&world.target()).exists());
}

/// The target the helper created, removed or replaced by someone else
/// before it is reopened: refused, nothing bound, and what someone else
/// put there left as it is.
#[test]
fn a_new_target_changed_before_it_is_reopened_is_not_used() {
    for replaced in [false, true] {
        let world = World::staged();
        let target = world.target();
        let changed = target.clone();
        world.fake.after(Step::CreateMountPoint, 0, move |_| {
            std::fs::remove_dir(&changed).unwrap();
            if replaced {
                std::fs::write(&changed, b"").unwrap();
            }
        });
        world.fake.forget();
        let detail = if replaced {
            "replaced during the request"
        } else {
            "vanished"
        };
        let expected = HelperError::System {
            operation: "opening the new target".into(),
            detail: detail.into(),
        };
        assert_eq!(
            world.handle(Request::Publish(world.publish_request(false))),
            Err(expected)
        );
        assert_eq!(world.fake.actions(), []);
        assert_eq!(world.fake.mounted().len(), 1, "the staging mount alone");
        let left = std::fs::symlink_metadata(&target).map(|m| m.is_file());
        assert_eq!(left.ok(), replaced.then_some(true), "{target}");
    }
}

#[test]
fn a_target_that_is_another_mount_is_refused_even_of_the_same_filesystem() {
    // Another directory of the volume's own filesystem bound there (the
    // same device, another inode), or another filesystem.
    for number in [NUMBER, (0, 99)] {
        let world = World::staged();
        let target = world.target();
        std::fs::create_dir_all(&target).unwrap();
        world.fake.mount_foreign(target.as_ref(), "ext4", number);
        let expected = HelperError::AlreadyMounted {
            path: target,
            detail: format!("a filesystem on device {}:{}", number.0, number.1),
        };
        world.refused(Request::Publish(world.publish_request(false)), &expected);
    }
}

#[test]
fn a_block_target_that_is_a_mount_of_anything_but_the_device_node_is_refused() {
    let world = World::new();
    let target = world.block_target();
    std::fs::create_dir_all(std::path::Path::new(&target).parent().unwrap()).unwrap();
    std::fs::write(&target, b"").unwrap();
    // A file of another filesystem bound there: a mount root, not a device.
    world.fake.mount_foreign(target.as_ref(), "tmpfs", (0, 99));
    let expected = HelperError::AlreadyMounted {
        path: target,
        detail: "a filesystem on device 0:99".into(),
    };
    world.refused(Request::Publish(world.block_publish_request()), &expected);
}

/// Third audit A3: once as many mount points hold volumes as the limit, a
/// Publish onto a new target (a directory or a raw block file) is refused
/// before anything is made; a repeated Publish or Stage is still answered.
#[test]
fn no_target_is_made_past_the_mount_limit() {
    let world = World::limited(2);
    assert_eq!(world.handle(Request::Stage(world.stage_request())), Ok(Reply::Done));
    let publish = Request::Publish(world.publish_request(false));
    assert_eq!(world.handle(publish.clone()), Ok(Reply::Done));
    world.fake.forget();
    assert_eq!(world.handle(publish), Ok(Reply::Done));
    assert_eq!(world.handle(Request::Stage(world.stage_request())), Ok(Reply::Done));
    assert_eq!(world.fake.actions(), []);
    let pv = "pods/pod-2/volumes/kubernetes.io~csi/pv-1";
    world.write_record(pv, "ebs.csi.aws.com", super::VOLUME);
    let other_pod = PublishRequest {
        target_path: world.path(&format!("{pv}/mount")),
        ..world.publish_request(false)
    };
    let expected = HelperError::MountLimit { limit: 2 };
    world.refused(Request::Publish(other_pod), &expected);
    // A raw block volume (not staged), the one mount point another pod's.
    let world = World::limited(1);
    std::fs::create_dir(world.target()).unwrap();
    world.fake.mount_foreign(world.target().as_ref(), "tmpfs", (0, 99));
    let expected = HelperError::MountLimit { limit: 1 };
    world.refused(Request::Publish(world.block_publish_request()), &expected);
}
