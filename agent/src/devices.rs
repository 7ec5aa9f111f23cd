//! `ebs-csi-agent devices`: the EBS volumes visible on this node, like
//! amazon-ec2-utils' `ebsnvme-id` for all of them at once.

use std::fmt::Write as _;
use std::path::Path;

use ebs_csi_linux::nvme::{self, EBS_MODEL};

use crate::stats;

/// One EBS volume seen in sysfs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisibleVolume {
    /// `vol-…`.
    pub volume_id: String,
    /// The namespace's device node, e.g. `/dev/nvme1n1`; `None` while the
    /// namespace has not appeared.
    pub device: Option<String>,
    /// The name given to AttachVolume, from Identify Controller; `None`
    /// when the ioctl is not permitted (kernels before 6.2 without
    /// CAP_SYS_ADMIN) or the area is empty.
    pub requested_device_name: Option<String>,
    /// Size in bytes.
    pub size_bytes: Option<u64>,
}

/// Lists the NVMe controllers under `sys_dir/class/nvme` whose model is
/// EBS's, sorted by volume id.
pub fn list(sys_dir: &Path, dev_dir: &Path) -> Vec<VisibleVolume> {
    let Ok(controllers) = std::fs::read_dir(sys_dir.join("class/nvme")) else {
        return Vec::new();
    };
    let read = |path: &Path| std::fs::read_to_string(path).map(|s| s.trim().to_owned()).ok();
    let mut volumes: Vec<VisibleVolume> = controllers
        .flatten()
        .filter(|c| read(&c.path().join("model")).as_deref() == Some(EBS_MODEL))
        .filter_map(|controller| {
            let serial = read(&controller.path().join("serial"))?;
            let name = controller.file_name().into_string().ok()?;
            let namespace = std::fs::read_dir(controller.path())
                .ok()?
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .find(|n| n.strip_prefix(&name).is_some_and(|r| r.starts_with('n')));
            let device = namespace.map(|n| dev_dir.join(n));
            let requested_device_name = std::fs::File::open(dev_dir.join(&name))
                .ok()
                .and_then(|f| nvme::identify_controller(&f).ok())
                .and_then(|id| id.requested_device_name);
            Some(VisibleVolume {
                volume_id: serial
                    .strip_prefix("vol")
                    .map_or_else(|| serial.clone(), |hex| format!("vol-{hex}")),
                size_bytes: device.as_deref().and_then(|d| stats::block_device_size(d, sys_dir)),
                device: device.map(|d| d.display().to_string()),
                requested_device_name,
            })
        })
        .collect();
    volumes.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
    volumes
}

/// Renders `volumes` as an aligned table.
pub fn table(volumes: &[VisibleVolume]) -> String {
    let mut out = format!(
        "{:<22} {:<16} {:<12} {:>16}\n",
        "VOLUME ID", "DEVICE", "REQUESTED", "SIZE (BYTES)"
    );
    for v in volumes {
        let dash = || "-".to_owned();
        let _ = writeln!(
            out,
            "{:<22} {:<16} {:<12} {:>16}",
            v.volume_id,
            v.device.clone().unwrap_or_else(dash),
            v.requested_device_name.clone().unwrap_or_else(dash),
            v.size_bytes.map_or_else(dash, |s| s.to_string())
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_ebs_controllers_only() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys/class/nvme");
        for (name, model, serial) in [
            ("nvme0", "Amazon Elastic Block Store", "vol0123456789abcdef0"),
            ("nvme1", "Amazon EC2 NVMe Instance Storage", "AWS1234"),
        ] {
            std::fs::create_dir_all(sys.join(name).join(format!("{name}n1"))).unwrap();
            std::fs::write(sys.join(name).join("model"), format!("{model}\n")).unwrap();
            std::fs::write(sys.join(name).join("serial"), format!("{serial}  \n")).unwrap();
        }
        let volumes = list(&dir.path().join("sys"), Path::new("/nonexistent"));
        assert_eq!(
            volumes,
            vec![VisibleVolume {
                volume_id: "vol-0123456789abcdef0".into(),
                device: Some("/nonexistent/nvme0n1".into()),
                requested_device_name: None,
                size_bytes: None
            }]
        );
        assert!(table(&volumes).contains("vol-0123456789abcdef0  /nonexistent/nvme0n1"));
    }
}
