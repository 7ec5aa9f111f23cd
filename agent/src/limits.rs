//! How many CSI volumes this node can attach, for NodeGetInfo's
//! `max_volumes_per_node`.
//!
//! Source: EC2's DescribeInstanceTypes (`EbsInfo.MaximumEbsAttachments`,
//! `EbsInfo.AttachmentLimitType`, `Hypervisor`) for every instance type, in
//! `agent/data/instance-types.tsv` (generated; its header names the
//! capture), and the Amazon EC2 User Guide, "Amazon EBS volume limits for
//! Amazon EC2 instances":
//! - *dedicated* limit types: `MaximumEbsAttachments` EBS volumes, whatever
//!   else is attached;
//! - *shared* limit types (most Nitro types): EBS volumes, network
//!   interfaces and NVMe instance-store volumes share the attachment slots;
//!   `MaximumEbsAttachments` already counts the instance store, the GPUs
//!   and the primary network interface, so each further interface takes
//!   one more;
//! - Xen types: network interfaces do not take EBS slots (the API calls
//!   them shared);
//! - types not in the table: 27, shared (28 slots less the primary
//!   interface, the most common value).
//!
//! The root volume and any other EBS volume the instance booted with take
//! their slots too (the reserved attachments).

use std::collections::HashMap;
use std::sync::LazyLock;

/// The generated table (instance type, hypervisor, limit type, maximum).
const TABLE: &str = include_str!("../data/instance-types.tsv");

/// `MaximumEbsAttachments` of a type not in the table.
const UNKNOWN_TYPE_MAXIMUM: u32 = 27;

/// What EC2 says of one instance type's EBS attachments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attachments {
    /// `EbsInfo.MaximumEbsAttachments`.
    pub maximum: u32,
    /// Whether further network interfaces take EBS slots: a shared limit
    /// on a type that is not Xen.
    pub shared_with_interfaces: bool,
}

static TYPES: LazyLock<HashMap<&'static str, Attachments>> = LazyLock::new(|| {
    TABLE
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let mut columns = line.split('\t');
            let (name, hypervisor, kind, maximum) =
                (columns.next()?, columns.next()?, columns.next()?, columns.next()?);
            let attachments = Attachments {
                maximum: maximum.parse().ok()?,
                shared_with_interfaces: kind == "shared" && hypervisor != "xen",
            };
            Some((name, attachments))
        })
        .collect()
});

/// EC2's facts for `instance_type`; a type not in the table is taken as
/// shared with [`UNKNOWN_TYPE_MAXIMUM`].
pub fn attachments(instance_type: &str) -> Attachments {
    TYPES.get(instance_type).copied().unwrap_or(Attachments {
        maximum: UNKNOWN_TYPE_MAXIMUM,
        shared_with_interfaces: true,
    })
}

/// What NodeGetInfo's limit is made of, beyond the node's metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSettings {
    /// `--volume-attach-limit`: reported as it is.
    pub fixed: Option<u32>,
    /// Attachments taken by boot volumes: `--reserved-volume-attachments`,
    /// or else the root volume and the EBS volumes in IMDS's
    /// `block-device-mapping/` (like the Go driver).
    pub reserved: u32,
}

impl LimitSettings {
    /// `max_volumes_per_node` for the node described by `metadata`.
    pub fn max_volumes(&self, metadata: &crate::metadata::NodeMetadata) -> u32 {
        self.fixed
            .unwrap_or_else(|| max_volumes(&metadata.instance_type, metadata.network_interfaces, self.reserved))
    }
}

/// The number of volumes the CSI driver may attach to an instance of
/// `instance_type` with `network_interfaces` attached interfaces and
/// `reserved` attachments taken by its boot volumes (root included): the
/// type's maximum less the reserved attachments and, where interfaces share
/// the slots, less every interface beyond the first. Never below 1.
pub fn max_volumes(instance_type: &str, network_interfaces: u32, reserved: u32) -> u32 {
    let Attachments {
        maximum,
        shared_with_interfaces,
    } = attachments(instance_type);
    let interfaces = if shared_with_interfaces {
        network_interfaces.saturating_sub(1)
    } else {
        0
    };
    maximum.saturating_sub(interfaces).saturating_sub(reserved).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_holds_every_generated_row() {
        let rows = TABLE.lines().filter(|l| !l.starts_with('#')).count();
        assert!(rows > 1000, "{rows} rows");
        assert_eq!(TYPES.len(), rows, "every row parses");
    }

    /// Expected values: EC2's MaximumEbsAttachments for the type (in the
    /// table) less the extra interfaces (shared types) and the reserved
    /// attachments.
    #[test]
    fn derives_limits_per_kind_of_instance() {
        for (instance_type, enis, reserved, expected) in [
            ("m5.large", 1, 1, 26),
            ("m5.large", 3, 1, 24),
            ("m5.large", 1, 3, 24),
            // One NVMe instance-store volume: EC2 says 26.
            ("m5d.large", 1, 1, 25),
            // One instance-store volume and one GPU: EC2 says 25.
            ("g4dn.xlarge", 1, 1, 24),
            // Dedicated: interfaces take no EBS slot.
            ("m7i.large", 8, 1, 31),
            ("m7i.48xlarge", 1, 1, 127),
            ("c8i.large", 1, 1, 31),
            ("c6i.metal", 1, 1, 30),
            ("p4d.24xlarge", 4, 1, 27),
            // Xen: 40, interfaces apart.
            ("t2.micro", 2, 1, 39),
            ("m4.xlarge", 4, 1, 39),
            ("z9.unknown", 1, 1, 26),
            ("z9.unknown", 2, 1, 25),
            ("m5.large", 40, 1, 1),
        ] {
            assert_eq!(
                max_volumes(instance_type, enis, reserved),
                expected,
                "{instance_type} with {enis} interfaces, {reserved} reserved"
            );
        }
    }
}
