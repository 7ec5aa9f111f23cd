//! How many CSI volumes an instance type can attach, for NodeGetInfo's
//! `max_volumes_per_node`.
//!
//! Source: Amazon EC2 User Guide, "Amazon EBS volume limits for Amazon EC2
//! instances" (instance volume limits) and DESIGN.md §5:
//! - Xen-based (previous generation) types: up to 39 attachments
//!   is the guidance for Linux;
//! - Nitro types with a *dedicated* EBS limit (the 7th-generation Intel and
//!   AMD and 8th-generation Graviton families below): 32 EBS volumes in
//!   their smaller sizes (larger sizes allow more; set
//!   `--volume-attach-limit` there);
//! - other Nitro types share 28 attachment slots between EBS volumes,
//!   network interfaces and NVMe instance-store volumes;
//! - unknown types: assumed to be shared-slot Nitro (the safe side).
//!
//! The root volume always takes one of the slots. NVMe instance-store
//! volumes (d-suffixed types) also take slots; their number is not known
//! here, so such nodes should set `--volume-attach-limit`.

/// Families whose instances have a dedicated EBS volume limit.
const DEDICATED_FAMILIES: [&str; 14] = [
    "c7a", "c7i", "c7i-flex", "m7a", "m7i", "m7i-flex", "r7a", "r7i", "r7iz", "c8g", "m8g", "r8g", "x8g", "i7ie",
];

/// Dedicated EBS limit of the smaller sizes of [`DEDICATED_FAMILIES`].
const DEDICATED_LIMIT: u32 = 32;

/// Families on the Xen hypervisor (previous generation).
const XEN_FAMILIES: [&str; 20] = [
    "c1", "c3", "c4", "cc2", "cr1", "d2", "f1", "g2", "g3", "g3s", "h1", "hs1", "i2", "m1", "m2", "m3", "m4", "p2",
    "p3", "r3",
];

/// Xen families matched only in some sizes or by a longer name.
const XEN_MORE: [&str; 5] = ["r4", "t1", "t2", "x1", "x1e"];

/// Attachment limit of Xen types (Linux guidance).
const XEN_LIMIT: u32 = 39;

/// Shared attachment slots of Nitro types.
const NITRO_SHARED_SLOTS: u32 = 28;

/// The number of volumes the CSI driver may attach to an instance of
/// `instance_type` with `network_interfaces` attached ENIs: the type's
/// limit minus the root volume (and, for shared slots, the ENIs).
pub fn max_volumes(instance_type: &str, network_interfaces: u32) -> u32 {
    let family = instance_type.split('.').next().unwrap_or_default();
    let is_metal = instance_type.ends_with(".metal");
    let total = if DEDICATED_FAMILIES.contains(&family) {
        DEDICATED_LIMIT
    } else if !is_metal && (XEN_FAMILIES.contains(&family) || XEN_MORE.contains(&family) || family == "i3") {
        XEN_LIMIT
    } else {
        NITRO_SHARED_SLOTS.saturating_sub(network_interfaces)
    };
    total.saturating_sub(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derives_limits_per_kind_of_instance() {
        for (instance_type, enis, expected) in [
            ("m5.large", 1, 26),
            ("m5.large", 3, 24),
            ("m7i.large", 1, 31),
            ("m7i.large", 8, 31),
            ("t2.micro", 1, 38),
            ("m4.xlarge", 2, 38),
            ("i3.large", 1, 38),
            ("i3.metal", 1, 26),
            ("z9.unknown", 1, 26),
            ("", 0, 27),
            ("m5.large", 40, 1),
        ] {
            assert_eq!(
                max_volumes(instance_type, enis),
                expected,
                "{instance_type} with {enis} ENIs"
            );
        }
    }
}
