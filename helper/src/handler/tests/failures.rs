//! An error at any step of the seam, in any request that changes the node:
//! the request answers that error and leaves nothing half done — no mount
//! of its own left attached, no file of its own left behind, the claim and
//! the lock released — so the same request, retried, completes.

use ebs_csi_helper_proto::{HelperError, Request, UnpublishRequest, UnstageRequest};

use super::fake::Step;
use super::{DEVICE, World, device_refused};
use crate::device::Refusal;

/// The error injected.
fn injected() -> HelperError {
    HelperError::System {
        operation: "the injected step".into(),
        detail: "EIO".into(),
    }
}

/// For each step `request` makes in `setup`'s world, each of its calls
/// made to fail in turn: the error is answered (or, where the request
/// reads that step's failure as a refusal, `refusal` gives it), the files
/// and the mounts are each as before or as after the request, and a retry
/// ends where the request without a failure ends.
fn every_failure_leaves_nothing_half_done(
    setup: fn() -> World,
    request: fn(&World) -> Request,
    refusal: fn(&World, Step) -> Option<HelperError>,
) {
    let reference = setup();
    let before = reference.snapshot();
    reference.fake.forget();
    reference.handle(request(&reference)).unwrap();
    let after = reference.snapshot();
    let mut calls: Vec<_> = reference.fake.calls().into_iter().collect();
    calls.sort_by_key(|(step, _)| format!("{step:?}"));
    assert!(calls.len() > 2, "{calls:?}");
    for (step, count) in calls {
        for nth in 0..count {
            let world = setup();
            world.fake.forget();
            world.fake.fail(step, nth, injected());
            let failed = world.handle(request(&world));
            let what = format!("{:?} failing at call {nth} of {step:?}", request(&world));
            let refused = refusal(&world, step).map(Err);
            assert!(
                failed == Err(injected()) || Some(&failed) == refused.as_ref(),
                "{what}: {failed:?}"
            );
            let now = world.snapshot();
            assert!(now.files == before.files || now.files == after.files, "{what}: {now:?}");
            assert!(
                now.mounts == before.mounts || now.mounts == after.mounts,
                "{what}: {now:?}"
            );
            world
                .handle(request(&world))
                .unwrap_or_else(|e| panic!("{what}, retried: {e}"));
            assert_eq!(world.snapshot(), after, "{what}, retried");
        }
    }
}

/// No step's failure is read as a refusal.
fn none(_: &World, _: Step) -> Option<HelperError> {
    None
}

/// The proof right after a new mount: a device that cannot be proved
/// again is refused as changed.
fn changed(_: &World, step: Step) -> Option<HelperError> {
    (step == Step::Reverify).then(|| device_refused(DEVICE, Refusal::Changed))
}

/// Kubelet has made the target's parent (the helper would make it, and a
/// refused Publish leaves what it made of the parents).
fn staged_with_target_parent() -> World {
    let world = World::staged();
    let target = world.target();
    std::fs::create_dir_all(std::path::Path::new(&target).parent().unwrap()).unwrap();
    let block = world.block_target();
    std::fs::create_dir_all(std::path::Path::new(&block).parent().unwrap()).unwrap();
    world
}

fn published() -> World {
    let world = staged_with_target_parent();
    world.handle(Request::Publish(world.publish_request(true))).unwrap();
    world
}

fn blank_with_target_parent() -> World {
    let world = World::new();
    let block = world.block_target();
    std::fs::create_dir_all(std::path::Path::new(&block).parent().unwrap()).unwrap();
    world
}

#[test]
fn stage_formatting_a_blank_device() {
    every_failure_leaves_nothing_half_done(World::new, |w| Request::Stage(w.stage_request()), changed);
}

#[test]
fn stage_mounting_and_growing_a_filesystem_found() {
    fn smaller_filesystem() -> World {
        let world = World::new();
        world.fake.device(DEVICE, |d| {
            d.contents = crate::format::Contents::Filesystem("ext4".into());
            d.filesystem = Some((1000, 4096));
        });
        world
    }
    every_failure_leaves_nothing_half_done(smaller_filesystem, |w| Request::Stage(w.stage_request()), changed);
}

#[test]
fn publish_of_a_staged_filesystem() {
    every_failure_leaves_nothing_half_done(
        staged_with_target_parent,
        |w| Request::Publish(w.publish_request(true)),
        none,
    );
}

#[test]
fn publish_of_a_raw_block_device() {
    every_failure_leaves_nothing_half_done(
        blank_with_target_parent,
        |w| Request::Publish(w.block_publish_request()),
        none,
    );
}

#[test]
fn unpublish() {
    every_failure_leaves_nothing_half_done(
        published,
        |w| {
            Request::Unpublish(UnpublishRequest {
                target_path: w.target(),
            })
        },
        none,
    );
}

#[test]
fn unstage() {
    every_failure_leaves_nothing_half_done(
        World::staged,
        |w| {
            Request::Unstage(UnstageRequest {
                staging_path: w.staging(),
            })
        },
        none,
    );
}

/// Expand reads a volume path it cannot inspect as not mounted.
fn not_mounted(world: &World, step: Step) -> Option<HelperError> {
    (step == Step::Inspect).then(|| HelperError::NotMounted { path: world.staging() })
}

#[test]
fn expand() {
    fn staged_smaller() -> World {
        let world = World::staged();
        world.fake.device(DEVICE, |d| d.filesystem = Some((1000, 4096)));
        world
    }
    every_failure_leaves_nothing_half_done(
        staged_smaller,
        |w| {
            Request::Expand(ebs_csi_helper_proto::ExpandRequest {
                volume_id: super::volume(),
                device: DEVICE.into(),
                volume_path: w.staging(),
            })
        },
        not_mounted,
    );
}
