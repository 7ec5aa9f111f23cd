//! The volume an NVMe controller's serial names, as the agent finds its
//! devices (the helper proves the other way: `VolumeId::nvme_serial`).

use ebs_csi_helper_proto::VolumeId;

/// The volume whose NVMe serial is `serial` (`vol0123456789abcdef0`: the
/// id without its dash, as EBS fills the Identify Controller data's serial
/// number); `None` for any serial that is not an EBS volume's.
pub fn volume_of_serial(serial: &str) -> Option<VolumeId> {
    VolumeId::parse(&format!("vol-{}", serial.strip_prefix("vol")?)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_ebs_serial_names_a_volume() {
        let id = VolumeId::parse("vol-0123456789abcdef0").unwrap();
        assert_eq!(volume_of_serial(&id.nvme_serial()), Some(id));
        for serial in ["AWS1234", "vol", "vol-0123456789abcdef0", "vol0123456789ABCDEF0"] {
            assert_eq!(volume_of_serial(serial), None, "{serial}");
        }
    }
}
