//! The SMBIOS (DMI) attributes the kernel exposes under `/sys/class/dmi/id`
//! (drivers/firmware/dmi-id.c; the three read here are mode 0444, so no
//! privilege is needed).
//!
//! On an instance built on the Nitro System, `sys_vendor` is `Amazon EC2`,
//! `product_name` the instance type (`t3.micro`) and `board_asset_tag` the
//! instance id (Amazon EC2 User Guide, "Detect whether a host is an EC2
//! instance"). Xen instances have no instance id there. No attribute gives
//! the availability zone.

use std::path::{Path, PathBuf};

use super::Found;

/// `sys_vendor` on EC2.
const EC2_VENDOR: &str = "Amazon EC2";

/// Why the DMI attributes give no instance.
#[derive(Debug, thiserror::Error)]
pub enum DmiError {
    /// An attribute could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The attribute file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The system vendor is not EC2's.
    #[error("the system vendor is {0:?}, not {EC2_VENDOR:?}")]
    NotEc2(String),
    /// The board asset tag is not an instance id (a Xen instance).
    #[error("the board asset tag {0:?} is not an instance id (not a Nitro instance)")]
    NoInstanceId(String),
}

/// Reads the instance id and type from the attributes in `dir`.
///
/// # Errors
/// [`DmiError`]: an attribute unreadable, another vendor, or no instance id.
pub fn read(dir: &Path) -> Result<Found, DmiError> {
    let attribute = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path)
            .map(|v| v.trim().to_owned())
            .map_err(|source| DmiError::Read { path, source })
    };
    let vendor = attribute("sys_vendor")?;
    if vendor != EC2_VENDOR {
        return Err(DmiError::NotEc2(vendor));
    }
    let asset_tag = attribute("board_asset_tag")?;
    if !is_instance_id(&asset_tag) {
        return Err(DmiError::NoInstanceId(asset_tag));
    }
    let instance_type = attribute("product_name")?;
    Ok(Found {
        instance_id: Some(asset_tag),
        instance_type: (!instance_type.is_empty()).then_some(instance_type),
        ..Found::default()
    })
}

/// `i-` and 8 or 17 lowercase hex digits (EC2 API Reference, "Instance":
/// `InstanceId`).
fn is_instance_id(value: &str) -> bool {
    value.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17) && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}
