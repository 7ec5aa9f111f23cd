//! Changed-block tracking from the outside: known data written at known
//! EBS blocks, and the SnapshotMetadata streams read back and checked
//! against every rule the CSI spec sets for them.

use std::os::unix::fs::FileExt;
use std::path::Path;

use ebs_csi_proto::v1::snapshot_metadata_client::SnapshotMetadataClient;
use ebs_csi_proto::v1::{
    BlockMetadata, BlockMetadataType, GetMetadataAllocatedRequest, GetMetadataAllocatedResponse,
    GetMetadataDeltaRequest, GetMetadataDeltaResponse,
};
use tonic::transport::Channel;

/// The size of an EBS snapshot block, bytes (EBS direct APIs: 512 KiB).
pub const BLOCK: u64 = 512 * 1024;

/// The contents written at block `index` in round `round`: non-zero, and
/// different for every block and round.
pub fn pattern(round: u8, index: u64) -> Vec<u8> {
    let stamp = format!("round {round} block {index}\n");
    stamp
        .bytes()
        .cycle()
        .take(usize::try_from(BLOCK).unwrap_or_default())
        .collect()
}

/// Writes [`pattern`]`(round, i)` at each block `i` of `indexes` in the file
/// or block device at `path`, and flushes it to the device.
///
/// # Errors
/// The error opening, writing or syncing `path`.
pub fn write_blocks(path: &Path, round: u8, indexes: &[u64]) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    for index in indexes {
        file.write_all_at(&pattern(round, *index), index * BLOCK)?;
    }
    file.sync_all()
}

/// Which blocks `path` (a snapshot's copy) holds [`pattern`]`(round, i)` at,
/// of `indexes`: all of them when the copy is exact.
pub fn blocks_holding(path: &Path, round: u8, indexes: &[u64]) -> std::io::Result<Vec<u64>> {
    let file = std::fs::File::open(path)?;
    let mut buffer = vec![0; usize::try_from(BLOCK).unwrap_or_default()];
    let mut holding = Vec::new();
    for index in indexes {
        file.read_exact_at(&mut buffer, index * BLOCK)?;
        if buffer == pattern(round, *index) {
            holding.push(*index);
        }
    }
    Ok(holding)
}

/// What one SnapshotMetadata stream said.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// The volume's capacity every message gave, bytes.
    pub capacity_bytes: i64,
    /// How many messages came.
    pub messages: usize,
    /// The block indexes, in order.
    pub blocks: Vec<u64>,
}

/// Folds one message into `listing`, checking the spec's rules: one
/// metadata type (FIXED_LENGTH, blocks of [`BLOCK`]) and one capacity in
/// all messages, at most `max_results` ranges a message (when set), ranges
/// strictly increasing and not overlapping across messages, none ending at
/// or before `starting_offset`.
fn fold(
    listing: &mut Listing,
    (kind, capacity, ranges): (i32, i64, Vec<BlockMetadata>),
    starting_offset: i64,
    max_results: i32,
) -> Result<(), String> {
    if kind != i32::from(BlockMetadataType::FixedLength) {
        return Err(format!("block_metadata_type {kind}"));
    }
    if listing.messages > 0 && capacity != listing.capacity_bytes {
        return Err(format!("capacity {capacity} after {}", listing.capacity_bytes));
    }
    if max_results > 0 && ranges.len() > usize::try_from(max_results).unwrap_or_default() {
        return Err(format!(
            "{} ranges in a message, max_results {max_results}",
            ranges.len()
        ));
    }
    listing.capacity_bytes = capacity;
    listing.messages += 1;
    for range in ranges {
        let index = u64::try_from(range.byte_offset).unwrap_or_default() / BLOCK;
        let well_formed = u64::try_from(range.size_bytes) == Ok(BLOCK)
            && u64::try_from(range.byte_offset) == Ok(index * BLOCK)
            && range.byte_offset + range.size_bytes > starting_offset
            && listing.blocks.last().is_none_or(|last| *last < index);
        if !well_formed {
            return Err(format!("range {range:?} after blocks {:?}", listing.blocks));
        }
        listing.blocks.push(index);
    }
    Ok(())
}

fn status(e: &tonic::Status) -> String {
    format!("{:?}: {}", e.code(), e.message())
}

/// The messages of an RPC's stream, each taken apart by `parts`, read to
/// the end and folded into a [`Listing`].
async fn read<T>(
    answer: Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>,
    parts: fn(T) -> (i32, i64, Vec<BlockMetadata>),
    starting_offset: i64,
    max_results: i32,
) -> Result<Listing, String> {
    let mut stream = answer.map_err(|e| status(&e))?.into_inner();
    let mut listing = Listing::default();
    while let Some(message) = stream.message().await.map_err(|e| status(&e))? {
        fold(&mut listing, parts(message), starting_offset, max_results)?;
    }
    Ok(listing)
}

/// GetMetadataAllocated of `snapshot_id`, read to its end and checked.
///
/// # Errors
/// The RPC's status as `Code: message`, or the rule a message broke.
pub async fn allocated(
    client: &mut SnapshotMetadataClient<Channel>,
    snapshot_id: &str,
    starting_offset: i64,
    max_results: i32,
) -> Result<Listing, String> {
    let request = GetMetadataAllocatedRequest {
        snapshot_id: snapshot_id.into(),
        starting_offset,
        max_results,
        ..Default::default()
    };
    let answer = client.get_metadata_allocated(request).await;
    let parts = |m: GetMetadataAllocatedResponse| (m.block_metadata_type, m.volume_capacity_bytes, m.block_metadata);
    read(answer, parts, starting_offset, max_results).await
}

/// GetMetadataDelta from `base` to `target`, read to its end and checked.
///
/// # Errors
/// As [`allocated`].
pub async fn delta(
    client: &mut SnapshotMetadataClient<Channel>,
    base: &str,
    target: &str,
    starting_offset: i64,
    max_results: i32,
) -> Result<Listing, String> {
    let request = GetMetadataDeltaRequest {
        base_snapshot_id: base.into(),
        target_snapshot_id: target.into(),
        starting_offset,
        max_results,
        ..Default::default()
    };
    let answer = client.get_metadata_delta(request).await;
    let parts = |m: GetMetadataDeltaResponse| (m.block_metadata_type, m.volume_capacity_bytes, m.block_metadata);
    read(answer, parts, starting_offset, max_results).await
}
