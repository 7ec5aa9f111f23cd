//! The GroupController service (CSI spec, "GroupController Service RPC"):
//! crash-consistent snapshots of a group of volumes.
//!
//! The volumes attached to one instance are snapshotted together by one
//! CreateSnapshots, which makes "point-in-time, crash-consistent" snapshots
//! of an instance's volumes (EC2 API Reference, CreateSnapshots), its boot
//! volume and its volumes outside the group left out; a detached volume has
//! no writer, so its CreateSnapshot is consistent with them whenever it is
//! taken. Volumes attached to several instances cannot be snapshotted at
//! one point in time by EC2: such a group is refused (FAILED_PRECONDITION).
//!
//! The group's id is its name: every member carries the tag
//! `CSIVolumeGroupSnapshotName=<name>`, which finds the group again after a
//! lost answer or a restart, and which ListSnapshots and GetSnapshot answer
//! as the member's `group_snapshot_id`.

use std::collections::BTreeSet;

use ebs_csi_proto::observed::observed;
use ebs_csi_proto::v1::group_controller_server::GroupController;
use ebs_csi_proto::v1::group_controller_service_capability::{self, rpc};
use ebs_csi_proto::v1::{
    CreateVolumeGroupSnapshotRequest, CreateVolumeGroupSnapshotResponse, DeleteVolumeGroupSnapshotRequest,
    DeleteVolumeGroupSnapshotResponse, GetVolumeGroupSnapshotRequest, GetVolumeGroupSnapshotResponse,
    GroupControllerGetCapabilitiesRequest, GroupControllerGetCapabilitiesResponse, GroupControllerServiceCapability,
    VolumeGroupSnapshot,
};
use tonic::{Request, Response, Status};

use super::snapshots::csi_snapshot;
use super::{ControllerService, required};
use crate::ec2::{AttachmentState, CreateSnapshotInput, Ec2, Ec2Error, Selector, Snapshot, SnapshotState, Volume};
use crate::error::ControllerError;
use crate::{parameters, tags};

/// How the volumes of a group are snapshotted.
struct Plan {
    /// The instance the attached volumes are attached to, and those volumes.
    attached: Option<(String, Vec<String>)>,
    /// The volumes attached nowhere.
    detached: Vec<String>,
}

impl Plan {
    /// The plan for `volumes`.
    ///
    /// # Errors
    /// FAILED_PRECONDITION when they are attached to more than one instance.
    fn of(volumes: &[Volume]) -> Result<Self, ControllerError> {
        let mut writers: BTreeSet<&str> = BTreeSet::new();
        let mut plan = Self {
            attached: None,
            detached: Vec::new(),
        };
        let mut attached = Vec::new();
        for volume in volumes {
            let instances: Vec<&str> = volume
                .attachments
                .iter()
                .filter(|a| a.state != AttachmentState::Detached)
                .map(|a| a.instance_id.as_str())
                .collect();
            if instances.is_empty() {
                plan.detached.push(volume.id.clone());
            } else {
                writers.extend(instances);
                attached.push(volume.id.clone());
            }
        }
        match writers.into_iter().collect::<Vec<_>>().as_slice() {
            [] => {}
            [instance] => plan.attached = Some(((*instance).to_owned(), attached)),
            several => {
                return Err(ControllerError::FailedPrecondition(format!(
                    "the volumes are attached to several instances ({}): EC2 snapshots volumes together at one \
                     point in time only on one instance (CreateSnapshots)",
                    several.join(", ")
                )));
            }
        }
        Ok(plan)
    }
}

/// The group `id` of `members`, one a volume. CreateSnapshots takes no
/// client token: a retry that came before EC2 listed the members of a lost
/// answer made a second set (EC2 API Reference, CreateSnapshots; Amazon
/// EC2 Developer Guide, "Eventual consistency in the Amazon EC2 API"). The
/// earliest of each volume's is its member — the first set, taken at one
/// moment — and DeleteVolumeGroupSnapshot deletes them all.
fn group(id: &str, mut members: Vec<Snapshot>) -> VolumeGroupSnapshot {
    members
        .sort_by(|a, b| (&a.volume_id, a.start_time_seconds, &a.id).cmp(&(&b.volume_id, b.start_time_seconds, &b.id)));
    members.dedup_by(|later, earlier| later.volume_id == earlier.volume_id);
    VolumeGroupSnapshot {
        group_snapshot_id: id.to_owned(),
        snapshots: members.iter().map(csi_snapshot).collect(),
        creation_time: members
            .iter()
            .map(|s| s.start_time_seconds)
            .min()
            .map(|seconds| prost_types::Timestamp { seconds, nanos: 0 }),
        ready_to_use: members.iter().all(|s| s.state == SnapshotState::Completed),
    }
}

impl<E: Ec2> ControllerService<E> {
    pub(super) async fn create_group_snapshot(
        &self,
        r: CreateVolumeGroupSnapshotRequest,
    ) -> Result<CreateVolumeGroupSnapshotResponse, ControllerError> {
        let name = required("name", &r.name)?;
        let wanted: BTreeSet<&str> = r.source_volume_ids.iter().map(String::as_str).collect();
        if wanted.is_empty() || wanted.contains("") || wanted.len() != r.source_volume_ids.len() {
            return Err(ControllerError::InvalidArgument(
                "source_volume_ids must name each volume once".into(),
            ));
        }
        let class_tags = parameters::group_snapshot(&r.parameters, self.settings.invalid_tags)?;
        let _guard = self.in_flight.acquire(name)?;
        let mut members = self.members(name).await?;
        if let Some(other) = members.iter().find(|s| !wanted.contains(s.volume_id.as_str())) {
            return Err(ControllerError::AlreadyExists(format!(
                "volume group snapshot {name} holds a snapshot of volume {}, which is not among the volumes asked for",
                other.volume_id
            )));
        }
        let volumes = self
            .ec2
            .describe_volumes(Selector::Ids(wanted.iter().map(|v| (*v).to_owned()).collect()))
            .await?;
        if let Some(missing) = wanted.iter().find(|v| !volumes.iter().any(|found| found.id == **v)) {
            return Err(ControllerError::NotFound(format!("volume {missing} not found")));
        }
        let plan = Plan::of(&volumes)?;
        let mut member_tags = tags::common(self.settings.cluster_id.as_deref(), name, &self.settings.extra_tags);
        member_tags.extend(class_tags);
        member_tags.insert(tags::GROUP_SNAPSHOT_NAME.to_owned(), name.to_owned());
        let mut made = Vec::new();
        let result = self.make_members(&plan, &mut members, &mut made, &member_tags).await;
        if let Err(e) = result {
            // Nothing half made stays: what this call made goes again.
            for snapshot in &made {
                if let Err(d) = self.ec2.delete_snapshot(&snapshot.id).await {
                    tracing::warn!(snapshot_id = %snapshot.id, error = %d, "deleting a member of a failed group");
                }
            }
            return Err(e);
        }
        for snapshot in &made {
            self.wait_visible(&snapshot.id).await?;
        }
        Ok(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(group(name, members)),
        })
    }

    /// Makes the members `members` lacks: the attached volumes' in one
    /// CreateSnapshots (again, all of them, should only some be there: a
    /// set of another moment is no point in time), then each detached
    /// volume's. What it makes goes into `made` as it is made.
    async fn make_members(
        &self,
        plan: &Plan,
        members: &mut Vec<Snapshot>,
        made: &mut Vec<Snapshot>,
        member_tags: &crate::ec2::Tags,
    ) -> Result<(), ControllerError> {
        let has = |members: &[Snapshot], volume: &str| members.iter().any(|s| s.volume_id == volume);
        if let Some((instance, attached)) = &plan.attached
            && !attached.iter().all(|v| has(members, v))
        {
            for stale in members.iter().filter(|s| attached.contains(&s.volume_id)) {
                tracing::info!(snapshot_id = %stale.id, "deleting a member of another moment");
                match self.ec2.delete_snapshot(&stale.id).await {
                    Ok(()) | Err(Ec2Error::NotFound(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            members.retain(|s| !attached.contains(&s.volume_id));
            let others: Vec<String> = self
                .ec2
                .describe_instances(vec![instance.clone()])
                .await?
                .into_iter()
                .flat_map(|i| i.data_volume_ids)
                .filter(|v| !attached.contains(v))
                .collect();
            let snapshots = self.ec2.create_snapshots(instance, others, member_tags.clone()).await?;
            tracing::info!(instance_id = %instance, count = snapshots.len(), "snapshots of the group's attached volumes");
            for snapshot in snapshots {
                // A volume attached after DescribeInstances was snapshotted too.
                if attached.contains(&snapshot.volume_id) {
                    members.push(snapshot.clone());
                    made.push(snapshot);
                } else if let Err(e) = self.ec2.delete_snapshot(&snapshot.id).await {
                    tracing::warn!(snapshot_id = %snapshot.id, error = %e, "deleting a snapshot outside the group");
                }
            }
            if let Some(lost) = attached.iter().find(|v| !has(members, v)) {
                return Err(ControllerError::Unavailable(format!(
                    "CreateSnapshots on {instance} made no snapshot of volume {lost}, detached meanwhile"
                )));
            }
        }
        let missing: Vec<&String> = plan.detached.iter().filter(|v| !has(members, v)).collect();
        for volume in missing {
            let input = CreateSnapshotInput {
                tags: member_tags.clone(),
                outpost_arn: None,
            };
            let snapshot = self.ec2.create_snapshot(volume, input).await?;
            members.push(snapshot.clone());
            made.push(snapshot);
        }
        Ok(())
    }

    /// The snapshots tagged as members of the group `id`.
    async fn members(&self, id: &str) -> Result<Vec<Snapshot>, ControllerError> {
        let tagged = self
            .ec2
            .describe_snapshots(Selector::Tag(tags::GROUP_SNAPSHOT_NAME.to_owned(), vec![id.to_owned()]))
            .await?;
        Ok(tagged.into_iter().filter(|s| s.state != SnapshotState::Error).collect())
    }

    /// Refuses `snapshot_ids` that name an existing snapshot outside the
    /// group `id`.
    async fn check_listed(&self, id: &str, snapshot_ids: &[String]) -> Result<(), ControllerError> {
        if snapshot_ids.is_empty() {
            return Ok(());
        }
        let listed = match self.ec2.describe_snapshots(Selector::Ids(snapshot_ids.to_vec())).await {
            Err(Ec2Error::NotFound(_)) => Vec::new(),
            other => other?,
        };
        match listed
            .iter()
            .find(|s| s.tags.get(tags::GROUP_SNAPSHOT_NAME).map(String::as_str) != Some(id))
        {
            Some(other) => Err(ControllerError::InvalidArgument(format!(
                "snapshot {} is not a member of volume group snapshot {id}",
                other.id
            ))),
            None => Ok(()),
        }
    }

    pub(super) async fn get_group_snapshot(
        &self,
        r: GetVolumeGroupSnapshotRequest,
    ) -> Result<GetVolumeGroupSnapshotResponse, ControllerError> {
        let id = required("group_snapshot_id", &r.group_snapshot_id)?;
        self.check_listed(id, &r.snapshot_ids).await?;
        let members = self.members(id).await?;
        if members.is_empty() {
            return Err(ControllerError::NotFound(format!(
                "volume group snapshot {id} not found"
            )));
        }
        Ok(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(group(id, members)),
        })
    }

    pub(super) async fn delete_group_snapshot(
        &self,
        r: DeleteVolumeGroupSnapshotRequest,
    ) -> Result<DeleteVolumeGroupSnapshotResponse, ControllerError> {
        let id = required("group_snapshot_id", &r.group_snapshot_id)?;
        let _guard = self.in_flight.acquire(id)?;
        self.check_listed(id, &r.snapshot_ids).await?;
        let members = self.members(id).await?;
        let ids: BTreeSet<&str> = members
            .iter()
            .map(|s| s.id.as_str())
            .chain(r.snapshot_ids.iter().map(String::as_str))
            .collect();
        for snapshot_id in ids {
            match self.ec2.delete_snapshot(snapshot_id).await {
                Ok(()) | Err(Ec2Error::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(DeleteVolumeGroupSnapshotResponse {})
    }
}

#[tonic::async_trait]
impl<E: Ec2> GroupController for ControllerService<E> {
    async fn group_controller_get_capabilities(
        &self,
        _: Request<GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<GroupControllerGetCapabilitiesResponse>, Status> {
        let capability = GroupControllerServiceCapability {
            r#type: Some(group_controller_service_capability::Type::Rpc(
                group_controller_service_capability::Rpc {
                    r#type: rpc::Type::CreateDeleteGetVolumeGroupSnapshot as i32,
                },
            )),
        };
        Ok(Response::new(GroupControllerGetCapabilitiesResponse {
            capabilities: vec![capability],
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        r: Request<CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<CreateVolumeGroupSnapshotResponse>, Status> {
        let r = r.into_inner();
        let subject = r.name.clone();
        observed(
            "CreateVolumeGroupSnapshot",
            &subject,
            true,
            self.create_group_snapshot(r),
        )
        .await
    }

    async fn delete_volume_group_snapshot(
        &self,
        r: Request<DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<DeleteVolumeGroupSnapshotResponse>, Status> {
        let r = r.into_inner();
        let subject = r.group_snapshot_id.clone();
        observed(
            "DeleteVolumeGroupSnapshot",
            &subject,
            true,
            self.delete_group_snapshot(r),
        )
        .await
    }

    async fn get_volume_group_snapshot(
        &self,
        r: Request<GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<GetVolumeGroupSnapshotResponse>, Status> {
        let r = r.into_inner();
        let subject = r.group_snapshot_id.clone();
        observed("GetVolumeGroupSnapshot", &subject, false, self.get_group_snapshot(r)).await
    }
}
