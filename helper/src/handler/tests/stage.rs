//! Stage over the fake: each branch of `handler/stage.rs` in its order.

use ebs_csi_helper_proto::{FormatOptions, FsType, HelperError, Reply, Request};
use rustix::fs::FileType;
use rustix::mount::MountFlags;

use super::fake::{Action, Step};
use super::{DEVICE, NUMBER, OTHER_DEVICE, SIZE, World, device_refused};
use crate::device::Refusal;
use crate::error::PathRefusal;
use crate::format::Contents;
use crate::options;

fn stage(world: &World) -> Request {
    Request::Stage(world.stage_request())
}

/// The mount of the volume's `fs` filesystem at the staging path, with the
/// `extra` flags and the data `options` the helper passes.
fn mount(world: &World, fs: FsType, extra: MountFlags, options: &[&str]) -> [Action; 2] {
    [
        Action::Mount {
            device: DEVICE.into(),
            fs,
            flags: MountFlags::NOSUID | MountFlags::NODEV | extra,
            options: options.iter().map(|o| (*o).to_owned()).collect(),
        },
        Action::Attach {
            target: world.staging(),
        },
    ]
}

#[test]
fn a_blank_device_is_formatted_mounted_and_not_grown() {
    let world = World::new();
    assert_eq!(world.handle(stage(&world)), Ok(Reply::Done));
    let mut expected = vec![Action::Format {
        device: DEVICE.into(),
        fs: FsType::Ext4,
    }];
    expected.extend(mount(&world, FsType::Ext4, MountFlags::empty(), &["errors=remount-ro"]));
    assert_eq!(world.fake.actions(), expected);
    assert_eq!(
        world.fake.mounted(),
        [(world.staging(), "ext4".into(), "rw,nosuid,nodev".into())]
    );
    assert_eq!(
        world.fake.calls().get(&Step::FilesystemSize),
        None,
        "a new filesystem is not grown"
    );
}

#[test]
fn a_staged_volume_is_staged_again_without_any_action() {
    let world = World::staged();
    assert_eq!(world.handle(stage(&world)), Ok(Reply::Done));
    assert_eq!(world.fake.actions(), []);
    assert_eq!(world.fake.mounted().len(), 1);
}

#[test]
fn a_filesystem_found_is_mounted_with_the_options_and_grown_to_its_device() {
    let world = World::new();
    world.fake.device(DEVICE, |d| {
        d.contents = Contents::Filesystem("ext4".into());
        d.filesystem = Some((SIZE / 4096 - 1000, 4096));
    });
    let mut request = world.stage_request();
    request.mount_flags = vec!["noatime".into(), "data=ordered".into()];
    assert_eq!(world.handle(Request::Stage(request)), Ok(Reply::Done));
    let mut expected = mount(
        &world,
        FsType::Ext4,
        MountFlags::NOATIME,
        &["data=ordered", "errors=remount-ro"],
    )
    .to_vec();
    expected.push(Action::ResizeExt {
        target: world.staging(),
        blocks: SIZE / 4096,
    });
    assert_eq!(world.fake.actions(), expected);
}

#[test]
fn a_filesystem_as_large_as_its_device_is_not_grown() {
    let world = World::new();
    world
        .fake
        .device(DEVICE, |d| d.contents = Contents::Filesystem("ext4".into()));
    assert_eq!(world.handle(stage(&world)), Ok(Reply::Done));
    assert_eq!(
        world.fake.actions(),
        mount(&world, FsType::Ext4, MountFlags::empty(), &["errors=remount-ro"])
    );
}

#[test]
fn xfs_grows_by_xfs_growfs_only_when_its_superblock_says_it_is_smaller() {
    for (blocks, grown) in [(SIZE / 4096 - 2, true), (SIZE / 4096, false)] {
        let world = World::new();
        world.fake.device(DEVICE, |d| {
            d.contents = Contents::Filesystem("xfs".into());
            d.filesystem = Some((blocks, 4096));
        });
        let mut request = world.stage_request();
        request.fs_type = FsType::Xfs;
        assert_eq!(world.handle(Request::Stage(request)), Ok(Reply::Done));
        let mut expected = mount(&world, FsType::Xfs, MountFlags::empty(), &["nouuid"]).to_vec();
        if grown {
            expected.push(Action::XfsGrowfs {
                target: world.staging(),
            });
        }
        assert_eq!(world.fake.actions(), expected, "{blocks} blocks");
    }
}

#[test]
fn another_filesystem_or_any_other_data_is_never_formatted() {
    for (contents, found) in [
        (Contents::Filesystem("xfs".into()), "xfs"),
        (Contents::Other("a gpt partition table".into()), "a gpt partition table"),
        (
            Contents::Other("data no prober recognises (byte 4096 is not zero)".into()),
            "data no prober recognises (byte 4096 is not zero)",
        ),
    ] {
        let world = World::new();
        world.fake.device(DEVICE, |d| d.contents = contents);
        let expected = HelperError::FilesystemMismatch {
            device: DEVICE.into(),
            found: found.into(),
            requested: "ext4".into(),
        };
        world.refused(stage(&world), &expected);
    }
}

#[test]
fn a_malformed_request_is_refused_before_anything_is_looked_at() {
    let world = World::new();
    let mut bad_format = world.stage_request();
    bad_format.format = FormatOptions {
        block_size: Some(3000),
        ..FormatOptions::default()
    };
    world.refused(
        Request::Stage(bad_format),
        &HelperError::InvalidRequest("blockSize=3000 is outside 1024..=65536 or not a power of two for ext4".into()),
    );
    let mut suid = world.stage_request();
    suid.mount_flags = vec!["suid".into()];
    let refusal = options::parse(Some(FsType::Ext4), &suid.mount_flags).unwrap_err();
    assert!(matches!(&refusal, HelperError::MountOptionRefused(o) if o.starts_with("\"suid\" refused")));
    world.refused(Request::Stage(suid), &refusal);
    for (path, reason) in [
        ("/etc/x".to_owned(), PathRefusal::OutsideRoots),
        (
            world.path("pods/pod-1/volumes/kubernetes.io~csi/pv-1/mount"),
            PathRefusal::NotItsShape,
        ),
        (format!("{}/../globalmount", world.staging()), PathRefusal::NotCanonical),
    ] {
        let mut request = world.stage_request();
        request.staging_path.clone_from(&path);
        world.refused(Request::Stage(request), &reason.of(&path));
    }
    assert_eq!(world.fake.calls().get(&Step::Verify), None, "no device was opened");
}

#[test]
fn the_staging_directory_must_exist_be_a_directory_and_be_empty() {
    let world = World::new();
    std::fs::remove_dir(world.staging()).unwrap();
    world.refused(stage(&world), &PathRefusal::Missing.of(&world.staging()));
    std::fs::write(world.staging(), b"").unwrap();
    world.refused(
        stage(&world),
        &PathRefusal::NotOfType(FileType::Directory).of(&world.staging()),
    );
    std::fs::remove_file(world.staging()).unwrap();
    std::fs::create_dir(world.staging()).unwrap();
    std::fs::write(format!("{}/data", world.staging()), b"").unwrap();
    world.refused(stage(&world), &PathRefusal::NotEmpty.of(&world.staging()));
}

#[test]
fn a_staging_directory_that_is_another_mount_is_refused() {
    let world = World::new();
    world.fake.mount_foreign(world.staging().as_ref(), "tmpfs", (0, 99));
    let expected = HelperError::AlreadyMounted {
        path: world.staging(),
        detail: "a filesystem on device 0:99".into(),
    };
    world.refused(stage(&world), &expected);
}

#[test]
fn a_device_that_is_not_the_volume_is_refused() {
    let world = World::new();
    for (device, reason) in [
        (OTHER_DEVICE, Refusal::OtherVolume),
        ("/dev/nvme9n1", Refusal::NotBlockDevice),
        ("/dev/sda", Refusal::NotKernelName),
    ] {
        let mut request = world.stage_request();
        request.device = device.into();
        world.refused(Request::Stage(request), &device_refused(device, reason));
    }
}

#[test]
fn a_device_in_use_by_the_host_or_as_a_raw_block_volume_is_refused() {
    let world = World::new();
    let outside = world.root.parent().unwrap().join("data");
    std::fs::create_dir(&outside).unwrap();
    world.fake.mount_foreign(&outside, "ext4", NUMBER);
    world.refused(stage(&world), &device_refused(DEVICE, Refusal::MountedOutside));

    // Beneath the root, at a path of no volume's shape (third audit A4).
    let world = World::new();
    let beneath = world.root.join("data");
    std::fs::create_dir(&beneath).unwrap();
    world.fake.mount_foreign(&beneath, "ext4", NUMBER);
    world.refused(stage(&world), &device_refused(DEVICE, Refusal::MountedOutside));

    let world = World::new();
    assert_eq!(
        world.handle(Request::Publish(world.block_publish_request())),
        Ok(Reply::Done)
    );
    world.refused(stage(&world), &device_refused(DEVICE, Refusal::PublishedRaw));
}

#[test]
fn a_device_being_formatted_is_refused_until_its_format_ends() {
    let world = World::new();
    let claim = world.handler.claims.claim(NUMBER, DEVICE).unwrap();
    let busy = HelperError::InProgress { device: DEVICE.into() };
    world.refused(stage(&world), &busy);
    drop(claim);
    assert_eq!(world.handle(stage(&world)), Ok(Reply::Done));
}

#[test]
fn what_changed_during_the_format_is_proved_again_before_the_mount() {
    let formatted = Action::Format {
        device: DEVICE.into(),
        fs: FsType::Ext4,
    };
    // Another mount at the staging path meanwhile.
    let world = World::new();
    let staging = world.staging();
    world.fake.before(Step::Format, 0, move |fake| {
        fake.mount_foreign(staging.as_ref(), "tmpfs", (0, 99))
    });
    let expected = HelperError::AlreadyMounted {
        path: world.staging(),
        detail: "a filesystem on device 0:99".into(),
    };
    assert_eq!(world.handle(stage(&world)), Err(expected));
    assert_eq!(world.fake.actions(), std::slice::from_ref(&formatted));
    // The same volume mounted there meanwhile: done.
    let world = World::new();
    let staging = world.staging();
    world.fake.before(Step::Format, 0, move |fake| {
        fake.mount_foreign(staging.as_ref(), "ext4", NUMBER)
    });
    assert_eq!(world.handle(stage(&world)), Ok(Reply::Done));
    assert_eq!(world.fake.actions(), std::slice::from_ref(&formatted));
    // The device replaced meanwhile.
    let world = World::new();
    world
        .fake
        .before(Step::Format, 0, |fake| fake.device(DEVICE, |d| d.changed = true));
    assert_eq!(
        world.handle(stage(&world)),
        Err(device_refused(DEVICE, Refusal::Changed))
    );
    assert_eq!(world.fake.actions(), [formatted]);
    assert_eq!(world.fake.mounted(), []);
}

/// Third audit A3: once as many mount points hold volumes as the limit (a
/// pod's target here), a Stage is refused before the device is probed or
/// formatted, and after a format when the limit was reached meanwhile.
#[test]
fn no_staging_mount_is_made_past_the_mount_limit() {
    let expected = HelperError::MountLimit { limit: 1 };
    let world = World::limited(1);
    std::fs::create_dir(world.target()).unwrap();
    world.fake.mount_foreign(world.target().as_ref(), "tmpfs", (0, 99));
    world.refused(stage(&world), &expected);
    let world = World::limited(1);
    let target = world.target();
    std::fs::create_dir(&target).unwrap();
    world.fake.before(Step::Format, 0, move |fake| {
        fake.mount_foreign(target.as_ref(), "tmpfs", (0, 99))
    });
    assert_eq!(world.handle(stage(&world)), Err(expected));
    let formatted = Action::Format {
        device: DEVICE.into(),
        fs: FsType::Ext4,
    };
    assert_eq!(world.fake.actions(), [formatted]);
}

#[test]
fn a_new_mount_is_checked_before_it_is_attached() {
    let world = World::new();
    world
        .fake
        .device(DEVICE, |d| d.contents = Contents::Filesystem("ext4".into()));
    // The check right after the mount (the request's third proof: the
    // second is under the lock again, after the probe).
    world
        .fake
        .fail(Step::Reverify, 1, device_refused(DEVICE, Refusal::Changed));
    assert_eq!(
        world.handle(stage(&world)),
        Err(device_refused(DEVICE, Refusal::Changed))
    );
    assert_eq!(
        world.fake.actions(),
        mount(&world, FsType::Ext4, MountFlags::empty(), &["errors=remount-ro"])[..1]
    );
    assert_eq!(world.fake.mounted(), [], "dropped unattached");
}

#[test]
fn a_growth_that_fails_unmounts_again_so_a_retry_grows() {
    let world = World::new();
    world.fake.device(DEVICE, |d| {
        d.contents = Contents::Filesystem("ext4".into());
        d.filesystem = Some((1000, 4096));
    });
    let failure = HelperError::System {
        operation: "growing".into(),
        detail: "EIO".into(),
    };
    world.fake.fail(Step::ResizeExt, 0, failure.clone());
    assert_eq!(world.handle(stage(&world)), Err(failure));
    let mut expected = mount(&world, FsType::Ext4, MountFlags::empty(), &["errors=remount-ro"]).to_vec();
    expected.push(Action::Unmount {
        target: world.staging(),
    });
    assert_eq!(world.fake.actions(), expected);
    assert_eq!(world.fake.mounted(), []);
    world.fake.forget();
    assert_eq!(world.handle(stage(&world)), Ok(Reply::Done));
    assert!(world.fake.actions().contains(&Action::ResizeExt {
        target: world.staging(),
        blocks: SIZE / 4096
    }));
}

#[test]
fn a_mount_of_another_disk_than_the_one_proved_is_dropped_unattached() {
    let world = World::new();
    world.fake.device(DEVICE, |d| {
        d.contents = Contents::Filesystem("ext4".into());
        d.mounts_as = (259, 2);
    });
    assert_eq!(
        world.handle(stage(&world)),
        Err(device_refused(DEVICE, Refusal::Changed))
    );
    assert_eq!(world.fake.mounted(), []);
}
