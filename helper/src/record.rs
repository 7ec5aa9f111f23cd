//! kubelet's record of a CSI volume, `vol_data.json`, which it writes
//! beside a volume's staging path and targets before it asks the plugin to
//! stage or publish there (kubernetes `pkg/volume/csi/csi_util.go`,
//! `saveVolumeData`: a JSON object of strings, among them `driverName` and
//! `volumeHandle`; `../shared/DESIGN.md` §12), and the hash kubelet names
//! a staging path by.

use std::io::Read;
use std::os::fd::OwnedFd;

use rustix::fs::FileType;
use sha2::{Digest, Sha256};

/// The largest record read, in bytes (kubelet's are a few hundred).
const MAX_BYTES: u64 = 64 << 10;

/// sha256 of `text`, in lower-case hex (64 digits): kubelet's staging path
/// component for a volume handle (`csi_attacher.go`, `MakeDeviceMountPath`).
pub fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The `driverName` and `volumeHandle` of the record open at `fd`, if it is
/// one kubelet could have written: a regular file of the helper's user
/// (kubelet runs as root, as the helper does) that neither its group nor
/// others may write, of at most [`MAX_BYTES`], a JSON object with both as
/// strings; `None` otherwise.
pub fn read(fd: &OwnedFd) -> Option<(String, String)> {
    let stat = rustix::fs::fstat(fd).ok()?;
    let written_by_kubelet = FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile
        && stat.st_uid == rustix::process::geteuid().as_raw()
        && stat.st_mode & 0o022 == 0;
    if !written_by_kubelet || u64::try_from(stat.st_size).ok()? > MAX_BYTES {
        return None;
    }
    let mut text = Vec::new();
    std::fs::File::from(fd.try_clone().ok()?)
        .take(MAX_BYTES)
        .read_to_end(&mut text)
        .ok()?;
    let record: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let field = |name: &str| record.get(name)?.as_str().map(str::to_owned);
    Some((field("driverName")?, field("volumeHandle")?))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_hash_is_kubelets() {
        // sha256("vol-0123456789abcdef0"), as `printf %s vol-… | sha256sum`.
        assert_eq!(
            sha256_hex("vol-0123456789abcdef0"),
            "7f0b2e31ddb1b3a849f76dd4a2ae35279a9d823391976605d7dcd0e593f57812"
        );
    }

    fn record_of(contents: &str, mode: u32) -> Option<(String, String)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vol_data.json");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(contents.as_bytes())
            .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        read(&std::fs::File::open(&path).unwrap().into())
    }

    #[test]
    fn kubelets_record_is_read_and_nothing_else() {
        let kubelets = r#"{"attachmentID":"csi-1","driverName":"ebs.csi.aws.com","nodeName":"n","specVolID":"pv-1","volumeHandle":"vol-1","volumeLifecycleMode":"Persistent"}"#;
        assert_eq!(
            record_of(kubelets, 0o644),
            Some(("ebs.csi.aws.com".into(), "vol-1".into()))
        );
        assert_eq!(record_of(kubelets, 0o664), None, "group-writable");
        assert_eq!(record_of(kubelets, 0o646), None, "world-writable");
        assert_eq!(record_of(r#"{"driverName":"ebs.csi.aws.com"}"#, 0o644), None);
        assert_eq!(record_of(r#"{"driverName":1,"volumeHandle":"vol-1"}"#, 0o644), None);
        assert_eq!(record_of("not json", 0o644), None);
        assert_eq!(
            record_of(&format!(r#"{{"x":"{}"}}"#, "a".repeat(70 << 10)), 0o644),
            None
        );
    }
}
