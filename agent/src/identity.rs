//! The CSI Identity service of the node agent.

use ebs_csi_proto::endpoint;
use ebs_csi_proto::v1::identity_server::Identity;
use ebs_csi_proto::v1::plugin_capability::service;
use ebs_csi_proto::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse,
    ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

use crate::helper::Helper;

/// Identity: name, capabilities, readiness.
#[derive(Debug)]
pub struct IdentityService {
    helper: Helper,
}

impl IdentityService {
    /// Reports readiness from `helper`.
    pub fn new(helper: Helper) -> Self {
        Self { helper }
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
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
        // The plugin's, as the Go driver's node reports them: conformance
        // tools and orchestrators read them from the node socket too.
        Ok(Response::new(endpoint::plugin_capabilities(&[
            service::Type::ControllerService,
            service::Type::VolumeAccessibilityConstraints,
        ])))
    }

    /// Ready when the helper answers a ping: one local round trip, no EC2.
    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {
            ready: Some(self.helper.is_ready().await),
        }))
    }
}
