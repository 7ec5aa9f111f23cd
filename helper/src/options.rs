//! Mount options: only those on an allowlist, turned into `mount(2)`
//! flags and filesystem data.
//!
//! Options that weaken the node (`suid`, `dev`, `exec` of other
//! filesystems' semantics, `user`, paths such as `journal_path=` or
//! `usrjquota=`, …) are not on the list; a request with any option not on it
//! is refused as a whole. Options with a value are accepted only in a fixed
//! shape: `commit=` a number of seconds, `context=` an SELinux label of a
//! container file type (what kubelet passes when the CSIDriver has
//! `seLinuxMount`).

use ebs_csi_helper_proto::{FsType, HelperError};
use rustix::mount::MountFlags;

/// Per-mount options that map to `mount(2)` flags (mount(8), "FILESYSTEM-
/// INDEPENDENT MOUNT OPTIONS").
const FLAG_OPTIONS: [(&str, MountFlags); 13] = [
    ("defaults", MountFlags::empty()),
    ("rw", MountFlags::empty()),
    ("ro", MountFlags::RDONLY),
    ("noatime", MountFlags::NOATIME),
    ("nodiratime", MountFlags::NODIRATIME),
    ("relatime", MountFlags::RELATIME),
    ("strictatime", MountFlags::STRICTATIME),
    ("lazytime", MountFlags::LAZYTIME),
    ("sync", MountFlags::SYNCHRONOUS),
    ("dirsync", MountFlags::DIRSYNC),
    ("noexec", MountFlags::NOEXEC),
    ("nosuid", MountFlags::NOSUID),
    ("nodev", MountFlags::NODEV),
];

const EXT: &[FsType] = &[FsType::Ext2, FsType::Ext3, FsType::Ext4];
const EXT34: &[FsType] = &[FsType::Ext3, FsType::Ext4];
const XFS: &[FsType] = &[FsType::Xfs];
const EXT4_XFS: &[FsType] = &[FsType::Ext4, FsType::Xfs];
const ALL: &[FsType] = &[FsType::Ext2, FsType::Ext3, FsType::Ext4, FsType::Xfs];

/// Filesystem-specific options passed as mount data (ext4(5), xfs(5)):
/// behaviour and quota accounting, nothing that names a file.
const DATA_OPTIONS: [(&str, &[FsType]); 22] = [
    ("discard", EXT4_XFS),
    ("nodiscard", EXT4_XFS),
    ("barrier", EXT34),
    ("nobarrier", EXT34),
    ("data=ordered", EXT34),
    ("data=writeback", EXT34),
    ("errors=remount-ro", EXT),
    ("errors=continue", EXT),
    ("inode64", XFS),
    // Checked by the kernel against the filesystem's features; without
    // them the mount fails (INTERNAL), nothing else happens.
    ("quota", ALL),
    ("noquota", ALL),
    ("usrquota", ALL),
    ("grpquota", ALL),
    ("prjquota", EXT4_XFS),
    ("uquota", XFS),
    ("gquota", XFS),
    ("pquota", XFS),
    ("uqnoenforce", XFS),
    ("gqnoenforce", XFS),
    ("pqnoenforce", XFS),
    ("qnoenforce", XFS),
    // XFS is always mounted with nouuid (see crate::mount); asking again
    // changes nothing.
    ("nouuid", XFS),
];

/// The longest `commit=` interval accepted, in seconds (a day).
const MAX_COMMIT_SECONDS: u32 = 86_400;

/// SELinux file types a `context=` label may carry: those container
/// runtimes label container files with (container-selinux's
/// `container_file_t`, and its older alias).
const CONTAINER_FILE_TYPES: [&str; 2] = ["container_file_t", "svirt_sandbox_file_t"];

/// Parsed mount options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    /// Flags for `mount(2)`.
    pub flags: MountFlags,
    /// Filesystem data options, comma-joined for `mount(2)`'s `data`.
    pub data: Vec<String>,
}

/// Parses CSI `mount_flags` (each entry may itself hold comma-separated
/// options; commas inside double quotes, as in an SELinux level, do not
/// separate) for a filesystem of type `fs`; `None` means a bind mount,
/// where filesystem options are accepted if some filesystem allows them but
/// have no effect (the kernel ignores data on a bind mount).
///
/// # Errors
/// [`HelperError::MountOptionRefused`] naming the first option that is not
/// on the allowlist for `fs`, or whose value has not the accepted shape.
pub fn parse(fs: Option<FsType>, mount_flags: &[String]) -> Result<MountOptions, HelperError> {
    let mut parsed = MountOptions {
        flags: MountFlags::empty(),
        data: Vec::new(),
    };
    for option in mount_flags
        .iter()
        .flat_map(|f| split(f))
        .map(str::trim)
        .filter(|o| !o.is_empty())
    {
        if let Some((_, flag)) = FLAG_OPTIONS.iter().find(|(name, _)| *name == option) {
            parsed.flags |= *flag;
            continue;
        }
        let refused = || HelperError::MountOptionRefused(option.to_owned());
        let (data, filesystems) = data_option(option).ok_or_else(refused)?;
        match fs {
            Some(fs) if !filesystems.contains(&fs) => return Err(refused()),
            Some(_) if !parsed.data.contains(&data) => parsed.data.push(data),
            _ => {}
        }
    }
    Ok(parsed)
}

/// `option` as mount data and the filesystems that take it, if allowed.
fn data_option(option: &str) -> Option<(String, &'static [FsType])> {
    if let Some((_, filesystems)) = DATA_OPTIONS.iter().find(|(name, _)| *name == option) {
        return Some((option.to_owned(), filesystems));
    }
    let (name, value) = option.split_once('=')?;
    match name {
        "commit" if value.bytes().all(|b| b.is_ascii_digit()) => {
            let seconds: u32 = value.parse().ok().filter(|s| *s <= MAX_COMMIT_SECONDS)?;
            Some((format!("commit={seconds}"), EXT34))
        }
        "context" => container_label(value).map(|label| (format!("context=\"{label}\""), ALL)),
        _ => None,
    }
}

/// The SELinux label in `value` (`user:role:type[:level]`, optionally in
/// double quotes) if its type is a container file type and every part has
/// only the characters labels are made of.
fn container_label(value: &str) -> Option<&str> {
    let label = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    let mut parts = label.splitn(4, ':');
    let (user, role, kind) = (parts.next()?, parts.next()?, parts.next()?);
    let level = parts.next().unwrap_or("");
    let word = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let level_ok = level
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_.:,-".contains(&b));
    (word(user) && word(role) && CONTAINER_FILE_TYPES.contains(&kind) && level_ok).then_some(label)
}

/// `flags` split at the commas that are not inside double quotes.
fn split(flags: &str) -> Vec<&str> {
    let mut options = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in flags.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                options.push(&flags[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    options.push(&flags[start..]);
    options
}

#[cfg(test)]
#[path = "options_tests.rs"]
mod tests;
