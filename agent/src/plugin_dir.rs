//! `ebs-csi-agent plugin-dir`: gives kubelet's plugin directory to the
//! agent's user, so that the unprivileged agent can bind its socket there.
//!
//! kubelet creates a `hostPath` directory owned by root, mode 0755
//! (`DirectoryOrCreate`, Kubernetes "Volumes" documentation); the node
//! DaemonSet runs this once, from an init container holding CAP_CHOWN alone.

use std::path::Path;

use rustix::fs::{Gid, Mode, OFlags, Uid};

/// Opens `path` as a directory, never following a symlink in its last
/// component, and makes `uid`:`gid` its owner through that descriptor.
///
/// # Errors
/// The errno of `open(2)` — ENOTDIR for a symlink or anything but a
/// directory, ENOENT — or of `fchown(2)`: EPERM without CAP_CHOWN.
pub fn give(path: &Path, uid: u32, gid: u32) -> rustix::io::Result<()> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir = rustix::fs::open(path, flags, Mode::empty())?;
    rustix::fs::fchown(&dir, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
}
