//! `ebs-csi-agent devices`: the EBS volumes visible on this node, like
//! amazon-ec2-utils' `ebsnvme-id` for all of them at once.

use std::fmt::Write as _;
use std::path::Path;

use ebs_csi_helper_client::volume_of_serial;
use ebs_csi_linux::nvme;

use crate::{discovery, stats};

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

/// Lists the NVMe controllers whose serial is an EBS volume's (`vol…`),
/// sorted by volume id: the disks the node would stage for those volumes
/// (the same walk, [`discovery::nvme_controllers`]; the helper proves the
/// rest of the identity before it acts).
pub fn list(sys_dir: &Path, dev_dir: &Path) -> Vec<VisibleVolume> {
    let mut volumes: Vec<VisibleVolume> = discovery::nvme_controllers(sys_dir)
        .filter_map(|controller| {
            let volume_id = volume_of_serial(&controller.serial)?;
            let device = controller.namespace.map(|n| dev_dir.join(n));
            let requested_device_name = std::fs::File::open(dev_dir.join(&controller.name))
                .ok()
                .and_then(|f| nvme::identify_controller(&f).ok())
                .and_then(|id| id.requested_device_name);
            Some(VisibleVolume {
                volume_id: volume_id.to_string(),
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
    fn lists_controllers_with_volume_serials_only() {
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
