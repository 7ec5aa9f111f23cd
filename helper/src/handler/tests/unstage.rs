//! Unstage over the fake (`handler/unstage.rs`).

use ebs_csi_helper_proto::{Reply, Request, UnstageRequest};

use super::World;
use super::fake::Action;
use crate::error::PathRefusal;

fn unstage(path: &str) -> Request {
    Request::Unstage(UnstageRequest {
        staging_path: path.into(),
    })
}

#[test]
fn a_staged_volume_is_unmounted_and_its_directory_left() {
    let world = World::staged();
    assert_eq!(world.handle(unstage(&world.staging())), Ok(Reply::Done));
    assert_eq!(
        world.fake.actions(),
        [Action::Unmount {
            target: world.staging()
        }]
    );
    assert_eq!(world.fake.mounted(), []);
    assert!(std::path::Path::new(&world.staging()).is_dir());
    world.fake.forget();
    assert_eq!(world.handle(unstage(&world.staging())), Ok(Reply::Done), "not a mount");
    std::fs::remove_dir(world.staging()).unwrap();
    assert_eq!(world.handle(unstage(&world.staging())), Ok(Reply::Done), "missing");
    assert_eq!(world.fake.actions(), []);
}

#[test]
fn a_mount_the_helper_does_not_make_or_a_misshapen_path_is_refused() {
    let world = World::new();
    world.fake.mount_foreign(world.staging().as_ref(), "tmpfs", (0, 99));
    world.refused(
        unstage(&world.staging()),
        &PathRefusal::ForeignMount.of(&world.staging()),
    );
    world.refused(unstage(&world.target()), &PathRefusal::NotItsShape.of(&world.target()));
}

#[test]
fn a_raw_block_volumes_staging_path_is_left_as_it_is() {
    let world = World::new();
    let block_staging = world.path("plugins/kubernetes.io/csi/volumeDevices/staging/pv-1");
    std::fs::create_dir_all(&block_staging).unwrap();
    // Whatever is mounted there is not the helper's.
    world.fake.mount_foreign(block_staging.as_ref(), "tmpfs", (0, 99));
    world.fake.forget();
    assert_eq!(world.handle(unstage(&block_staging)), Ok(Reply::Done));
    assert_eq!(world.fake.actions(), []);
    assert!(world.fake.calls().is_empty(), "{:?}", world.fake.calls());
    assert!(std::path::Path::new(&block_staging).is_dir());
}
