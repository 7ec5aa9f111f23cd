//! `/proc/self/mountinfo` (proc(5)): which filesystems are mounted where.

use std::io;

/// One line of mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// Unique id of the mount (field 1).
    pub mount_id: u64,
    /// Device number of the filesystem, major part (field 3).
    pub major: u32,
    /// Device number of the filesystem, minor part (field 3).
    pub minor: u32,
    /// The directory of the filesystem that forms this mount's root (field 4).
    pub root: String,
    /// Mount point, relative to the process's root (field 5).
    pub mount_point: String,
    /// Per-mount options such as `ro,nosuid` (field 6).
    pub mount_options: String,
    /// Filesystem type (first field after the `-` separator).
    pub fs_type: String,
}

impl MountEntry {
    /// Whether the per-mount options include `ro`.
    pub fn is_read_only(&self) -> bool {
        self.mount_options.split(',').any(|o| o == "ro")
    }
}

/// Reads and parses this process's mountinfo.
///
/// # Errors
/// The read error; unparsable lines are skipped.
pub fn read() -> io::Result<Vec<MountEntry>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// Parses mountinfo text; lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let mut fields = line.split(' ');
    let mount_id = fields.next()?.parse().ok()?;
    let _parent_id = fields.next()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let root = unescape(fields.next()?);
    let mount_point = unescape(fields.next()?);
    let mount_options = fields.next()?.to_owned();
    let fs_type = fields.skip_while(|f| *f != "-").nth(1)?.to_owned();
    Some(MountEntry {
        mount_id,
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        root,
        mount_point,
        mount_options,
        fs_type,
    })
}

/// Undoes the kernel's octal escapes (`\040` for space, `\011`, `\012`,
/// `\134`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let s = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(s, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
95 22 7:3 / /var/lib/kubelet/plugins/stage\\040dir rw,nosuid,nodev master:3 - xfs /dev/loop3 rw,nouuid
96 22 7:3 / /var/lib/kubelet/pods/p/mount ro,nosuid,nodev shared:4 - xfs /dev/loop3 rw
garbage line
";

    #[test]
    fn parses_entries_with_optional_fields_and_escapes() {
        let entries = parse(SAMPLE);
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[1].mount_point, "/var/lib/kubelet/plugins/stage dir");
        assert_eq!((entries[1].major, entries[1].minor), (7, 3));
        assert_eq!(entries[1].fs_type, "xfs");
        assert!(!entries[1].is_read_only());
        assert!(entries[2].is_read_only());
        assert_eq!(entries[0].root, "/");
    }
}
