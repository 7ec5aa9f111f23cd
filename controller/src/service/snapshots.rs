//! CreateSnapshot, DeleteSnapshot and ListSnapshots.

use ebs_csi_proto::v1::list_snapshots_response;
use ebs_csi_proto::v1::{
    CreateSnapshotRequest, CreateSnapshotResponse, DeleteSnapshotRequest, DeleteSnapshotResponse, GetSnapshotRequest,
    GetSnapshotResponse, ListSnapshotsRequest, ListSnapshotsResponse,
};

use super::volumes::page;
use super::{ControllerService, GIB, required};
use crate::ec2::{Ec2, Ec2Error, Selector, Snapshot, SnapshotState};
use crate::error::ControllerError;
use crate::{parameters, tags};

fn csi_snapshot(s: &Snapshot) -> ebs_csi_proto::v1::Snapshot {
    ebs_csi_proto::v1::Snapshot {
        size_bytes: i64::from(s.size_gib) * GIB,
        snapshot_id: s.id.clone(),
        source_volume_id: s.volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: s.start_time_seconds,
            nanos: 0,
        }),
        ready_to_use: s.state == SnapshotState::Completed,
        group_snapshot_id: String::new(),
    }
}

impl<E: Ec2> ControllerService<E> {
    pub(super) async fn snapshot(&self, r: CreateSnapshotRequest) -> Result<CreateSnapshotResponse, ControllerError> {
        let volume_id = required("source_volume_id", &r.source_volume_id)?;
        let name = required("name", &r.name)?;
        let extra = parameters::snapshot(&r.parameters)?;
        let _guard = self.in_flight.acquire(name)?;
        let existing = self
            .ec2
            .describe_snapshots(Selector::Tag(tags::SNAPSHOT_NAME.to_owned(), vec![name.to_owned()]))
            .await?;
        let snapshot = match existing.into_iter().find(|s| s.state != SnapshotState::Error) {
            Some(s) if s.volume_id == volume_id => s,
            Some(s) => {
                return Err(ControllerError::AlreadyExists(format!(
                    "snapshot {} named {name} is of volume {}",
                    s.id, s.volume_id
                )));
            }
            None => {
                self.existing(volume_id).await?;
                let mut snapshot_tags =
                    tags::common(self.settings.cluster_id.as_deref(), name, &self.settings.extra_tags);
                snapshot_tags.extend(extra);
                snapshot_tags.insert(tags::SNAPSHOT_NAME.to_owned(), name.to_owned());
                let snapshot = self.ec2.create_snapshot(volume_id, snapshot_tags).await?;
                tracing::info!(snapshot_id = %snapshot.id, volume_id, name, "snapshot created");
                snapshot
            }
        };
        Ok(CreateSnapshotResponse {
            snapshot: Some(csi_snapshot(&snapshot)),
        })
    }

    pub(super) async fn delete_snapshot(
        &self,
        r: DeleteSnapshotRequest,
    ) -> Result<DeleteSnapshotResponse, ControllerError> {
        let snapshot_id = required("snapshot_id", &r.snapshot_id)?;
        let _guard = self.in_flight.acquire(snapshot_id)?;
        match self.ec2.delete_snapshot(snapshot_id).await {
            Ok(()) | Err(Ec2Error::NotFound(_)) => Ok(DeleteSnapshotResponse {}),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) async fn get_snapshot(&self, r: GetSnapshotRequest) -> Result<GetSnapshotResponse, ControllerError> {
        let snapshot_id = required("snapshot_id", &r.snapshot_id)?;
        let snapshot = self
            .describe
            .snapshots
            .get(snapshot_id)
            .await?
            .ok_or_else(|| ControllerError::NotFound(format!("snapshot {snapshot_id} not found")))?;
        Ok(GetSnapshotResponse {
            snapshot: Some(csi_snapshot(&snapshot)),
        })
    }

    pub(super) async fn list_snapshots(
        &self,
        r: ListSnapshotsRequest,
    ) -> Result<ListSnapshotsResponse, ControllerError> {
        let selector = if !r.snapshot_id.is_empty() {
            Selector::Ids(vec![r.snapshot_id.clone()])
        } else if !r.source_volume_id.is_empty() {
            Selector::SourceVolume(r.source_volume_id.clone())
        } else {
            Selector::TagKey(tags::CLUSTER.to_owned())
        };
        let mut snapshots = match self.ec2.describe_snapshots(selector).await {
            Err(Ec2Error::NotFound(_)) => Vec::new(),
            other => other?,
        };
        snapshots.sort_by(|a, b| a.id.cmp(&b.id));
        let (snapshots, next_token) = page(snapshots, |s| &s.id, &r.starting_token, r.max_entries)?;
        Ok(ListSnapshotsResponse {
            entries: snapshots
                .iter()
                .map(|s| list_snapshots_response::Entry {
                    snapshot: Some(csi_snapshot(s)),
                })
                .collect(),
            next_token,
        })
    }
}
