//! EBS volume types and the limits the driver needs to build a request:
//! sizes and IOPS from the EC2 API Reference, CreateVolume (as in
//! aws-sdk-ec2 1.274: gp3 up to 64 TiB and 80,000 IOPS), the IOPS-per-GiB
//! ratios from the Amazon EBS User Guide, "Amazon EBS volume types". A
//! size is chosen within a type's range (CSI's capacity range against it)
//! and IOPS are raised or capped as the Go driver does, so those limits
//! shape the request. Throughput shapes nothing: it goes to EC2 as asked,
//! and EC2's own refusal (`InvalidParameterValue`) reaches the CO as
//! INVALID_ARGUMENT with EC2's message, so a limit EC2 raises is taken the
//! day it is raised.

use crate::error::ControllerError;

/// Provisioned-IOPS limits of a type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IopsLimits {
    /// Minimum IOPS.
    pub min: i32,
    /// Maximum IOPS.
    pub max: i32,
    /// Maximum IOPS per GiB of size.
    pub per_gib: i32,
    /// EC2 requires an IOPS value at creation (io1, io2).
    pub required: bool,
}

/// One volume type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeType {
    /// EC2's name.
    pub name: &'static str,
    /// Smallest size, GiB.
    pub min_gib: i32,
    /// Largest size, GiB.
    pub max_gib: i32,
    /// IOPS settings, where the type has them.
    pub iops: Option<IopsLimits>,
    /// Supports Multi-Attach (io1, io2).
    pub multi_attach: bool,
}

/// The type used when a StorageClass names none (as the Go driver).
pub const DEFAULT: &str = "gp3";

const TYPES: [VolumeType; 7] = [
    VolumeType {
        name: "gp2",
        min_gib: 1,
        max_gib: 16_384,
        iops: None,
        multi_attach: false,
    },
    VolumeType {
        name: "gp3",
        min_gib: 1,
        max_gib: 65_536,
        iops: Some(IopsLimits {
            min: 3_000,
            max: 80_000,
            per_gib: 500,
            required: false,
        }),
        multi_attach: false,
    },
    VolumeType {
        name: "io1",
        min_gib: 4,
        max_gib: 16_384,
        iops: Some(IopsLimits {
            min: 100,
            max: 64_000,
            per_gib: 50,
            required: true,
        }),
        multi_attach: true,
    },
    VolumeType {
        name: "io2",
        min_gib: 4,
        max_gib: 65_536,
        iops: Some(IopsLimits {
            min: 100,
            max: 256_000,
            per_gib: 1_000,
            required: true,
        }),
        multi_attach: true,
    },
    VolumeType {
        name: "st1",
        min_gib: 125,
        max_gib: 16_384,
        iops: None,
        multi_attach: false,
    },
    VolumeType {
        name: "sc1",
        min_gib: 125,
        max_gib: 16_384,
        iops: None,
        multi_attach: false,
    },
    VolumeType {
        name: "standard",
        min_gib: 1,
        max_gib: 1_024,
        iops: None,
        multi_attach: false,
    },
];

/// The IOPS maximum an EC2 refusal names: "Volume iops of 200000 is too
/// high; maximum is 80000" (gp3, io1), or for io2 "io2 volumes configured
/// with greater than 64 TiB or 256K IOPS or 1000:1 IOPS:GB ratio are not
/// supported" (the two messages the Go driver's `nonIo2ErrRegex` and
/// `io2ErrRegex` in `pkg/cloud/cloud.go` are written for, quoted there).
pub fn max_iops_in(message: &str) -> Option<i32> {
    let lower = message.to_ascii_lowercase();
    let leading_number = |text: &str| -> Option<i32> {
        let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    if lower.contains("volume iops") && lower.contains("is too high") {
        return leading_number(lower.split("maximum is ").nth(1)?);
    }
    let before = lower.split("k iops").next().filter(|b| b.len() < lower.len())?;
    let start = before.rfind(|c: char| !c.is_ascii_digit()).map_or(0, |i| i + 1);
    leading_number(&before[start..])?.checked_mul(1000)
}

/// Looks a type up by EC2 name (case-insensitive).
///
/// # Errors
/// INVALID_ARGUMENT listing the known types.
pub fn lookup(name: &str) -> Result<VolumeType, ControllerError> {
    TYPES
        .iter()
        .copied()
        .find(|t| t.name.eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            let names: Vec<&str> = TYPES.iter().map(|t| t.name).collect();
            ControllerError::InvalidArgument(format!("volume type {name:?} is not one of {}", names.join(", ")))
        })
}

impl VolumeType {
    /// Checks a size in GiB.
    ///
    /// # Errors
    /// OUT_OF_RANGE naming the type's size range.
    pub fn check_size(&self, size_gib: i64) -> Result<(), ControllerError> {
        if size_gib < i64::from(self.min_gib) || size_gib > i64::from(self.max_gib) {
            return Err(ControllerError::OutOfRange(format!(
                "{} volumes must be {}–{} GiB, not {size_gib} GiB",
                self.name, self.min_gib, self.max_gib
            )));
        }
        Ok(())
    }

    /// This type with another IOPS maximum (one EC2 named for a zone).
    pub fn with_max_iops(mut self, max: i32) -> Self {
        if let Some(limits) = self.iops.as_mut() {
            limits.max = max;
        }
        self
    }

    /// The IOPS to provision for `size_gib`: `iops` if given, else
    /// `iops`, or `iops_per_gib × size`, as the Go driver's `capIOPS`
    /// makes it (pkg/cloud/cloud.go): raised to the type's minimum with
    /// `allow_increase` (`allowAutoIOPSPerGBIncrease`), capped at its
    /// maximum, then at its IOPS per GiB when that still leaves the
    /// minimum; without either key the type's default (none).
    ///
    /// # Errors
    /// INVALID_ARGUMENT when the result is below the minimum or, for a
    /// volume too small for the minimum, above the IOPS per GiB (EC2 would
    /// refuse both), or when IOPS are given for a type without them or
    /// missing for io1/io2.
    pub fn resolve_iops(
        &self,
        size_gib: i32,
        iops: Option<i32>,
        iops_per_gib: Option<i32>,
        allow_increase: bool,
    ) -> Result<Option<i32>, ControllerError> {
        let invalid = |m: String| Err(ControllerError::InvalidArgument(m));
        let Some(limits) = self.iops else {
            return if iops.is_some() || iops_per_gib.is_some() {
                invalid(format!("{} volumes do not take provisioned IOPS", self.name))
            } else {
                Ok(None)
            };
        };
        let requested = match (iops, iops_per_gib) {
            (Some(iops), _) => iops,
            (None, Some(per_gib)) => per_gib.saturating_mul(size_gib),
            (None, None) if limits.required => return invalid(format!("{} volumes need iops or iopsPerGB", self.name)),
            (None, None) => return Ok(None),
        };
        let mut iops = requested;
        if iops < limits.min && allow_increase {
            iops = limits.min;
        }
        iops = iops.min(limits.max);
        let by_size = limits.per_gib.saturating_mul(size_gib);
        if iops > by_size && by_size >= limits.min {
            iops = by_size;
        }
        if iops != requested {
            tracing::info!(
                requested,
                iops,
                size_gib,
                volume_type = self.name,
                "IOPS adjusted to the type's limits"
            );
        }
        if iops < limits.min {
            return invalid(format!(
                "{} volumes take at least {} IOPS, not {iops}",
                self.name, limits.min
            ));
        }
        // The minimum is allowed at any size (a 1 GiB gp3 volume has 3,000).
        let allowed = by_size.max(limits.min);
        if iops > allowed {
            return invalid(format!(
                "{iops} IOPS exceed the {allowed} a {size_gib} GiB {} volume takes ({} IOPS per GiB, at least {})",
                self.name, limits.per_gib, limits.min
            ));
        }
        Ok(Some(iops))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two refusals the Go driver's regexes are written for, and
    /// others that name no maximum.
    #[test]
    fn finds_the_maximum_ec2_names() {
        let gp3 = "Volume iops of 200000 is too high; maximum is 80000";
        assert_eq!(max_iops_in(gp3), Some(80_000));
        let io2 =
            "io2 volumes configured with greater than 64 TiB or 256K IOPS or 1000:1 IOPS:GB ratio are not supported";
        assert_eq!(max_iops_in(io2), Some(256_000));
        assert_eq!(
            max_iops_in("Iops to volume size ratio of 61 is too high; maximum is 50"),
            None
        );
        assert_eq!(
            max_iops_in("Request would have succeeded, but DryRun flag is set."),
            None
        );
        assert_eq!(lookup("gp3").unwrap().with_max_iops(16_000).iops.unwrap().max, 16_000);
    }

    #[test]
    fn checks_sizes_per_type() {
        assert!(lookup("GP3").unwrap().check_size(1).is_ok());
        assert!(
            matches!(lookup("io1").unwrap().check_size(2), Err(ControllerError::OutOfRange(m)) if m.contains("4–16384"))
        );
        assert!(lookup("st1").unwrap().check_size(100).is_err());
        assert!(lookup("io2").unwrap().check_size(65_536).is_ok());
        assert!(lookup("standard").unwrap().check_size(1_025).is_err());
        assert!(lookup("gp4").is_err());
    }

    #[test]
    fn resolves_iops_like_the_go_driver() {
        let io1 = lookup("io1").unwrap();
        assert_eq!(io1.resolve_iops(100, None, Some(10), false).unwrap(), Some(1_000));
        assert_eq!(
            io1.resolve_iops(10_000, None, Some(50), false).unwrap(),
            Some(64_000),
            "capped at the maximum"
        );
        assert_eq!(
            io1.resolve_iops(4, None, Some(10), false).unwrap_err().to_string(),
            "io1 volumes take at least 100 IOPS, not 40",
            "40 < 100 without auto increase"
        );
        assert_eq!(io1.resolve_iops(4, None, Some(10), true).unwrap(), Some(100));
        assert!(io1.resolve_iops(10, None, None, false).is_err(), "io1 needs IOPS");
        assert_eq!(
            io1.resolve_iops(10, Some(1_000), None, false).unwrap(),
            Some(500),
            "capped at 50 IOPS per GiB"
        );
        assert_eq!(
            io1.resolve_iops(2_000, Some(70_000), None, false).unwrap(),
            Some(64_000),
            "capped at the maximum"
        );
        let gp3 = lookup("gp3").unwrap();
        assert_eq!(gp3.resolve_iops(10, None, None, false).unwrap(), None);
        assert_eq!(gp3.resolve_iops(100, Some(20_000), None, false).unwrap(), Some(20_000));
        assert_eq!(
            gp3.resolve_iops(1_000, Some(90_000), None, false).unwrap(),
            Some(80_000)
        );
        assert_eq!(gp3.resolve_iops(1, Some(3_000), None, false).unwrap(), Some(3_000));
        assert_eq!(
            gp3.resolve_iops(5, Some(4_000), None, false).unwrap_err().to_string(),
            "4000 IOPS exceed the 3000 a 5 GiB gp3 volume takes (500 IOPS per GiB, at least 3000)",
            "too small to take more than the minimum: EC2 would refuse"
        );
        assert!(
            lookup("gp2")
                .unwrap()
                .resolve_iops(100, Some(3_000), None, false)
                .is_err()
        );
    }
}
