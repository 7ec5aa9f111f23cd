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

use std::collections::BTreeMap;
use std::sync::LazyLock;

use ebs_csi_helper_proto::{FsType, HelperError};
use rustix::mount::MountFlags;
use serde::Deserialize;

/// The policy as reviewed data: every option taken, dropped or refused,
/// each refusal with its reason, each value's shape, with their sources.
const POLICY_TEXT: &str = include_str!("../policy/mount-options.json");

/// The policy, parsed once; [`check_policy`] at start stops a helper whose
/// policy does not parse.
static POLICY: LazyLock<Result<Policy, String>> = LazyLock::new(|| Policy::from_text(POLICY_TEXT));

/// helper/policy/mount-options.json, each table as its `about` describes
/// it (the `about` texts are for the reader).
#[derive(Debug, Deserialize)]
struct Text {
    flags: Table<BTreeMap<String, String>>,
    userspace_only: Table<Vec<String>>,
    refused: Table<BTreeMap<String, String>>,
    filesystems: Filesystems<FsOptions>,
    container_file_types: Types,
}

/// A table's rows.
#[derive(Debug, Deserialize)]
struct Table<T> {
    options: T,
}

/// A table per filesystem family, and one every filesystem takes.
#[derive(Debug, Deserialize)]
struct Filesystems<T> {
    ext: T,
    xfs: T,
    all: T,
}

/// A filesystem's options: without a value, and with one of a shape.
#[derive(Debug, Deserialize)]
struct FsOptions {
    flags: Vec<String>,
    values: BTreeMap<String, Value>,
}

/// The SELinux types a `context=` label may carry.
#[derive(Debug, Deserialize)]
struct Types {
    types: Vec<String>,
}

/// The policy the helper judges by: [`Text`] with its flags as `mount(2)`
/// flags.
#[derive(Debug)]
struct Policy {
    flags: BTreeMap<String, MountFlags>,
    userspace_only: Vec<String>,
    refused: BTreeMap<String, String>,
    filesystems: Filesystems<FsOptions>,
    container_file_types: Vec<String>,
}

impl Policy {
    /// The policy `text` gives.
    ///
    /// # Errors
    /// The JSON error, a flag name rustix's `MountFlags` does not have, or a
    /// refusal without its reason.
    fn from_text(text: &str) -> Result<Self, String> {
        let text: Text = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let flags = text
            .flags
            .options
            .into_iter()
            .map(|(option, flag)| match flag.as_str() {
                "" => Ok((option, MountFlags::empty())),
                name => MountFlags::from_name(name)
                    .map(|parsed| (option.clone(), parsed))
                    .ok_or_else(|| format!("{option}: {flag:?} is not a mount(2) flag")),
            })
            .collect::<Result<_, _>>()?;
        if let Some((option, _)) = text.refused.options.iter().find(|(_, why)| why.trim().is_empty()) {
            return Err(format!("{option} is refused without a reason"));
        }
        Ok(Self {
            flags,
            userspace_only: text.userspace_only.options,
            refused: text.refused.options,
            filesystems: text.filesystems,
            container_file_types: text.container_file_types.types,
        })
    }
}

/// Parses the mount-option policy, so that one that does not parse stops
/// the helper at start.
///
/// # Errors
/// Why it does not parse.
pub fn check_policy() -> Result<(), String> {
    POLICY.as_ref().map(drop).map_err(Clone::clone)
}

/// The shape a value must have: one of the words the kernel documents, or
/// a [`Shape`].
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum Value {
    /// One of these words.
    OneOf(Vec<String>),
    /// Of this shape.
    Shape(Shape),
}

/// A value's shape, named in the policy.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Shape {
    /// A decimal number that fits 32 bits; the kernel checks its range.
    Number,
    /// A number of bytes with an optional `k`, `m` or `g` (binary units).
    Size,
    /// A file in the filesystem's root directory (a quota file).
    FileName,
    /// An SELinux label of a container file type (see [`container_label`]).
    ContainerLabel,
}

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
/// have no effect (the kernel ignores data on a bind mount). The policy is
/// helper/policy/mount-options.json.
///
/// # Errors
/// [`HelperError::MountOptionRefused`] naming the first option refused and
/// why: one the policy refuses, one `fs` does not take, a value not of its
/// documented shape, or an option unknown to mount(8), ext4 and XFS (and
/// naming the policy's error, were it not to parse).
pub fn parse(fs: Option<FsType>, mount_flags: &[String]) -> Result<MountOptions, HelperError> {
    let policy = POLICY
        .as_ref()
        .map_err(|e| HelperError::MountOptionRefused(e.clone()))?;
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
        if let Some(flag) = policy.flags.get(option) {
            parsed.flags |= *flag;
            continue;
        }
        if policy.userspace_only(option) {
            continue;
        }
        let data = policy.data_option(fs, option)?;
        if fs.is_some() && !parsed.data.contains(&data) {
            parsed.data.push(data);
        }
    }
    Ok(parsed)
}

impl Policy {
    /// Whether mount(8) drops `option` before calling the kernel.
    fn userspace_only(&self, option: &str) -> bool {
        self.userspace_only.iter().any(|o| o == option) || option.starts_with("x-") || option.starts_with("comment=")
    }

    /// `option` as mount data for `fs` (any of ext2/3/4 and XFS when `None`).
    fn data_option(&self, fs: Option<FsType>, option: &str) -> Result<String, HelperError> {
        let (name, value) = option.split_once('=').map_or((option, None), |(n, v)| (n, Some(v)));
        let refuse = |reason: &str| Err(HelperError::MountOptionRefused(format!("{option:?} refused: {reason}")));
        if let Some(reason) = self.refused.get(option).or_else(|| self.refused.get(name)) {
            return refuse(reason);
        }
        let ext = matches!(fs, None | Some(FsType::Ext2 | FsType::Ext3 | FsType::Ext4));
        let xfs = matches!(fs, None | Some(FsType::Xfs));
        let Filesystems {
            ext: ext_options,
            xfs: xfs_options,
            all,
        } = &self.filesystems;
        let tables = [(ext_options, ext), (xfs_options, xfs), (all, true)];
        let mut taken = tables.iter().filter(|(_, takes)| *takes).map(|(table, _)| *table);
        let Some(value) = value else {
            return if taken.any(|t| t.flags.iter().any(|f| f == name)) {
                Ok(option.to_owned())
            } else {
                refuse(&unknown(fs))
            };
        };
        let Some(shape) = taken.find_map(|t| t.values.get(name)) else {
            return refuse(&unknown(fs));
        };
        match shape {
            Value::Shape(Shape::ContainerLabel) => {
                self.container_label(value).map(|label| format!("context=\"{label}\""))
            }
            shape => self.admits(shape, value).then(|| option.to_owned()),
        }
        .map_or_else(|| refuse(&format!("the value must be {}", self.describe(shape))), Ok)
    }

    /// Whether `value` has the shape `shape`.
    fn admits(&self, shape: &Value, value: &str) -> bool {
        let number = |v: &str| !v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit());
        match shape {
            Value::OneOf(words) => words.iter().any(|w| w == value),
            Value::Shape(Shape::Number) => number(value) && value.parse::<u32>().is_ok(),
            Value::Shape(Shape::Size) => number(value.trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G'])),
            Value::Shape(Shape::FileName) => {
                let name = |b: u8| b.is_ascii_alphanumeric() || b"._-".contains(&b);
                !value.is_empty() && value != "." && value != ".." && value.bytes().all(name)
            }
            Value::Shape(Shape::ContainerLabel) => self.container_label(value).is_some(),
        }
    }

    /// The shape `shape` in words, for a refusal.
    fn describe(&self, shape: &Value) -> String {
        match shape {
            Value::OneOf(words) => format!("one of {}", words.join(", ")),
            Value::Shape(Shape::Number) => "a decimal number".to_owned(),
            Value::Shape(Shape::Size) => "a size in bytes, with an optional k, m or g".to_owned(),
            Value::Shape(Shape::FileName) => "a file name in the filesystem's root directory".to_owned(),
            Value::Shape(Shape::ContainerLabel) => {
                format!("an SELinux label of type {}", self.container_file_types.join(" or "))
            }
        }
    }

    /// The SELinux label in `value` (`user:role:type[:level]`, optionally
    /// in double quotes) if its type is one of the policy's container file
    /// types and every part has only the characters labels are made of.
    fn container_label<'v>(&self, value: &'v str) -> Option<&'v str> {
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
        let container = self.container_file_types.iter().any(|t| t == kind);
        (word(user) && word(role) && container && level_ok).then_some(label)
    }
}

/// Why an option nobody on the lists takes is refused.
fn unknown(fs: Option<FsType>) -> String {
    let fs = fs.map_or("a bind mount", FsType::name);
    format!("not an option mount(8) or the kernel documents for {fs}")
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
