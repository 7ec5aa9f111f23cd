//! Staging and target paths, resolved beneath an allowed root without
//! following any symlink.
//!
//! Every path the agent sends is checked for form (absolute, no `.`/`..`,
//! no empty component), matched to one of the allowed roots, checked to
//! have the shape the orchestrator gives such a path ([`crate::layout`]),
//! and opened
//! component by component with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` from a directory fd the helper opened at start.
//! The parents are walked with `RESOLVE_NO_XDEV` as well: a path never
//! leads into another mount (another pod's volume, a secret), only its
//! last component may be a mount point. The helper then acts on the fd
//! (`/proc/self/fd/N`), never on the path string again, so a symlink
//! swapped in during the call cannot redirect a mount.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use ebs_csi_helper_proto::{HelperError, VolumeId};
use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::error::{Operation, PathRefusal};
use crate::layout::{DRIVER_NAME, Layout, Role};
use crate::record;

/// The longest path accepted, in bytes (Linux `PATH_MAX`).
const PATH_MAX: usize = 4096;

/// The directories beneath which the helper may mount, and the layout of
/// the paths there.
#[derive(Debug)]
pub struct AllowedRoots {
    roots: Vec<Root>,
    layout: Layout,
}

#[derive(Debug)]
struct Root {
    components: Vec<String>,
    dir: OwnedFd,
}

/// A path that passed the syntactic checks and lies beneath a root.
#[derive(Debug)]
pub struct SafePath<'r> {
    root: &'r Root,
    layout: Layout,
    /// Components below the root, the last being the path's own name.
    below: Vec<String>,
    text: String,
}

impl AllowedRoots {
    /// Canonicalizes and opens each root directory, beneath which paths
    /// have the shapes of `layout`.
    ///
    /// # Errors
    /// `InvalidInput` for `/` or a relative root (allowing everything is
    /// never what is meant), or the error opening a root.
    pub fn open(dirs: &[PathBuf], layout: Layout) -> io::Result<Self> {
        let roots = dirs
            .iter()
            .map(|dir| {
                let canonical = std::fs::canonicalize(dir)?;
                let components = components_of(&canonical)?;
                if components.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "/ cannot be an allowed root",
                    ));
                }
                let dir = rustix::fs::open(
                    &canonical,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                Ok(Root { components, dir })
            })
            .collect::<io::Result<_>>()?;
        Ok(Self { roots, layout })
    }

    /// Whether a mount point (an absolute, canonical path, as mountinfo
    /// gives it) is where a volume of the layout is mounted: a staging,
    /// target or raw block target path beneath a root. A disk mounted
    /// anywhere else — outside the roots, at a root itself, or beneath one
    /// at a path of no volume's shape — is the host's (third audit A4).
    pub fn holds_volume(&self, mount_point: &str) -> bool {
        self.check(mount_point, Role::Volume).is_ok()
    }

    /// Checks the form of `path`, finds its root, and checks that it has
    /// the layout's shape of a path of `role` there.
    ///
    /// # Errors
    /// [`HelperError::PathRefused`] when the path is relative, too long,
    /// has an empty, `.` or `..` component, lies outside every root (or
    /// is a root itself), or is not of that shape ([`PathRefusal`]).
    pub fn check<'r>(&'r self, path: &str, role: Role) -> Result<SafePath<'r>, HelperError> {
        let refuse = |reason: PathRefusal| reason.of(path);
        if path.len() > PATH_MAX || path.contains('\0') {
            return Err(refuse(PathRefusal::TooLong));
        }
        let rest = path.strip_prefix('/').ok_or_else(|| refuse(PathRefusal::NotAbsolute))?;
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.iter().any(|c| c.is_empty() || *c == "." || *c == "..") {
            return Err(refuse(PathRefusal::NotCanonical));
        }
        let root = self
            .roots
            .iter()
            .filter(|root| parts.len() > root.components.len())
            .find(|root| root.components.iter().zip(&parts).all(|(a, b)| a == b))
            .ok_or_else(|| refuse(PathRefusal::OutsideRoots))?;
        if !self.layout.accepts(role, &parts[root.components.len()..]) {
            return Err(refuse(PathRefusal::NotItsShape));
        }
        Ok(SafePath {
            root,
            layout: self.layout,
            below: parts[root.components.len()..].iter().map(|c| (*c).to_owned()).collect(),
            text: path.to_owned(),
        })
    }
}

impl SafePath<'_> {
    /// The path as the agent sent it (for logs and errors).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether this target path may take a bind of the volume staged at
    /// `staging` ([`Layout::publishes`]).
    pub fn publishes_from(&self, staging: &SafePath<'_>) -> bool {
        self.layout.publishes(&staging.components(), &self.components())
    }

    /// The components below the root.
    fn components(&self) -> Vec<&str> {
        self.below.iter().map(String::as_str).collect()
    }

    /// The last component.
    pub fn name(&self) -> &str {
        self.below.last().map_or("", String::as_str)
    }

    /// Opens the path itself as an `O_PATH` fd; `None` when it does not
    /// exist. Its parents must not cross a mount; the path itself may be a
    /// mount point.
    ///
    /// # Errors
    /// [`HelperError::PathRefused`] for a symlink, a non-directory or a
    /// mount on the way, [`HelperError::System`] for other errors.
    pub fn open(&self) -> Result<Option<OwnedFd>, HelperError> {
        let Some(parent) = self.walk_parents(false)? else {
            return Ok(None);
        };
        match open_beneath(&parent, self.name()) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.error(e)),
        }
    }

    /// Opens the parent directory, one component at a time, none of them
    /// a mount point; with `create`, missing directories below the root are
    /// made (mode 0755, so the unprivileged agent can reach the volume for
    /// NodeGetVolumeStats).
    ///
    /// # Errors
    /// As [`SafePath::open`]; a missing parent without `create` is
    /// [`HelperError::PathRefused`].
    pub fn open_parent(&self, create: bool) -> Result<OwnedFd, HelperError> {
        self.walk_parents(create)?
            .ok_or_else(|| self.error(rustix::io::Errno::NOENT.into()))
    }

    /// The walk of [`SafePath::open_parent`]; `None` when a parent is
    /// missing and not to be created.
    /// Proves the path is `volume_id`'s where its layout binds it to a
    /// volume ([`Layout::binding`]): its hash is sha256 of the volume id,
    /// and kubelet's record beside it ([`crate::record`]) names this driver
    /// and this volume. A path of a layout that binds nothing passes.
    ///
    /// # Errors
    /// [`HelperError::PathRefused`]: [`PathRefusal::OtherVolumesHash`],
    /// [`PathRefusal::NoVolumeRecord`] (missing, or not as kubelet writes
    /// it), [`PathRefusal::OtherVolumesRecord`], or the reason the way to
    /// the record is refused (a symlink, a mount point crossed).
    pub fn check_bound(&self, volume_id: &VolumeId) -> Result<(), HelperError> {
        let below = self.components();
        let Some(binding) = self.layout.binding(&below) else {
            return Ok(());
        };
        let refuse = |reason: PathRefusal| reason.of(&self.text);
        if binding
            .hash
            .is_some_and(|hash| hash != record::sha256_hex(volume_id.as_str()))
        {
            return Err(refuse(PathRefusal::OtherVolumesHash));
        }
        let fd = self.open_record(&binding.record).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => refuse(PathRefusal::NoVolumeRecord),
            _ => self.error(e),
        })?;
        let (driver, volume) = record::read(&fd).ok_or_else(|| refuse(PathRefusal::NoVolumeRecord))?;
        if driver != DRIVER_NAME || volume != volume_id.as_str() {
            return Err(refuse(PathRefusal::OtherVolumesRecord));
        }
        Ok(())
    }

    /// Whether a missing parent of this path is created (Publish's
    /// target): as its layout says ([`Layout::creates_target_parents`]).
    pub fn creates_parents(&self) -> bool {
        self.layout.creates_target_parents()
    }

    /// Opens the file at `components` beneath the path's root for reading,
    /// through no symlink or mount point, without blocking on a FIFO.
    fn open_record(&self, components: &[&str]) -> io::Result<OwnedFd> {
        let (name, parents) = components.split_last().ok_or(io::ErrorKind::InvalidInput)?;
        let mut dir = rustix::io::fcntl_dupfd_cloexec(&self.root.dir, 0)?;
        for parent in parents {
            dir = open_dir_beneath(&dir, parent)?;
        }
        Ok(rustix::fs::openat2(
            &dir,
            *name,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
        )?)
    }

    fn walk_parents(&self, create: bool) -> Result<Option<OwnedFd>, HelperError> {
        let parents = &self.below[..self.below.len() - 1];
        let mut dir = rustix::io::fcntl_dupfd_cloexec(&self.root.dir, 0).map_err(|e| self.error(e.into()))?;
        for name in parents {
            dir = match open_dir_beneath(&dir, name) {
                Err(e) if e.kind() == io::ErrorKind::NotFound && !create => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    match rustix::fs::mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(self.error(e.into())),
                    }
                    open_dir_beneath(&dir, name)
                }
                other => other,
            }
            .map_err(|e| self.error(e))?;
        }
        Ok(Some(dir))
    }

    fn error(&self, e: io::Error) -> HelperError {
        let reason = match e.raw_os_error().map(rustix::io::Errno::from_raw_os_error) {
            Some(rustix::io::Errno::LOOP) => PathRefusal::Symlink,
            Some(rustix::io::Errno::XDEV) => PathRefusal::CrossesMount,
            Some(rustix::io::Errno::NOTDIR) => PathRefusal::ParentNotDirectory,
            Some(rustix::io::Errno::NOENT) => PathRefusal::ParentMissing,
            _ => return Operation::Resolve(self.text.clone()).failed(e),
        };
        reason.of(&self.text)
    }
}

/// Opens the directory `name` in `dir` as an `O_PATH` fd like
/// [`open_beneath`], and refuses it if it is a mount point (`EXDEV`).
fn open_dir_beneath(dir: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        dir,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
    )?)
}

/// Opens `relative` beneath `dir` as an `O_PATH` fd, refusing symlinks
/// (`ELOOP`) anywhere, the last component included (no `O_NOFOLLOW`, which
/// would return an fd on the link itself), and escapes from `dir` (`EXDEV`).
///
/// # Errors
/// The `openat2` error.
pub fn open_beneath(dir: &OwnedFd, relative: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        dir,
        relative,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// The `/proc/self/fd/N` path of an fd: the kernel resolves it to exactly
/// the file the fd refers to, whatever happened to its name since.
pub fn fd_path(fd: &impl AsRawFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

fn components_of(path: &Path) -> io::Result<Vec<String>> {
    path.to_str()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "root is not UTF-8"))
        .map(|s| s.split('/').filter(|c| !c.is_empty()).map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests use Nomad's shapes, the shortest: staging
    /// `staging/<volume>/<usage>`, target `per-alloc/<alloc>/<volume>/<usage>`.
    fn nomad_roots(dir: &Path) -> AllowedRoots {
        AllowedRoots::open(&[dir.to_owned()], Layout::Nomad).unwrap()
    }

    #[test]
    fn refuses_malformed_outside_and_misshapen_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        let roots = nomad_roots(&dir);
        let root = dir.to_str().unwrap();
        for bad in [
            "relative/path".to_owned(),
            format!("{root}/staging/v/../u"),
            format!("{root}/staging/./v/u"),
            format!("{root}//staging/v/u"),
            format!("{root}/staging/v/u/"),
            root.to_owned(),
            "/etc/passwd".to_owned(),
            format!("{root}x/staging/v/u"),
            format!("{root}/staging/v/u\0b"),
        ] {
            assert!(
                matches!(roots.check(&bad, Role::Staging), Err(HelperError::PathRefused { .. })),
                "{bad:?} accepted"
            );
        }
        let ok = roots.check(&format!("{root}/staging/v/u"), Role::Staging).unwrap();
        assert_eq!(ok.name(), "u");
        assert!(roots.holds_volume(&format!("{root}/staging/v/u")));
        assert!(
            !roots.holds_volume(&format!("{root}/a")),
            "a mount of no volume's shape is the host's"
        );
        assert!(!roots.holds_volume(root), "a mount at the root itself is the host's");
        assert!(!roots.holds_volume("/var"));
        for (path, role) in [
            (format!("{root}/staging/v/u"), Role::Target),
            (format!("{root}/per-alloc/a/v/u"), Role::Staging),
            (format!("{root}/staging/v"), Role::Volume),
            (format!("{root}/a/b"), Role::Volume),
        ] {
            assert_eq!(
                roots.check(&path, role).unwrap_err(),
                PathRefusal::NotItsShape.of(&path)
            );
        }
    }

    #[test]
    fn refuses_the_filesystem_root() {
        assert!(AllowedRoots::open(&[PathBuf::from("/")], Layout::Kubelet).is_err());
    }

    #[test]
    fn refuses_symlinks_on_the_way() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        std::fs::create_dir_all(dir.join("staging/real/u")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.join("staging/link")).unwrap();
        let roots = nomad_roots(&dir);
        let root = dir.to_str().unwrap();
        let check = |path: String| roots.check(&path, Role::Staging).unwrap();
        assert!(check(format!("{root}/staging/real/u")).open().unwrap().is_some());
        assert!(check(format!("{root}/staging/real/missing")).open().unwrap().is_none());
        for path in [format!("{root}/staging/link/u"), format!("{root}/staging/link/passwd")] {
            let err = check(path.clone()).open().unwrap_err();
            assert!(matches!(err, HelperError::PathRefused { .. }), "{path}: {err}");
        }
        let err = check(format!("{root}/staging/link/x")).open_parent(true).unwrap_err();
        assert!(matches!(err, HelperError::PathRefused { .. }), "{err}");
        assert!(!Path::new("/etc/x").exists());
    }
}
