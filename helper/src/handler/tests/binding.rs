//! Every kubelet path bound to its volume (audit 3, A2, A3, A10): a staging
//! path named by another volume's hash, a path without kubelet's record of
//! the volume beside it or with one of another driver or volume, and a
//! target whose parent kubelet never made are refused, and nothing changes;
//! a Nomad target takes only the volume staged at its staging path.

use ebs_csi_helper_proto::{PublishSource, Reply, Request};

use super::fake::Step;
use super::{OTHER_VOLUME, VOLUME, World};
use crate::error::PathRefusal;
use crate::layout::Layout;
use crate::record;

/// kubelet's directory of `volume`'s staging path, beneath its root.
fn volume_dir(volume: &str) -> String {
    format!(
        "plugins/kubernetes.io/csi/ebs.csi.aws.com/{}",
        record::sha256_hex(volume)
    )
}

#[test]
fn a_staging_path_of_another_volumes_hash_is_refused() {
    let world = World::new();
    let other = volume_dir(OTHER_VOLUME);
    world.write_record(&other, "ebs.csi.aws.com", VOLUME);
    let staging = world.path(&format!("{other}/globalmount"));
    std::fs::create_dir(&staging).unwrap();
    let mut request = world.stage_request();
    request.staging_path.clone_from(&staging);
    world.refused(Request::Stage(request), &PathRefusal::OtherVolumesHash.of(&staging));
    assert_eq!(world.fake.calls().get(&Step::Verify), None, "no device was opened");
}

#[test]
fn a_staging_path_without_the_volumes_record_is_refused() {
    let world = World::new();
    let record_dir = volume_dir(VOLUME);
    let stage = || Request::Stage(world.stage_request());
    world.write_record(&record_dir, "efs.csi.aws.com", VOLUME);
    world.refused(stage(), &PathRefusal::OtherVolumesRecord.of(&world.staging()));
    world.write_record(&record_dir, "ebs.csi.aws.com", OTHER_VOLUME);
    world.refused(stage(), &PathRefusal::OtherVolumesRecord.of(&world.staging()));
    std::fs::remove_file(world.root.join(&record_dir).join("vol_data.json")).unwrap();
    world.refused(stage(), &PathRefusal::NoVolumeRecord.of(&world.staging()));
    std::os::unix::fs::symlink("/etc/hostname", world.root.join(&record_dir).join("vol_data.json")).unwrap();
    world.refused(stage(), &PathRefusal::Symlink.of(&world.staging()));
    assert_eq!(world.fake.calls().get(&Step::Verify), None, "no device was opened");
}

#[test]
fn a_target_of_another_driver_or_volume_is_refused() {
    let world = World::staged();
    let pv = "pods/pod-1/volumes/kubernetes.io~csi/pv-1";
    let publish = || Request::Publish(world.publish_request(false));
    // Experiment E-B: another driver's volume directory.
    world.write_record(pv, "secrets-store.csi.k8s.io", "csi-abc");
    world.refused(publish(), &PathRefusal::OtherVolumesRecord.of(&world.target()));
    world.write_record(pv, "ebs.csi.aws.com", OTHER_VOLUME);
    world.refused(publish(), &PathRefusal::OtherVolumesRecord.of(&world.target()));
    std::fs::remove_file(world.root.join(pv).join("vol_data.json")).unwrap();
    world.refused(publish(), &PathRefusal::NoVolumeRecord.of(&world.target()));
}

#[test]
fn a_raw_block_target_without_the_volumes_record_is_refused() {
    let world = World::new();
    std::fs::remove_dir_all(world.path("plugins/kubernetes.io/csi/volumeDevices/pv-1")).unwrap();
    world.refused(
        Request::Publish(world.block_publish_request()),
        &PathRefusal::NoVolumeRecord.of(&world.block_target()),
    );
    world.write_record(
        "plugins/kubernetes.io/csi/volumeDevices/pv-1/data",
        "ebs.csi.aws.com",
        OTHER_VOLUME,
    );
    world.refused(
        Request::Publish(world.block_publish_request()),
        &PathRefusal::OtherVolumesRecord.of(&world.block_target()),
    );
}

#[test]
fn no_parent_of_a_kubelet_target_is_created() {
    // Experiment E-M: a made-up pod; and the staging source of another
    // volume's hash.
    let world = World::staged();
    let made_up = world.path("pods/made-up/volumes/kubernetes.io~csi/pv-1/mount");
    let mut request = world.publish_request(false);
    request.target_path.clone_from(&made_up);
    world.refused(Request::Publish(request), &PathRefusal::NoVolumeRecord.of(&made_up));
    assert!(!world.root.join("pods/made-up").exists());
    std::fs::create_dir_all(world.path("pods/pod-2/volumes/kubernetes.io~csi")).unwrap();
    let unmade = world.path("pods/pod-2/volumes/kubernetes.io~csi/pv-1/mount");
    let mut request = world.publish_request(false);
    request.target_path.clone_from(&unmade);
    world.refused(Request::Publish(request), &PathRefusal::NoVolumeRecord.of(&unmade));
    let mut request = world.publish_request(false);
    let PublishSource::Staging { staging_path, .. } = &mut request.source else {
        unreachable!()
    };
    let other = world.path(&format!("{}/globalmount", volume_dir(OTHER_VOLUME)));
    staging_path.clone_from(&other);
    world.refused(Request::Publish(request), &PathRefusal::OtherVolumesHash.of(&other));
}

/// Nomad's layout (third audit A2): a staged filesystem is bound only onto
/// a target that carries its staging path's Nomad volume id and usage.
#[test]
fn a_nomad_target_of_another_volume_is_refused() {
    let world = World::with_layout(Layout::Nomad);
    let usage = "rw-file-system-single-node-writer";
    let staging = world.path(&format!("staging/default/vol-a/{usage}"));
    std::fs::create_dir_all(&staging).unwrap();
    let mut stage = world.stage_request();
    stage.staging_path.clone_from(&staging);
    assert_eq!(world.handle(Request::Stage(stage)), Ok(Reply::Done));
    let publish = |target: String| {
        let mut request = world.publish_request(false);
        request.target_path = target;
        if let PublishSource::Staging { staging_path, .. } = &mut request.source {
            staging_path.clone_from(&staging);
        }
        Request::Publish(request)
    };
    let other = world.path(&format!("per-alloc/alloc-1/vol-b/{usage}"));
    world.refused(publish(other.clone()), &PathRefusal::OtherVolumesTarget.of(&other));
    let own = world.path(&format!("per-alloc/alloc-1/vol-a/{usage}"));
    assert_eq!(world.handle(publish(own)), Ok(Reply::Done));
}
