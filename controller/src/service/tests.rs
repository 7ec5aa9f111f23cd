//! The controller against the in-memory EC2 model: what moto cannot show.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ebs_csi_proto::v1::volume_capability::access_mode::Mode;
use ebs_csi_proto::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use ebs_csi_proto::v1::*;
use tonic::Code;

use super::{ControllerService, Settings};
use crate::ec2::batch::BatchConfig;
use crate::ec2::model::{Behaviour, Model};
use crate::ec2::{AttachmentState, Initializing, VolumeState};
use crate::error::ControllerError;
use crate::metrics::DetachPending;
use crate::tags::InvalidTags;

mod benches;
mod groups;

const GIB: i64 = 1 << 30;

fn controller(behaviour: Behaviour) -> (Arc<Model>, ControllerService<Model>) {
    let model = Arc::new(Model::new(behaviour));
    model.add_instance("i-1", "us-east-1a");
    model.add_instance("i-2", "us-east-1a");
    let service = restarted(&model);
    (model, service)
}

/// A controller that starts on `model` (as after a restart: it remembers
/// nothing).
fn restarted(model: &Arc<Model>) -> ControllerService<Model> {
    let settings = Settings {
        batch: BatchConfig {
            window: Duration::from_millis(20),
            ..BatchConfig::default()
        },
        modify_window: Duration::from_millis(100),
        create_timeout: Duration::from_secs(10),
        attach_timeout: Duration::from_secs(2),
        state_timeout: Duration::from_secs(10),
        detach_timeout: Duration::from_secs(10),
        ..Settings::default()
    };
    ControllerService::new(Arc::clone(model), settings)
}

fn capability(mode: Mode, block: bool) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume::default())
        }),
    }
}

fn request(name: &str, parameters: &[(&str, &str)], cap: VolumeCapability) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 10 * GIB,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap],
        parameters: parameters
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![],
            preferred: vec![Topology {
                segments: HashMap::from([("topology.kubernetes.io/zone".into(), "us-east-1a".into())]),
            }],
        }),
        ..Default::default()
    }
}

async fn create(service: &ControllerService<Model>, name: &str) -> String {
    service
        .create(request(name, &[], capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap()
        .volume
        .unwrap()
        .volume_id
}

fn publish(volume_id: &str, node: &str, cap: VolumeCapability) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node.into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn code(error: ControllerError) -> Code {
    tonic::Status::from(error).code()
}

#[tokio::test]
async fn create_waits_for_available_and_repeats_return_the_same_volume() {
    let (model, service) = controller(Behaviour::default());
    let id = create(&service, "pvc-1").await;
    assert_eq!(model.volume(&id).unwrap().state, VolumeState::Available);
    assert_eq!(create(&service, "pvc-1").await, id);
    assert_eq!(model.calls("CreateVolume"), 1);
}

#[tokio::test]
async fn a_repeat_finds_the_volume_ec2_encrypted_unasked() {
    let (model, service) = controller(Behaviour {
        encrypted_by_default: true,
        ..Behaviour::default()
    });
    let id = create(&service, "pvc-default-encrypted").await;
    assert!(model.volume(&id).unwrap().encrypted);
    assert_eq!(create(&service, "pvc-default-encrypted").await, id);
    assert_eq!(model.calls("CreateVolume"), 1);
    // Asked for and not there: another volume under that name.
    let (_, service) = controller(Behaviour::default());
    create(&service, "pvc-plain").await;
    let cap = capability(Mode::SingleNodeWriter, false);
    for parameters in [
        [("encrypted", "true")],
        [("kmsKeyId", "arn:aws:kms:us-east-1:111122223333:key/k1")],
    ] {
        let err = service
            .create(request("pvc-plain", &parameters, cap.clone()))
            .await
            .unwrap_err();
        let message = err.to_string();
        assert_eq!(
            (code(err), message),
            (
                Code::AlreadyExists,
                "volume vol-00000000000000001 named pvc-plain exists with other parameters".to_owned()
            )
        );
    }
}

#[tokio::test]
async fn a_volume_attributes_class_given_at_creation_applies() {
    let (model, service) = controller(Behaviour::default());
    let with_class = |name: &str, class: &[(&str, &str)]| CreateVolumeRequest {
        mutable_parameters: class.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..request(
            name,
            &[("type", "gp3"), ("iops", "3000")],
            capability(Mode::SingleNodeWriter, false),
        )
    };
    let class = [
        ("type", "io2"),
        ("iops", "4000"),
        ("tagSpecification_1", "team=storage"),
    ];
    let id = service
        .create(with_class("pvc-class", &class))
        .await
        .unwrap()
        .volume
        .unwrap()
        .volume_id;
    let volume = model.volume(&id).unwrap();
    assert_eq!((volume.volume_type.as_str(), volume.iops), ("io2", Some(4000)));
    assert_eq!(volume.tags.get("team").map(String::as_str), Some("storage"));
    let err = service
        .create(with_class("pvc-bad-class", &[("volumeSize", "10")]))
        .await
        .unwrap_err();
    let message = err.to_string();
    assert_eq!(
        (code(err), message.as_str()),
        (Code::InvalidArgument, "parameter \"volumesize\" is not known")
    );
    assert_eq!(model.calls("CreateVolume"), 1, "nothing created for the bad class");
}

#[tokio::test]
async fn unpublish_of_a_volume_not_attached_there_succeeds() {
    let (model, service) = controller(Behaviour::default());
    let id = create(&service, "pvc-detached").await;
    let unpublish = |volume_id: &str, node_id: &str| ControllerUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node_id.into(),
        ..Default::default()
    };
    // Attached nowhere: EC2 answers IncorrectState ("… 'available' state.").
    service.unpublish(unpublish(&id, "i-1")).await.unwrap();
    // Attached to another node: InvalidAttachment.NotFound; i-1 keeps it.
    service
        .publish(publish(&id, "i-1", capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap();
    service.unpublish(unpublish(&id, "i-2")).await.unwrap();
    assert_eq!(model.volume(&id).unwrap().attachments[0].instance_id, "i-1");
    // No such volume: InvalidVolume.NotFound.
    service
        .unpublish(unpublish("vol-0000000000000dead", "i-1"))
        .await
        .unwrap();
    assert_eq!(model.calls("DetachVolume"), 3);
}

/// An instance type with several EBS cards: each volume goes on the card
/// with the fewest EBS volumes (the root is on card 0); with one card, or
/// none reported, no `EbsCardIndex` is sent. The type is described once.
#[tokio::test]
async fn volumes_spread_over_the_ebs_cards_of_the_instance() {
    for (cards, expected) in [
        (Some(2), vec![Some(1), Some(0), Some(1)]),
        (None, vec![None, None, None]),
    ] {
        let (model, service) = controller(Behaviour {
            ebs_cards: cards,
            ..Behaviour::default()
        });
        for i in 0..3 {
            let id = create(&service, &format!("pvc-card-{i}")).await;
            service
                .publish(publish(&id, "i-1", capability(Mode::SingleNodeWriter, false)))
                .await
                .unwrap();
        }
        assert_eq!(model.ebs_cards_asked(), expected);
        assert_eq!(model.calls("DescribeInstanceTypes"), 1);
    }
}

/// `blockAttachUntilInitialized`: no AttachVolume while EC2 reports the
/// volume initializing; UNAVAILABLE with its progress, for the CO to retry.
#[tokio::test]
async fn a_volume_still_initializing_is_not_attached_when_its_class_says_so() {
    let (model, service) = controller(Behaviour {
        initializing: Some(Initializing {
            progress_percent: Some(42),
            seconds_left: Some(120),
        }),
        ..Behaviour::default()
    });
    let created = service
        .create(request(
            "pvc-initializing",
            &[("blockAttachUntilInitialized", "true")],
            capability(Mode::SingleNodeWriter, false),
        ))
        .await
        .unwrap()
        .volume
        .unwrap();
    assert_eq!(
        created
            .volume_context
            .get("blockattachuntilinitialized")
            .map(String::as_str),
        Some("true")
    );
    let held = ControllerPublishVolumeRequest {
        volume_context: created.volume_context.clone(),
        ..publish(&created.volume_id, "i-1", capability(Mode::SingleNodeWriter, false))
    };
    match service.publish(held).await.unwrap_err() {
        ControllerError::Unavailable(m) => assert_eq!(
            m,
            format!(
                "volume {} is still being initialized from its snapshot, 42% done, about 120 s left; \
                 blockAttachUntilInitialized holds the attachment until it is done",
                created.volume_id
            )
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(model.calls("AttachVolume"), 0);
    // Without the key the volume is attached at once.
    service
        .publish(publish(
            &created.volume_id,
            "i-1",
            capability(Mode::SingleNodeWriter, false),
        ))
        .await
        .unwrap();
    assert_eq!(model.calls("AttachVolume"), 1);
}

/// `aws_ebs_csi_ec2_detach_pending_seconds_total` carries a detachment
/// while ControllerUnpublishVolume waits for it, and not after; the wait is
/// the Go driver's, not the other waits' (here 1 s, shorter than this
/// detachment).
#[tokio::test]
async fn a_pending_detachment_is_reported_while_it_is_waited_for() {
    assert_eq!(Settings::default().detach_timeout, Duration::from_secs(2_602));
    let model = Arc::new(Model::new(Behaviour {
        detach_delay: Duration::from_millis(1500),
        ..Behaviour::default()
    }));
    model.add_instance("i-1", "us-east-1a");
    let tracker = DetachPending::with_threshold(Duration::ZERO);
    let service = Arc::new(ControllerService::new(
        Arc::clone(&model),
        Settings {
            detach_pending: tracker.clone(),
            state_timeout: Duration::from_secs(1),
            ..Settings::default()
        },
    ));
    let id = create(&service, "pvc-slow-detach").await;
    service
        .publish(publish(&id, "i-1", capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap();
    let unpublishing = tokio::spawn({
        let (service, id) = (Arc::clone(&service), id.clone());
        async move {
            let request = ControllerUnpublishVolumeRequest {
                volume_id: id,
                node_id: "i-1".into(),
                ..Default::default()
            };
            service.unpublish(request).await
        }
    });
    let series = format!(
        r#"aws_ebs_csi_ec2_detach_pending_seconds_total{{attachment_state="detaching",instance_id="i-1",volume_id="{id}"}} "#
    );
    // Seen while the model keeps the attachment `detaching` (1.5 s).
    while !tracker.render().contains(&series) {
        assert!(!unpublishing.is_finished(), "detached before it was reported");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    unpublishing.await.unwrap().unwrap();
    assert!(!tracker.render().contains(&id), "{}", tracker.render());
}

#[tokio::test]
async fn a_reused_client_token_with_other_parameters_is_already_exists() {
    let (model, service) = controller(Behaviour::default());
    model.burn_token(&super::tokens::ClientTokens::default().token("pvc-reused"));
    let pvc = || request("pvc-reused", &[], capability(Mode::SingleNodeWriter, false));
    let err = service.create(pvc()).await.unwrap_err();
    assert_eq!(code(err), Code::AlreadyExists);
    // The retry uses the name's next token and creates the volume.
    service.create(pvc()).await.unwrap();
    assert_eq!(model.calls("CreateVolume"), 2);
}

/// EC2 keeps a client token after its volume is deleted and answers it
/// with that volume: a name used again (csi-sanity's specs, a claim
/// deleted and made again) gets a new volume.
#[tokio::test]
async fn a_name_used_again_after_delete_gets_a_new_volume() {
    let (model, service) = controller(Behaviour::default());
    let delete = |volume_id: &str| DeleteVolumeRequest {
        volume_id: volume_id.to_owned(),
        ..Default::default()
    };
    let first = create(&service, "pvc-again").await;
    service.delete(delete(&first)).await.unwrap();
    let second = create(&service, "pvc-again").await;
    assert_ne!(first, second);
    assert_eq!(model.calls("CreateVolume"), 2);

    // A controller that restarted since does not know the tokens moved:
    // EC2 answers the name's first two with the deleted volumes, and each
    // retry moves on to the next.
    let service = restarted(&model);
    service.delete(delete(&second)).await.unwrap();
    let pvc = || request("pvc-again", &[], capability(Mode::SingleNodeWriter, false));
    for deleted in [&first, &second] {
        let err = service.create(pvc()).await.unwrap_err();
        let message = err.to_string();
        assert!(message.contains(deleted.as_str()), "{message}");
        assert_eq!(code(err), Code::Unavailable);
    }
    let third = service.create(pvc()).await.unwrap().volume.unwrap().volume_id;
    assert!(third != first && third != second, "{third}");
    assert_eq!(model.volumes(), vec![third]);
}

/// The one exception to "deleted only on DeleteVolume": a volume this
/// call's CreateVolume made that EC2 reports `error`. The retry takes the
/// name's next client token.
#[tokio::test]
async fn a_volume_that_fails_is_reported_and_deleted() {
    let (model, service) = controller(Behaviour {
        creations_fail: true,
        ..Behaviour::default()
    });
    let pvc = || request("pvc-bad", &[], capability(Mode::SingleNodeWriter, false));
    let err = service.create(pvc()).await.unwrap_err();
    assert_eq!(code(err), Code::Internal);
    assert_eq!(model.calls("DeleteVolume"), 1);
    assert_eq!(model.volumes(), Vec::<String>::new(), "nothing is left behind");
    let err = service.create(pvc()).await.unwrap_err();
    assert_eq!(code(err), Code::Internal);
    assert_eq!(
        (model.calls("CreateVolume"), model.calls("DeleteVolume")),
        (2, 2),
        "the retry made a volume of its own"
    );
}

/// EC2 answers CreateVolume `creating` and may leave the new volume out of
/// DescribeVolumes for a while: the wait looks again, and nothing is
/// deleted.
#[tokio::test]
async fn a_volume_not_yet_visible_is_waited_for_and_never_deleted() {
    let (model, service) = controller(Behaviour {
        create_delay: Duration::from_millis(50),
        visibility_lag: Duration::from_secs(2),
        ..Behaviour::default()
    });
    let id = create(&service, "pvc-late").await;
    assert_eq!(model.volume(&id).unwrap().state, VolumeState::Available);
    assert_eq!((model.calls("CreateVolume"), model.calls("DeleteVolume")), (1, 0));
}

/// A repeated CreateVolume (the provisioner retries after a timeout) for
/// a volume a pod already uses returns it, `in-use`, and deletes nothing.
#[tokio::test]
async fn a_repeat_for_an_attached_volume_returns_it() {
    let (model, service) = controller(Behaviour::default());
    let id = create(&service, "pvc-used").await;
    service
        .publish(publish(&id, "i-1", capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap();
    assert_eq!(model.volume(&id).unwrap().state, VolumeState::InUse);
    assert_eq!(create(&service, "pvc-used").await, id);
    assert_eq!((model.calls("CreateVolume"), model.calls("DeleteVolume")), (1, 0));
}

/// A lost answer to CreateSnapshot leaves a twin no CO knows (CreateSnapshot
/// takes no client token): a repeat answers the earliest, and DeleteSnapshot
/// takes the twin with it.
#[tokio::test]
async fn a_snapshots_twin_goes_with_it() {
    let (model, service) = controller(Behaviour::default());
    let volume = create(&service, "pvc-snapped").await;
    let request = CreateSnapshotRequest {
        source_volume_id: volume.clone(),
        name: "snapshot-twinned".into(),
        ..Default::default()
    };
    let first = service
        .snapshot(request.clone())
        .await
        .unwrap()
        .snapshot
        .unwrap()
        .snapshot_id;
    let tags = model.snapshot_tags(&first);
    let twin = crate::ec2::Ec2::create_snapshot(
        model.as_ref(),
        &volume,
        crate::ec2::CreateSnapshotInput {
            tags,
            ..Default::default()
        },
    )
    .await
    .unwrap()
    .id;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = service.snapshot(request).await.unwrap().snapshot.unwrap().snapshot_id;
    assert_eq!(again, first, "the earliest of the twins");
    service
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: first.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        model.snapshots(),
        Vec::<String>::new(),
        "{first} and its twin {twin} are gone"
    );
}

/// An attachment DescribeVolumes does not show yet is waited for, not
/// taken for one that went away and undone.
#[tokio::test]
async fn an_attachment_not_yet_visible_is_waited_for() {
    let (model, service) = controller(Behaviour {
        attach_delay: Some(Duration::from_millis(50)),
        visibility_lag: Duration::from_secs(1),
        ..Behaviour::default()
    });
    let id = create(&service, "pvc-lagging").await;
    service
        .publish(publish(&id, "i-1", capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap();
    assert_eq!(
        model.volume(&id).unwrap().attachments[0].state,
        AttachmentState::Attached
    );
    assert_eq!(model.calls("DetachVolume"), 0);
}

#[tokio::test]
async fn publish_waits_for_attached_and_undoes_a_stuck_attachment() {
    let (model, service) = controller(Behaviour::default());
    let id = create(&service, "pvc-attach").await;
    let context = service
        .publish(publish(&id, "i-1", capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap()
        .publish_context;
    assert_eq!(
        model.volume(&id).unwrap().attachments[0].state,
        AttachmentState::Attached
    );
    assert_eq!(
        context.get("devicePath"),
        Some(&model.volume(&id).unwrap().attachments[0].device)
    );

    let (model, service) = controller(Behaviour {
        attach_delay: None,
        ..Behaviour::default()
    });
    let id = create(&service, "pvc-stuck").await;
    let err = service
        .publish(publish(&id, "i-1", capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap_err();
    assert_eq!(code(err), Code::Unavailable);
    assert_eq!(model.calls("DetachVolume"), 1, "the stuck attachment is undone");
}

#[tokio::test]
async fn refused_device_names_are_skipped_and_limits_are_resource_exhausted() {
    let behaviour = Behaviour {
        refused_names: vec!["/dev/xvdaa".into()],
        attachment_limit: 3,
        ..Behaviour::default()
    };
    let (model, service) = controller(behaviour);
    let first = create(&service, "pvc-a").await;
    let context = service
        .publish(publish(&first, "i-1", capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap()
        .publish_context;
    assert_eq!(context.get("devicePath").map(String::as_str), Some("/dev/xvdab"));
    assert_eq!(model.calls("AttachVolume"), 2);
    let second = create(&service, "pvc-b").await;
    service
        .publish(publish(&second, "i-1", capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap();
    let third = create(&service, "pvc-c").await;
    let err = service
        .publish(publish(&third, "i-1", capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap_err();
    assert_eq!(code(err), Code::ResourceExhausted);
}

#[tokio::test]
async fn io2_block_volumes_attach_to_several_nodes() {
    let (_model, service) = controller(Behaviour::default());
    let block = capability(Mode::MultiNodeMultiWriter, true);
    let id = service
        .create(request(
            "pvc-shared",
            &[("type", "io2"), ("iops", "1000")],
            block.clone(),
        ))
        .await
        .unwrap()
        .volume
        .unwrap()
        .volume_id;
    service.publish(publish(&id, "i-1", block.clone())).await.unwrap();
    service.publish(publish(&id, "i-2", block)).await.unwrap();
    let single = create(&service, "pvc-single").await;
    service
        .publish(publish(&single, "i-1", capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap();
    let err = service
        .publish(publish(&single, "i-2", capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap_err();
    assert_eq!(code(err), Code::FailedPrecondition);
}

#[tokio::test]
async fn concurrent_calls_for_one_volume_are_aborted() {
    let (_model, service) = controller(Behaviour::default());
    let service = Arc::new(service);
    let id = create(&service, "pvc-race").await;
    let first = tokio::spawn({
        let (service, id) = (Arc::clone(&service), id.clone());
        async move {
            service
                .publish(publish(&id, "i-1", capability(Mode::SingleNodeWriter, false)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = service
        .publish(publish(&id, "i-1", capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap_err();
    assert_eq!(code(second), Code::Aborted);
    first.await.unwrap().unwrap();
}

#[tokio::test]
async fn one_modification_at_a_time_and_four_a_day() {
    // Each call returns once its modification is seen: long before it
    // has been optimized.
    let optimize_delay = Duration::from_secs(1);
    let (model, service) = controller(Behaviour {
        optimize_delay,
        visibility_lag: Duration::from_millis(10),
        ..Behaviour::default()
    });
    let service = Arc::new(service);
    let id = create(&service, "pvc-mod").await;
    let expand = |gib: i64| ControllerExpandVolumeRequest {
        volume_id: id.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: gib * GIB,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let modify = ControllerModifyVolumeRequest {
        volume_id: id.clone(),
        mutable_parameters: HashMap::from([("iops".into(), "4000".into())]),
        ..Default::default()
    };
    let (expanded, modified) = tokio::join!(service.expand(expand(20)), service.modify(modify));
    assert_eq!(expanded.unwrap().capacity_bytes, 20 * GIB);
    modified.unwrap();
    assert_eq!(model.calls("ModifyVolume"), 1);
    let volume = model.volume(&id).unwrap();
    assert_eq!((volume.size_gib, volume.iops), (20, Some(4000)));
    let err = service.expand(expand(30)).await.unwrap_err();
    let message = err.to_string();
    assert_eq!(
        code(err),
        Code::FailedPrecondition,
        "EC2 modifies a volume once its last modification has completed"
    );
    assert!(
        message.contains("cannot be modified in modification state OPTIMIZING"),
        "{message}"
    );
    // A class's tags are applied before its ModifyVolume, as the Go
    // driver's: EC2's refusal holds back the IOPS, not the tags.
    let retier = ControllerModifyVolumeRequest {
        volume_id: id.clone(),
        mutable_parameters: HashMap::from([
            ("iops".into(), "5000".into()),
            ("tagSpecification_1".into(), "tier=gold".into()),
        ]),
        ..Default::default()
    };
    assert_eq!(
        code(service.modify(retier).await.unwrap_err()),
        Code::FailedPrecondition
    );
    let volume = model.volume(&id).unwrap();
    assert_eq!(volume.iops, Some(4000));
    assert_eq!(volume.tags.get("tier").map(String::as_str), Some("gold"));
    // Three more that day, each once the last has completed; EC2 refuses
    // the fifth.
    for gib in [30, 40, 50] {
        tokio::time::sleep(optimize_delay * 3 / 2).await;
        service.expand(expand(gib)).await.unwrap();
    }
    tokio::time::sleep(optimize_delay * 3 / 2).await;
    let err = service.expand(expand(60)).await.unwrap_err();
    let message = err.to_string();
    assert_eq!(code(err), Code::FailedPrecondition);
    assert!(message.contains("maximum modification rate per volume"), "{message}");
    // Four taken (the first for a resize and a class change at once),
    // three refused.
    assert_eq!(model.calls("ModifyVolume"), 7);
    assert_eq!(model.volume(&id).unwrap().size_gib, 50);
}

#[tokio::test]
async fn throttling_that_survives_retries_is_unavailable() {
    let (model, service) = controller(Behaviour::default());
    model.throttle(1);
    let err = service
        .create(request("pvc-throttled", &[], capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap_err();
    assert_eq!(code(err), Code::Unavailable);
    create(&service, "pvc-throttled").await;
}

/// A requirement with an Outpost's segments (from a node on it): the
/// volume is created on that Outpost, and its topology names it too.
#[tokio::test]
async fn a_topology_on_an_outpost_creates_the_volume_there() {
    let (model, service) = controller(Behaviour::default());
    let arn = "arn:aws:outposts:us-east-1:111122223333:outpost/op-0123456789abcdef0";
    let segments: HashMap<String, String> = [
        ("topology.ebs.csi.aws.com/zone", "us-east-1a"),
        ("topology.ebs.csi.aws.com/outpost-id", "op-0123456789abcdef0"),
        ("topology.ebs.csi.aws.com/account-id", "111122223333"),
        ("topology.ebs.csi.aws.com/region", "us-east-1"),
        ("topology.ebs.csi.aws.com/partition", "aws"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .into();
    let r = CreateVolumeRequest {
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![Topology {
                segments: segments.clone(),
            }],
            preferred: vec![],
        }),
        ..request("pvc-outpost", &[], capability(Mode::SingleNodeWriter, false))
    };
    let volume = service.create(r).await.unwrap().volume.unwrap();
    assert_eq!(
        model.volume(&volume.volume_id).unwrap().outpost_arn.as_deref(),
        Some(arn)
    );
    let reported = &volume.accessible_topology[0].segments;
    assert!(segments.iter().all(|(k, v)| reported.get(k) == Some(v)), "{reported:?}");
}

/// Zone ids (`topology.k8s.aws/zone-id`) as the Go driver takes them: the
/// zone with the preferred id, else one with a requisite id; the reply's
/// topology carries the id too, since the CO's nodes report it.
#[tokio::test]
async fn zone_ids_pick_the_zone_and_come_back_in_the_topology() {
    let (_model, service) = controller(Behaviour::default());
    let by_id = |id: &str| Topology {
        segments: HashMap::from([("topology.k8s.aws/zone-id".into(), id.into())]),
    };
    let requirement = |preferred: Vec<Topology>, requisite: Vec<Topology>| TopologyRequirement { requisite, preferred };
    let cases = [
        (
            requirement(vec![by_id("use1-az1")], vec![by_id("use1-az2"), by_id("use1-az1")]),
            "us-east-1b",
            "use1-az1",
        ),
        (requirement(vec![], vec![by_id("use1-az2")]), "us-east-1c", "use1-az2"),
    ];
    for (i, (requirement, zone, id)) in cases.into_iter().enumerate() {
        let r = CreateVolumeRequest {
            accessibility_requirements: Some(requirement),
            ..request(
                &format!("pvc-zone-id-{i}"),
                &[],
                capability(Mode::SingleNodeWriter, false),
            )
        };
        let volume = service.create(r).await.unwrap().volume.unwrap();
        let segments = &volume.accessible_topology[0].segments;
        assert_eq!(
            segments.get("topology.kubernetes.io/zone").map(String::as_str),
            Some(zone)
        );
        assert_eq!(segments.get("topology.k8s.aws/zone-id").map(String::as_str), Some(id));
    }
    let unknown = CreateVolumeRequest {
        accessibility_requirements: Some(requirement(vec![], vec![by_id("usw2-az9")])),
        ..request("pvc-zone-id-unknown", &[], capability(Mode::SingleNodeWriter, false))
    };
    match service.create(unknown).await.unwrap_err() {
        ControllerError::ResourceExhausted(m) => {
            assert_eq!(m, "no available zone of the region meets the topology requirement");
        }
        other => panic!("{other:?}"),
    }
    // Zone names alone: no zone id in the reply, no zone lookup.
    let named = service
        .create(request("pvc-zone-name", &[], capability(Mode::SingleNodeWriter, false)))
        .await
        .unwrap()
        .volume
        .unwrap();
    assert!(
        !named.accessible_topology[0]
            .segments
            .contains_key("topology.k8s.aws/zone-id")
    );
}

/// Without a topology the name picks the zone: names spread across the
/// region's zones, and a retry of one name asks for the same zone again
/// (its client token then returns the first attempt's volume).
#[tokio::test]
async fn volumes_without_topology_spread_across_zones_by_name() {
    let (model, service) = controller(Behaviour::default());
    let no_topology = |name: &str| CreateVolumeRequest {
        accessibility_requirements: None,
        ..request(name, &[], capability(Mode::SingleNodeWriter, false))
    };
    let mut zones = Vec::new();
    for i in 0..12 {
        let id = service
            .create(no_topology(&format!("pvc-{i}")))
            .await
            .unwrap()
            .volume
            .unwrap()
            .volume_id;
        zones.push(model.volume(&id).unwrap().zone);
    }
    let mut distinct = zones.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{zones:?}");
    let (model, service) = controller(Behaviour::default());
    for (i, zone) in zones.iter().enumerate() {
        let id = service
            .create(no_topology(&format!("pvc-{i}")))
            .await
            .unwrap()
            .volume
            .unwrap()
            .volume_id;
        assert_eq!(
            &model.volume(&id).unwrap().zone,
            zone,
            "pvc-{i} in a controller of its own"
        );
    }
}

#[tokio::test]
async fn volumes_are_cloned_in_the_source_zone_and_status_gives_the_condition() {
    let (model, service) = controller(Behaviour {
        volumes_impaired: true,
        ..Behaviour::default()
    });
    let source = create(&service, "pvc-source").await;
    let clone = CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Volume(
                volume_content_source::VolumeSource {
                    volume_id: source.clone(),
                },
            )),
        }),
        accessibility_requirements: None,
        ..request("pvc-clone", &[], capability(Mode::SingleNodeWriter, false))
    };
    let source_named = clone.volume_content_source.clone();
    let cloned = service.create(clone).await.unwrap().volume.unwrap();
    assert_eq!(model.calls("CopyVolumes"), 1);
    assert_eq!(cloned.content_source, source_named, "the reply names its source");
    assert_eq!(
        model.volume(&cloned.volume_id).unwrap().zone,
        model.volume(&source).unwrap().zone
    );
    let got = service
        .get(ControllerGetVolumeRequest { volume_id: source })
        .await
        .unwrap();
    let condition = got.status.unwrap().volume_condition.unwrap();
    assert!(
        condition.abnormal && condition.message.contains("impaired"),
        "{condition:?}"
    );
    let missing = CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Volume(
                volume_content_source::VolumeSource {
                    volume_id: "vol-0000000000000dead".into(),
                },
            )),
        }),
        ..request("pvc-clone-2", &[], capability(Mode::SingleNodeWriter, false))
    };
    assert_eq!(code(service.create(missing).await.unwrap_err()), Code::NotFound);
}

/// `volumeInitializationRate` (EC2 API Reference, CreateVolume): only for a
/// volume restored from a snapshot, 100–300 MiB/s; refused before EC2 is
/// called otherwise.
#[tokio::test]
async fn an_initialization_rate_needs_a_snapshot_and_ec2s_range() {
    let (model, service) = controller(Behaviour::default());
    let cap = || capability(Mode::SingleNodeWriter, false);
    for (parameters, expected) in [
        (
            [("volumeInitializationRate", "200")],
            "volumeInitializationRate applies only to a volume restored from a snapshot",
        ),
        (
            [("volumeInitializationRate", "301")],
            "volumeinitializationrate=301 is outside EC2's 100–300 MiB/s",
        ),
    ] {
        let err = service
            .create(request("pvc-rate", &parameters, cap()))
            .await
            .unwrap_err();
        let message = err.to_string();
        assert_eq!((code(err), message.as_str()), (Code::InvalidArgument, expected));
    }
    assert_eq!(model.calls("CreateVolume"), 0);
    let source = create(&service, "pvc-source").await;
    let snapshot = service
        .snapshot(CreateSnapshotRequest {
            source_volume_id: source,
            name: "snapshot-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .snapshot
        .unwrap();
    let restore = CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: snapshot.snapshot_id,
                },
            )),
        }),
        ..request("pvc-restored", &[("volumeInitializationRate", "200")], cap())
    };
    service.create(restore).await.unwrap();
    assert_eq!(model.calls("CreateVolume"), 2);
}

/// A clone lands in its source's zone with its source's encryption
/// (CopyVolumes takes neither): a request that asks otherwise is refused
/// before EC2 is called, with the code the CSI spec gives each case.
#[tokio::test]
async fn a_clone_that_cannot_match_its_request_is_refused() {
    let (model, service) = controller(Behaviour::default());
    let key = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab";
    let cap = || capability(Mode::SingleNodeWriter, false);
    let plain = create(&service, "pvc-plain").await;
    let sealed = service
        .create(request("pvc-sealed", &[("kmsKeyId", key)], cap()))
        .await
        .unwrap()
        .volume
        .unwrap()
        .volume_id;
    let clone_of = |source: &str, name: &str, parameters: &[(&str, &str)]| CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Volume(
                volume_content_source::VolumeSource {
                    volume_id: source.to_owned(),
                },
            )),
        }),
        ..request(name, parameters, cap())
    };
    let elsewhere = CreateVolumeRequest {
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![Topology {
                segments: HashMap::from([("topology.kubernetes.io/zone".into(), "us-east-1b".into())]),
            }],
            preferred: vec![],
        }),
        ..clone_of(&plain, "pvc-elsewhere", &[])
    };
    let refusals = [
        (
            elsewhere,
            Code::ResourceExhausted,
            format!(
                "the source volume {plain} is in us-east-1a, outside the requisite topology; a clone stays in its source's zone"
            ),
        ),
        (
            clone_of(&plain, "pvc-encrypted", &[("encrypted", "true")]),
            Code::InvalidArgument,
            format!("the source volume {plain} is not encrypted, and a clone keeps its source's encryption"),
        ),
        (
            clone_of(
                &sealed,
                "pvc-rekeyed",
                &[("kmsKeyId", "0000aaaa-12ab-34cd-56ef-1234567890ab")],
            ),
            Code::InvalidArgument,
            format!("the source volume {sealed} is encrypted with {key}, and a clone keeps its source's key"),
        ),
    ];
    for (request, expected_code, expected) in refusals {
        let err = service.create(request).await.unwrap_err();
        let message = err.to_string();
        assert_eq!((code(err), message), (expected_code, expected));
    }
    assert_eq!(model.calls("CopyVolumes"), 0);
    // The source's key by id or by alias (which only KMS could resolve).
    for (name, given) in [
        ("pvc-same-key", "1234abcd-12ab-34cd-56ef-1234567890ab"),
        ("pvc-alias", "alias/ebs"),
    ] {
        service
            .create(clone_of(&sealed, name, &[("kmsKeyId", given)]))
            .await
            .unwrap();
    }
    assert_eq!(model.calls("CopyVolumes"), 2);
}

/// Formatting options are judged before EC2 is called, against the
/// filesystem the capability asks for (else the class's `fsType`, else
/// ext4), and refused for a block volume, as the Go driver does
/// (`controller.go`, "ValidateFormattingOptions").
#[tokio::test]
async fn formatting_options_are_judged_against_the_filesystem_before_ec2() {
    let (model, service) = controller(Behaviour::default());
    let mount = |fs_type: &str| VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            ..MountVolume::default()
        })),
    };
    for (parameters, cap, expected) in [
        (
            &[("blockSize", "4096")][..],
            capability(Mode::SingleNodeWriter, true),
            "formatting options (blockSize, inodeSize, …) do not apply to a block volume",
        ),
        (
            &[("bytesPerInode", "4096")][..],
            mount("xfs"),
            "bytesPerInode is not supported for xfs",
        ),
        (
            &[("inodeSize", "64")][..],
            mount(""),
            "inodeSize=64 is outside 128..=4096 or not a power of two for ext4",
        ),
        (
            &[("csi.storage.k8s.io/fstype", "xfs"), ("numberOfInodes", "1000")][..],
            mount(""),
            "numberOfInodes is not supported for xfs",
        ),
    ] {
        let err = service
            .create(request("pvc-format", parameters, cap))
            .await
            .unwrap_err();
        let message = err.to_string();
        assert_eq!(
            (code(err), message.as_str()),
            (Code::InvalidArgument, expected),
            "{parameters:?}"
        );
    }
    assert_eq!(model.calls("CreateVolume"), 0);
}

/// A repeated CreateVolume whose answer says `available` (EC2 answers a
/// reused client token with the volume in its state now) for a volume
/// DescribeVolumes does not list yet answers only once it is listed: a
/// DeleteVolume sent before would meet InvalidVolume.NotFound, take the
/// volume for gone, and leak it (found by the chaos run, seed 1722114418).
#[tokio::test]
async fn a_repeat_answered_available_waits_until_the_volume_is_listed() {
    let (model, service) = controller(Behaviour {
        create_delay: Duration::from_millis(10),
        visibility_lag: Duration::from_secs(2),
        ..Behaviour::default()
    });
    let request = request("pvc-repeat", &[], capability(Mode::SingleNodeWriter, false));
    // The first call made the volume; its answer was lost (the controller
    // was killed while it waited for the volume to be listed).
    let first = tokio::time::timeout(Duration::from_millis(300), service.create(request.clone())).await;
    assert!(first.is_err(), "the first call still waits");
    let made = model.volumes();
    assert_eq!(made.len(), 1);
    let again = service.create(request).await.unwrap().volume.unwrap().volume_id;
    assert_eq!(again, made[0]);
    service
        .delete(DeleteVolumeRequest {
            volume_id: again.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(model.volume(&again), None, "deleted, not leaked");
    assert_eq!(model.calls("CreateVolume"), 2);
}

/// `--warn-on-invalid-tag` (the Go driver's): a class's tag whose template
/// fails or whose key is reserved is refused by default, nothing created;
/// with the flag it is left out and the volume is made with the others.
#[tokio::test]
async fn an_invalid_tag_is_refused_or_left_out_as_the_flag_says() {
    let model = Arc::new(Model::new(Behaviour::default()));
    let parameters = [
        ("tagSpecification_1", "team=storage"),
        ("tagSpecification_2", "owner={{ .NoSuchField }}"),
        ("tagSpecification_3", "CSIVolumeName=mine"),
    ];
    let cap = || capability(Mode::SingleNodeWriter, false);
    let err = restarted(&model)
        .create(request("pvc-tags", &parameters, cap()))
        .await
        .unwrap_err();
    assert_eq!(code(err), Code::InvalidArgument);
    assert_eq!(model.calls("CreateVolume"), 0);
    let warned = ControllerService::new(
        Arc::clone(&model),
        Settings {
            invalid_tags: InvalidTags::Skip,
            ..Settings::default()
        },
    );
    let id = warned
        .create(request("pvc-tags", &parameters, cap()))
        .await
        .unwrap()
        .volume
        .unwrap()
        .volume_id;
    let tags = model.volume(&id).unwrap().tags;
    assert_eq!(tags.get("team").map(String::as_str), Some("storage"));
    assert_eq!(tags.get("owner"), None);
    assert_eq!(tags.get("CSIVolumeName").map(String::as_str), Some("pvc-tags"));
}
