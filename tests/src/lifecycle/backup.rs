//! The lifecycle's changed-block tracking: what an incremental backup
//! asks. Known data goes to known 512 KiB blocks of a raw block volume
//! through the node; two snapshots later, GetMetadataAllocated names
//! exactly the first round's blocks and GetMetadataDelta exactly the second
//! round's, and the snapshot copies the attach simulator made hold those
//! bytes where the streams say.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ebs_csi_proto::v1::volume_capability::access_mode::Mode;
use ebs_csi_proto::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
use ebs_csi_proto::v1::*;

use super::{Component, Driver, Environment, Failure, Report, status};
use crate::changed_blocks::{self, BLOCK, blocks_holding, write_blocks};

/// Blocks written before the first snapshot: a few apart, and a run.
fn first_round() -> Vec<u64> {
    [0, 1, 7].into_iter().chain(300..340).collect()
}

/// Blocks written between the snapshots: two of the first round again
/// (with other bytes), and a run long enough for EBS to answer in pages
/// (more than 100 blocks).
fn second_round() -> Vec<u64> {
    [1, 7, 8].into_iter().chain(1000..1150).collect()
}

fn raw_block() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

/// The first `n` blocks of `blocks` as byte ranges, for the report.
fn ranges(blocks: &[u64], n: usize) -> String {
    let shown: Vec<String> = blocks
        .iter()
        .take(n)
        .map(|b| format!("[{}, {})", b * BLOCK, (b + 1) * BLOCK))
        .collect();
    shown.join(" ")
}

/// CreateSnapshot of `volume_id`, answered once the snapshot is ready to
/// use (as csi-snapshotter asks again until it is) and the attach
/// simulator has copied its contents to `images`.
async fn snapshot(d: &Driver, volume_id: &str, name: &str, images: &Path) -> Result<String, String> {
    let mut controller = d.controller.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let request = CreateSnapshotRequest {
            source_volume_id: volume_id.into(),
            name: name.into(),
            ..Default::default()
        };
        let snapshot = controller
            .create_snapshot(request)
            .await
            .map_err(status)?
            .into_inner()
            .snapshot
            .ok_or("no snapshot")?;
        let copied = images.join(format!("{}.img", snapshot.snapshot_id)).exists();
        if snapshot.ready_to_use && copied {
            return Ok(snapshot.snapshot_id);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} ready {}, copied {copied}",
                snapshot.snapshot_id, snapshot.ready_to_use
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs the steps on a new 1 GiB raw block volume and removes it.
///
/// # Errors
/// The first step that fails.
pub(super) async fn changed_blocks(d: &Driver, env: &Environment, report: &mut Report) -> Result<(), Failure> {
    let mut d = Driver {
        capability: raw_block(),
        ..d.clone()
    };
    let images: PathBuf = env.sandbox.path().join("ebs/snapshots");
    let volume_id = report
        .step(
            "CreateVolume (gp3, 1 GiB, raw block) for changed-block tracking",
            Component::Controller,
            d.create("pvc-backup", 1, None),
        )
        .await?;
    let volume = report
        .step(
            "ControllerPublishVolume (raw block volume)",
            Component::Controller,
            d.attach(&volume_id, "pvc-backup"),
        )
        .await?;
    report
        .step(
            "NodeStageVolume (raw block: nothing to mount)",
            Component::Agent,
            d.stage(&volume),
        )
        .await?;
    report
        .step(
            "NodePublishVolume (the device at the target path)",
            Component::Agent,
            d.publish(&volume),
        )
        .await?;
    let (first, second) = (first_round(), second_round());
    let device = volume.target.clone();
    report
        .step(
            &format!("write {} blocks of 512 KiB through the device", first.len()),
            Component::Workload,
            async { write_blocks(&device, 1, &first).map_err(|e| e.to_string()) },
        )
        .await?;
    let base = report
        .step(
            "CreateSnapshot (the base)",
            Component::Controller,
            snapshot(&d, &volume_id, "snapshot-backup-base", &images),
        )
        .await?;
    report
        .step(
            &format!("write {} more blocks, two of them again", second.len()),
            Component::Workload,
            async { write_blocks(&device, 2, &second).map_err(|e| e.to_string()) },
        )
        .await?;
    let target = report
        .step(
            "CreateSnapshot (the target)",
            Component::Controller,
            snapshot(&d, &volume_id, "snapshot-backup-target", &images),
        )
        .await?;
    let mut metadata = env.controller.metadata().await;
    let allocated = report
        .step(
            "GetMetadataAllocated of the base: exactly the blocks written",
            Component::Controller,
            async {
                let listing = changed_blocks::allocated(&mut metadata, &base, 0, 0).await?;
                if listing.blocks != first {
                    return Err(format!("blocks {:?}", listing.blocks));
                }
                Ok(listing)
            },
        )
        .await?;
    report.note(&format!(
        "{} allocated blocks in {} message(s); first ranges {}",
        allocated.blocks.len(),
        allocated.messages,
        ranges(&allocated.blocks, 3)
    ));
    let delta = report
        .step(
            "GetMetadataDelta base → target (max_results 64): exactly the blocks written between",
            Component::Controller,
            async {
                let listing = changed_blocks::delta(&mut metadata, &base, &target, 0, 64).await?;
                if listing.blocks != second {
                    return Err(format!("blocks {:?}", listing.blocks));
                }
                Ok(listing)
            },
        )
        .await?;
    report.note(&format!(
        "{} changed blocks in {} messages; first ranges {}",
        delta.blocks.len(),
        delta.messages,
        ranges(&delta.blocks, 3)
    ));
    report
        .step(
            "the snapshot copies hold those bytes at those blocks",
            Component::Simulator,
            async {
                let base_image = images.join(format!("{base}.img"));
                let target_image = images.join(format!("{target}.img"));
                let error = |e: std::io::Error| e.to_string();
                let in_base = blocks_holding(&base_image, 1, &first).map_err(error)?;
                let in_target = blocks_holding(&target_image, 2, &second).map_err(error)?;
                let second_in_base = blocks_holding(&base_image, 2, &second).map_err(error)?;
                if in_base != first || in_target != second || !second_in_base.is_empty() {
                    return Err(format!(
                        "base holds {in_base:?} of round 1 and {second_in_base:?} of round 2; target {in_target:?}"
                    ));
                }
                Ok(())
            },
        )
        .await?;
    for id in [target, base] {
        report
            .step(
                &format!("DeleteSnapshot {id}"),
                Component::Controller,
                d.delete_snapshot(&id),
            )
            .await?;
    }
    d.teardown(&volume, report).await?;
    report
        .step(
            &format!("DeleteVolume {volume_id}"),
            Component::Controller,
            d.delete_volume(&volume_id),
        )
        .await
}
