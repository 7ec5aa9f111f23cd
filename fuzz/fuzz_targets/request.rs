//! Arbitrary bytes on the helper socket: the frame reader and decoder, then
//! every validation the helper runs before touching the system (path form
//! and root, device name form, mount options, format options). None may
//! panic; an accepted path must lie strictly beneath the root and have no
//! `.`/`..`; an accepted device must be `/dev/` and a bare NVMe namespace
//! or loop device name.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use ebs_csi_helper::device::kernel_name_of;
use ebs_csi_helper::layout::{Layout, Role};
use ebs_csi_helper::options;
use ebs_csi_helper::path::AllowedRoots;
use ebs_csi_helper_proto::{PublishSource, Request, RequestFrame, decode, read_payload};
use libfuzzer_sys::fuzz_target;

fn roots() -> &'static AllowedRoots {
    static ROOTS: OnceLock<AllowedRoots> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let dir = std::env::temp_dir().join("ebs-csi-fuzz-root");
        std::fs::create_dir_all(&dir).unwrap();
        AllowedRoots::open(&[PathBuf::from(dir)], Layout::Kubelet).unwrap()
    })
}

fn check_path(path: &str) {
    if roots().check(path, Role::Volume).is_ok() {
        let root = std::env::temp_dir().join("ebs-csi-fuzz-root").canonicalize().unwrap();
        let root = root.to_str().unwrap();
        assert!(path.starts_with(root) && path.len() > root.len() + 1, "{path:?} accepted");
        assert!(!path.split('/').skip(1).any(|c| c.is_empty() || c == "." || c == ".."), "{path:?} accepted");
    }
}

fn check_device(device: &str) {
    if let Some(name) = kernel_name_of(device) {
        assert_eq!(device, format!("/dev/{name}"), "{device:?} accepted");
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let nvme = name.strip_prefix("nvme").and_then(|r| r.split_once('n')).is_some_and(|(c, n)| digits(c) && digits(n));
        let looped = name.strip_prefix("loop").is_some_and(digits);
        assert!(nvme || looped, "{device:?} accepted");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(payload) = read_payload(&mut &data[..]) else { return };
    let Ok(frame) = decode::<RequestFrame>(&payload) else { return };
    match frame.request {
        Request::Ping => {}
        Request::Stage(r) => {
            check_path(&r.staging_path);
            check_device(&r.device);
            let _ = options::parse(Some(r.fs_type), &r.mount_flags);
            let _ = r.format.validate(r.fs_type);
        }
        Request::Unstage(r) => check_path(&r.staging_path),
        Request::Publish(r) => {
            check_path(&r.target_path);
            match &r.source {
                PublishSource::Staging { device, staging_path, mount_flags, .. } => {
                    check_device(device);
                    check_path(staging_path);
                    let _ = options::parse(None, mount_flags);
                }
                PublishSource::Device { device, .. } => check_device(device),
            }
        }
        Request::Unpublish(r) => check_path(&r.target_path),
        Request::Expand(r) => {
            check_path(&r.volume_path);
            check_device(&r.device);
        }
        Request::VolumeStats(r) => check_path(&r.volume_path),
        Request::PerformanceStatistics(r) => check_device(&r.device),
    }
});
