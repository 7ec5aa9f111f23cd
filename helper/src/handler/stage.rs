//! Stage (`docs/helper.md`, "Stage"), as a plan: the request's form; under
//! the lock, the staging directory and the device proved; outside it, the
//! device claimed, what it holds decides — the requested filesystem, or a
//! device proved blank, formatted; under the lock again, the same proved
//! again, the filesystem mounted (and grown, when it was found).

use std::os::fd::{AsFd, OwnedFd};

use ebs_csi_helper_proto::{HelperError, Reply, StageRequest};
use ebs_csi_linux::mountinfo::MountEntry;
use rustix::fs::FileType;

use super::{Handler, already_mounted, refuse_if_not_empty};
use crate::device::{self, Refusal, VerifiedDevice};
use crate::format::Contents;
use crate::layout::Role;
use crate::mount;
use crate::options::{self, MountOptions};
use crate::path::SafePath;

/// Whether Stage grows the filesystem it mounts to its device's size.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Grow {
    /// A filesystem found on the device (a snapshot restored, or a volume
    /// cloned, into a larger one), as the Go driver does at NodeStage.
    IfSmaller,
    /// A filesystem this request just made, as large as its device.
    No,
}

impl Handler {
    pub(super) fn stage(&self, r: &StageRequest) -> Result<Reply, HelperError> {
        // 1–3. The request's form: format options, mount options, the
        // staging path's form and root.
        r.format.validate(r.fs_type).map_err(HelperError::InvalidRequest)?;
        let options = options::parse(Some(r.fs_type), &r.mount_flags)?;
        let staging = self.roots.check(&r.staging_path, Role::Staging)?;
        staging.check_bound(&r.volume_id)?;
        let exclusive = self.lock();
        // 3–6. Under the lock: the staging directory, the device proved.
        let (dir, node) = self.open_existing(&staging, FileType::Directory)?;
        let mounts = self.kernel.mounts()?;
        let device = self.verify(&r.volume_id, &r.device, &mounts)?;
        let Some(dir) = vacant(&staging, dir, &node, &device, &mounts)? else {
            return Ok(Reply::Done);
        };
        self.refuse_at_mount_limit(&mounts, &staging)?;
        // 7. Outside the lock, the device claimed (no other request acts
        // on it meanwhile; verified again before each tool): what it holds
        // decides — mount and grow the requested filesystem, or format a
        // device proved blank. Probes of other devices run meanwhile.
        drop((dir, mounts));
        let claim = self.claims.claim(device.number, &device.path())?;
        drop(exclusive);
        let grow = match self.kernel.probe(&device)? {
            Contents::Filesystem(found) if found == r.fs_type.name() => Grow::IfSmaller,
            Contents::Blank => {
                tracing::info!(volume_id = %r.volume_id, device = ?device.path(), fs_type = r.fs_type.name(), "format");
                self.kernel.format(r.fs_type, &r.format, &device)?;
                Grow::No
            }
            Contents::Filesystem(found) | Contents::Other(found) => {
                return Err(HelperError::FilesystemMismatch {
                    device: device.path(),
                    found,
                    requested: r.fs_type.name().to_owned(),
                });
            }
        };
        let _exclusive = self.lock();
        drop(claim);
        // 8. Under the lock again: the same device, the staging directory
        // as it is now; then the filesystem mounted.
        let (dir, node) = self.open_existing(&staging, FileType::Directory)?;
        let mounts = self.kernel.mounts()?;
        self.kernel.reverify(&device)?;
        let Some(dir) = vacant(&staging, dir, &node, &device, &mounts)? else {
            return Ok(Reply::Done);
        };
        self.refuse_at_mount_limit(&mounts, &staging)?;
        self.mount_staged(r, &options, &staging, dir, &device, grow)
    }

    /// Mounts the `r.fs_type` filesystem on `device` (checked on the new
    /// mount to be that device before it is attached anywhere: dropped, it
    /// leaves nothing) onto `dir`, the staging directory's fd, and grows it
    /// as `grow` says; a growth that fails unmounts it again, so a retried
    /// Stage grows it again.
    fn mount_staged(
        &self,
        r: &StageRequest,
        options: &MountOptions,
        staging: &SafePath<'_>,
        dir: OwnedFd,
        device: &VerifiedDevice,
        grow: Grow,
    ) -> Result<Reply, HelperError> {
        // The kernel mounts what `/dev/<name>` names when it mounts: that
        // must still be the verified device.
        let options = mount::staging_options(r.fs_type, options);
        let mount = self.kernel.mount_filesystem(device, r.fs_type, &options)?;
        if self.kernel.inspect(mount.fd())?.dev != device.number || self.kernel.reverify(device).is_err() {
            return Err(device.refusal(Refusal::Changed));
        }
        let root = self.kernel.attach(mount, dir.as_fd())?;
        drop(dir);
        if grow == Grow::IfSmaller
            && let Err(e) = self.grow(r.fs_type, device, &root, false)
        {
            drop(root);
            self.kernel
                .unmount(staging.open_parent(false)?.as_fd(), staging.name())?;
            return Err(e);
        }
        Ok(Reply::Done)
    }
}

/// The staging directory `dir` (of `node`) if the volume can be mounted
/// there: `None` when it already is `device`'s mount; refused when it is
/// another mount, holds anything, or the device is in use as a raw block
/// volume.
fn vacant(
    staging: &SafePath<'_>,
    dir: OwnedFd,
    node: &mount::Node,
    device: &VerifiedDevice,
    mounts: &[MountEntry],
) -> Result<Option<OwnedFd>, HelperError> {
    if node.is_mount_root {
        return if node.dev == device.number {
            Ok(None)
        } else {
            Err(already_mounted(staging, node))
        };
    }
    refuse_if_not_empty(staging, &dir, node)?;
    device::refuse_if_published_raw(device, mounts)?;
    Ok(Some(dir))
}
