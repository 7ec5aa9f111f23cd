//! Unpublish over the fake (`handler/unpublish.rs`).

use std::os::unix::fs::PermissionsExt;

use ebs_csi_helper_proto::{HelperError, Reply, Request, UnpublishRequest};

use super::World;
use super::fake::{Action, Step};
use crate::error::PathRefusal;

fn unpublish(path: &str) -> Request {
    Request::Unpublish(UnpublishRequest {
        target_path: path.into(),
    })
}

#[test]
fn a_published_volume_is_unmounted_and_its_mount_point_removed() {
    for block in [false, true] {
        let world = if block { World::new() } else { World::staged() };
        let (request, target) = if block {
            (world.block_publish_request(), world.block_target())
        } else {
            (world.publish_request(false), world.target())
        };
        world.handle(Request::Publish(request)).unwrap();
        world.fake.forget();
        assert_eq!(world.handle(unpublish(&target)), Ok(Reply::Done));
        assert_eq!(world.fake.actions(), [Action::Unmount { target: target.clone() }]);
        assert!(!std::path::Path::new(&target).exists());
        assert_eq!(world.handle(unpublish(&target)), Ok(Reply::Done), "missing");
    }
}

#[test]
fn a_mount_point_removed_by_someone_else_right_after_its_unmount_is_done() {
    let world = World::staged();
    let target = world.target();
    world.handle(Request::Publish(world.publish_request(false))).unwrap();
    world.fake.forget();
    let removed = target.clone();
    world
        .fake
        .after(Step::Unmount, 0, move |_| std::fs::remove_dir(&removed).unwrap());
    assert_eq!(world.handle(unpublish(&target)), Ok(Reply::Done));
    assert_eq!(world.fake.actions(), [Action::Unmount { target: target.clone() }]);
    assert!(world.fake.mounted().iter().all(|(point, ..)| *point != target));
}

/// A target the helper cannot reopen after its unmount (its parent made
/// unsearchable meanwhile; the test's thread gives up overriding file
/// permissions, as a normal user has none to give up): the error is
/// answered, and once the parent is searchable again a retry removes the
/// mount point.
#[test]
fn a_target_that_cannot_be_reopened_after_its_unmount_is_an_error_and_a_retry_ends_it() {
    std::thread::spawn(|| {
        let mut sets = rustix::thread::capabilities(None).unwrap();
        sets.effective = rustix::thread::CapabilitySet::empty();
        rustix::thread::set_capabilities(None, sets).unwrap();
        let world = World::staged();
        let target = world.target();
        world.handle(Request::Publish(world.publish_request(false))).unwrap();
        let parent = std::path::Path::new(&target).parent().unwrap().to_owned();
        let mode = |bits| std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(bits)).unwrap();
        let hidden = parent.clone();
        world.fake.after(Step::Unmount, 0, move |_| {
            std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o000)).unwrap();
        });
        let expected = HelperError::System {
            operation: format!("opening {target}"),
            detail: "Permission denied (os error 13)".into(),
        };
        assert_eq!(world.handle(unpublish(&target)), Err(expected));
        mode(0o755);
        assert!(world.fake.mounted().iter().all(|(point, ..)| *point != target));
        assert!(std::path::Path::new(&target).is_dir(), "left until the retry");
        assert_eq!(world.handle(unpublish(&target)), Ok(Reply::Done));
        assert!(!std::path::Path::new(&target).exists());
    })
    .join()
    .unwrap();
}

#[test]
fn what_the_helper_does_not_make_is_left_as_it_is() {
    let world = World::new();
    let target = world.target();
    std::fs::create_dir_all(&target).unwrap();
    world.fake.mount_foreign(target.as_ref(), "tmpfs", (0, 99));
    world.refused(unpublish(&target), &PathRefusal::ForeignMount.of(&target));

    let world = World::new();
    let target = world.target();
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(format!("{target}/data"), b"x").unwrap();
    world.refused(unpublish(&target), &PathRefusal::NotAMountPoint.of(&target));
    std::fs::remove_dir_all(&target).unwrap();
    std::fs::write(&target, b"x").unwrap();
    world.refused(unpublish(&target), &PathRefusal::NotAMountPoint.of(&target));
    std::fs::remove_file(&target).unwrap();
    std::os::unix::fs::symlink("/etc", &target).unwrap();
    world.refused(unpublish(&target), &PathRefusal::Symlink.of(&target));
}

#[test]
fn a_mount_point_someone_else_owns_is_left() {
    for file in [false, true] {
        let world = World::new();
        let target = world.target();
        std::fs::create_dir_all(std::path::Path::new(&target).parent().unwrap()).unwrap();
        if file {
            std::fs::write(&target, b"").unwrap();
        } else {
            std::fs::create_dir(&target).unwrap();
        }
        world.fake.chown(target.as_ref(), 1000);
        world.refused(unpublish(&target), &PathRefusal::NotAMountPoint.of(&target));
    }
}
