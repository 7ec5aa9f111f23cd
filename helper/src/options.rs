//! Mount options: only those on an allowlist, turned into `mount(2)`
//! flags and filesystem data.
//!
//! Options that weaken the node (`suid`, `dev`, `exec` of other
//! filesystems' semantics, `user`, `context=`, …) are not on the list; a
//! request with any option not on it is refused as a whole.

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

/// Filesystem-specific options passed as mount data (ext4(5), xfs(5)).
const DATA_OPTIONS: [(&str, &[FsType]); 10] = [
    ("discard", &[FsType::Ext4, FsType::Xfs]),
    ("nodiscard", &[FsType::Ext4, FsType::Xfs]),
    ("barrier", &[FsType::Ext3, FsType::Ext4]),
    ("nobarrier", &[FsType::Ext3, FsType::Ext4]),
    ("data=ordered", &[FsType::Ext3, FsType::Ext4]),
    ("data=writeback", &[FsType::Ext3, FsType::Ext4]),
    ("errors=remount-ro", &[FsType::Ext2, FsType::Ext3, FsType::Ext4]),
    ("errors=continue", &[FsType::Ext2, FsType::Ext3, FsType::Ext4]),
    ("noquota", &[FsType::Xfs]),
    ("inode64", &[FsType::Xfs]),
];

/// Parsed mount options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    /// Flags for `mount(2)`.
    pub flags: MountFlags,
    /// Filesystem data options, comma-joined for `mount(2)`'s `data`.
    pub data: Vec<&'static str>,
}

/// Parses CSI `mount_flags` (each entry may itself hold comma-separated
/// options) for a filesystem of type `fs`; `None` means a bind mount, where
/// filesystem options are accepted if some filesystem allows them but have
/// no effect (the kernel ignores data on a bind remount).
///
/// # Errors
/// [`HelperError::MountOptionRefused`] naming the first option that is not
/// on the allowlist for `fs`.
pub fn parse(fs: Option<FsType>, mount_flags: &[String]) -> Result<MountOptions, HelperError> {
    let mut parsed = MountOptions {
        flags: MountFlags::empty(),
        data: Vec::new(),
    };
    for option in mount_flags
        .iter()
        .flat_map(|f| f.split(','))
        .map(str::trim)
        .filter(|o| !o.is_empty())
    {
        if let Some((_, flag)) = FLAG_OPTIONS.iter().find(|(name, _)| *name == option) {
            parsed.flags |= *flag;
            continue;
        }
        let (name, filesystems) = DATA_OPTIONS
            .iter()
            .find(|(name, _)| *name == option)
            .ok_or_else(|| HelperError::MountOptionRefused(option.to_owned()))?;
        match fs {
            Some(fs) if filesystems.contains(&fs) => parsed.data.push(name),
            Some(_) => return Err(HelperError::MountOptionRefused(option.to_owned())),
            None => {}
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(options: &[&str]) -> Vec<String> {
        options.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn maps_allowed_options() {
        let parsed = parse(Some(FsType::Ext4), &strings(&["noatime,discard", "nodiratime", "rw"])).unwrap();
        assert_eq!(parsed.flags, MountFlags::NOATIME | MountFlags::NODIRATIME);
        assert_eq!(parsed.data, vec!["discard"]);
        let bind = parse(None, &strings(&["ro", "discard"])).unwrap();
        assert_eq!(
            bind,
            MountOptions {
                flags: MountFlags::RDONLY,
                data: vec![]
            }
        );
    }

    #[test]
    fn refuses_everything_else() {
        for (fs, option) in [
            (Some(FsType::Ext4), "suid"),
            (Some(FsType::Ext4), "dev"),
            (Some(FsType::Ext4), "exec"),
            (Some(FsType::Ext4), "user"),
            (Some(FsType::Ext4), "context=system_u:object_r:x"),
            (Some(FsType::Ext4), "noatime,bind"),
            (Some(FsType::Xfs), "nobarrier"),
            (Some(FsType::Ext2), "discard"),
            (Some(FsType::Ext4), "data=journal"),
            (None, "rbind"),
            (None, "x-mount.mkdir"),
        ] {
            let err = parse(fs, &strings(&[option])).unwrap_err();
            assert!(matches!(err, HelperError::MountOptionRefused(_)), "{option}");
        }
    }
}
