//! The CSI Identity service of the controller.

use std::sync::Arc;
use std::time::Duration;

use ebs_csi_proto::endpoint;
use ebs_csi_proto::v1::identity_server::Identity;
use ebs_csi_proto::v1::plugin_capability::service;
use ebs_csi_proto::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse,
    ProbeRequest, ProbeResponse,
};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::ec2::Ec2;

/// How long a successful dry run keeps Probe answering ready without
/// calling EC2 again.
const PROBE_CACHE: Duration = Duration::from_secs(60);

/// The services the controller's endpoint serves (GetPluginCapabilities).
pub const CONTROLLER_SERVICES: &[service::Type] = &[
    service::Type::ControllerService,
    service::Type::VolumeAccessibilityConstraints,
    service::Type::GroupControllerService,
];

/// The services the snapshot metadata endpoint serves.
pub const SNAPSHOT_METADATA_SERVICES: &[service::Type] = &[service::Type::SnapshotMetadataService];

/// Identity: name, the services of its endpoint, and a cheap Probe.
pub struct IdentityService<E: Ec2> {
    ec2: Arc<E>,
    services: &'static [service::Type],
    last_ready: Mutex<Option<Instant>>,
}

impl<E: Ec2> IdentityService<E> {
    /// Advertises `services` ([`CONTROLLER_SERVICES`] or
    /// [`SNAPSHOT_METADATA_SERVICES`]: each endpoint only what it serves);
    /// probes through `ec2`.
    pub fn new(ec2: Arc<E>, services: &'static [service::Type]) -> Self {
        Self {
            ec2,
            services,
            last_ready: Mutex::new(None),
        }
    }
}

#[tonic::async_trait]
impl<E: Ec2> Identity for IdentityService<E> {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(endpoint::plugin_info(env!("CARGO_PKG_VERSION"))))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(endpoint::plugin_capabilities(self.services)))
    }

    /// Ready when a dry-run EC2 call succeeded within the last minute;
    /// otherwise one dry run (DescribeAvailabilityZones, `DryRun=true`).
    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        let mut last_ready = self.last_ready.lock().await;
        if last_ready.is_some_and(|at| at.elapsed() < PROBE_CACHE) {
            return Ok(Response::new(ProbeResponse { ready: Some(true) }));
        }
        let ready = match self.ec2.dry_run().await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "probe: EC2 dry run failed");
                false
            }
        };
        *last_ready = ready.then(Instant::now);
        Ok(Response::new(ProbeResponse { ready: Some(ready) }))
    }
}
