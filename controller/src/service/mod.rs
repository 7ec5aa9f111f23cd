//! The CSI Controller service: request validation, idempotency and
//! concurrency guards, then EC2 through [`Ec2`] and the batched
//! [`Describer`].

mod attach;
mod capability;
mod ebs_cards;
mod groups;
pub mod identity;
mod iops_ceiling;
mod modify;
mod modify_properties;
mod snapshots;
mod tokens;
mod topology;
mod volumes;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use ebs_csi_proto::inflight::InFlight;
use ebs_csi_proto::observed::observed;
use ebs_csi_proto::v1::controller_server::Controller;
use ebs_csi_proto::v1::controller_service_capability::{self, rpc};
use ebs_csi_proto::v1::*;
use tonic::{Request, Response, Status};

pub use identity::IdentityService;

use crate::devices::DeviceAllocator;
use crate::ec2::Ec2;
use crate::ec2::Tags;
use crate::ec2::batch::{BatchConfig, Describer};
use crate::error::ControllerError;
use crate::metrics::DetachPending;
use crate::tags::InvalidTags;
use ebs_cards::EbsCards;
use iops_ceiling::IopsCeilings;
use modify::Coalescer;
use tokens::ClientTokens;
use topology::ZonePicker;
use wait::Cadence;

/// Settings of the controller service.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--k8s-tag-cluster-id`: adds `kubernetes.io/cluster/<id>=owned`.
    pub cluster_id: Option<String>,
    /// `--extra-tags`: added to every volume and snapshot.
    pub extra_tags: Tags,
    /// `--warn-on-invalid-tag`: what a class's invalid tag does.
    pub invalid_tags: InvalidTags,
    /// `--batching` and its window.
    pub batch: BatchConfig,
    /// `--modify-volume-request-handler-timeout`: how long modification
    /// requests for one volume are collected into one ModifyVolume.
    pub modify_window: Duration,
    /// How long CreateVolume waits for `available`.
    pub create_timeout: Duration,
    /// How long an attachment may stay `attaching` before it is undone
    /// (the Go driver uses 90 s).
    pub attach_timeout: Duration,
    /// How long modification and snapshot waits last.
    pub state_timeout: Duration,
    /// How long ControllerUnpublishVolume waits for the detachment: the Go
    /// driver's wait, 13 polls backing off from 1 s by 1.8 times
    /// (`pkg/cloud/cloud.go`, `volumeAttachmentStatePoll*`), 2,602 s. The
    /// CO's own deadline for the call (the external-attacher's `--timeout`)
    /// ends it sooner, and the CO calls again.
    pub detach_timeout: Duration,
    /// Where detachments being waited for are reported.
    pub detach_pending: DetachPending,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            cluster_id: None,
            extra_tags: Tags::new(),
            invalid_tags: InvalidTags::Refuse,
            batch: BatchConfig::default(),
            modify_window: Duration::from_secs(2),
            create_timeout: Duration::from_secs(300),
            attach_timeout: Duration::from_secs(90),
            state_timeout: Duration::from_secs(300),
            detach_timeout: Duration::from_secs(2_602),
            detach_pending: DetachPending::default(),
        }
    }
}

/// The Controller service over an [`Ec2`].
pub struct ControllerService<E: Ec2> {
    ec2: Arc<E>,
    describe: Describer,
    settings: Settings,
    in_flight: InFlight,
    devices: DeviceAllocator,
    zones: ZonePicker,
    coalescer: Coalescer<E>,
    tokens: ClientTokens,
    iops_ceilings: IopsCeilings,
    ebs_cards: EbsCards,
}

impl<E: Ec2> ControllerService<E> {
    /// A controller over `ec2`.
    pub fn new(ec2: Arc<E>, settings: Settings) -> Self {
        Self {
            describe: Describer::new(Arc::clone(&ec2), settings.batch),
            coalescer: Coalescer::new(Arc::clone(&ec2), settings.modify_window),
            ec2,
            settings,
            in_flight: InFlight::default(),
            devices: DeviceAllocator::default(),
            zones: ZonePicker::default(),
            tokens: ClientTokens::default(),
            iops_ceilings: IopsCeilings::default(),
            ebs_cards: EbsCards::default(),
        }
    }
}

impl<E: Ec2> ControllerService<E> {
    /// How waits look again: at once when batching holds the looks,
    /// backing off when each look is a call of its own.
    fn cadence(&self) -> Cadence {
        if self.settings.batch.enabled {
            Cadence::Batched
        } else {
            Cadence::Backoff
        }
    }
}

/// Requires a non-empty string field.
pub(crate) fn required<'a>(field: &str, value: &'a str) -> Result<&'a str, ControllerError> {
    if value.is_empty() {
        return Err(ControllerError::InvalidArgument(format!("{field} is required")));
    }
    Ok(value)
}

/// GiB, in bytes.
pub(crate) const GIB: i64 = 1 << 30;

/// Whole GiB needed to hold `bytes` (positive).
fn gib_ceil(bytes: i64) -> i64 {
    bytes / GIB + i64::from(bytes % GIB != 0)
}

#[tonic::async_trait]
impl<E: Ec2> Controller for ControllerService<E> {
    async fn create_volume(&self, r: Request<CreateVolumeRequest>) -> Result<Response<CreateVolumeResponse>, Status> {
        let r = r.into_inner();
        let subject = r.name.clone();
        observed("CreateVolume", &subject, true, self.create(r)).await
    }

    async fn delete_volume(&self, r: Request<DeleteVolumeRequest>) -> Result<Response<DeleteVolumeResponse>, Status> {
        let r = r.into_inner();
        let subject = r.volume_id.clone();
        observed("DeleteVolume", &subject, true, self.delete(r)).await
    }

    async fn controller_publish_volume(
        &self,
        r: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let subject = r.volume_id.clone();
        observed("ControllerPublishVolume", &subject, true, self.publish(r)).await
    }

    async fn controller_unpublish_volume(
        &self,
        r: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let subject = r.volume_id.clone();
        observed("ControllerUnpublishVolume", &subject, true, self.unpublish(r)).await
    }

    async fn validate_volume_capabilities(
        &self,
        r: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let r = r.into_inner();
        let subject = r.volume_id.clone();
        observed("ValidateVolumeCapabilities", &subject, false, self.validate(r)).await
    }

    async fn list_volumes(&self, r: Request<ListVolumesRequest>) -> Result<Response<ListVolumesResponse>, Status> {
        observed("ListVolumes", "", false, self.list(r.into_inner())).await
    }

    async fn get_capacity(&self, _: Request<GetCapacityRequest>) -> Result<Response<GetCapacityResponse>, Status> {
        Err(
            ControllerError::Unimplemented("GetCapacity is not supported: EBS capacity is not limited per zone".into())
                .into(),
        )
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let rpc = |kind: rpc::Type| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc { r#type: kind as i32 },
            )),
        };
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: [
                rpc::Type::CreateDeleteVolume,
                rpc::Type::CloneVolume,
                rpc::Type::PublishUnpublishVolume,
                rpc::Type::ListVolumes,
                rpc::Type::ListVolumesPublishedNodes,
                rpc::Type::GetVolume,
                rpc::Type::VolumeCondition,
                rpc::Type::CreateDeleteSnapshot,
                rpc::Type::ListSnapshots,
                rpc::Type::GetSnapshot,
                rpc::Type::ExpandVolume,
                rpc::Type::ModifyVolume,
                rpc::Type::SingleNodeMultiWriter,
            ]
            .into_iter()
            .map(rpc)
            .collect(),
        }))
    }

    async fn create_snapshot(
        &self,
        r: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let r = r.into_inner();
        let subject = r.name.clone();
        observed("CreateSnapshot", &subject, true, self.snapshot(r)).await
    }

    async fn delete_snapshot(
        &self,
        r: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let r = r.into_inner();
        let subject = r.snapshot_id.clone();
        observed("DeleteSnapshot", &subject, true, self.delete_snapshot(r)).await
    }

    async fn get_snapshot(&self, r: Request<GetSnapshotRequest>) -> Result<Response<GetSnapshotResponse>, Status> {
        let r = r.into_inner();
        let subject = r.snapshot_id.clone();
        observed("GetSnapshot", &subject, false, self.get_snapshot(r)).await
    }

    async fn list_snapshots(
        &self,
        r: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        observed("ListSnapshots", "", false, self.list_snapshots(r.into_inner())).await
    }

    async fn controller_expand_volume(
        &self,
        r: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let r = r.into_inner();
        let subject = r.volume_id.clone();
        observed("ControllerExpandVolume", &subject, true, self.expand(r)).await
    }

    async fn controller_get_volume(
        &self,
        r: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        let r = r.into_inner();
        let subject = r.volume_id.clone();
        observed("ControllerGetVolume", &subject, false, self.get(r)).await
    }

    async fn controller_modify_volume(
        &self,
        r: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        let r = r.into_inner();
        let subject = r.volume_id.clone();
        observed("ControllerModifyVolume", &subject, true, self.modify(r)).await
    }
}

#[cfg(test)]
mod tests;
