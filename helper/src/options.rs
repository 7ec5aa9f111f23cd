//! Mount options: what mount(8) accepts for ext2/3/4 and XFS, judged one
//! by one into `mount(2)` flags, filesystem data for the kernel (which
//! checks it against the filesystem), options dropped as mount(8) drops
//! them, or a refusal with its reason.
//!
//! Refused are only the options that give a pod more than its volume:
//! `suid` and `dev` (the helper mounts `nosuid,nodev` always), options
//! naming another file or device (`journal_path=`, `logdev=`, …),
//! `errors=panic`, and operations of mount(8) written as options (`bind`,
//! `remount`). Options with a value are accepted only in the shape the
//! kernel documents (a number, a size, one of its words). `context=` is
//! accepted only with an SELinux label of a container file type (what
//! kubelet passes when the CSIDriver has `seLinuxMount`).

use ebs_csi_helper_proto::{FsType, HelperError};
use rustix::mount::MountFlags;

/// Per-mount options that map to `mount(2)` flags, and those that ask for
/// what the kernel does anyway (mount(8), "FILESYSTEM-INDEPENDENT MOUNT
/// OPTIONS": `exec`, `async`, `atime`, `diratime`, `nomand`, `loud` are
/// the defaults; the atime default is `relatime`).
const FLAG_OPTIONS: [(&str, MountFlags); 22] = [
    ("defaults", MountFlags::empty()),
    ("rw", MountFlags::empty()),
    ("exec", MountFlags::empty()),
    ("async", MountFlags::empty()),
    ("atime", MountFlags::empty()),
    ("diratime", MountFlags::empty()),
    ("nostrictatime", MountFlags::empty()),
    ("nolazytime", MountFlags::empty()),
    ("nomand", MountFlags::empty()),
    ("loud", MountFlags::empty()),
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
    ("nosymfollow", MountFlags::NOSYMFOLLOW),
];

/// Options mount(8) keeps to itself and never passes to the kernel
/// (mount(8), fstab(5)): dropped here as there. Besides these, every
/// `x-*` option and `comment=`.
const USERSPACE_ONLY: [&str; 5] = ["nofail", "_netdev", "auto", "noauto", "nouser"];

/// Options refused, each with its reason.
const REFUSED: [(&str, &str); 17] = [
    ("suid", SETUID),
    ("dev", "device nodes on the volume would open the node's devices"),
    ("user", FSTAB_USERS),
    ("users", FSTAB_USERS),
    ("owner", FSTAB_USERS),
    ("group", FSTAB_USERS),
    ("bind", OPERATION),
    ("rbind", OPERATION),
    ("remount", OPERATION),
    ("move", OPERATION),
    (
        "errors=panic",
        "an inconsistency in the volume's filesystem would panic the node",
    ),
    ("abort", "a debugging option that breaks the filesystem on purpose"),
    ("test_dummy_encryption", "a test option of the kernel"),
    ("journal_path", NAMES_A_DEVICE),
    ("journal_dev", NAMES_A_DEVICE),
    ("logdev", NAMES_A_DEVICE),
    ("rtdev", NAMES_A_DEVICE),
];
const SETUID: &str = "set-user-ID files on the volume would run with their owner's rights on the node";
const FSTAB_USERS: &str = "lets users mount it from fstab; a CSI mount has no fstab entry";
const OPERATION: &str = "an operation of mount(8), not an option of a mount";
const NAMES_A_DEVICE: &str = "names a device or file other than the volume, which the helper cannot prove";

/// ext2/3/4 options without a value (the kernel's
/// Documentation/admin-guide/ext4.rst, "Mount Options"; the ext4 driver
/// serves ext2 and ext3 too and checks each against the filesystem).
const EXT_FLAGS: [&str; 43] = [
    "barrier",
    "nobarrier",
    "journal_checksum",
    "nojournal_checksum",
    "journal_async_commit",
    "norecovery",
    "noload",
    "user_xattr",
    "nouser_xattr",
    "acl",
    "noacl",
    "bsddf",
    "minixdf",
    "debug",
    "grpid",
    "bsdgroups",
    "nogrpid",
    "sysvgroups",
    "quota",
    "noquota",
    "usrquota",
    "grpquota",
    "prjquota",
    "delalloc",
    "nodelalloc",
    "auto_da_alloc",
    "noauto_da_alloc",
    "init_itable",
    "noinit_itable",
    "discard",
    "nodiscard",
    "nouid32",
    "block_validity",
    "noblock_validity",
    "dioread_lock",
    "dioread_nolock",
    "i_version",
    "dax",
    "prefetch_block_bitmaps",
    "no_prefetch_block_bitmaps",
    "nombcache",
    "inlinecrypt",
    "oldalloc",
];

/// ext2/3/4 options with a value, and its shape (ext4.rst).
const EXT_VALUES: [(&str, Value); 21] = [
    ("data", Value::OneOf(&["journal", "ordered", "writeback"])),
    ("errors", Value::OneOf(&["remount-ro", "continue"])),
    ("data_err", Value::OneOf(&["ignore", "abort"])),
    ("commit", Value::Number),
    ("barrier", Value::OneOf(&["0", "1"])),
    ("inode_readahead_blks", Value::Number),
    ("resgid", Value::Number),
    ("resuid", Value::Number),
    ("sb", Value::Number),
    ("jqfmt", Value::OneOf(&["vfsold", "vfsv0", "vfsv1"])),
    ("usrjquota", Value::FileName),
    ("grpjquota", Value::FileName),
    ("stripe", Value::Number),
    ("max_batch_time", Value::Number),
    ("min_batch_time", Value::Number),
    ("journal_ioprio", Value::Number),
    ("auto_da_alloc", Value::OneOf(&["0", "1"])),
    ("init_itable", Value::Number),
    ("max_dir_size_kb", Value::Number),
    ("mb_optimize_scan", Value::OneOf(&["0", "1"])),
    ("dax", Value::OneOf(&["always", "never", "inode"])),
];

/// XFS options without a value (the kernel's
/// Documentation/admin-guide/xfs.rst, "Mount Options"; deprecated ones are
/// the kernel's to refuse).
const XFS_FLAGS: [&str; 35] = [
    "attr2",
    "noattr2",
    "discard",
    "nodiscard",
    "grpid",
    "bsdgroups",
    "nogrpid",
    "sysvgroups",
    "filestreams",
    "ikeep",
    "noikeep",
    "inode32",
    "inode64",
    "largeio",
    "nolargeio",
    "noalign",
    "norecovery",
    "nouuid",
    "noquota",
    "uquota",
    "usrquota",
    "uqnoenforce",
    "quota",
    "qnoenforce",
    "gquota",
    "grpquota",
    "gqnoenforce",
    "pquota",
    "prjquota",
    "pqnoenforce",
    "swalloc",
    "wsync",
    "dax",
    "lifetime",
    "nolifetime",
];

/// XFS options with a value, and its shape (xfs.rst).
const XFS_VALUES: [(&str, Value); 8] = [
    ("allocsize", Value::Size),
    ("logbufs", Value::Number),
    ("logbsize", Value::Size),
    ("sunit", Value::Number),
    ("swidth", Value::Number),
    ("dax", Value::OneOf(&["always", "never", "inode"])),
    ("max_open_zones", Value::Number),
    ("max_atomic_write", Value::Size),
];

/// Options with a value every filesystem takes: the SELinux label
/// (selinux(8), "context=").
const COMMON_VALUES: [(&str, Value); 1] = [("context", Value::ContainerLabel)];

/// The shape a value must have.
#[derive(Clone, Copy, Debug)]
enum Value {
    /// A decimal number that fits 32 bits; the kernel checks its range.
    Number,
    /// A number of bytes with an optional `k`, `m` or `g` (binary units).
    Size,
    /// One of the words the kernel documents.
    OneOf(&'static [&'static str]),
    /// A file in the filesystem's root directory (a quota file).
    FileName,
    /// An SELinux label of a container file type (see [`container_label`]).
    ContainerLabel,
}

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
/// where filesystem options are accepted if ext2/3/4 or XFS takes them but
/// have no effect (the kernel ignores data on a bind mount).
///
/// # Errors
/// [`HelperError::MountOptionRefused`] naming the first option refused and
/// why: one in [`REFUSED`], one `fs` does not take, a value not of its
/// documented shape, or an option unknown to mount(8), ext4 and XFS.
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
        if userspace_only(option) {
            continue;
        }
        let data = data_option(fs, option)?;
        if fs.is_some() && !parsed.data.contains(&data) {
            parsed.data.push(data);
        }
    }
    Ok(parsed)
}

/// Whether mount(8) drops `option` before calling the kernel.
fn userspace_only(option: &str) -> bool {
    USERSPACE_ONLY.contains(&option) || option.starts_with("x-") || option.starts_with("comment=")
}

/// `option` as mount data for `fs` (any of ext2/3/4 and XFS when `None`).
fn data_option(fs: Option<FsType>, option: &str) -> Result<String, HelperError> {
    let (name, value) = option.split_once('=').map_or((option, None), |(n, v)| (n, Some(v)));
    let refuse = |reason: &str| Err(HelperError::MountOptionRefused(format!("{option:?} refused: {reason}")));
    if let Some((_, reason)) = REFUSED
        .iter()
        .find(|(refused, _)| *refused == option || *refused == name)
    {
        return refuse(reason);
    }
    let ext = matches!(fs, None | Some(FsType::Ext2 | FsType::Ext3 | FsType::Ext4));
    let xfs = matches!(fs, None | Some(FsType::Xfs));
    let Some(value) = value else {
        let known = (ext && EXT_FLAGS.contains(&name)) || (xfs && XFS_FLAGS.contains(&name));
        return if known {
            Ok(option.to_owned())
        } else {
            refuse(&unknown(fs))
        };
    };
    let tables: [(&[(&str, Value)], bool); 3] = [(&EXT_VALUES, ext), (&XFS_VALUES, xfs), (&COMMON_VALUES, true)];
    let Some(shape) = tables
        .iter()
        .filter(|(_, takes)| *takes)
        .flat_map(|(table, _)| table.iter())
        .find_map(|(n, shape)| (*n == name).then_some(*shape))
    else {
        return refuse(&unknown(fs));
    };
    match shape {
        Value::ContainerLabel => container_label(value).map(|label| format!("context=\"{label}\"")),
        shape => shape.admits(value).then(|| option.to_owned()),
    }
    .map_or_else(|| refuse(&format!("the value must be {}", shape.describe())), Ok)
}

/// Why an option nobody on the lists takes is refused.
fn unknown(fs: Option<FsType>) -> String {
    let fs = fs.map_or("a bind mount", FsType::name);
    format!("not an option mount(8) or the kernel documents for {fs}")
}

impl Value {
    /// Whether `value` has this shape.
    fn admits(self, value: &str) -> bool {
        let number = |v: &str| !v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit());
        match self {
            Value::Number => number(value) && value.parse::<u32>().is_ok(),
            Value::Size => number(value.trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G'])),
            Value::OneOf(words) => words.contains(&value),
            Value::FileName => {
                let name = |b: u8| b.is_ascii_alphanumeric() || b"._-".contains(&b);
                !value.is_empty() && value != "." && value != ".." && value.bytes().all(name)
            }
            Value::ContainerLabel => container_label(value).is_some(),
        }
    }

    /// The shape in words, for a refusal.
    fn describe(self) -> String {
        match self {
            Value::Number => "a decimal number".to_owned(),
            Value::Size => "a size in bytes, with an optional k, m or g".to_owned(),
            Value::OneOf(words) => format!("one of {}", words.join(", ")),
            Value::FileName => "a file name in the filesystem's root directory".to_owned(),
            Value::ContainerLabel => "an SELinux label of type container_file_t (or svirt_sandbox_file_t)".to_owned(),
        }
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
