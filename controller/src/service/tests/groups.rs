//! CreateVolumeGroupSnapshot, GetVolumeGroupSnapshot and
//! DeleteVolumeGroupSnapshot against the model.

use ebs_csi_proto::v1::volume_capability::access_mode::Mode;
use ebs_csi_proto::v1::*;
use tonic::Code;

use super::{capability, code, controller, create, publish};
use crate::ec2::model::{Behaviour, Model};
use crate::service::ControllerService;
use crate::tags;

fn group_request(name: &str, volumes: &[&str]) -> CreateVolumeGroupSnapshotRequest {
    CreateVolumeGroupSnapshotRequest {
        name: name.into(),
        source_volume_ids: volumes.iter().map(|v| (*v).to_owned()).collect(),
        ..Default::default()
    }
}

/// The group CreateVolumeGroupSnapshot answers `request` with.
async fn made(service: &ControllerService<Model>, request: CreateVolumeGroupSnapshotRequest) -> VolumeGroupSnapshot {
    service
        .create_group_snapshot(request)
        .await
        .unwrap()
        .group_snapshot
        .unwrap()
}

async fn attach(service: &ControllerService<Model>, volume: &str, node: &str) {
    service
        .publish(publish(volume, node, capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap();
}

/// Two volumes of `i-1` and a detached one, with a third volume of `i-1`
/// outside the group.
async fn volumes(service: &ControllerService<Model>) -> [String; 4] {
    let [a, b, detached, outside] = ["pvc-a", "pvc-b", "pvc-detached", "pvc-outside"];
    let ids = [
        create(service, a).await,
        create(service, b).await,
        create(service, detached).await,
        create(service, outside).await,
    ];
    for id in [&ids[0], &ids[1], &ids[3]] {
        attach(service, id, "i-1").await;
    }
    ids
}

#[tokio::test]
async fn an_instances_volumes_are_snapshotted_together_and_a_detached_one_alone() {
    let (model, service) = controller(Behaviour::default());
    let [a, b, detached, outside] = volumes(&service).await;
    let request = group_request("groupsnapshot-1", &[&a, &b, &detached]);
    let group = made(&service, request.clone()).await;
    assert_eq!(group.group_snapshot_id, "groupsnapshot-1");
    let mut sources: Vec<&str> = group.snapshots.iter().map(|s| s.source_volume_id.as_str()).collect();
    sources.sort_unstable();
    let mut expected = vec![a.as_str(), b.as_str(), detached.as_str()];
    expected.sort_unstable();
    assert_eq!(sources, expected, "no snapshot of {outside}");
    assert!(group.snapshots.iter().all(|s| s.group_snapshot_id == "groupsnapshot-1"));
    assert_eq!((model.calls("CreateSnapshots"), model.calls("CreateSnapshot")), (1, 1));
    for snapshot in &group.snapshots {
        let tags = model.snapshot_tags(&snapshot.snapshot_id);
        assert_eq!(
            tags.get(tags::GROUP_SNAPSHOT_NAME).map(String::as_str),
            Some("groupsnapshot-1")
        );
        assert_eq!(tags.get(tags::CLUSTER).map(String::as_str), Some("true"));
    }
    // A retry (a lost answer, a restarted controller) finds the same group.
    let again = made(&service, request).await;
    assert_eq!(again.snapshots, group.snapshots);
    assert_eq!(model.snapshots().len(), 3, "nothing made twice");
    // Each member is a snapshot of its own too, naming its group.
    let listed = service
        .list_snapshots(ListSnapshotsRequest {
            source_volume_id: a.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        listed.entries[0].snapshot.as_ref().unwrap().group_snapshot_id,
        "groupsnapshot-1"
    );
}

#[tokio::test]
async fn volumes_of_several_instances_are_refused() {
    let (model, service) = controller(Behaviour::default());
    let [a, _, detached, _] = volumes(&service).await;
    attach(&service, &detached, "i-2").await;
    let refused = service
        .create_group_snapshot(group_request("groupsnapshot-2", &[&a, &detached]))
        .await
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "the volumes are attached to several instances (i-1, i-2): EC2 snapshots volumes together at one point in \
         time only on one instance (CreateSnapshots)"
    );
    assert_eq!(code(refused), Code::FailedPrecondition);
    assert_eq!(model.snapshots(), Vec::<String>::new());
}

#[tokio::test]
async fn a_name_taken_by_other_volumes_or_a_bad_request_is_refused() {
    let (_, service) = controller(Behaviour::default());
    let [a, b, detached, _] = volumes(&service).await;
    service
        .create_group_snapshot(group_request("groupsnapshot-3", &[&a, &b]))
        .await
        .unwrap();
    let taken = service
        .create_group_snapshot(group_request("groupsnapshot-3", &[&detached]))
        .await
        .unwrap_err();
    assert_eq!(code(taken), Code::AlreadyExists);
    for bad in [
        group_request("", &[&a]),
        group_request("groupsnapshot-4", &[]),
        group_request("groupsnapshot-4", &[&a, &a]),
    ] {
        let refused = service.create_group_snapshot(bad).await.unwrap_err();
        assert_eq!(code(refused), Code::InvalidArgument);
    }
    let missing = service
        .create_group_snapshot(group_request("groupsnapshot-4", &["vol-0000000000000dead"]))
        .await
        .unwrap_err();
    assert_eq!(code(missing), Code::NotFound);
}

#[tokio::test]
async fn a_group_is_got_and_deleted_with_its_members() {
    let (model, service) = controller(Behaviour::default());
    let [a, b, detached, _] = volumes(&service).await;
    let group = made(&service, group_request("groupsnapshot-5", &[&a, &b, &detached])).await;
    let ids: Vec<String> = group.snapshots.iter().map(|s| s.snapshot_id.clone()).collect();
    let got = service
        .get_group_snapshot(GetVolumeGroupSnapshotRequest {
            group_snapshot_id: "groupsnapshot-5".into(),
            snapshot_ids: ids.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .group_snapshot
        .unwrap();
    assert_eq!(got.snapshots, group.snapshots);
    let single = crate::ec2::Ec2::create_snapshot(model.as_ref(), &a, crate::ec2::CreateSnapshotInput::default())
        .await
        .unwrap()
        .id;
    let mismatch = DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: "groupsnapshot-5".into(),
        snapshot_ids: vec![single.clone()],
        ..Default::default()
    };
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(
        code(service.delete_group_snapshot(mismatch).await.unwrap_err()),
        Code::InvalidArgument
    );
    let delete = DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: "groupsnapshot-5".into(),
        snapshot_ids: ids,
        ..Default::default()
    };
    service.delete_group_snapshot(delete.clone()).await.unwrap();
    assert_eq!(model.snapshots(), vec![single], "only the members went");
    service.delete_group_snapshot(delete).await.unwrap();
    let gone = service
        .get_group_snapshot(GetVolumeGroupSnapshotRequest {
            group_snapshot_id: "groupsnapshot-5".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code(gone), Code::NotFound);
}

/// A second set of members, made by a retry that came before EC2 listed
/// the first (CreateSnapshots takes no client token): the group answers the
/// first set, and its deletion takes both.
#[tokio::test]
async fn a_second_set_of_members_is_not_the_group_and_goes_with_it() {
    let (model, service) = controller(Behaviour::default());
    let [a, b, _, outside] = volumes(&service).await;
    let request = group_request("groupsnapshot-6", &[&a, &b]);
    let first = made(&service, request.clone()).await;
    let tags = model.snapshot_tags(&first.snapshots[0].snapshot_id);
    let second = crate::ec2::Ec2::create_snapshots(model.as_ref(), "i-1", vec![outside], tags)
        .await
        .unwrap();
    assert_eq!(second.len(), 2);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let again = made(&service, request).await;
    assert_eq!(again.snapshots, first.snapshots);
    assert_eq!(model.snapshots().len(), 4);
    service
        .delete_group_snapshot(DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: "groupsnapshot-6".into(),
            snapshot_ids: first.snapshots.iter().map(|s| s.snapshot_id.clone()).collect(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(model.snapshots(), Vec::<String>::new());
}
