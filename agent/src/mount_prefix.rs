//! `--csi-mount-point-prefix`, as the Go driver takes it
//! (`pkg/driver/options.go`; `pkg/metrics/nvme.go`, `getCSIManagedDevices`):
//! the metrics report a volume only when one of its mounts, in this
//! process's mount table, is at a path that begins with the prefix,
//! cleaned lexically (Go's `filepath.Clean`) and followed by `/`.

use std::path::Path;

use ebs_csi_linux::mountinfo::MountEntry;

/// The prefix, cleaned, with its `/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountPointPrefix(String);

impl MountPointPrefix {
    /// `prefix` cleaned as Go's `filepath.Clean` cleans it, then `/`
    /// appended, as the Go driver does (so `/` gives `//`, and an empty
    /// prefix `./`: both match no mount point, as in the Go driver).
    pub fn new(prefix: &str) -> Self {
        Self(format!("{}/", clean(prefix)))
    }

    /// Whether the namespace `name` (e.g. `nvme1n1`), of device number
    /// `number` (sysfs `block/<name>/dev`), is mounted beneath the prefix
    /// in `mounts`: a filesystem on it, or a bind of its device node (a
    /// raw block volume: a devtmpfs mount whose root is `/<name>`).
    pub fn holds(&self, mounts: &[MountEntry], name: &str, number: Option<(u32, u32)>) -> bool {
        mounts.iter().filter(|m| m.mount_point.starts_with(&self.0)).any(|m| {
            Some((m.major, m.minor)) == number || (m.fs_type == "devtmpfs" && m.root.strip_prefix('/') == Some(name))
        })
    }
}

/// The device number sysfs gives for block device `name` under `sys_dir`
/// (`block/<name>/dev`, `MAJOR:MINOR`).
pub fn device_number(sys_dir: &Path, name: &str) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(sys_dir.join("block").join(name).join("dev")).ok()?;
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Go's `filepath.Clean` on Unix: one `/` between elements, no `.`
/// element, each `..` removed with the element before it (none beyond the
/// root), no trailing `/`; `.` for nothing.
fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut kept: Vec<&str> = Vec::new();
    for element in path.split('/').filter(|e| !e.is_empty() && *e != ".") {
        match element {
            ".." if kept.last().is_some_and(|last| *last != "..") => {
                kept.pop();
            }
            ".." if rooted => {}
            _ => kept.push(element),
        }
    }
    match (rooted, kept.join("/")) {
        (true, joined) => format!("/{joined}"),
        (false, joined) if joined.is_empty() => ".".to_owned(),
        (false, joined) => joined,
    }
}

#[cfg(test)]
mod tests {
    use ebs_csi_linux::mountinfo;

    use super::*;

    /// Go's own answers (`path/filepath`'s `Clean` examples and tests).
    #[test]
    fn cleans_as_go_does() {
        for (path, cleaned) in [
            ("", "."),
            ("/", "/"),
            ("/var/lib/kubelet/", "/var/lib/kubelet"),
            ("/test//unclean/../path", "/test/path"),
            ("a/c/..", "a"),
            ("../../a", "../../a"),
            ("/../a/./b", "/a/b"),
            ("abc/../..", ".."),
        ] {
            assert_eq!(clean(path), cleaned, "{path}");
        }
        assert_eq!(MountPointPrefix::new("/test//unclean/../path").0, "/test/path/");
    }

    #[test]
    fn holds_the_volumes_mounted_beneath_the_prefix_only() {
        let mounts = mountinfo::parse(concat!(
            "40 1 259:1 / /var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/ab/globalmount rw - ext4 /dev/nvme1n1 rw\n",
            "41 1 0:5 /nvme2n1 /var/lib/kubelet/pods/p/volumeDevices/kubernetes.io~csi/pv rw - devtmpfs udev rw\n",
            "42 1 259:3 / /mnt/data rw - xfs /dev/nvme3n1 rw\n",
            "43 1 259:4 / /var/lib/kubelet rw - ext4 /dev/nvme4n1 rw\n",
        ));
        let prefix = MountPointPrefix::new("/var/lib/kubelet");
        let held: Vec<&str> = [
            ("nvme1n1", (259, 1)),
            ("nvme2n1", (259, 2)),
            ("nvme3n1", (259, 3)),
            ("nvme4n1", (259, 4)),
        ]
        .into_iter()
        .filter(|(name, number)| prefix.holds(&mounts, name, Some(*number)))
        .map(|(name, _)| name)
        .collect();
        // nvme4n1 is mounted at the prefix itself, not beneath it.
        assert_eq!(held, ["nvme1n1", "nvme2n1"]);
        assert!(!MountPointPrefix::new("").holds(&mounts, "nvme1n1", Some((259, 1))));
    }
}
