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

/// Identity: name, capabilities, and a cheap Probe.
pub struct IdentityService<E: Ec2> {
    ec2: Arc<E>,
    last_ready: Mutex<Option<Instant>>,
}

impl<E: Ec2> IdentityService<E> {
    /// Probes through `ec2`.
    pub fn new(ec2: Arc<E>) -> Self {
        Self {
            ec2,
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
        Ok(Response::new(endpoint::plugin_capabilities(&[
            service::Type::ControllerService,
            service::Type::VolumeAccessibilityConstraints,
            service::Type::GroupControllerService,
        ])))
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
