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
//! - Xen types: no volume can be staged ([`XenInstance`]): their EBS
//!   volumes are not NVMe devices, so nothing proves a device is the
//!   volume named;
//! - types not in the table: 27, shared (28 slots less the primary
//!   interface, the most common value), Nitro.
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
    /// Whether the type runs on Xen (`Hypervisor` `xen`).
    pub xen: bool,
}

/// A node whose instance type runs on Xen, where ebs-csi stages no volume:
/// Xen presents EBS volumes as `xvd` block devices without an NVMe
/// controller, so there is no Identify Controller serial to prove a device
/// is the volume named, and the helper touches no device it cannot prove.
/// NodeGetInfo answers FAILED_PRECONDITION, so kubelet does not register
/// the driver on the node (and the startup taint stays).
#[derive(Debug, thiserror::Error)]
#[error(
    "instance type {0} runs on Xen: its EBS volumes are not NVMe devices, so the helper cannot prove a device is the volume named, and no volume is staged on this node; use a Nitro instance type"
)]
pub struct XenInstance(pub String);

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
                xen: hypervisor == "xen",
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
        xen: false,
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
    /// `max_volumes_per_node` for an instance of `instance_type` with
    /// `network_interfaces` attached interfaces.
    ///
    /// # Errors
    /// [`XenInstance`] on a Xen type, whatever the settings.
    pub fn max_volumes(&self, instance_type: &str, network_interfaces: u32) -> Result<u32, XenInstance> {
        if attachments(instance_type).xen {
            return Err(XenInstance(instance_type.to_owned()));
        }
        Ok(self
            .fixed
            .unwrap_or_else(|| max_volumes(instance_type, network_interfaces, self.reserved)))
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
        ..
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
            // G4ad: missing from moto's capture (agent/data/generate.py).
            ("g4ad.xlarge", 1, 1, 24),
            ("g4ad.16xlarge", 2, 1, 19),
            // Metal types the API calls shared, dedicated in fact
            // (agent/data/generate.py): the first the Go driver listed,
            // then one of each 8th- and 9th-generation family it added
            // by v1.64.0 (interfaces take no slot).
            ("i7i.metal-48xl", 4, 1, 78),
            ("x8i.metal-96xl", 1, 1, 78),
            ("c8id.metal-96xl", 4, 1, 78),
            ("c8ib.metal-48xl", 2, 1, 63),
            ("m8in.metal-96xl", 2, 1, 77),
            ("m8idb.metal-48xl", 2, 1, 63),
            ("m8gn.metal-24xl", 2, 1, 38),
            ("r8idn.metal-96xl", 2, 1, 77),
            ("i8g.metal-48xl", 2, 1, 78),
            ("c9gd.metal-48xl", 2, 1, 78),
            ("m9g.metal-48xl", 2, 1, 78),
            // Not in the Go driver's list: the API's shared limit.
            ("r9g.metal-48xl", 2, 1, 77),
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

    #[test]
    fn a_xen_type_takes_no_volume_whatever_the_settings() {
        for fixed in [None, Some(20)] {
            let settings = LimitSettings { fixed, reserved: 1 };
            for xen in ["t2.micro", "m4.xlarge", "c4.large", "i3.large"] {
                assert_eq!(
                    settings.max_volumes(xen, 1).unwrap_err().to_string(),
                    format!(
                        "instance type {xen} runs on Xen: its EBS volumes are not NVMe devices, so the helper cannot prove a device is the volume named, and no volume is staged on this node; use a Nitro instance type"
                    )
                );
            }
            assert!(settings.max_volumes("m5.large", 1).is_ok());
        }
    }
}
