//! The agent's side of a frame: the version a request needs, the frame it
//! goes in, and the helper's answer read back. The helper itself only
//! checks a frame's version and decodes it (`ebs_csi_helper_proto`).

use std::io::Read;

use ebs_csi_helper_proto::{FrameError, Request, RequestFrame, Response, decode, read_payload};

/// The protocol version that introduced `request`, or the newest field it
/// uses (every request of version 3 has 3): a helper of that version or
/// newer serves it. Version 4 added PerformanceStatistics, version 5
/// Stage's `ext4EncryptionSupport`, version 6 its `--legacy-xfs`
/// (`ebs_csi_helper_proto::PROTOCOL_VERSION`).
pub fn version(request: &Request) -> u16 {
    match request {
        Request::Stage(stage) if stage.format.xfs_legacy => 6,
        Request::Stage(stage) if stage.format.ext4_encryption => 5,
        Request::Ping
        | Request::Stage(_)
        | Request::Unstage(_)
        | Request::Publish(_)
        | Request::Unpublish(_)
        | Request::Expand(_)
        | Request::VolumeStats(_) => 3,
        Request::PerformanceStatistics(_) => 4,
    }
}

/// `request` in a frame of the version that introduced it ([`version`]).
pub fn frame(request: Request) -> RequestFrame {
    RequestFrame {
        version: version(&request),
        request,
    }
}

/// Reads the helper's answer: one frame holding exactly one [`Response`].
///
/// # Errors
/// [`FrameError::TooLarge`], [`FrameError::Truncated`],
/// [`FrameError::Decode`] or [`FrameError::Io`].
pub fn read_response<R: Read>(reader: &mut R) -> Result<Response, FrameError> {
    decode(&read_payload(reader)?)
}

#[cfg(test)]
mod tests {
    use ebs_csi_helper_proto::{
        FormatOptions, FsType, OLDEST_VERSION, PerformanceStatisticsRequest, StageRequest, UnstageRequest, VolumeId,
        write_frame,
    };

    use super::*;

    /// A frame carries the version that introduced its request: 3 for
    /// every request a version-3 helper knows, so that it serves them.
    #[test]
    fn a_frame_carries_its_requests_version() {
        let statistics = Request::PerformanceStatistics(PerformanceStatisticsRequest {
            volume_id: VolumeId::parse("vol-0aaaaaaaaaaaaaaa1").unwrap(),
            device: "/dev/nvme1n1".into(),
        });
        assert_eq!(frame(statistics).version, 4);
        assert_eq!(frame(Request::Ping).version, OLDEST_VERSION);
        let unstage = Request::Unstage(UnstageRequest {
            staging_path: "/var/lib/kubelet/x".into(),
        });
        assert_eq!(frame(unstage).version, OLDEST_VERSION);
        // A Stage is of version 3 unless it uses version 5's field, which is
        // then on the wire (and absent otherwise, for version-3 helpers).
        let mut stage = StageRequest {
            volume_id: VolumeId::parse("vol-0aaaaaaaaaaaaaaa1").unwrap(),
            device: "/dev/nvme1n1".into(),
            staging_path: "/var/lib/kubelet/s".into(),
            fs_type: FsType::Ext4,
            mount_flags: vec![],
            format: FormatOptions::default(),
        };
        let encoded = |stage: &StageRequest| {
            let mut bytes = Vec::new();
            write_frame(&mut bytes, &frame(Request::Stage(stage.clone()))).unwrap();
            String::from_utf8_lossy(&bytes).contains("ext4_encryption")
        };
        assert_eq!(frame(Request::Stage(stage.clone())).version, OLDEST_VERSION);
        assert!(!encoded(&stage));
        stage.format.ext4_encryption = true;
        assert_eq!(frame(Request::Stage(stage.clone())).version, 5);
        assert!(encoded(&stage));
        // An XFS stage with the node's `--legacy-xfs` is of version 6.
        let xfs = StageRequest {
            fs_type: FsType::Xfs,
            format: FormatOptions {
                xfs_legacy: true,
                ..FormatOptions::default()
            },
            ..stage
        };
        assert_eq!(frame(Request::Stage(xfs)).version, 6);
    }

    /// The fuzzer's seeds (`fuzz/seeds/request`) are well-formed frames,
    /// one per request kind, each of its request's version, so fuzzing
    /// starts from requests the helper accepts.
    #[test]
    fn the_fuzz_seeds_are_requests_the_helper_serves() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/request");
        let mut kinds = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            let frame: RequestFrame = decode(&read_payload(&mut bytes.as_slice()).unwrap()).unwrap();
            assert_eq!(frame.version, version(&frame.request), "{:?}", frame.request);
            kinds.push(std::mem::discriminant(&frame.request));
        }
        kinds.sort_by_key(|k| format!("{k:?}"));
        kinds.dedup();
        assert_eq!(kinds.len(), 8, "a seed for each request kind");
    }
}
