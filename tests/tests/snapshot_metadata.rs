//! The SnapshotMetadata service over the wire: the real controller binary,
//! its own socket, and EBS's direct APIs as serve.py answers them from
//! snapshot contents. Here the test writes each snapshot's contents where
//! the attach simulator would (the lifecycle test has the simulator copy
//! them from a volume written through the node).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::path::PathBuf;
use std::time::Duration;

use ebs_csi_proto::v1::plugin_capability::service;
use ebs_csi_proto::v1::{GetPluginCapabilitiesRequest, GetPluginInfoRequest, ProbeRequest};
use ebs_csi_tests::Sandbox;
use ebs_csi_tests::changed_blocks::{self, BLOCK, Listing, write_blocks};
use ebs_csi_tests::moto::{Controller, Moto, REGION, ZONE, xml_values};

const GIB: i64 = 1 << 30;

struct Setup {
    moto: Moto,
    controller: Controller,
    images: PathBuf,
    _sandbox: Sandbox,
}

fn setup() -> Setup {
    let sandbox = Sandbox::new();
    let images = sandbox.path().join("snapshots");
    std::fs::create_dir(&images).unwrap();
    let moto = Moto::start_with(&["--snapshot-images", &images.to_string_lossy()]);
    let controller = Controller::start(&sandbox, &moto, REGION, &[]);
    Setup {
        moto,
        controller,
        images,
        _sandbox: sandbox,
    }
}

impl Setup {
    /// A new 1 GiB volume's id, once EC2 lists it available.
    fn volume(&self) -> String {
        let xml = self
            .moto
            .ec2(REGION, "CreateVolume", &[("AvailabilityZone", ZONE), ("Size", "1")]);
        let volume_id = xml_values(&xml, "volumeId").remove(0);
        self.moto
            .volume_once(REGION, &volume_id, |xml| xml.contains("<status>available</status>"));
        volume_id
    }

    /// A snapshot of `volume_id` holding `rounds` (each round's blocks
    /// written in turn), once EC2 lists it; its contents are put where the
    /// attach simulator puts them.
    fn snapshot(&self, volume_id: &str, rounds: &[(u8, &[u64])]) -> String {
        let xml = self.moto.ec2(REGION, "CreateSnapshot", &[("VolumeId", volume_id)]);
        let snapshot_id = xml_values(&xml, "snapshotId").remove(0);
        let image = self.images.join(format!("{snapshot_id}.partial"));
        std::fs::File::create(&image).and_then(|f| f.set_len(1 << 30)).unwrap();
        for (round, blocks) in rounds {
            write_blocks(&image, *round, blocks).unwrap();
        }
        std::fs::rename(&image, image.with_extension("img")).unwrap();
        ebs_csi_tests::wait_until("EC2 to list the snapshot", Duration::from_secs(10), || {
            let xml = self
                .moto
                .ec2(REGION, "DescribeSnapshots", &[("SnapshotId.1", &snapshot_id)]);
            xml_values(&xml, "snapshotId").contains(&snapshot_id)
        });
        snapshot_id
    }

    async fn allocated(&self, snapshot_id: &str, starting_offset: i64, max_results: i32) -> Result<Listing, String> {
        let mut client = self.controller.metadata().await;
        changed_blocks::allocated(&mut client, snapshot_id, starting_offset, max_results).await
    }

    async fn delta(&self, base: &str, target: &str, starting_offset: i64, max_results: i32) -> Result<Listing, String> {
        let mut client = self.controller.metadata().await;
        changed_blocks::delta(&mut client, base, target, starting_offset, max_results).await
    }
}

fn blocks(listing: &Result<Listing, String>) -> Vec<u64> {
    listing.as_ref().unwrap().blocks.clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn allocated_blocks_stream_in_ebs_pages_and_messages_of_max_results() {
    let s = setup();
    let volume = s.volume();
    let written: Vec<u64> = [0, 3].into_iter().chain(200..452).collect();
    let snapshot = s.snapshot(&volume, &[(1, &written)]);

    // 254 blocks: three EBS pages of at most 100 (MaxResults' least), in
    // messages of at most 100.
    let listing = s.allocated(&snapshot, 0, 100).await.unwrap();
    assert_eq!(listing.blocks, written);
    assert_eq!(listing.capacity_bytes, GIB);
    assert_eq!(listing.messages, 3);
    // max_results 0: the plugin decides; 7: each page of 100, 100 and 54
    // blocks in messages of at most 7 (15 + 15 + 8).
    assert_eq!(blocks(&s.allocated(&snapshot, 0, 0).await), written);
    let sevens = s.allocated(&snapshot, 0, 7).await.unwrap();
    assert_eq!((sevens.blocks, sevens.messages), (written.clone(), 38));

    // Continuing from an offset inside block 3 starts at block 3.
    let from_3 = i64::try_from(3 * BLOCK + 1).unwrap();
    assert_eq!(blocks(&s.allocated(&snapshot, from_3, 0).await), written[1..]);
    // At the very end nothing is left, and the capacity is still said.
    let end = s.allocated(&snapshot, GIB, 0).await.unwrap();
    assert_eq!((end.blocks.len(), end.messages, end.capacity_bytes), (0, 1, GIB));
    assert_eq!(
        s.allocated(&snapshot, GIB + 1, 0).await.unwrap_err(),
        "OutOfRange: starting_offset 1073741825 is beyond the end of the 1073741824-byte volume"
    );
    assert_eq!(
        s.allocated(&snapshot, -1, 0).await.unwrap_err(),
        "OutOfRange: starting_offset -1 is negative"
    );
    assert_eq!(
        s.allocated(&snapshot, 0, -1).await.unwrap_err(),
        "InvalidArgument: max_results -1 is negative"
    );
    assert_eq!(
        s.allocated("", 0, 0).await.unwrap_err(),
        "InvalidArgument: snapshot_id is required"
    );
    // DescribeSnapshots filtered by snapshot-id lists none.
    assert_eq!(
        s.allocated("snap-0123456789abcdef0", 0, 0).await.unwrap_err(),
        "NotFound: snapshot snap-0123456789abcdef0 does not exist"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_delta_is_the_blocks_whose_contents_changed_between_two_snapshots() {
    let s = setup();
    let volume = s.volume();
    let first: &[u64] = &[0, 1, 2, 10];
    let second: Vec<u64> = [2, 10, 11].into_iter().chain(300..421).collect();
    let base = s.snapshot(&volume, &[(1, first)]);
    let target = s.snapshot(&volume, &[(1, first), (2, &second)]);

    // 124 changed blocks: two EBS pages, messages of at most 50.
    let delta = s.delta(&base, &target, 0, 50).await.unwrap();
    assert_eq!(delta.blocks, second);
    assert_eq!((delta.messages, delta.capacity_bytes), (3, GIB));
    let from_11 = i64::try_from(11 * BLOCK).unwrap();
    assert_eq!(blocks(&s.delta(&base, &target, from_11, 0).await), second[2..]);
    // Nothing changed from a snapshot to itself.
    assert!(blocks(&s.delta(&target, &target, 0, 0).await).is_empty());

    // A snapshot of another volume: EBS refuses the pair
    // (ValidationException UNRELATED_SNAPSHOTS).
    let other = s.snapshot(&s.volume(), &[(3, first)]);
    assert_eq!(
        s.delta(&base, &other, 0, 0).await.unwrap_err(),
        format!("InvalidArgument: invalid parameter: The snapshots '{base}' and '{other}' are not related.")
    );
    assert_eq!(
        s.delta("snap-0123456789abcdef0", &target, 0, 0).await.unwrap_err(),
        "NotFound: snapshot snap-0123456789abcdef0 does not exist"
    );
    assert_eq!(
        s.delta(&base, &target, GIB + 1, 0).await.unwrap_err(),
        "OutOfRange: starting_offset 1073741825 is beyond the end of the 1073741824-byte volume"
    );
    assert_eq!(
        s.delta("", &target, 0, 0).await.unwrap_err(),
        "InvalidArgument: base_snapshot_id is required"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_metadata_socket_serves_identity_and_snapshot_metadata_only() {
    let s = setup();
    let mut identity = s.controller.metadata_identity().await;
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "ebs.csi.aws.com");
    let services = |caps: Vec<ebs_csi_proto::v1::PluginCapability>| -> Vec<i32> {
        caps.into_iter()
            .filter_map(|c| match c.r#type {
                Some(ebs_csi_proto::v1::plugin_capability::Type::Service(s)) => Some(s.r#type),
                _ => None,
            })
            .collect()
    };
    let metadata = identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(services(metadata), vec![service::Type::SnapshotMetadataService as i32]);
    let probe = identity.probe(ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    // The CSI socket does not claim the service, and the metadata socket
    // serves no Controller RPC.
    let controller = s
        .controller
        .identity()
        .await
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert!(!services(controller).contains(&(service::Type::SnapshotMetadataService as i32)));
    let mut wrong = ebs_csi_proto::v1::controller_client::ControllerClient::new(s.controller.metadata_channel().await);
    let refused = wrong
        .controller_get_capabilities(ebs_csi_proto::v1::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented);
}
