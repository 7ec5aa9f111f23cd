//! The real controller binary against moto server: every RPC, idempotent
//! repeats and error codes, over the wire.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use ebs_csi_proto::modify::{GetCsiDriverModificationCapabilityRequest, ModifyVolumePropertiesRequest};
use ebs_csi_proto::v1::controller_client::ControllerClient;
use ebs_csi_proto::v1::identity_client::IdentityClient;
use ebs_csi_proto::v1::volume_capability::access_mode::Mode;
use ebs_csi_proto::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use ebs_csi_proto::v1::*;
use ebs_csi_tests::http_proxy::HttpProxy;
use ebs_csi_tests::moto::{Controller, Moto, REGION, ZONE, assert_tags, aws_env, xml_values};
use ebs_csi_tests::nomad::{self, NomadClient};
use ebs_csi_tests::otlp::{OtlpCollector, SPAN_KIND_CLIENT, SPAN_KIND_SERVER, STATUS_CODE_ERROR, TRACEPARENT};
use ebs_csi_tests::{Sandbox, binary, require_root, spawn, wait_until};
use tonic::Code;
use tonic::transport::Channel;

const GIB: i64 = 1 << 30;

struct Setup {
    moto: Moto,
    controller: Controller,
    client: ControllerClient<Channel>,
    _sandbox: Sandbox,
}

async fn setup(args: &[&str]) -> Setup {
    let sandbox = Sandbox::new();
    let moto = Moto::start();
    let controller = Controller::start(&sandbox, &moto, REGION, args);
    let client = controller.client().await;
    Setup {
        moto,
        controller,
        client,
        _sandbox: sandbox,
    }
}

fn mount() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

/// ControllerPublishVolume of `volume_id` to `node_id`, as a filesystem.
fn publish_request(volume_id: &str, node_id: &str) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        node_id: node_id.to_owned(),
        volume_capability: Some(mount()),
        ..Default::default()
    }
}

fn block(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

/// A request's parameters from `(key, value)` pairs.
fn string_map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn create_request(name: &str, gib: i64, parameters: &[(&str, &str)]) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: gib * GIB,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount()],
        parameters: string_map(parameters),
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![],
            preferred: vec![Topology {
                segments: HashMap::from([("topology.kubernetes.io/zone".to_owned(), ZONE.to_owned())]),
            }],
        }),
        ..Default::default()
    }
}

/// [`create_request`] for a volume made from `source` (a snapshot or a volume).
fn request_from(source: volume_content_source::Type, name: &str, gib: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource { r#type: Some(source) }),
        ..create_request(name, gib, &[])
    }
}

async fn create(client: &mut ControllerClient<Channel>, name: &str, gib: i64) -> ebs_csi_proto::v1::Volume {
    created(client, create_request(name, gib, &[])).await
}

/// The volume CreateVolume answers `request` with.
async fn created(client: &mut ControllerClient<Channel>, request: CreateVolumeRequest) -> ebs_csi_proto::v1::Volume {
    client
        .create_volume(request)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn volumes_are_created_idempotently_tagged_listed_and_deleted() {
    let Setup {
        moto,
        mut client,
        controller,
        _sandbox,
    } = setup(&[
        "--k8s-tag-cluster-id",
        "test-cluster",
        "--extra-tags",
        "team=storage",
        "--http-endpoint",
        "127.0.0.1:0",
        // The Go driver's --warn-on-invalid-tag (its effect: the service's
        // tests), then klog's flags and an option of the Go driver its
        // manifests and chart pass, which mean nothing here.
        "--warn-on-invalid-tag",
        "--logtostderr",
        "--v=2",
        "--log_file_max_size",
        "1800",
        "--metadata-sources=imds,kubernetes",
    ])
    .await;
    let metrics_address = metrics_address(&controller);
    let log = controller.process.log();
    assert!(
        log.contains("flag=\"--metadata-sources=imds,kubernetes\"")
            && log.contains("the region is --region's, else AWS_REGION's, the profile's or IMDS's"),
        "{log}"
    );
    let request = create_request(
        "pvc-a",
        4,
        &[
            ("type", "gp3"),
            ("csi.storage.k8s.io/fstype", "xfs"),
            ("blockSize", "4096"),
            ("tagSpecification_1", "app=shop"),
            // The Go driver's template functions (its docs/tagging.md).
            (
                "tagSpecification_2",
                r#"cost-center={{ .PVCNamespace | field "-" 0 | toUpper }}"#,
            ),
            ("csi.storage.k8s.io/pvc/namespace", "payments-prod"),
        ],
    );
    let volume = created(&mut client, request.clone()).await;
    assert!(volume.volume_id.starts_with("vol-"));
    assert_eq!(volume.capacity_bytes, 4 * GIB);
    assert_eq!(
        volume.accessible_topology[0]
            .segments
            .get("topology.ebs.csi.aws.com/zone")
            .map(String::as_str),
        Some(ZONE)
    );
    assert_eq!(volume.volume_context.get("blocksize").map(String::as_str), Some("4096"));
    // The same request again: the same volume.
    let again = created(&mut client, request.clone()).await;
    assert_eq!(again.volume_id, volume.volume_id);
    // The same name with another size: ALREADY_EXISTS.
    let other = client.create_volume(create_request("pvc-a", 8, &[])).await.unwrap_err();
    assert_eq!(other.code(), Code::AlreadyExists, "{other:?}");
    // Each mutating RPC once at info when it succeeds, at warn with its
    // code when it fails.
    let log = controller.process.log();
    let lines = |level: &str| {
        log.lines()
            .filter(|l| l.contains(level) && l.contains(r#"rpc="CreateVolume" subject="pvc-a""#))
            .count()
    };
    assert_eq!((lines("INFO"), lines("WARN")), (2, 1), "{log}");
    assert!(log.contains("code=AlreadyExists"), "{log}");
    for flag in ["--logtostderr=true", "--log_file_max_size=1800"] {
        assert!(
            log.lines()
                .any(|l| l.contains("WARN") && l.contains(&format!(r#"flag="{flag}""#))),
            "no warning for {flag}:\n{log}"
        );
    }
    // Tags, as EC2 stores them.
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume.volume_id)]);
    assert_tags(
        &xml,
        &[
            ("CSIVolumeName", "pvc-a"),
            ("ebs.csi.aws.com/cluster", "true"),
            ("kubernetes.io/cluster/test-cluster", "owned"),
            ("Name", "test-cluster-dynamic-pvc-a"),
            ("KubernetesCluster", "test-cluster"),
            ("ebs.csi.aws.com/cluster-name", "test-cluster"),
            ("team", "storage"),
            ("app", "shop"),
            ("cost-center", "PAYMENTS"),
        ],
    );
    assert_eq!(xml_values(&xml, "volumeType"), vec!["gp3"]);
    // Get, validate, list with pagination.
    let got = client
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: volume.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.volume.unwrap().capacity_bytes, 4 * GIB);
    assert!(!got.status.unwrap().volume_condition.unwrap().abnormal);
    let validate = ValidateVolumeCapabilitiesRequest {
        volume_id: volume.volume_id.clone(),
        volume_capabilities: vec![mount()],
        ..Default::default()
    };
    assert!(
        client
            .validate_volume_capabilities(validate)
            .await
            .unwrap()
            .into_inner()
            .confirmed
            .is_some()
    );
    let multi = ValidateVolumeCapabilitiesRequest {
        volume_id: volume.volume_id.clone(),
        volume_capabilities: vec![block(Mode::MultiNodeMultiWriter)],
        ..Default::default()
    };
    assert!(
        client
            .validate_volume_capabilities(multi)
            .await
            .unwrap()
            .into_inner()
            .confirmed
            .is_none(),
        "gp3 has no Multi-Attach"
    );
    create(&mut client, "pvc-b", 1).await;
    create(&mut client, "pvc-c", 1).await;
    let first = client
        .list_volumes(ListVolumesRequest {
            max_entries: 2,
            starting_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.entries.len(), 2);
    assert!(!first.next_token.is_empty());
    let rest = client
        .list_volumes(ListVolumesRequest {
            max_entries: 2,
            starting_token: first.next_token,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rest.entries.len(), 1);
    assert!(rest.next_token.is_empty());
    let bad = client
        .list_volumes(ListVolumesRequest {
            max_entries: 2,
            starting_token: "garbage".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::Aborted);
    // Delete, twice; then it is gone.
    for _ in 0..2 {
        client
            .delete_volume(DeleteVolumeRequest {
                volume_id: volume.volume_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let gone = client
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: volume.volume_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    let metrics = http_get(&metrics_address, "/metrics");
    for line in [
        "aws_ebs_csi_api_request_duration_seconds_count{request=\"CreateVolume\"} 3",
        "aws_ebs_csi_api_request_errors_total{code=\"InvalidVolume.NotFound\",request=\"DeleteVolume\"} 1",
        "aws_ebs_csi_ec2_collector_scrapes_total 1",
        "aws_ebs_csi_ec2_collector_duration_seconds_count 1",
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
    // The in-tree cloud provider's names only with --deprecated-metrics.
    assert!(!metrics.contains("cloudprovider_aws"), "{metrics}");
}

/// The port the kernel chose for `--http-endpoint 127.0.0.1:0`, from the
/// controller's log line.
fn metrics_address(controller: &Controller) -> String {
    let log = controller.process.log();
    log.lines()
        .find(|l| l.contains("serving metrics"))
        .and_then(|l| l.split("address=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no metrics address in:\n{log}"))
        .to_owned()
}

fn http_get(address: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_requests_are_refused_before_a_volume_is_asked_of_ec2() {
    let Setup {
        moto,
        mut client,
        controller,
        _sandbox,
    } = setup(&[]).await;
    let cases: Vec<(CreateVolumeRequest, Code)> = vec![
        (create_request("", 1, &[]), Code::InvalidArgument),
        (
            CreateVolumeRequest {
                volume_capabilities: vec![],
                ..create_request("x", 1, &[])
            },
            Code::InvalidArgument,
        ),
        (create_request("x", 1, &[("color", "blue")]), Code::InvalidArgument),
        (create_request("x", 1, &[("type", "gp9")]), Code::InvalidArgument),
        (create_request("x", 70_000, &[("type", "gp3")]), Code::OutOfRange),
        (
            CreateVolumeRequest {
                capacity_range: Some(CapacityRange {
                    required_bytes: GIB,
                    limit_bytes: 2 * GIB,
                }),
                ..create_request("x", 1, &[("type", "st1")])
            },
            Code::OutOfRange,
        ),
        (create_request("x", 10, &[("type", "io2")]), Code::InvalidArgument),
        (
            create_request("x", 5, &[("type", "gp3"), ("iops", "4000")]),
            Code::InvalidArgument,
        ),
        (
            create_request("x", 10, &[("tagSpecification_1", "CSIVolumeName=evil")]),
            Code::InvalidArgument,
        ),
        (
            CreateVolumeRequest {
                volume_capabilities: vec![block(Mode::MultiNodeMultiWriter)],
                ..create_request("x", 10, &[("type", "gp3")])
            },
            Code::InvalidArgument,
        ),
    ];
    moto.start_recording();
    for (request, code) in cases {
        let err = client.create_volume(request.clone()).await.unwrap_err();
        assert_eq!(err.code(), code, "{:?}: {err:?}", request.parameters);
    }
    // A class that asks IOPS may cost the zone's dry run (it learns the
    // zone's maximum, the Go driver's getVolumeLimits), nothing more.
    let created: Vec<String> = moto
        .recorded_bodies("CreateVolume")
        .into_iter()
        .filter(|body| !body.contains("DryRun=true"))
        .collect();
    assert_eq!(created, Vec::<String>::new(), "a refused request reached EC2");
    let missing = CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: "snap-0123456789abcdef0".into(),
                },
            )),
        }),
        ..create_request("from-missing", 1, &[])
    };
    assert_eq!(client.create_volume(missing).await.unwrap_err().code(), Code::NotFound);
    let capacity = client.get_capacity(GetCapacityRequest::default()).await.unwrap_err();
    assert_eq!(capacity.code(), Code::Unimplemented);
    let caps = client
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert!(caps.len() >= 10);
    let mut identity = controller.identity().await;
    assert_eq!(
        identity
            .get_plugin_info(GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner()
            .name,
        "ebs.csi.aws.com"
    );
    assert_eq!(
        identity.probe(ProbeRequest {}).await.unwrap().into_inner().ready,
        Some(true)
    );
    assert_eq!(
        identity.probe(ProbeRequest {}).await.unwrap().into_inner().ready,
        Some(true)
    );
}

/// Throughput goes to EC2 as the class asks, and EC2 judges it (its
/// range, its ratio to IOPS, its type: tests/ec2/serve.py answers as EC2,
/// each message cited there): EC2's refusal reaches the CO as
/// INVALID_ARGUMENT with EC2's message, at creation and at a
/// VolumeAttributesClass change, and nothing is created; EC2's highest
/// gp3 throughput is taken.
#[tokio::test(flavor = "multi_thread")]
async fn ec2_judges_throughput_and_its_refusal_reaches_the_co() {
    let world = setup(&[]).await;
    let (moto, mut client) = (&world.moto, world.client.clone());
    for (parameters, refusal) in [
        (
            vec![("type", "gp3"), ("throughput", "3000")],
            "Volume throughput of 3000 is too high; maximum is 2000",
        ),
        (
            vec![("type", "gp3"), ("throughput", "1000")],
            "Throughput (MiBps) to iops ratio of 0.333333 is too high; maximum is 0.250000 MiBps per iops",
        ),
        (
            vec![("type", "io2"), ("iops", "1000"), ("throughput", "250")],
            "throughput can only be specified for volumeType gp3.",
        ),
    ] {
        let err = client
            .create_volume(create_request("refused", 10, &parameters))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{parameters:?}: {err:?}");
        assert!(err.message().ends_with(refusal), "{parameters:?}: {}", err.message());
    }
    let named = |name: &str| {
        let xml = moto.ec2(
            REGION,
            "DescribeVolumes",
            &[("Filter.1.Name", "tag:CSIVolumeName"), ("Filter.1.Value.1", name)],
        );
        xml_values(&xml, "volumeId")
    };
    assert_eq!(named("refused"), Vec::<String>::new(), "EC2 made a volume it refused");
    let most = [("type", "gp3"), ("iops", "8000"), ("throughput", "2000")];
    let volume = client
        .create_volume(create_request("fastest", 16, &most))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume.volume_id)]);
    assert_eq!(xml_values(&xml, "throughput"), vec!["2000"]);
    let faster = ControllerModifyVolumeRequest {
        volume_id: volume.volume_id.clone(),
        mutable_parameters: HashMap::from([("iops".to_owned(), "4000".to_owned())]),
        ..Default::default()
    };
    let err = client.controller_modify_volume(faster).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message()
            .ends_with("Throughput (MiBps) to iops ratio of 0.500000 is too high; maximum is 0.250000 MiBps per iops"),
        "{}",
        err.message()
    );
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume.volume_id)]);
    assert_eq!(xml_values(&xml, "iops"), vec!["8000"], "the refused change was applied");
}

/// The volume-modifier-for-k8s sidecar's `modify.v1.Modify` on the
/// controller's socket, as the Go driver serves it for a PVC's
/// `ebs.csi.aws.com/<key>` annotations: ModifyVolumeProperties changes the
/// volume as a VolumeAttributesClass with the same keys would, a refused key
/// is ControllerModifyVolume's INVALID_ARGUMENT with nothing changed, and the
/// capability is the Go driver's empty answer.
#[tokio::test(flavor = "multi_thread")]
async fn the_volume_modifiers_annotations_modify_the_volume() {
    let world = setup(&[]).await;
    let (moto, mut client) = (&world.moto, world.client.clone());
    let mut modifier = world.controller.modifier().await;
    modifier
        .get_csi_driver_modification_capability(GetCsiDriverModificationCapabilityRequest {})
        .await
        .unwrap();
    let volume = created(&mut client, create_request("pvc-annotated", 10, &[("type", "gp2")])).await;
    let annotations = |pairs: &[(&str, &str)]| ModifyVolumePropertiesRequest {
        name: volume.volume_id.clone(),
        parameters: string_map(pairs),
        context: HashMap::from([("csi.storage.k8s.io/pvc/name".to_owned(), "data".to_owned())]),
    };
    let refused = modifier
        .modify_volume_properties(annotations(&[("iops", "many")]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume.volume_id)]);
    assert_eq!(
        xml_values(&xml, "volumeType"),
        vec!["gp2"],
        "the refused change was applied"
    );
    modifier
        .modify_volume_properties(annotations(&[("type", "gp3"), ("iops", "4000"), ("throughput", "250")]))
        .await
        .unwrap();
    let xml = moto.volume_once(REGION, &volume.volume_id, |xml| xml.contains("<iops>4000</iops>"));
    assert_eq!(xml_values(&xml, "volumeType"), vec!["gp3"]);
    assert_eq!(xml_values(&xml, "throughput"), vec!["250"]);
}

/// Flags and a class key of the Go driver's, as a cluster that switches
/// keeps them: the deprecated `--extra-volume-tags`, beside `--extra-tags`,
/// starts the controller and tags nothing, as in the Go driver (v1.64 parses
/// it and never uses it), `--user-agent-extra` is in every EC2 call's
/// User-Agent as the Go driver puts it (`exec-env/aws-ebs-csi-driver-<version>-<extra>`,
/// an extra with a space and a character beyond ASCII taken).
#[tokio::test(flavor = "multi_thread")]
async fn the_go_drivers_extra_volume_tags_and_user_agent() {
    let world = setup(&[
        "--extra-tags",
        "team=platform",
        "--extra-volume-tags",
        "team=legacy,legacy=true",
        "--user-agent-extra",
        "helm chart é",
    ])
    .await;
    let (moto, mut client) = (&world.moto, world.client.clone());
    moto.start_recording();
    let volume = created(&mut client, create_request("pvc-go-flags", 40, &[("type", "gp3")])).await;
    let agents = moto.recorded_user_agents("CreateVolume");
    assert!(
        !agents.is_empty()
            && agents.iter().all(|agent| agent.contains(&format!(
                "exec-env/aws-ebs-csi-driver-v{}-helm chart _",
                env!("CARGO_PKG_VERSION")
            ))),
        "{agents:?}"
    );
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume.volume_id)]);
    assert_tags(&xml, &[("team", "platform")]);
    assert!(!xml.contains("<key>legacy</key>"), "{xml}");
    assert!(
        world
            .controller
            .process
            .log()
            .contains("--extra-volume-tags=team=legacy,legacy=true"),
        "the flag is named in a warning"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn volumes_are_attached_and_detached() {
    let Setup {
        moto,
        mut client,
        controller: _controller,
        _sandbox,
    } = setup(&[]).await;
    let node = moto.run_instance(REGION, ZONE);
    let other_node = moto.run_instance(REGION, ZONE);
    let volume = create(&mut client, "pvc-attach", 2).await;
    let publish = |node_id: &str| ControllerPublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: node_id.to_owned(),
        volume_capability: Some(mount()),
        ..Default::default()
    };
    let context = client
        .controller_publish_volume(publish(&node))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let device = context.get("devicePath").cloned().unwrap();
    assert!(device.starts_with("/dev/xvd"), "{device}");
    let again = client
        .controller_publish_volume(publish(&node))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    assert_eq!(
        again.get("devicePath"),
        Some(&device),
        "a repeat returns the same device"
    );
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume.volume_id)]);
    assert_eq!(xml_values(&xml, "device"), vec![device.clone()]);
    let elsewhere = client
        .controller_publish_volume(publish(&other_node))
        .await
        .unwrap_err();
    assert_eq!(elsewhere.code(), Code::FailedPrecondition);
    assert!(elsewhere.message().contains(&node), "{elsewhere:?}");
    let status = client
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: volume.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status.unwrap().published_node_ids, vec![node.clone()]);
    let in_use = client
        .delete_volume(DeleteVolumeRequest {
            volume_id: volume.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(in_use.code(), Code::FailedPrecondition);
    let missing_node = client
        .controller_publish_volume(publish("i-0000000000000dead"))
        .await
        .unwrap_err();
    assert_eq!(missing_node.code(), Code::NotFound);
    let unpublish = ControllerUnpublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: node.clone(),
        ..Default::default()
    };
    for _ in 0..2 {
        client.controller_unpublish_volume(unpublish.clone()).await.unwrap();
    }
    let second = create(&mut client, "pvc-attach-2", 2).await;
    let next = client
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: second.volume_id.clone(),
            ..publish(&node)
        })
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    assert_ne!(next.get("devicePath"), Some(&device), "device names rotate");
    client
        .delete_volume(DeleteVolumeRequest {
            volume_id: volume.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// The Go driver's VolumeSnapshotClass keys for fast snapshot restore and
/// snapshot locks, over the wire: EC2's own state shows both; a bad lock or
/// a zone outside the region is INVALID_ARGUMENT with no snapshot made.
#[tokio::test(flavor = "multi_thread")]
async fn snapshot_classes_lock_and_enable_fast_restore() {
    let Setup {
        mut client,
        moto,
        controller: _controller,
        _sandbox,
    } = setup(&[]).await;
    let volume = create(&mut client, "pvc-locked", 3).await;
    let request = |name: &str, parameters: &[(&str, &str)]| CreateSnapshotRequest {
        source_volume_id: volume.volume_id.clone(),
        name: name.into(),
        parameters: string_map(parameters),
        ..Default::default()
    };
    moto.start_recording();
    for (parameters, why) in [
        (
            vec![("fastSnapshotRestoreAvailabilityZones", "us-east-1q")],
            "fastSnapshotRestoreAvailabilityZones: us-east-1q is not a zone of this region",
        ),
        (
            vec![("lockMode", "forever")],
            "lockMode=\"forever\" is not compliance or governance",
        ),
    ] {
        let refused = client
            .create_snapshot(request("snapshot-bad", &parameters))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(refused.message().contains(why), "{refused:?}");
    }
    assert_eq!(moto.recorded("CreateSnapshot"), 0);
    let class = [
        ("fastSnapshotRestoreAvailabilityZones", ZONE),
        ("lockMode", "governance"),
        ("lockDuration", "7"),
    ];
    let snapshot = client
        .create_snapshot(request("snapshot-locked", &class))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let xml = moto.ec2(REGION, "DescribeLockedSnapshots", &[]);
    assert_eq!(xml_values(&xml, "snapshotId"), vec![snapshot.snapshot_id.clone()]);
    assert_eq!(xml_values(&xml, "lockState"), vec!["governance"]);
    assert_eq!(xml_values(&xml, "lockDuration"), vec!["7"]);
    let xml = moto.ec2(REGION, "DescribeFastSnapshotRestores", &[]);
    assert_eq!(xml_values(&xml, "snapshotId"), vec![snapshot.snapshot_id.clone()]);
    assert_eq!(xml_values(&xml, "availabilityZone"), vec![ZONE]);
    // A repeat finds the snapshot; fast restore is asked again, no new lock.
    moto.start_recording();
    client
        .create_snapshot(request("snapshot-locked", &class))
        .await
        .unwrap();
    assert_eq!(
        (
            moto.recorded("LockSnapshot"),
            moto.recorded("EnableFastSnapshotRestores")
        ),
        (0, 1)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_are_created_listed_restored_and_deleted() {
    let Setup {
        mut client,
        moto,
        controller: _controller,
        _sandbox,
    } = setup(&["--k8s-tag-cluster-id", "test-cluster"]).await;
    let volume = create(&mut client, "pvc-snap", 3).await;
    let other = create(&mut client, "pvc-snap-other", 3).await;
    let request = CreateSnapshotRequest {
        source_volume_id: volume.volume_id.clone(),
        name: "snapshot-1".into(),
        parameters: HashMap::from([
            (
                "tagSpecification_1".to_owned(),
                "origin={{ .VolumeSnapshotName }}".to_owned(),
            ),
            (
                "csi.storage.k8s.io/volumesnapshot/name".to_owned(),
                "nightly".to_owned(),
            ),
        ]),
        ..Default::default()
    };
    let snapshot = client
        .create_snapshot(request.clone())
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(snapshot.snapshot_id.starts_with("snap-"));
    assert_eq!(snapshot.source_volume_id, volume.volume_id);
    assert_eq!(snapshot.size_bytes, 3 * GIB);
    // Described and tagged as the Go driver does, as EC2 stores them.
    let xml = moto.ec2(REGION, "DescribeSnapshots", &[("SnapshotId.1", &snapshot.snapshot_id)]);
    assert_eq!(
        xml_values(&xml, "description"),
        vec![format!("Created by AWS EBS CSI driver for volume {}", volume.volume_id)]
    );
    assert_tags(
        &xml,
        &[
            ("CSIVolumeSnapshotName", "snapshot-1"),
            ("Name", "test-cluster-dynamic-snapshot-1"),
            ("ebs.csi.aws.com/cluster-name", "test-cluster"),
            ("origin", "nightly"),
        ],
    );
    assert_eq!(
        client
            .create_snapshot(request.clone())
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap()
            .snapshot_id,
        snapshot.snapshot_id
    );
    let conflict = client
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: other.volume_id.clone(),
            ..request.clone()
        })
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists);
    let by_volume = client
        .list_snapshots(ListSnapshotsRequest {
            source_volume_id: volume.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_volume.entries.len(), 1);
    let by_id = client
        .list_snapshots(ListSnapshotsRequest {
            snapshot_id: snapshot.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        by_id.entries[0].snapshot.as_ref().unwrap().snapshot_id,
        snapshot.snapshot_id
    );
    let snapshot_source = volume_content_source::SnapshotSource {
        snapshot_id: snapshot.snapshot_id.clone(),
    };
    let restore = request_from(
        volume_content_source::Type::Snapshot(snapshot_source),
        "pvc-restored",
        1,
    );
    let restored = created(&mut client, restore).await;
    assert_eq!(restored.capacity_bytes, 3 * GIB, "at least the snapshot's size");
    assert!(restored.content_source.is_some());
    let got = client
        .get_snapshot(GetSnapshotRequest {
            snapshot_id: snapshot.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(got.into_inner().snapshot.is_some());
    for _ in 0..2 {
        client
            .delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: snapshot.snapshot_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let empty = client
        .list_snapshots(ListSnapshotsRequest {
            snapshot_id: snapshot.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(empty.entries.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn volumes_are_expanded_and_modified_in_one_call() {
    let Setup {
        moto,
        mut client,
        controller: _controller,
        _sandbox,
    } = setup(&["--modify-volume-request-handler-timeout", "300ms"]).await;
    let volume = create(&mut client, "pvc-grow", 4).await;
    moto.start_recording();
    let expand = ControllerExpandVolumeRequest {
        volume_id: volume.volume_id.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: 8 * GIB,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount()),
        ..Default::default()
    };
    let modify = ControllerModifyVolumeRequest {
        volume_id: volume.volume_id.clone(),
        mutable_parameters: HashMap::from([
            ("type".to_owned(), "io2".to_owned()),
            ("iops".to_owned(), "400".to_owned()),
        ]),
        ..Default::default()
    };
    let (mut c1, mut c2) = (client.clone(), client.clone());
    let (expanded, modified) = tokio::join!(
        c1.controller_expand_volume(expand.clone()),
        c2.controller_modify_volume(modify)
    );
    let expanded = expanded.unwrap().into_inner();
    modified.unwrap();
    assert_eq!(
        moto.recorded("ModifyVolume"),
        1,
        "a resize and a type change make one ModifyVolume"
    );
    assert_eq!(expanded.capacity_bytes, 8 * GIB);
    assert!(expanded.node_expansion_required);
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume.volume_id)]);
    assert_eq!(xml_values(&xml, "size"), vec!["8"]);
    assert_eq!(xml_values(&xml, "volumeType"), vec!["io2"]);
    // A repeat and a no-op send nothing.
    moto.start_recording();
    client.controller_expand_volume(expand).await.unwrap();
    let smaller = ControllerExpandVolumeRequest {
        volume_id: volume.volume_id.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: 2 * GIB,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    assert_eq!(
        client
            .controller_expand_volume(smaller)
            .await
            .unwrap()
            .into_inner()
            .capacity_bytes,
        8 * GIB
    );
    assert_eq!(moto.recorded("ModifyVolume"), 0);
    // Tags through VolumeAttributesClass parameters.
    let tags = ControllerModifyVolumeRequest {
        volume_id: volume.volume_id.clone(),
        mutable_parameters: HashMap::from([("tagSpecification_1".to_owned(), "tier=gold".to_owned())]),
        ..Default::default()
    };
    client.controller_modify_volume(tags).await.unwrap();
    moto.volume_once(REGION, &volume.volume_id, |xml| xml.contains("<key>tier</key>"));
    let unknown = ControllerModifyVolumeRequest {
        volume_id: volume.volume_id.clone(),
        mutable_parameters: HashMap::from([("encrypted".to_owned(), "true".to_owned())]),
        ..Default::default()
    };
    assert_eq!(
        client.controller_modify_volume(unknown).await.unwrap_err().code(),
        Code::InvalidArgument
    );
}

/// `allowAutoIOPSIncreaseOnModify` with `iopsPerGB`: the ratio is recorded
/// on the volume in the Go driver's tags, and a resize raises the IOPS with
/// the size in the same ModifyVolume.
#[tokio::test(flavor = "multi_thread")]
async fn iops_follow_the_size_when_the_class_allows_it() {
    let Setup {
        moto,
        mut client,
        controller: _controller,
        _sandbox,
    } = setup(&["--modify-volume-request-handler-timeout", "300ms"]).await;
    let parameters = [("iopsPerGB", "400"), ("allowAutoIOPSIncreaseOnModify", "true")];
    let volume = created(&mut client, create_request("pvc-ratio", 10, &parameters)).await;
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume.volume_id)]);
    assert_eq!(xml_values(&xml, "iops"), vec!["4000"]);
    assert_tags(
        &xml,
        &[
            ("ebs.csi.aws.com/IOPSPerGb", "400"),
            ("ebs.csi.aws.com/AllowAutoIOPSIncreaseOnModify", "true"),
        ],
    );
    moto.start_recording();
    let expand = ControllerExpandVolumeRequest {
        volume_id: volume.volume_id.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: 25 * GIB,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount()),
        ..Default::default()
    };
    client.controller_expand_volume(expand).await.unwrap();
    assert_eq!(moto.recorded("ModifyVolume"), 1);
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume.volume_id)]);
    assert_eq!(xml_values(&xml, "size"), vec!["25"]);
    assert_eq!(xml_values(&xml, "iops"), vec!["10000"]);
    // A class with a fixed IOPS ends the ratio: the next resize keeps them.
    let fixed = ControllerModifyVolumeRequest {
        volume_id: volume.volume_id.clone(),
        mutable_parameters: HashMap::from([("iops".to_owned(), "12000".to_owned())]),
        ..Default::default()
    };
    client.controller_modify_volume(fixed).await.unwrap();
    let xml = moto.volume_once(REGION, &volume.volume_id, |xml| {
        !xml.contains("ebs.csi.aws.com/IOPSPerGb")
    });
    assert_eq!(xml_values(&xml, "iops"), vec!["12000"]);
    // moto's dry run names no maximum (DryRunOperation): the EC2 API
    // Reference's 80,000 for gp3 stands.
    let documented = created(&mut client, create_request("pvc-documented", 100, &[("iops", "20000")])).await;
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &documented.volume_id)]);
    assert_eq!(xml_values(&xml, "iops"), vec!["20000"]);
}

/// A VolumeAttributesClass's `iopsPerGB`, as the Go driver (parity row
/// 4.5): recorded on the volume alone; with
/// `allowAutoIOPSIncreaseOnModify` it sets the IOPS to size × ratio at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_class_ratio_sets_the_iops_only_where_the_class_allows_it() {
    let world = setup(&["--modify-volume-request-handler-timeout", "300ms"]).await;
    let (moto, mut client) = (&world.moto, world.client.clone());
    let volume = created(&mut client, create_request("pvc-class-ratio", 10, &[])).await;
    let modify = |parameters: &[(&str, &str)]| ControllerModifyVolumeRequest {
        volume_id: volume.volume_id.clone(),
        mutable_parameters: string_map(parameters),
        ..Default::default()
    };
    moto.start_recording();
    client
        .controller_modify_volume(modify(&[("iopsPerGB", "500")]))
        .await
        .unwrap();
    assert_eq!(moto.recorded("ModifyVolume"), 0);
    let xml = moto.volume_once(REGION, &volume.volume_id, |xml| {
        xml.contains("ebs.csi.aws.com/IOPSPerGb")
    });
    assert_tags(&xml, &[("ebs.csi.aws.com/IOPSPerGb", "500")]);
    assert_eq!(xml_values(&xml, "iops"), vec!["3000"]);
    let allowed = modify(&[("iopsPerGB", "500"), ("allowAutoIOPSIncreaseOnModify", "true")]);
    moto.start_recording();
    client.controller_modify_volume(allowed).await.unwrap();
    assert_eq!(moto.recorded("ModifyVolume"), 1);
    let xml = moto.volume_once(REGION, &volume.volume_id, |xml| {
        xml.contains("ebs.csi.aws.com/AllowAutoIOPSIncreaseOnModify")
    });
    assert_eq!(xml_values(&xml, "iops"), vec!["5000"]);
    assert_tags(&xml, &[("ebs.csi.aws.com/AllowAutoIOPSIncreaseOnModify", "true")]);
}

/// `--endpoint tcp://…`, as the Go driver takes it: the controller serves
/// CSI on the address (port 0: the kernel picks one), which it names in a
/// warning that every peer reaching it may call every RPC.
#[tokio::test(flavor = "multi_thread")]
async fn a_tcp_endpoint_is_served_and_named_in_a_warning() {
    let sandbox = Sandbox::new();
    let moto = Moto::start();
    let metadata_socket = sandbox.path().join("snapshot-metadata.sock");
    let mut command = Command::new(binary("ebs-csi-controller"));
    command.arg("--endpoint=tcp://127.0.0.1:0").arg(format!(
        "--snapshot-metadata-endpoint=unix://{}",
        metadata_socket.display()
    ));
    aws_env(&mut command, &moto.endpoint, REGION);
    // The SnapshotMetadata socket is bound first, the CSI address after it.
    let controller = spawn(
        "controller",
        command,
        sandbox.path().join("controller.log"),
        &metadata_socket,
    );
    let warning = "serving CSI on TCP: CSI has no authentication, so every peer that reaches this address \
                   may call every RPC; keep it on an address only the CO's components reach address=";
    wait_until("the TCP endpoint's warning", Duration::from_secs(30), || {
        controller.log().contains(warning)
    });
    let log = controller.log();
    let address = log[log.find(warning).unwrap() + warning.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert!(
        address.starts_with("127.0.0.1:") && !address.ends_with(":0"),
        "{address}"
    );
    let channel = Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let info = IdentityClient::new(channel)
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "ebs.csi.aws.com");
}

/// `blockAttachUntilInitialized` over the wire: while DescribeVolumeStatus
/// reports the volume initializing, ControllerPublishVolume is UNAVAILABLE
/// with EC2's progress and nothing is attached; once it is done, the
/// volume is attached.
#[tokio::test(flavor = "multi_thread")]
async fn a_class_can_hold_the_attachment_until_the_volume_is_initialized() {
    let Setup {
        moto,
        mut client,
        controller: _controller,
        _sandbox,
    } = setup(&[]).await;
    let request = create_request("pvc-held", 4, &[("blockAttachUntilInitialized", "true")]);
    let volume = created(&mut client, request).await;
    let node = moto.run_instance(REGION, ZONE);
    let publish = ControllerPublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: node,
        volume_capability: Some(mount()),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    };
    moto.set_initializing(&volume.volume_id, Some((42, 120)));
    moto.start_recording();
    let held = client.controller_publish_volume(publish.clone()).await.unwrap_err();
    assert_eq!(held.code(), Code::Unavailable);
    assert_eq!(
        held.message(),
        format!(
            "volume {} is still being initialized from its snapshot, 42% done, about 120 s left; \
             blockAttachUntilInitialized holds the attachment until it is done",
            volume.volume_id
        )
    );
    assert_eq!(moto.recorded("AttachVolume"), 0);
    moto.set_initializing(&volume.volume_id, None);
    let published = client.controller_publish_volume(publish).await.unwrap().into_inner();
    assert!(published.publish_context.contains_key("devicePath"));
}

/// A requirement by zone id only (`topology.k8s.aws/zone-id`): the volume
/// goes to the zone EC2 maps that id to in this account, and its topology
/// carries the id.
#[tokio::test(flavor = "multi_thread")]
async fn a_zone_id_names_the_zone_over_the_wire() {
    let Setup {
        moto,
        mut client,
        controller: _controller,
        _sandbox,
    } = setup(&[]).await;
    let zones = moto.ec2(REGION, "DescribeAvailabilityZones", &[("ZoneName.1", "us-east-1b")]);
    let id = xml_values(&zones, "zoneId").pop().expect("us-east-1b's zone id");
    let by_id = Topology {
        segments: HashMap::from([("topology.k8s.aws/zone-id".to_owned(), id.clone())]),
    };
    let request = CreateVolumeRequest {
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![by_id.clone()],
            preferred: vec![by_id],
        }),
        ..create_request("pvc-by-zone-id", 2, &[])
    };
    let volume = created(&mut client, request).await;
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume.volume_id)]);
    assert_eq!(xml_values(&xml, "availabilityZone"), vec!["us-east-1b"]);
    let segments = &volume.accessible_topology[0].segments;
    assert_eq!(segments.get("topology.k8s.aws/zone-id"), Some(&id));
    assert_eq!(
        segments.get("topology.kubernetes.io/zone").map(String::as_str),
        Some("us-east-1b")
    );
}

/// The Go driver's `AWS_EC2_ENDPOINT` names the EC2 endpoint too.
#[tokio::test(flavor = "multi_thread")]
async fn the_go_drivers_endpoint_variable_is_honoured() {
    let sandbox = Sandbox::new();
    let moto = Moto::start();
    let controller = Controller::start_with_go_endpoint_variable(&sandbox, &moto, REGION);
    let mut client = controller.client().await;
    let volume = create(&mut client, "pvc-endpoint", 1).await;
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume.volume_id)]);
    assert_eq!(xml_values(&xml, "volumeId"), vec![volume.volume_id]);
}

/// Creates and publishes `count` volumes at once; returns the Describe
/// calls EC2 received.
async fn describe_calls(batching: &str, count: usize) -> usize {
    let Setup {
        moto,
        client,
        controller: _controller,
        _sandbox,
    } = setup(&[&format!("--batching={batching}")]).await;
    let nodes = [moto.run_instance(REGION, ZONE), moto.run_instance(REGION, ZONE)];
    moto.start_recording();
    let tasks: Vec<_> = (0..count)
        .map(|i| {
            let mut client = client.clone();
            let node = nodes[i % 2].clone();
            tokio::spawn(async move {
                let volume = create(&mut client, &format!("pvc-{i}"), 1).await;
                let publish = ControllerPublishVolumeRequest {
                    volume_id: volume.volume_id,
                    node_id: node,
                    volume_capability: Some(mount()),
                    ..Default::default()
                };
                client.controller_publish_volume(publish).await.unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    moto.recorded("Describe")
}

#[tokio::test(flavor = "multi_thread")]
async fn batching_merges_describe_calls() {
    let with = describe_calls("true", 50).await;
    let without = describe_calls("false", 50).await;
    eprintln!("Describe calls for 50 volumes: {with} with batching, {without} without");
    assert!(with * 2 < without, "{with} with batching vs {without} without");
}

/// EC2's request limits, kept by `tests/ec2/serve.py` as EC2 documents
/// them: 60 volumes created, attached and detached at once are more
/// AttachVolume and DetachVolume calls than their buckets hold (50), yet
/// none is throttled: the controller waits for its tokens instead, and
/// every RPC succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn the_controller_keeps_within_ec2s_request_limits() {
    let Setup {
        moto,
        client,
        controller: _controller,
        _sandbox,
    } = setup(&[]).await;
    let nodes: Vec<String> = (0..3).map(|_| moto.run_instance(REGION, ZONE)).collect();
    moto.request_limits();
    moto.start_recording();
    let tasks: Vec<_> = (0..60)
        .map(|i| {
            let mut client = client.clone();
            let node = nodes[i % 3].clone();
            tokio::spawn(async move {
                let volume_id = create(&mut client, &format!("pvc-{i}"), 1).await.volume_id;
                let publish = ControllerPublishVolumeRequest {
                    volume_id: volume_id.clone(),
                    node_id: node.clone(),
                    volume_capability: Some(mount()),
                    ..Default::default()
                };
                client.controller_publish_volume(publish).await.unwrap();
                let unpublish = ControllerUnpublishVolumeRequest {
                    volume_id,
                    node_id: node,
                    ..Default::default()
                };
                client.controller_unpublish_volume(unpublish).await.unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(moto.throttled_by_limits(), 0);
    assert_eq!(moto.recorded("AttachVolume"), 60, "each sent once");
}

/// The controller job of deploy/nomad as a Nomad client runs it (see
/// `ebs_csi_tests::nomad`): root binds the socket in Nomad's root-only
/// directory and hands it over; the controller serves it as nobody.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn the_nomad_controller_job_serves_nomads_socket_unprivileged() {
    require_root();
    let moto = Moto::start();
    let sandbox = Sandbox::new();
    let nomad = NomadClient::new(sandbox.path());
    let controller = nomad.start_controller_task(sandbox.path(), &moto.endpoint, REGION);
    let info = controller
        .identity()
        .await
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "ebs.csi.aws.com");
    nomad::assert_handed_over(controller.process.pid(), "ebs-csi-control", 65534);
}

/// EC2's answers that moto does not give, from `tests/ec2/serve.py` (each
/// cites its source there), over the wire: throttling the SDK's retries
/// get through, a detach EC2 refuses because the volume is already
/// available, a ClientToken reused with other parameters, and a clone made
/// by CopyVolumes. Each is counted in the metrics with EC2's error code,
/// served over TLS (a certificate made by openssl, checked by curl).
#[tokio::test(flavor = "multi_thread")]
async fn ec2s_own_answers_are_survived_over_the_wire() {
    let tls = tempfile::tempdir().unwrap();
    let (cert, key) = (tls.path().join("cert.pem"), tls.path().join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
        ])
        .args([
            "-subj",
            "/CN=ebs-csi-metrics",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
        ])
        .args([&key, std::path::Path::new("-out"), &cert])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let (cert_arg, key_arg) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let Setup {
        moto,
        mut client,
        controller,
        _sandbox,
    } = setup(&[
        "--http-endpoint",
        "127.0.0.1:0",
        "--metrics-cert-file",
        cert_arg,
        "--metrics-key-file",
        key_arg,
        "--deprecated-metrics",
    ])
    .await;
    // Two throttled calls: the SDK's third attempt (adaptive mode) passes.
    moto.fault("throttle", 2);
    let volume = create(&mut client, "pvc-throttled", 2).await;
    assert_eq!(moto.fault_left("throttle"), 0);

    // Never attached, so EC2 answers DetachVolume with IncorrectState
    // "… is in the 'available' state.": already detached, success.
    let node = moto.run_instance(REGION, ZONE);
    moto.fault("detach-available", 1);
    client
        .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: node,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(moto.fault_left("detach-available"), 0);

    // IdempotentParameterMismatch: ALREADY_EXISTS now, a volume on retry.
    moto.fault("token-mismatch", 1);
    let mismatch = client
        .create_volume(create_request("pvc-token", 2, &[]))
        .await
        .unwrap_err();
    assert_eq!(mismatch.code(), Code::AlreadyExists, "{mismatch:?}");
    assert!(
        mismatch.message().ends_with("the next attempt uses a new client token"),
        "{mismatch:?}"
    );
    let retried = create(&mut client, "pvc-token", 2).await;
    assert!(retried.volume_id.starts_with("vol-"));

    // A clone: CopyVolumes in the source's zone, the source in the reply.
    let volume_source = volume_content_source::VolumeSource {
        volume_id: volume.volume_id.clone(),
    };
    let request = request_from(volume_content_source::Type::Volume(volume_source), "pvc-clone", 4);
    let clone = created(&mut client, request.clone()).await;
    assert_eq!(clone.content_source, request.volume_content_source);
    assert_eq!(clone.capacity_bytes, 4 * GIB);
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &clone.volume_id)]);
    assert_eq!(xml_values(&xml, "availabilityZone"), vec![ZONE]);
    assert_tags(
        &xml,
        &[("CSIVolumeName", "pvc-clone"), ("ebs.csi.aws.com/cluster", "true")],
    );
    let again = created(&mut client, request).await;
    assert_eq!(again.volume_id, clone.volume_id, "a repeat finds the clone");

    // The zone's IOPS maximum from a dry run's refusal caps what the class
    // asks; a second volume uses the maximum found, with no dry run. The
    // dry run carries the volume's tags, which the IAM policy requires of
    // every CreateVolume (deploy/validate.py evaluates it).
    moto.fault("iops-maximum", 2);
    moto.start_recording();
    for name in ["pvc-capped", "pvc-capped-again"] {
        let capped = created(&mut client, create_request(name, 100, &[("iops", "20000")])).await;
        let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &capped.volume_id)]);
        assert_eq!(xml_values(&xml, "iops"), vec!["16000"]);
    }
    assert_eq!(moto.fault_left("iops-maximum"), 1, "one dry run for the zone and type");
    let dry_runs: Vec<String> = moto
        .recorded_bodies("CreateVolume")
        .into_iter()
        .filter(|body| body.contains("DryRun=true"))
        .collect();
    assert_eq!(dry_runs.len(), 1, "{dry_runs:?}");
    for tag in [
        "Key=ebs.csi.aws.com%2Fcluster",
        "Value=true",
        "Key=CSIVolumeName",
        "Value=pvc-capped",
    ] {
        assert!(
            dry_runs[0].contains(tag),
            "{tag} missing from the dry run {}",
            dry_runs[0]
        );
    }

    let address = metrics_address(&controller);
    let curl = |url: &str| {
        std::process::Command::new("curl")
            .args([
                "--silent",
                "--show-error",
                "--fail",
                "--max-time",
                "10",
                "--cacert",
                cert_arg,
                url,
            ])
            .output()
            .unwrap()
    };
    let plain = curl(&format!("http://{address}/metrics"));
    assert!(!plain.status.success(), "plain HTTP answered: {plain:?}");
    let served = curl(&format!("https://{address}/metrics"));
    assert!(served.status.success(), "{served:?}");
    let metrics = String::from_utf8(served.stdout).unwrap();
    for line in [
        // Every throttled attempt, by operation, as the Go driver counts
        // them: the two throttles hit the name lookup before CreateVolume.
        "aws_ebs_csi_api_request_throttles_total{operation_name=\"DescribeVolumes\"} 2",
        "aws_ebs_csi_api_request_errors_total{code=\"IncorrectState\",request=\"DetachVolume\"} 1",
        "aws_ebs_csi_api_request_errors_total{code=\"IdempotentParameterMismatch\",request=\"CreateVolume\"} 1",
        // The same points under the in-tree cloud provider's names
        // (--deprecated-metrics), as the Go driver serves them.
        "# HELP cloudprovider_aws_api_throttled_requests_total Total number of throttled requests per request type (deprecated)",
        "cloudprovider_aws_api_throttled_requests_total{operation_name=\"DescribeVolumes\"} 2",
        "cloudprovider_aws_api_request_errors{code=\"IncorrectState\",request=\"DetachVolume\"} 1",
        "cloudprovider_aws_api_request_errors{code=\"IdempotentParameterMismatch\",request=\"CreateVolume\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
    let created = metrics
        .lines()
        .find(|l| l.starts_with("aws_ebs_csi_api_request_duration_seconds_count{request=\"CreateVolume\"}"))
        .unwrap_or_else(|| panic!("no CreateVolume duration in:\n{metrics}"));
    let deprecated = created.replace("aws_ebs_csi_api", "cloudprovider_aws_api");
    assert!(metrics.contains(&deprecated), "{deprecated} missing from:\n{metrics}");
}

/// A mutating call gets the Go driver's 50 attempts
/// (`pkg/cloud/retry_manager.go`), where the SDK's default is three: three
/// throttled AttachVolume attempts, and the fourth attaches the volume, in
/// one call, with no error counted. Each retry waits for the SDK's adaptive
/// rate limiter (about 18 s once it has slowed to its lowest rate).
#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_mutating_call_gets_the_go_drivers_attempts() {
    let Setup {
        moto,
        mut client,
        controller,
        _sandbox,
    } = setup(&["--http-endpoint", "127.0.0.1:0"]).await;
    let node = moto.run_instance(REGION, ZONE);
    let volume = create(&mut client, "pvc-attached", 2).await;
    moto.fault("throttle-attach", 3);
    client
        .controller_publish_volume(publish_request(&volume.volume_id, &node))
        .await
        .unwrap();
    assert_eq!(moto.fault_left("throttle-attach"), 0);
    let metrics = http_get(&metrics_address(&controller), "/metrics");
    let throttled = "aws_ebs_csi_api_request_throttles_total{operation_name=\"AttachVolume\"} 3";
    assert!(metrics.contains(throttled), "{throttled} missing from:\n{metrics}");
    assert!(!metrics.contains("code=\"RequestLimitExceeded\""), "{metrics}");
}

/// The controller's EC2 calls go through the proxy `HTTP_PROXY` and
/// `HTTPS_PROXY` name, as the Go driver's do (its chart's
/// `proxy.http_proxy`), but for the hosts `NO_PROXY` lists (`proxy.no_proxy`):
/// a real forwarding proxy, proxy.py, logs each call it forwards. The
/// controller's HTTP client reads them (controller/src/https.rs), as the
/// SDK's default client does from behavior version 2025-08-07 on.
#[tokio::test(flavor = "multi_thread")]
async fn ec2_calls_go_through_the_proxy_the_environment_names() {
    let proxy = HttpProxy::start();
    let moto = Moto::start();
    let forwarded = format!("POST {}/", moto.endpoint.trim_start_matches("http://"));
    let url = proxy.url.as_str();
    let sandbox = Sandbox::new();
    let through = [("HTTP_PROXY", url), ("HTTPS_PROXY", url), ("NO_PROXY", "")];
    let controller = Controller::start_with_env(&sandbox, &moto, REGION, &[], &through);
    create(&mut controller.client().await, "pvc-proxied", 1).await;
    wait_until("the proxy's log of the calls", Duration::from_secs(10), || {
        proxy.log().contains(&forwarded)
    });
    drop(controller);
    let proxied = proxy.log().matches(&forwarded).count();
    let sandbox = Sandbox::new();
    let direct = [("HTTP_PROXY", url), ("HTTPS_PROXY", url), ("NO_PROXY", "127.0.0.1")];
    let controller = Controller::start_with_env(&sandbox, &moto, REGION, &[], &direct);
    create(&mut controller.client().await, "pvc-direct", 1).await;
    assert_eq!(proxy.log().matches(&forwarded).count(), proxied, "{}", proxy.log());
}

/// `--enable-otel-tracing` (the Go driver's flag; its chart's
/// `controller.otelTracing` sets it with `OTEL_SERVICE_NAME` and
/// `OTEL_EXPORTER_OTLP_ENDPOINT`): each RPC is a server span, the child of
/// the caller's W3C Trace Context, and each EC2 call it makes a client span
/// beneath it (`EC2.CreateVolume`, OpenTelemetry's AWS SDK conventions);
/// a refused RPC's span carries its gRPC code and the error status. They
/// reach the collector by the time the controller has stopped (SIGTERM).
#[tokio::test(flavor = "multi_thread")]
async fn each_rpc_and_its_ec2_calls_are_spans_at_the_otlp_collector() {
    let collector = OtlpCollector::start().await;
    let moto = Moto::start();
    let sandbox = Sandbox::new();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
        ("OTEL_SERVICE_NAME", "ebs-csi-controller"),
    ];
    let controller = Controller::start_with_env(&sandbox, &moto, REGION, &["--enable-otel-tracing"], &env);
    let mut client = controller.client().await;
    let mut traced = tonic::Request::new(create_request("pvc-traced", 1, &[]));
    traced
        .metadata_mut()
        .insert("traceparent", TRACEPARENT.parse().unwrap());
    client.create_volume(traced).await.unwrap();
    let refused = client.delete_volume(DeleteVolumeRequest::default()).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    drop(controller);

    let rpc = collector.span("csi.v1.Controller/CreateVolume");
    assert_eq!(
        (rpc.trace_id.as_str(), rpc.parent_span_id.as_str(), rpc.kind),
        ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", SPAN_KIND_SERVER),
        "the caller's trace: {rpc:#?}"
    );
    assert_eq!(rpc.service_name, "ebs-csi-controller");
    for (key, value) in [
        ("rpc.system", "grpc"),
        ("rpc.service", "csi.v1.Controller"),
        ("rpc.method", "CreateVolume"),
        ("rpc.grpc.status_code", "0"),
    ] {
        assert_eq!(rpc.attributes.get(key).map(String::as_str), Some(value), "{rpc:#?}");
    }
    let ec2 = collector.span("EC2.CreateVolume");
    assert_eq!(
        (ec2.trace_id.as_str(), ec2.parent_span_id.as_str(), ec2.kind),
        (rpc.trace_id.as_str(), rpc.span_id.as_str(), SPAN_KIND_CLIENT),
        "beneath the RPC: {ec2:#?}"
    );
    for (key, value) in [
        ("rpc.system", "aws-api"),
        ("rpc.service", "EC2"),
        ("rpc.method", "CreateVolume"),
    ] {
        assert_eq!(ec2.attributes.get(key).map(String::as_str), Some(value), "{ec2:#?}");
    }
    let failed = collector.span("csi.v1.Controller/DeleteVolume");
    assert_eq!(failed.parent_span_id, "", "a root span without Trace Context");
    assert_eq!(
        (
            failed.attributes.get("rpc.grpc.status_code").map(String::as_str),
            failed.status_code
        ),
        (Some("3"), STATUS_CODE_ERROR),
        "{failed:#?}"
    );
    assert_eq!(failed.status_message, "volume_id is required");
}

/// EC2 answers CreateVolume `creating` and lists the new volume only a
/// while later; a repeated CreateVolume may find the volume attached.
/// Neither may cost the user the volume: over the wire, no DeleteVolume
/// reaches EC2 (the controller deletes only on a DeleteVolume RPC).
#[tokio::test(flavor = "multi_thread")]
async fn eventual_consistency_never_costs_a_volume() {
    let sandbox = Sandbox::new();
    let moto = Moto::start_with(&["--lag", "2", "--create", "0.5", "--attach", "0.5"]);
    let controller = Controller::start(&sandbox, &moto, REGION, &[]);
    let mut client = controller.client().await;
    let node = moto.run_instance(REGION, ZONE);
    moto.start_recording();
    let volume = create(&mut client, "pvc-late", 2).await;
    assert_eq!(
        (moto.recorded("CreateVolume"), moto.recorded("DeleteVolume")),
        (1, 0),
        "made once, looked for again while EC2 did not list it, never deleted"
    );
    assert!(moto.recorded("DescribeVolumes") >= 2, "the wait looked again");

    moto.start_recording();
    client
        .controller_publish_volume(publish_request(&volume.volume_id, &node))
        .await
        .unwrap();
    let again = create(&mut client, "pvc-late", 2).await;
    assert_eq!(
        again.volume_id, volume.volume_id,
        "the provisioner's retry finds the attached volume"
    );
    let xml = moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume.volume_id)]);
    assert_eq!(xml_values(&xml, "status"), vec!["in-use", "attached"]);
    assert_eq!(moto.recorded("DeleteVolume"), 0);
}

/// `--aws-sdk-debug-log` (the Go driver's flag) turns on the SDK's own
/// debug lines — the requests it sends and their retries — which stay off
/// otherwise, whatever `-v`.
#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_debug_log_is_on_only_when_asked() {
    for (args, shown) in [(&["--aws-sdk-debug-log"][..], true), (&["--v=5"][..], false)] {
        let Setup {
            moto: _moto,
            mut client,
            controller,
            _sandbox,
        } = setup(args).await;
        created(&mut client, create_request("pvc-debug", 1, &[])).await;
        let log = controller.process.log();
        let sdk_lines = log
            .lines()
            .filter(|l| l.contains("DEBUG") && l.contains("aws_smithy_runtime"))
            .count();
        assert_eq!(sdk_lines > 0, shown, "{args:?}: {sdk_lines} SDK debug lines\n{log}");
    }
}

/// A volume group snapshot over the wire, against moto's CreateSnapshots
/// (with serve.py leaving out ExcludeDataVolumeIds, as EC2 does): the
/// group's volumes attached to one instance in one CreateSnapshots, the
/// instance's other volume left out, a detached one by CreateSnapshot; the
/// same group again on a retry; each member a snapshot restorable and
/// listed with its group; refused across instances; deleted with its
/// members.
#[tokio::test]
async fn volume_group_snapshots_are_crash_consistent_per_instance() {
    let Setup {
        moto,
        mut client,
        controller,
        _sandbox,
    } = setup(&[]).await;
    let mut groups = controller.groups().await;
    let node = moto.run_instance(REGION, ZONE);
    let other_node = moto.run_instance(REGION, ZONE);
    let mut ids = Vec::new();
    for name in ["pvc-g1", "pvc-g2", "pvc-g-detached", "pvc-g-outside"] {
        ids.push(create(&mut client, name, 1).await.volume_id);
    }
    for volume in [&ids[0], &ids[1], &ids[3]] {
        client
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: volume.clone(),
                node_id: node.clone(),
                volume_capability: Some(mount()),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let capabilities = groups
        .group_controller_get_capabilities(GroupControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(capabilities.len(), 1);
    let request = CreateVolumeGroupSnapshotRequest {
        name: "groupsnapshot-wire".into(),
        source_volume_ids: ids[..3].to_vec(),
        parameters: HashMap::from([("tagSpecification_1".into(), "team=storage".into())]),
        ..Default::default()
    };
    moto.start_recording();
    let group = groups
        .create_volume_group_snapshot(request.clone())
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(group.group_snapshot_id, "groupsnapshot-wire");
    let mut sources: Vec<String> = group.snapshots.iter().map(|s| s.source_volume_id.clone()).collect();
    sources.sort();
    let mut expected = ids[..3].to_vec();
    expected.sort();
    assert_eq!(
        sources, expected,
        "no snapshot of the instance's other volume {}",
        ids[3]
    );
    assert_eq!(
        (moto.recorded("CreateSnapshots&"), moto.recorded("CreateSnapshot&")),
        (1, 1)
    );
    let asked = moto.recorded_bodies("CreateSnapshots&").concat();
    for parameter in [
        format!("InstanceSpecification.InstanceId={node}"),
        "InstanceSpecification.ExcludeBootVolume=true".to_owned(),
        format!("InstanceSpecification.ExcludeDataVolumeId.1={}", ids[3]),
    ] {
        assert!(asked.contains(&parameter), "{parameter} not in {asked}");
    }
    assert_eq!(moto.recorded("DeleteSnapshot"), 0, "nothing made outside the group");
    let xml = moto.ec2(
        REGION,
        "DescribeSnapshots",
        &[("Filter.1.Name", "volume-id"), ("Filter.1.Value.1", &ids[3])],
    );
    assert_eq!(xml_values(&xml, "snapshotId"), Vec::<String>::new(), "{xml}");
    for snapshot in &group.snapshots {
        assert_eq!(snapshot.group_snapshot_id, "groupsnapshot-wire");
        let xml = moto.ec2(REGION, "DescribeSnapshots", &[("SnapshotId.1", &snapshot.snapshot_id)]);
        assert_tags(
            &xml,
            &[
                ("CSIVolumeGroupSnapshotName", "groupsnapshot-wire"),
                ("team", "storage"),
                ("ebs.csi.aws.com/cluster", "true"),
            ],
        );
    }
    moto.start_recording();
    let again = groups
        .create_volume_group_snapshot(request)
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    let member_ids = |g: &VolumeGroupSnapshot| {
        let mut ids: Vec<String> = g.snapshots.iter().map(|s| s.snapshot_id.clone()).collect();
        ids.sort();
        ids
    };
    assert_eq!(member_ids(&again), member_ids(&group));
    assert_eq!(moto.recorded("CreateSnapshot"), 0, "a retry makes nothing");
    // Each member is a snapshot of its own: listed with its group, restorable.
    let listed = client
        .list_snapshots(ListSnapshotsRequest {
            snapshot_id: group.snapshots[0].snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let entry = listed.entries[0].snapshot.clone().unwrap();
    assert_eq!(entry.group_snapshot_id, "groupsnapshot-wire");
    let restored = created(
        &mut client,
        request_from(
            volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
                snapshot_id: entry.snapshot_id.clone(),
            }),
            "pvc-from-member",
            1,
        ),
    )
    .await;
    assert!(restored.content_source.is_some());
    // Volumes of two instances are refused, naming both.
    client
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: ids[2].clone(),
            node_id: other_node.clone(),
            volume_capability: Some(mount()),
            ..Default::default()
        })
        .await
        .unwrap();
    let refused = groups
        .create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest {
            name: "groupsnapshot-two-instances".into(),
            source_volume_ids: vec![ids[0].clone(), ids[2].clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains(&node) && refused.message().contains(&other_node),
        "{refused:?}"
    );
    groups
        .delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: group.group_snapshot_id.clone(),
            snapshot_ids: member_ids(&group),
            ..Default::default()
        })
        .await
        .unwrap();
    let gone = groups
        .get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
            group_snapshot_id: group.group_snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
}
