//! The CSI SnapshotMetadata service (CSI spec v1.12, "Snapshot Metadata
//! Service RPCs"): the allocated blocks of a snapshot and the blocks
//! changed between two, from the EBS direct APIs ([`blocks`]), streamed.
//!
//! It is served on an endpoint of its own (`--snapshot-metadata-endpoint`)
//! beside an Identity service that advertises it, so the
//! external-snapshot-metadata sidecar, which faces backup clients over the
//! network, reaches these two read-only RPCs and nothing of the
//! Controller service.

pub mod blocks;
mod stream;

use std::pin::Pin;
use std::sync::Arc;

use ebs_csi_proto::v1::snapshot_metadata_server::SnapshotMetadata;
use ebs_csi_proto::v1::{
    GetMetadataAllocatedRequest, GetMetadataAllocatedResponse, GetMetadataDeltaRequest, GetMetadataDeltaResponse,
};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use self::blocks::{Blocks, Listing};
use self::stream::{Chunk, Query};
use crate::ec2::{Ec2, Selector, Snapshot, SnapshotState};
use crate::error::ControllerError;
use crate::service::{GIB, required};

/// How many messages wait in a stream for a slow reader before the next
/// EBS page is fetched.
const BUFFERED_MESSAGES: usize = 4;

/// A stream of one RPC's messages.
type Messages<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// SnapshotMetadata over EC2 (DescribeSnapshots, to know the snapshots)
/// and the EBS direct APIs.
pub struct SnapshotMetadataService<E: Ec2, B: Blocks> {
    ec2: Arc<E>,
    blocks: Arc<B>,
}

impl<E: Ec2, B: Blocks> SnapshotMetadataService<E, B> {
    /// Describes snapshots through `ec2` and lists their blocks through
    /// `blocks`.
    pub fn new(ec2: Arc<E>, blocks: Arc<B>) -> Self {
        Self { ec2, blocks }
    }

    /// The snapshots `ids`, each completed, in the order asked.
    ///
    /// # Errors
    /// NOT_FOUND for one EC2 does not list (InvalidSnapshot.NotFound, or a
    /// malformed id); FAILED_PRECONDITION for one still `pending` or in
    /// `error` (its blocks are fixed only once it is `completed`).
    async fn completed(&self, ids: &[&str]) -> Result<Vec<Snapshot>, ControllerError> {
        let ids: Vec<String> = ids.iter().map(|id| (*id).to_owned()).collect();
        let found = self.ec2.describe_snapshots(Selector::Ids(ids.clone())).await?;
        let snapshots = ids
            .iter()
            .map(|id| {
                found
                    .iter()
                    .find(|s| &s.id == id)
                    .cloned()
                    .ok_or_else(|| ControllerError::NotFound(format!("snapshot {id} does not exist")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(s) = snapshots.iter().find(|s| s.state != SnapshotState::Completed) {
            return Err(ControllerError::FailedPrecondition(format!(
                "snapshot {} is {:?}: its blocks can be listed once it is completed",
                s.id, s.state
            )));
        }
        Ok(snapshots)
    }

    /// Streams `listing` from `query`'s offset, after checking the offset
    /// against the size of `volume` (bytes).
    fn stream<T: Send + 'static>(
        &self,
        listing: Listing,
        query: &Query,
        volume: &Snapshot,
        message: fn(Chunk) -> T,
    ) -> Result<Messages<T>, ControllerError> {
        let capacity = i64::from(volume.size_gib) * GIB;
        if query.starting_offset > capacity {
            return Err(ControllerError::OutOfRange(format!(
                "starting_offset {} is beyond the end of the {capacity}-byte volume",
                query.starting_offset
            )));
        }
        let (sender, receiver) = tokio::sync::mpsc::channel(BUFFERED_MESSAGES);
        tokio::spawn(stream::send(
            Arc::clone(&self.blocks),
            listing,
            query.clone(),
            sender,
            message,
        ));
        Ok(Box::pin(ReceiverStream::new(receiver)))
    }
}

#[tonic::async_trait]
impl<E: Ec2, B: Blocks> SnapshotMetadata for SnapshotMetadataService<E, B> {
    type GetMetadataAllocatedStream = Messages<GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Messages<GetMetadataDeltaResponse>;

    /// ListSnapshotBlocks of the snapshot from the block holding
    /// `starting_offset`: FIXED_LENGTH blocks of 512 KiB, at most
    /// `max_results` a message.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for an empty `snapshot_id` or a negative
    /// `max_results`; OUT_OF_RANGE for a negative `starting_offset` or one
    /// beyond the volume's size; NOT_FOUND for an unknown snapshot;
    /// FAILED_PRECONDITION for one not yet completed. An EBS error after the
    /// stream began ends it with that error's code.
    async fn get_metadata_allocated(
        &self,
        request: Request<GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let r = request.into_inner();
        let query = Query::new(r.starting_offset, r.max_results)?;
        let snapshot_id = required("snapshot_id", &r.snapshot_id)?;
        let snapshot = self.completed(&[snapshot_id]).await?;
        let listing = Listing::Allocated {
            snapshot_id: snapshot_id.to_owned(),
        };
        let stream = self.stream(listing, &query, &snapshot[0], |c| GetMetadataAllocatedResponse {
            block_metadata_type: c.block_metadata_type,
            volume_capacity_bytes: c.volume_capacity_bytes,
            block_metadata: c.block_metadata,
        })?;
        Ok(Response::new(stream))
    }

    /// ListChangedBlocks between the base and target snapshots from the
    /// block holding `starting_offset`, as for GetMetadataAllocated.
    ///
    /// # Errors
    /// As GetMetadataAllocated, for both ids; INVALID_ARGUMENT when EBS
    /// refuses the pair (`ValidationException` `UNRELATED_SNAPSHOTS`:
    /// snapshots of different volumes or lineages).
    async fn get_metadata_delta(
        &self,
        request: Request<GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let r = request.into_inner();
        let query = Query::new(r.starting_offset, r.max_results)?;
        let base = required("base_snapshot_id", &r.base_snapshot_id)?;
        let target = required("target_snapshot_id", &r.target_snapshot_id)?;
        let snapshots = self.completed(&[base, target]).await?;
        let listing = Listing::Changed {
            base_snapshot_id: base.to_owned(),
            target_snapshot_id: target.to_owned(),
        };
        let stream = self.stream(listing, &query, &snapshots[1], |c| GetMetadataDeltaResponse {
            block_metadata_type: c.block_metadata_type,
            volume_capacity_bytes: c.volume_capacity_bytes,
            block_metadata: c.block_metadata,
        })?;
        Ok(Response::new(stream))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tonic::Code;

    use super::blocks::{Page, Start};
    use super::*;
    use crate::ec2::model::{Behaviour, Model};
    use crate::ec2::{CreateSnapshotInput, CreateVolumeInput, Ec2Error};

    /// EBS, for requests that must be refused before it is asked.
    struct NotAsked;

    impl Blocks for NotAsked {
        async fn list(&self, listing: &Listing, _: Start, _: i32) -> Result<Page, Ec2Error> {
            panic!("EBS asked for {listing:?}")
        }
    }

    fn service() -> (Arc<Model>, SnapshotMetadataService<Model, NotAsked>) {
        let behaviour = Behaviour {
            create_delay: Duration::ZERO,
            visibility_lag: Duration::ZERO,
            ..Behaviour::default()
        };
        let model = Arc::new(Model::new(behaviour));
        (
            Arc::clone(&model),
            SnapshotMetadataService::new(model, Arc::new(NotAsked)),
        )
    }

    fn allocated(snapshot_id: &str) -> Request<GetMetadataAllocatedRequest> {
        Request::new(GetMetadataAllocatedRequest {
            snapshot_id: snapshot_id.into(),
            ..Default::default()
        })
    }

    fn refusal<T>(result: Result<T, Status>) -> (Code, String) {
        let status = result.err().expect("a refusal");
        (status.code(), status.message().to_owned())
    }

    #[tokio::test]
    async fn a_pending_snapshot_has_no_blocks_to_list_yet() {
        let (model, service) = service();
        let input = CreateVolumeInput {
            zone: "us-east-1a".into(),
            size_gib: 1,
            volume_type: "gp3".into(),
            ..Default::default()
        };
        let volume = model.create_volume(input).await.unwrap();
        // EC2 answers CreateSnapshot `pending` (EC2 API Reference,
        // CreateSnapshot); the model's snapshots stay so.
        let snapshot = model
            .create_snapshot(&volume.id, CreateSnapshotInput::default())
            .await
            .unwrap();
        let (code, message) = refusal(service.get_metadata_allocated(allocated(&snapshot.id)).await);
        assert_eq!(code, Code::FailedPrecondition);
        assert_eq!(
            message,
            format!(
                "snapshot {} is Pending: its blocks can be listed once it is completed",
                snapshot.id
            )
        );
        let delta = GetMetadataDeltaRequest {
            base_snapshot_id: snapshot.id.clone(),
            target_snapshot_id: "snap-0000000000000ffff".into(),
            ..Default::default()
        };
        let (code, message) = refusal(service.get_metadata_delta(Request::new(delta)).await);
        assert_eq!(code, Code::NotFound);
        assert_eq!(message, "snapshot snap-0000000000000ffff does not exist");
    }

    #[tokio::test]
    async fn requests_without_their_ids_are_refused_before_ec2_is_asked() {
        let (_, service) = service();
        let (code, message) = refusal(service.get_metadata_allocated(allocated("")).await);
        assert_eq!(
            (code, message.as_str()),
            (Code::InvalidArgument, "snapshot_id is required")
        );
        let delta = GetMetadataDeltaRequest {
            base_snapshot_id: "snap-1".into(),
            ..Default::default()
        };
        let (code, message) = refusal(service.get_metadata_delta(Request::new(delta)).await);
        assert_eq!(
            (code, message.as_str()),
            (Code::InvalidArgument, "target_snapshot_id is required")
        );
    }
}
