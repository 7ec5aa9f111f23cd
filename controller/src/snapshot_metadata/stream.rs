//! From pages of EBS block indexes to the messages of a SnapshotMetadata
//! stream (CSI spec v1.12, "Special considerations for processing a
//! snapshot metadata gRPC stream"): FIXED_LENGTH ranges, strictly
//! increasing, none ending at or before `starting_offset`, at most
//! `max_results` a message, the stream ended only once all are sent and
//! aborted with the error otherwise.

use std::sync::Arc;

use ebs_csi_proto::v1::{BlockMetadata, BlockMetadataType};
use tokio::sync::mpsc::Sender;
use tonic::Status;

use super::blocks::{BLOCK_SIZE_BYTES, Blocks, Listing, PAGE_SIZES, Page, Start};
use crate::error::ControllerError;
use crate::service::GIB;

/// What a request asks of its stream, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// Bytes from the start of the volume; no range sent ends at or before
    /// it.
    pub starting_offset: i64,
    /// Most ranges a message, 0 for no limit of the caller's.
    max_results: i32,
}

impl Query {
    /// # Errors
    /// OUT_OF_RANGE for a negative `starting_offset` (its check against the
    /// volume's size comes once the snapshot is known); INVALID_ARGUMENT for
    /// a negative `max_results`.
    pub fn new(starting_offset: i64, max_results: i32) -> Result<Self, ControllerError> {
        if starting_offset < 0 {
            return Err(ControllerError::OutOfRange(format!(
                "starting_offset {starting_offset} is negative"
            )));
        }
        if max_results < 0 {
            return Err(ControllerError::InvalidArgument(format!(
                "max_results {max_results} is negative"
            )));
        }
        Ok(Self {
            starting_offset,
            max_results,
        })
    }

    /// The block that holds `starting_offset`: where EBS is asked to start.
    fn first_block(&self) -> i32 {
        i32::try_from(self.starting_offset / BLOCK_SIZE_BYTES).unwrap_or(i32::MAX)
    }

    /// `MaxResults` of each EBS call: `max_results` within EBS's range, the
    /// most EBS allows when the caller set no limit.
    fn page_size(&self) -> i32 {
        match self.max_results {
            0 => *PAGE_SIZES.end(),
            n => n.clamp(*PAGE_SIZES.start(), *PAGE_SIZES.end()),
        }
    }

    /// Most ranges a message.
    fn per_message(&self) -> usize {
        match self.max_results {
            0 => usize::MAX,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        }
    }
}

/// The fields both RPCs' messages share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Always FIXED_LENGTH: EBS lists whole blocks.
    pub block_metadata_type: i32,
    /// The volume's size, bytes.
    pub volume_capacity_bytes: i64,
    /// The ranges, each one block.
    pub block_metadata: Vec<BlockMetadata>,
}

/// The messages of one EBS page: its blocks that start at or after
/// `next_offset` (bytes; advanced past each block taken), at most
/// [`Query::per_message`] a message.
fn messages(page: &Page, query: &Query, next_offset: &mut i64) -> Vec<Chunk> {
    let size = page.block_size_bytes;
    let mut ranges = Vec::new();
    for index in &page.block_indexes {
        let byte_offset = i64::from(*index) * size;
        if byte_offset >= *next_offset {
            ranges.push(BlockMetadata {
                byte_offset,
                size_bytes: size,
            });
            *next_offset = byte_offset + size;
        }
    }
    ranges
        .chunks(query.per_message())
        .map(|ranges| Chunk {
            block_metadata_type: BlockMetadataType::FixedLength.into(),
            volume_capacity_bytes: page.volume_size_gib * GIB,
            block_metadata: ranges.to_vec(),
        })
        .collect()
}

/// Lists `listing` page by page and sends each page's messages, made into
/// the RPC's type by `message`; a listing with no block still sends one
/// message, for the volume's capacity. Ends the stream with the error of
/// an EBS call that fails; stops when the caller has gone.
pub async fn send<B: Blocks, T>(
    blocks: Arc<B>,
    listing: Listing,
    query: Query,
    sender: Sender<Result<T, Status>>,
    message: fn(Chunk) -> T,
) {
    let mut start = Start::Block(query.first_block());
    let mut next_offset = i64::from(query.first_block()) * BLOCK_SIZE_BYTES;
    let mut sent = false;
    loop {
        let page = match blocks.list(&listing, start, query.page_size()).await {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(?listing, error = %e, "listing snapshot blocks failed");
                let _ = sender.send(Err(ControllerError::from(e).into())).await;
                return;
            }
        };
        let mut chunks = messages(&page, &query, &mut next_offset);
        if chunks.is_empty() && !sent && page.next_token.is_none() {
            chunks.push(Chunk {
                block_metadata_type: BlockMetadataType::FixedLength.into(),
                volume_capacity_bytes: page.volume_size_gib * GIB,
                block_metadata: Vec::new(),
            });
        }
        for chunk in chunks {
            if sender.send(Ok(message(chunk))).await.is_err() {
                return;
            }
            sent = true;
        }
        match page.next_token {
            Some(token) => start = Start::Token(token),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: i64 = BLOCK_SIZE_BYTES;

    fn page(indexes: &[i32]) -> Page {
        Page {
            block_indexes: indexes.to_vec(),
            block_size_bytes: BLOCK,
            volume_size_gib: 4,
            next_token: None,
        }
    }

    fn offsets(chunks: &[Chunk]) -> Vec<Vec<i64>> {
        chunks
            .iter()
            .map(|c| c.block_metadata.iter().map(|b| b.byte_offset / BLOCK).collect())
            .collect()
    }

    #[test]
    fn a_query_refuses_what_the_spec_refuses() {
        let offset = Query::new(-1, 0).unwrap_err();
        assert_eq!(offset.to_string(), "starting_offset -1 is negative");
        assert!(matches!(offset, ControllerError::OutOfRange(_)));
        let max = Query::new(0, -5).unwrap_err();
        assert_eq!(max.to_string(), "max_results -5 is negative");
        assert!(matches!(max, ControllerError::InvalidArgument(_)));
    }

    #[test]
    fn ebs_is_asked_from_the_block_holding_the_offset_within_its_page_sizes() {
        let q = |offset, max| Query::new(offset, max).unwrap();
        assert_eq!(q(0, 0).first_block(), 0);
        assert_eq!(q(BLOCK - 1, 0).first_block(), 0);
        assert_eq!(q(BLOCK, 0).first_block(), 1);
        assert_eq!(q(3 * BLOCK + 7, 0).first_block(), 3);
        assert_eq!(q(0, 0).page_size(), 10_000);
        assert_eq!(q(0, 3).page_size(), 100);
        assert_eq!(q(0, 250).page_size(), 250);
        assert_eq!(q(0, 50_000).page_size(), 10_000);
    }

    #[test]
    fn messages_hold_at_most_max_results_fixed_length_ranges() {
        let query = Query::new(0, 2).unwrap();
        let mut next = 0;
        let chunks = messages(&page(&[0, 1, 5, 9, 10]), &query, &mut next);
        assert_eq!(offsets(&chunks), vec![vec![0, 1], vec![5, 9], vec![10]]);
        assert_eq!(next, 11 * BLOCK);
        for c in &chunks {
            assert_eq!(c.block_metadata_type, i32::from(BlockMetadataType::FixedLength));
            assert_eq!(c.volume_capacity_bytes, 4 * GIB);
            assert!(c.block_metadata.iter().all(|b| b.size_bytes == BLOCK));
        }
    }

    #[test]
    fn no_range_ends_before_the_offset_or_goes_back() {
        // The offset inside block 3: block 3 is still sent (it ends after
        // the offset), blocks 0–2 are not; a block listed again or out of
        // order on a later page is not sent twice.
        let query = Query::new(3 * BLOCK + 10, 0).unwrap();
        let mut next = i64::from(query.first_block()) * BLOCK;
        let first = messages(&page(&[1, 3, 4]), &query, &mut next);
        assert_eq!(offsets(&first), vec![vec![3, 4]]);
        let second = messages(&page(&[4, 2, 6]), &query, &mut next);
        assert_eq!(offsets(&second), vec![vec![6]]);
        assert!(messages(&page(&[]), &query, &mut next).is_empty());
    }

    /// EBS as the direct APIs answer a listing: `pages` in turn, each
    /// answered once, recording each call's start.
    struct Pages {
        pages: std::sync::Mutex<Vec<Result<Page, crate::ec2::Ec2Error>>>,
        starts: std::sync::Mutex<Vec<(Start, i32)>>,
    }

    impl Blocks for Pages {
        async fn list(&self, _: &Listing, from: Start, page_size: i32) -> Result<Page, crate::ec2::Ec2Error> {
            self.starts.lock().unwrap().push((from, page_size));
            self.pages.lock().unwrap().remove(0)
        }
    }

    async fn run(
        pages: Vec<Result<Page, crate::ec2::Ec2Error>>,
        query: Query,
    ) -> (Vec<Result<Chunk, Status>>, Vec<(Start, i32)>) {
        let blocks = Arc::new(Pages {
            pages: std::sync::Mutex::new(pages),
            starts: std::sync::Mutex::new(Vec::new()),
        });
        let (sender, mut receiver) = tokio::sync::mpsc::channel(100);
        let listing = Listing::Allocated {
            snapshot_id: "snap-1".into(),
        };
        send(Arc::clone(&blocks), listing, query, sender, |c| c).await;
        let mut received = Vec::new();
        while let Some(m) = receiver.recv().await {
            received.push(m);
        }
        let starts = blocks.starts.lock().unwrap().clone();
        (received, starts)
    }

    #[tokio::test]
    async fn pages_are_followed_by_their_token_until_the_last() {
        let mut first = page(&[2, 3]);
        first.next_token = Some("t1".into());
        let (received, starts) = run(vec![Ok(first), Ok(page(&[7]))], Query::new(2 * BLOCK, 0).unwrap()).await;
        let chunks: Vec<Chunk> = received.into_iter().map(Result::unwrap).collect();
        assert_eq!(offsets(&chunks), vec![vec![2, 3], vec![7]]);
        assert_eq!(
            starts,
            vec![(Start::Block(2), 10_000), (Start::Token("t1".into()), 10_000)]
        );
    }

    #[tokio::test]
    async fn a_listing_without_blocks_still_says_the_capacity() {
        let (received, _) = run(vec![Ok(page(&[]))], Query::new(0, 0).unwrap()).await;
        let chunks: Vec<Chunk> = received.into_iter().map(Result::unwrap).collect();
        assert_eq!(chunks.len(), 1);
        assert!(chunks[0].block_metadata.is_empty());
        assert_eq!(chunks[0].volume_capacity_bytes, 4 * GIB);
    }

    #[tokio::test]
    async fn a_failed_page_ends_the_stream_with_its_error_after_what_was_sent() {
        let mut first = page(&[0]);
        first.next_token = Some("t1".into());
        let throttled = crate::ec2::Ec2Error::Throttled("Rate exceeded".into());
        let (received, _) = run(vec![Ok(first), Err(throttled)], Query::new(0, 0).unwrap()).await;
        assert_eq!(received.len(), 2);
        assert_eq!(offsets(&[received[0].clone().unwrap()]), vec![vec![0]]);
        let status = received[1].clone().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
    }
}
