//! The volume-modifier-for-k8s sidecar's service, `modify.v1.Modify`, which
//! the Go driver serves on its controller socket
//! (`pkg/driver/controller_modify_volume.go`): the sidecar turns a PVC's
//! `ebs.csi.aws.com/<key>` annotations into ModifyVolumeProperties, here
//! the ControllerModifyVolume of the same keys.

use ebs_csi_proto::modify::modify_server::Modify;
use ebs_csi_proto::modify::{
    GetCsiDriverModificationCapabilityRequest, GetCsiDriverModificationCapabilityResponse,
    ModifyVolumePropertiesRequest, ModifyVolumePropertiesResponse,
};
use ebs_csi_proto::v1::ControllerModifyVolumeRequest;
use ebs_csi_proto::v1::controller_server::Controller;
use tonic::{Request, Response, Status};

use super::ControllerService;
use crate::ec2::Ec2;

#[tonic::async_trait]
impl<E: Ec2> Modify for ControllerService<E> {
    /// An empty answer, as the Go driver's.
    async fn get_csi_driver_modification_capability(
        &self,
        _: Request<GetCsiDriverModificationCapabilityRequest>,
    ) -> Result<Response<GetCsiDriverModificationCapabilityResponse>, Status> {
        Ok(Response::new(GetCsiDriverModificationCapabilityResponse {}))
    }

    /// ControllerModifyVolume of the volume `name` with `parameters` as its
    /// mutable parameters: the same keys (`type`, `iops`, `throughput`,
    /// `tagSpecification_N`, …), checks, errors and coalescing with other
    /// requests for the volume. `context` is not read, as the Go driver
    /// reads none of it.
    ///
    /// # Errors
    /// ControllerModifyVolume's: INVALID_ARGUMENT for no name or a
    /// parameter refused, NOT_FOUND for a volume EC2 does not have, ….
    async fn modify_volume_properties(
        &self,
        r: Request<ModifyVolumePropertiesRequest>,
    ) -> Result<Response<ModifyVolumePropertiesResponse>, Status> {
        let r = r.into_inner();
        let request = ControllerModifyVolumeRequest {
            volume_id: r.name,
            mutable_parameters: r.parameters,
            ..Default::default()
        };
        self.controller_modify_volume(Request::new(request)).await?;
        Ok(Response::new(ModifyVolumePropertiesResponse {}))
    }
}
