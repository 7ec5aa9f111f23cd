//! Expand over the fake (`handler/expand.rs`).

use ebs_csi_helper_proto::{ExpandRequest, FsType, HelperError, Reply, Request};

use super::fake::Action;
use super::{DEVICE, SIZE, World, volume};
use crate::error::PathRefusal;
use crate::format::Contents;

fn expand(path: &str) -> Request {
    Request::Expand(ExpandRequest {
        volume_id: volume(),
        device: DEVICE.into(),
        volume_path: path.into(),
    })
}

#[test]
fn a_staged_filesystem_grows_to_its_device_and_the_size_is_answered() {
    let world = World::staged();
    world.fake.device(DEVICE, |d| d.filesystem = Some((1000, 4096)));
    let expanded = Ok(Reply::Expanded { size_bytes: SIZE });
    assert_eq!(world.handle(expand(&world.staging())), expanded);
    let grown = Action::ResizeExt {
        target: world.staging(),
        blocks: SIZE / 4096,
    };
    assert_eq!(world.fake.actions(), [grown]);
    world.fake.forget();
    assert_eq!(world.handle(expand(&world.staging())), expanded);
    assert_eq!(world.fake.actions(), [], "as large as its device: not grown");
}

#[test]
fn xfs_is_grown_by_xfs_growfs_at_every_expand() {
    let world = World::new();
    world
        .fake
        .device(DEVICE, |d| d.contents = Contents::Filesystem("xfs".into()));
    let mut stage = world.stage_request();
    stage.fs_type = FsType::Xfs;
    world.handle(Request::Stage(stage)).unwrap();
    world.fake.forget();
    assert_eq!(
        world.handle(expand(&world.staging())),
        Ok(Reply::Expanded { size_bytes: SIZE })
    );
    assert_eq!(
        world.fake.actions(),
        [Action::XfsGrowfs {
            target: world.staging()
        }]
    );
}

#[test]
fn only_the_volumes_mounted_filesystem_is_grown() {
    let world = World::new();
    let not_mounted = HelperError::NotMounted { path: world.staging() };
    world.refused(expand(&world.staging()), &not_mounted);
    world.fake.mount_foreign(world.staging().as_ref(), "ext4", (259, 2));
    world.refused(expand(&world.staging()), &not_mounted);
    let world = World::new();
    world
        .fake
        .mount_foreign(world.staging().as_ref(), "tmpfs", super::NUMBER);
    let not_mounted = HelperError::NotMounted { path: world.staging() };
    world.refused(expand(&world.staging()), &not_mounted);
    let misshapen = world.path("plugins/x");
    world.refused(expand(&misshapen), &PathRefusal::NotItsShape.of(&misshapen));
}
