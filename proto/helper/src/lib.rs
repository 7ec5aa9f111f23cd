//! The agent↔helper protocol: a closed, versioned set of requests and
//! replies, each carried as one length-prefixed CBOR frame over a unix
//! stream socket.
//!
//! A connection carries exactly one exchange: the agent writes one
//! [`RequestFrame`], the helper answers with one [`Response`] and closes.
//! Every struct rejects unknown fields and every enum is closed, so a frame
//! that does not match its version exactly is refused as a whole. Versions
//! only add requests, so the helper and the agent may be upgraded in either
//! order ([`PROTOCOL_VERSION`]).
//!
//! This crate has no async runtime and no gRPC dependency, so the helper
//! binary can link it while staying free of tokio and tonic.

mod error;
mod format_options;
mod frame;
mod message;
mod volume_id;

pub use error::HelperError;
pub use format_options::FormatOptions;
pub use frame::{FrameError, MAX_FRAME_BYTES, decode, read_payload, write_frame};
pub use message::{
    ExpandRequest, FrameVersion, FsType, OLDEST_VERSION, PROTOCOL_VERSION, PerformanceStatisticsRequest,
    PublishRequest, PublishSource, Reply, Request, RequestFrame, Response, StageRequest, UnpublishRequest,
    UnstageRequest, VolumeStatsRequest, VolumeUsage,
};
pub use volume_id::{InvalidVolumeId, VolumeId};
