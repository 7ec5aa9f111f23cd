//! The CSI Node service. Each handler validates, takes the volume's guard,
//! finds the device if it needs one, and asks the helper for the change.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ebs_csi_helper_proto::{
    ExpandRequest, FormatOptions, FsType, PublishRequest, PublishSource, Request as HelperRequest, StageRequest,
    UnpublishRequest, UnstageRequest, VolumeId,
};
use ebs_csi_proto::inflight::{InFlight, InFlightGuard};
use ebs_csi_proto::observed::observed;
use ebs_csi_proto::v1::node_server::Node;
use ebs_csi_proto::v1::node_service_capability::{self, rpc};
use ebs_csi_proto::v1::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse,
    NodeGetInfoRequest, NodeGetInfoResponse, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse, NodeUnstageVolumeRequest,
    NodeUnstageVolumeResponse, Topology,
};
use ebs_csi_proto::{
    TOPOLOGY_KEY_OS, TOPOLOGY_KEY_WELL_KNOWN_ZONE, TOPOLOGY_KEY_ZONE, TOPOLOGY_KEY_ZONE_ID, outpost_segments,
};
use tonic::{Request, Response, Status};

use crate::discovery::DeviceFinder;
use crate::error::NodeError;
use crate::helper::Helper;
use crate::limits::{self, LimitSettings};
use crate::metadata::{NodeMetadata, imds};
use crate::request::{self, Access};
use crate::stats;

/// The publish-context key ControllerPublishVolume sets to the device
/// name given to AttachVolume (the Go driver's name, which Nomad and
/// kubelet pass through).
const DEVICE_PATH_KEY: &str = "devicePath";

/// Node: stage, publish, expand, stats, info.
#[derive(Debug)]
pub struct NodeService {
    helper: Helper,
    finder: DeviceFinder,
    in_flight: InFlight,
    metadata: NodeMetadata,
    limit: LimitSettings,
    /// The network interfaces IMDS (or the metadata labeler's label) listed
    /// last (see [`NodeService::info`]).
    network_interfaces: AtomicU32,
    device_wait: Duration,
    /// `--legacy-xfs`: XFS is formatted for kernels 5.4 and older.
    legacy_xfs: bool,
    /// Becomes true once NodeGetInfo has been answered (kubelet registers
    /// a plugin with it).
    info_answered: tokio::sync::watch::Sender<bool>,
}

impl NodeService {
    /// A Node service for the node described by `metadata`, computing its
    /// attachment limit with `limit` on each NodeGetInfo, waiting up to
    /// `device_wait` for a volume's device to appear, and formatting XFS
    /// for old kernels with `legacy_xfs`.
    pub fn new(
        helper: Helper,
        finder: DeviceFinder,
        metadata: NodeMetadata,
        limit: LimitSettings,
        device_wait: Duration,
        legacy_xfs: bool,
    ) -> Self {
        Self {
            helper,
            finder,
            in_flight: InFlight::default(),
            network_interfaces: AtomicU32::new(metadata.network_interfaces.unwrap_or(1)),
            metadata,
            limit,
            device_wait,
            legacy_xfs,
            info_answered: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Completes once NodeGetInfo has been answered.
    pub fn info_answered(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut answered = self.info_answered.subscribe();
        async move {
            let _ = answered.wait_for(|answered| *answered).await;
        }
    }

    /// The volume's in-flight guard for a call that asks `request` (the
    /// RPC's name and its parsed fields, no secrets): ABORTED while a
    /// different call holds it; an identical call waits for the one
    /// running, then runs (and finds its work done).
    async fn guard(&self, volume_id: &VolumeId, request: impl std::fmt::Debug) -> Result<InFlightGuard, NodeError> {
        self.in_flight
            .acquire_or_wait(volume_id.as_str(), &format!("{request:?}"))
            .await
            .map_err(|e| NodeError::Aborted(e.0))
    }

    async fn stage(&self, r: NodeStageVolumeRequest) -> Result<NodeStageVolumeResponse, NodeError> {
        let volume_id = request::volume_id(&r.volume_id)?;
        let staging_path = request::required_path("staging_target_path", &r.staging_target_path)?;
        let partition = request::partition(&r.volume_context)?;
        let Access::Mount { fs_type, mount_flags } = request::capability(r.volume_capability.as_ref())? else {
            // Block volumes are published straight from the device.
            return Ok(NodeStageVolumeResponse {});
        };
        let format = FormatOptions {
            xfs_legacy: self.legacy_xfs && fs_type == FsType::Xfs,
            ..request::format_options(&r.volume_context)?
        };
        let device_path = device_path(&r.publish_context);
        let asked = (
            "NodeStageVolume",
            staging_path,
            fs_type,
            &mount_flags,
            &format,
            device_path,
            partition,
        );
        let _guard = self.guard(&volume_id, asked).await?;
        let disk = self.finder.wait(&volume_id, device_path, self.device_wait).await?;
        let device = request::on_partition(disk, partition);
        tracing::info!(%volume_id, device = %device.display(), staging_path, fs_type = fs_type.name(), "staging");
        self.helper
            .act(HelperRequest::Stage(StageRequest {
                volume_id,
                device: device.to_string_lossy().into_owned(),
                staging_path: staging_path.to_owned(),
                fs_type,
                mount_flags,
                format,
            }))
            .await?;
        Ok(NodeStageVolumeResponse {})
    }

    async fn unstage(&self, r: NodeUnstageVolumeRequest) -> Result<NodeUnstageVolumeResponse, NodeError> {
        let staging_path = request::required_path("staging_target_path", &r.staging_target_path)?;
        let volume_id = request::existing_volume_id(&r.volume_id)?;
        let _guard = self.guard(&volume_id, ("NodeUnstageVolume", staging_path)).await?;
        tracing::info!(%volume_id, staging_path, "unstaging");
        self.helper
            .act(HelperRequest::Unstage(UnstageRequest {
                staging_path: staging_path.to_owned(),
            }))
            .await?;
        Ok(NodeUnstageVolumeResponse {})
    }

    async fn publish(&self, r: NodePublishVolumeRequest) -> Result<NodePublishVolumeResponse, NodeError> {
        let volume_id = request::volume_id(&r.volume_id)?;
        let target_path = request::required_path("target_path", &r.target_path)?;
        let access = request::capability(r.volume_capability.as_ref())?;
        let staging_path = request::required_path("staging_target_path", &r.staging_target_path)?;
        let partition = request::partition(&r.volume_context)?;
        let device_path = device_path(&r.publish_context);
        let asked = (
            "NodePublishVolume",
            target_path,
            &access,
            staging_path,
            r.readonly,
            device_path,
            partition,
        );
        let _guard = self.guard(&volume_id, asked).await?;
        // The helper binds only what it proves to be this volume, so both
        // sources name the device.
        let disk = self.finder.wait(&volume_id, device_path, self.device_wait).await?;
        let device = request::on_partition(disk, partition).to_string_lossy().into_owned();
        let source = match access {
            Access::Mount { mount_flags, .. } => PublishSource::Staging {
                volume_id: volume_id.clone(),
                device,
                staging_path: staging_path.to_owned(),
                mount_flags,
            },
            Access::Block => PublishSource::Device {
                volume_id: volume_id.clone(),
                device,
            },
        };
        tracing::info!(%volume_id, target_path, readonly = r.readonly, "publishing");
        self.helper
            .act(HelperRequest::Publish(PublishRequest {
                target_path: target_path.to_owned(),
                readonly: r.readonly,
                source,
            }))
            .await?;
        Ok(NodePublishVolumeResponse {})
    }

    async fn unpublish(&self, r: NodeUnpublishVolumeRequest) -> Result<NodeUnpublishVolumeResponse, NodeError> {
        let target_path = request::required_path("target_path", &r.target_path)?;
        let volume_id = request::existing_volume_id(&r.volume_id)?;
        let _guard = self.guard(&volume_id, ("NodeUnpublishVolume", target_path)).await?;
        tracing::info!(%volume_id, target_path, "unpublishing");
        self.helper
            .act(HelperRequest::Unpublish(UnpublishRequest {
                target_path: target_path.to_owned(),
            }))
            .await?;
        Ok(NodeUnpublishVolumeResponse {})
    }

    async fn volume_stats(&self, r: NodeGetVolumeStatsRequest) -> Result<NodeGetVolumeStatsResponse, NodeError> {
        request::required_path("volume_path", &r.volume_path)?;
        let volume_id = request::existing_volume_id(&r.volume_id)?;
        let staging = Some(r.staging_target_path.as_str());
        stats::volume_stats(&self.helper, volume_id, &r.volume_path, staging, self.finder.sys_dir()).await
    }

    async fn expand(&self, r: NodeExpandVolumeRequest) -> Result<NodeExpandVolumeResponse, NodeError> {
        let volume_path = request::required_path("volume_path", &r.volume_path)?;
        let volume_id = request::existing_volume_id(&r.volume_id)?;
        let access = r
            .volume_capability
            .as_ref()
            .map(|c| request::capability(Some(c)))
            .transpose()?;
        let _guard = self
            .guard(&volume_id, ("NodeExpandVolume", volume_path, &access))
            .await?;
        let device = self
            .finder
            .find(&volume_id, None)
            .ok_or_else(|| NodeError::NotFound(format!("the device of volume {volume_id}")))?;
        if access == Some(Access::Block) {
            // A raw block volume has no filesystem to grow.
            let size = stats::block_device_size(&device, self.finder.sys_dir())
                .ok_or_else(|| NodeError::Internal(format!("cannot read the size of {}", device.display())))?;
            return Ok(NodeExpandVolumeResponse {
                capacity_bytes: stats::to_i64(size),
            });
        }
        // A volume staged from a partition grows (as far as the partition
        // does) on that partition.
        let device = stats::mounted_partition(&device, volume_path, self.finder.sys_dir()).unwrap_or(device);
        tracing::info!(%volume_id, volume_path, device = %device.display(), "expanding");
        let size_bytes = self
            .helper
            .expand(ExpandRequest {
                volume_id,
                device: device.to_string_lossy().into_owned(),
                volume_path: volume_path.to_owned(),
            })
            .await?;
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: stats::to_i64(size_bytes),
        })
    }
}

fn device_path(publish_context: &HashMap<String, String>) -> Option<&str> {
    publish_context.get(DEVICE_PATH_KEY).map(String::as_str)
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        r: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let r = r.into_inner();
        let volume_id = r.volume_id.clone();
        observed("NodeStageVolume", &volume_id, true, self.stage(r)).await
    }

    async fn node_unstage_volume(
        &self,
        r: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let r = r.into_inner();
        let volume_id = r.volume_id.clone();
        observed("NodeUnstageVolume", &volume_id, true, self.unstage(r)).await
    }

    async fn node_publish_volume(
        &self,
        r: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let volume_id = r.volume_id.clone();
        observed("NodePublishVolume", &volume_id, true, self.publish(r)).await
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let volume_id = r.volume_id.clone();
        observed("NodeUnpublishVolume", &volume_id, true, self.unpublish(r)).await
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let r = r.into_inner();
        let volume_id = r.volume_id.clone();
        observed("NodeGetVolumeStats", &volume_id, false, self.volume_stats(r)).await
    }

    async fn node_expand_volume(
        &self,
        r: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let r = r.into_inner();
        let volume_id = r.volume_id.clone();
        observed("NodeExpandVolume", &volume_id, true, self.expand(r)).await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        observed("NodeGetCapabilities", "", false, async {
            Ok::<_, Status>(capabilities())
        })
        .await
    }

    async fn node_get_info(&self, _: Request<NodeGetInfoRequest>) -> Result<Response<NodeGetInfoResponse>, Status> {
        let answer = observed("NodeGetInfo", "", false, self.info()).await;
        if answer.is_ok() {
            self.info_answered.send_replace(true);
        }
        answer
    }
}

/// NodeGetCapabilities' answer.
fn capabilities() -> NodeGetCapabilitiesResponse {
    let rpc = |kind: rpc::Type| NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(node_service_capability::Rpc {
            r#type: kind as i32,
        })),
    };
    NodeGetCapabilitiesResponse {
        capabilities: vec![
            rpc(rpc::Type::StageUnstageVolume),
            rpc(rpc::Type::ExpandVolume),
            rpc(rpc::Type::GetVolumeStats),
            rpc(rpc::Type::VolumeCondition),
        ],
    }
}

impl NodeService {
    /// NodeGetInfo's answer: this node's id, attachment limit and topology.
    ///
    /// # Errors
    /// [`NodeError::Xen`] (FAILED_PRECONDITION) on a Xen instance type.
    async fn info(&self) -> Result<NodeGetInfoResponse, NodeError> {
        let zone = &self.metadata.availability_zone;
        let interfaces = self.network_interfaces().await;
        let max_volumes = self.limit.max_volumes(&self.metadata.instance_type, interfaces)?;
        Ok(NodeGetInfoResponse {
            node_id: self.metadata.instance_id.clone(),
            max_volumes_per_node: i64::from(max_volumes),
            accessible_topology: Some(Topology {
                segments: [
                    (TOPOLOGY_KEY_ZONE.to_owned(), zone.clone()),
                    (TOPOLOGY_KEY_WELL_KNOWN_ZONE.to_owned(), zone.clone()),
                    (TOPOLOGY_KEY_OS.to_owned(), std::env::consts::OS.to_owned()),
                ]
                .into_iter()
                .chain(
                    self.metadata
                        .availability_zone_id
                        .clone()
                        .map(|id| (TOPOLOGY_KEY_ZONE_ID.to_owned(), id)),
                )
                .chain(
                    self.metadata
                        .outpost_arn
                        .as_deref()
                        .and_then(outpost_segments)
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k.to_owned(), v)),
                )
                .collect(),
            }),
        })
    }

    /// The network interfaces attached now, where they share attachment
    /// slots and the start read them from IMDS: read again, so an interface
    /// attached since (the VPC CNI adds them as pods come) takes its slot in
    /// the limit kubelet asks for every `nodeAllocatableUpdatePeriodSeconds`
    /// (KEP-4876); the last count when IMDS does not answer.
    async fn network_interfaces(&self) -> u32 {
        let last = self.network_interfaces.load(Ordering::Relaxed);
        let shared = limits::attachments(&self.metadata.instance_type).shared_with_interfaces;
        if !self.metadata.interfaces_from_imds || self.limit.fixed.is_some() || !shared {
            return last;
        }
        match imds::network_interfaces().await {
            Ok(now) => {
                if now != last {
                    tracing::info!(
                        network_interfaces = now,
                        before = last,
                        "the network interfaces changed"
                    );
                }
                self.network_interfaces.store(now, Ordering::Relaxed);
                now
            }
            Err(error) => {
                tracing::warn!(%error, network_interfaces = last, "network interfaces not read again; the last count stands");
                last
            }
        }
    }
}
