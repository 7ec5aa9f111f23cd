//! The EBS direct APIs the SnapshotMetadata service reads: ListSnapshotBlocks
//! and ListChangedBlocks (EBS direct APIs reference), one page a call.
//!
//! Endpoint, region and credentials come from the SDK's standard settings
//! (`AWS_ENDPOINT_URL_EBS`, `AWS_REGION`, the default credential chain), as
//! for EC2. The IAM actions are `ebs:ListSnapshotBlocks` and
//! `ebs:ListChangedBlocks`.

use std::future::Future;

use aws_sdk_ebs::Client;
use aws_sdk_ebs::config::retry::RetryConfig;

use crate::ec2::Ec2Error;
use crate::ec2::sdk::classify;
use crate::metrics::ApiMetrics;

/// The size of every block of an EBS snapshot: 512 KiB (EBS direct APIs
/// User Guide, "Key concepts": blocks are of a fixed size, and
/// ListSnapshotBlocks answers `BlockSize` 524288).
pub const BLOCK_SIZE_BYTES: i64 = 512 * 1024;

/// The fewest and most blocks one page may be asked for (`MaxResults`,
/// valid range 100–10,000; EBS direct APIs reference, ListSnapshotBlocks
/// and ListChangedBlocks).
pub const PAGE_SIZES: std::ops::RangeInclusive<i32> = 100..=10_000;

/// Which blocks to list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listing {
    /// The blocks of one snapshot (ListSnapshotBlocks `SnapshotId`).
    Allocated {
        /// `snap-…`.
        snapshot_id: String,
    },
    /// The blocks that differ between two snapshots of one volume or
    /// lineage (ListChangedBlocks `FirstSnapshotId`, `SecondSnapshotId`).
    Changed {
        /// The earlier snapshot, `snap-…`.
        base_snapshot_id: String,
        /// The later snapshot, `snap-…`.
        target_snapshot_id: String,
    },
}

/// Where a page starts: at a block index, or where the last page left off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// `StartingBlockIndex`: this block or the next one listed.
    Block(i32),
    /// `NextToken` of the previous page (EBS then ignores the index).
    Token(String),
}

/// One page of an answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    /// The block indexes listed, ascending (`BlockIndex` of `Blocks` or
    /// `ChangedBlocks`).
    pub block_indexes: Vec<i32>,
    /// `BlockSize`, bytes.
    pub block_size_bytes: i64,
    /// `VolumeSize`, GiB: the size of the snapshot's volume (the second
    /// snapshot's, for ListChangedBlocks).
    pub volume_size_gib: i64,
    /// `NextToken`, while more pages follow.
    pub next_token: Option<String>,
}

/// The EBS direct API calls the service makes.
pub trait Blocks: Send + Sync + 'static {
    /// One page of `listing` from `from`, at most `page_size` blocks (within
    /// [`PAGE_SIZES`]).
    ///
    /// # Errors
    /// [`Ec2Error::NotFound`] for a snapshot EBS does not know
    /// (`ResourceNotFoundException`), [`Ec2Error::InvalidParameter`] for what
    /// EBS refuses (`ValidationException`, e.g. `UNRELATED_SNAPSHOTS`),
    /// [`Ec2Error::Throttled`] or [`Ec2Error::Transport`] when it cannot be
    /// reached; others as [`Ec2Error::Service`].
    fn list(
        &self,
        listing: &Listing,
        from: Start,
        page_size: i32,
    ) -> impl Future<Output = Result<Page, Ec2Error>> + Send;
}

/// [`Blocks`] over aws-sdk-ebs.
#[derive(Clone, Debug)]
pub struct SdkBlocks {
    client: Client,
    metrics: ApiMetrics,
}

impl SdkBlocks {
    /// A client from the shared SDK configuration, with the SDK's adaptive
    /// retries (EBS asks callers to retry 5xx, `ThrottlingException` and
    /// `RequestThrottledException`).
    pub fn new(config: &aws_config::SdkConfig, metrics: ApiMetrics) -> Self {
        let conf = aws_sdk_ebs::config::Builder::from(config)
            .retry_config(RetryConfig::adaptive())
            .interceptor(metrics.throttle_counter())
            .build();
        Self {
            client: Client::from_conf(conf),
            metrics: metrics.of_service("EBS"),
        }
    }
}

impl Blocks for SdkBlocks {
    async fn list(&self, listing: &Listing, from: Start, page_size: i32) -> Result<Page, Ec2Error> {
        let (index, token) = match from {
            Start::Block(index) => (Some(index), None),
            Start::Token(token) => (None, Some(token)),
        };
        match listing {
            Listing::Allocated { snapshot_id } => {
                self.metrics
                    .observe("ListSnapshotBlocks", async {
                        let out = self
                            .client
                            .list_snapshot_blocks()
                            .snapshot_id(snapshot_id)
                            .set_starting_block_index(index)
                            .set_next_token(token)
                            .max_results(page_size)
                            .send()
                            .await
                            .map_err(classify)?;
                        let indexes = out.blocks().iter().filter_map(|b| b.block_index()).collect();
                        Ok(page(indexes, out.block_size(), out.volume_size(), out.next_token()))
                    })
                    .await
            }
            Listing::Changed {
                base_snapshot_id,
                target_snapshot_id,
            } => {
                self.metrics
                    .observe("ListChangedBlocks", async {
                        let out = self
                            .client
                            .list_changed_blocks()
                            .first_snapshot_id(base_snapshot_id)
                            .second_snapshot_id(target_snapshot_id)
                            .set_starting_block_index(index)
                            .set_next_token(token)
                            .max_results(page_size)
                            .send()
                            .await
                            .map_err(classify)?;
                        let indexes = out.changed_blocks().iter().filter_map(|b| b.block_index()).collect();
                        Ok(page(indexes, out.block_size(), out.volume_size(), out.next_token()))
                    })
                    .await
            }
        }
    }
}

fn page(block_indexes: Vec<i32>, block_size: Option<i32>, volume_size: Option<i64>, next_token: Option<&str>) -> Page {
    Page {
        block_indexes,
        block_size_bytes: block_size.map_or(BLOCK_SIZE_BYTES, i64::from),
        volume_size_gib: volume_size.unwrap_or_default(),
        next_token: next_token.filter(|t| !t.is_empty()).map(str::to_owned),
    }
}
