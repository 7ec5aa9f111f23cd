//! CreateSnapshot, DeleteSnapshot and ListSnapshots.

use ebs_csi_proto::v1::list_snapshots_response;
use ebs_csi_proto::v1::{
    CreateSnapshotRequest, CreateSnapshotResponse, DeleteSnapshotRequest, DeleteSnapshotResponse, GetSnapshotRequest,
    GetSnapshotResponse, ListSnapshotsRequest, ListSnapshotsResponse,
};

use super::volumes::page;
use super::wait::{self, Cadence, Look};
use super::{ControllerService, GIB, required};
use crate::ec2::{CreateSnapshotInput, Ec2, Ec2Error, Selector, Snapshot, SnapshotLock, SnapshotState};
use crate::error::ControllerError;
use crate::{parameters, tags};

/// The CSI form of `s`; a member of a volume group snapshot names its
/// group (the tag [`tags::GROUP_SNAPSHOT_NAME`]).
pub(super) fn csi_snapshot(s: &Snapshot) -> ebs_csi_proto::v1::Snapshot {
    ebs_csi_proto::v1::Snapshot {
        size_bytes: i64::from(s.size_gib) * GIB,
        snapshot_id: s.id.clone(),
        source_volume_id: s.volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: s.start_time_seconds,
            nanos: 0,
        }),
        ready_to_use: s.state == SnapshotState::Completed,
        group_snapshot_id: s.tags.get(tags::GROUP_SNAPSHOT_NAME).cloned().unwrap_or_default(),
    }
}

impl<E: Ec2> ControllerService<E> {
    pub(super) async fn snapshot(&self, r: CreateSnapshotRequest) -> Result<CreateSnapshotResponse, ControllerError> {
        let volume_id = required("source_volume_id", &r.source_volume_id)?;
        let name = required("name", &r.name)?;
        let p = parameters::snapshot(&r.parameters, self.settings.invalid_tags)?;
        if !p.fast_restore_zones.is_empty() {
            let region: Vec<&str> = self
                .zones
                .region_zones(self.ec2.as_ref())
                .await?
                .iter()
                .map(|z| z.name.as_str())
                .collect();
            if let Some(zone) = p.fast_restore_zones.iter().find(|z| !region.contains(&z.as_str())) {
                return Err(ControllerError::InvalidArgument(format!(
                    "fastSnapshotRestoreAvailabilityZones: {zone} is not a zone of this region ({})",
                    region.join(", ")
                )));
            }
        }
        let _guard = self.in_flight.acquire(name)?;
        let existing = self
            .ec2
            .describe_snapshots(Selector::Tag(tags::SNAPSHOT_NAME.to_owned(), vec![name.to_owned()]))
            .await?;
        // The earliest, should a lost answer have left twins (see `twins`).
        let earliest = existing
            .into_iter()
            .filter(|s| s.state != SnapshotState::Error)
            .min_by(|a, b| (a.start_time_seconds, &a.id).cmp(&(b.start_time_seconds, &b.id)));
        let snapshot = match earliest {
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
                snapshot_tags.extend(p.tags);
                snapshot_tags.insert(tags::SNAPSHOT_NAME.to_owned(), name.to_owned());
                let input = CreateSnapshotInput {
                    tags: snapshot_tags,
                    outpost_arn: p.outpost_arn,
                };
                let snapshot = self.ec2.create_snapshot(volume_id, input).await?;
                tracing::info!(snapshot_id = %snapshot.id, volume_id, name, "snapshot created");
                if let Some(lock) = &p.lock {
                    self.lock(&snapshot.id, lock).await?;
                }
                self.wait_visible(&snapshot.id).await?;
                snapshot
            }
        };
        // On every call, so that a retry finishes what a failure left.
        if !p.fast_restore_zones.is_empty() {
            let unsuccessful = self
                .ec2
                .enable_fast_snapshot_restores(&snapshot.id, &p.fast_restore_zones)
                .await?;
            if !unsuccessful.is_empty() {
                return Err(ControllerError::Internal(format!(
                    "fast snapshot restore of {} not enabled in {}",
                    snapshot.id,
                    unsuccessful.join("; ")
                )));
            }
        }
        Ok(CreateSnapshotResponse {
            snapshot: Some(csi_snapshot(&snapshot)),
        })
    }

    /// Waits until DescribeSnapshots lists a snapshot just made (EC2's
    /// API is eventually consistent: Amazon EC2 Developer Guide,
    /// "Eventual consistency in the Amazon EC2 API"). CreateSnapshot takes
    /// no client token, so a retry knows the snapshot only by finding it
    /// by name; answering once it can be found keeps a retry after this
    /// answer from making a second one.
    ///
    /// # Errors
    /// UNAVAILABLE at the state timeout; the DescribeSnapshots error.
    pub(super) async fn wait_visible(&self, snapshot_id: &str) -> Result<(), ControllerError> {
        wait::until(
            &format!("snapshot {snapshot_id} to be listed by DescribeSnapshots"),
            self.settings.state_timeout,
            self.cadence(),
            || async {
                Ok(match self.describe.snapshots.get(snapshot_id).await? {
                    Some(_) => Look::Done(()),
                    None => Look::Again,
                })
            },
        )
        .await
    }

    /// Locks a snapshot just created; if EC2 refuses, deletes it again, so
    /// that the retry makes one it can lock rather than finding one
    /// without the lock the class asks for. `InvalidSnapshot.NotFound` is
    /// no refusal: EC2 may not know a snapshot it has just made (Amazon
    /// EC2 Developer Guide, "Eventual consistency in the Amazon EC2
    /// API"), so the lock is asked again, backing off, until the state
    /// timeout.
    async fn lock(&self, snapshot_id: &str, lock: &SnapshotLock) -> Result<(), ControllerError> {
        let locked = wait::until(
            &format!("snapshot {snapshot_id} to be known to LockSnapshot"),
            self.settings.state_timeout,
            Cadence::Backoff,
            || async {
                match self.ec2.lock_snapshot(snapshot_id, lock).await {
                    Ok(()) => Ok(Look::Done(Ok(()))),
                    Err(Ec2Error::NotFound(_)) => Ok(Look::Again),
                    Err(refused) => Ok(Look::Done(Err(refused))),
                }
            },
        )
        .await?;
        let Err(refused) = locked else {
            return Ok(());
        };
        tracing::warn!(snapshot_id, error = %refused, "lock refused; deleting the snapshot");
        if let Err(e) = self.ec2.delete_snapshot(snapshot_id).await {
            tracing::warn!(snapshot_id, error = %e, "deleting the snapshot that could not be locked");
        }
        Err(refused.into())
    }

    pub(super) async fn delete_snapshot(
        &self,
        r: DeleteSnapshotRequest,
    ) -> Result<DeleteSnapshotResponse, ControllerError> {
        let snapshot_id = required("snapshot_id", &r.snapshot_id)?;
        let _guard = self.in_flight.acquire(snapshot_id)?;
        for id in self
            .twins(snapshot_id)
            .await?
            .iter()
            .map(String::as_str)
            .chain([snapshot_id])
        {
            match self.ec2.delete_snapshot(id).await {
                Ok(()) | Err(Ec2Error::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            if id != snapshot_id {
                tracing::info!(snapshot_id, twin = id, "deleted a twin of the snapshot");
            }
        }
        Ok(DeleteSnapshotResponse {})
    }

    /// The other snapshots of `snapshot_id`'s source volume with its
    /// `CSIVolumeSnapshotName`: CreateSnapshot takes no client token, so
    /// when its answer is lost (the connection dropped after EC2 made the
    /// snapshot) the retry makes a second one that no CO knows of. It goes
    /// with the one the CO deletes.
    ///
    /// # Errors
    /// The DescribeSnapshots error.
    async fn twins(&self, snapshot_id: &str) -> Result<Vec<String>, ControllerError> {
        let Some(snapshot) = self.describe.snapshots.get(snapshot_id).await? else {
            return Ok(Vec::new());
        };
        let Some(name) = snapshot.tags.get(tags::SNAPSHOT_NAME) else {
            return Ok(Vec::new());
        };
        let named = self
            .ec2
            .describe_snapshots(Selector::Tag(tags::SNAPSHOT_NAME.to_owned(), vec![name.clone()]))
            .await?;
        Ok(named
            .into_iter()
            .filter(|s| s.id != snapshot.id && s.volume_id == snapshot.volume_id)
            .map(|s| s.id)
            .collect())
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
