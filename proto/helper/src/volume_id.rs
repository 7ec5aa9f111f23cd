//! The EBS volume id, validated once at the edge.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An EBS volume id: `vol-` followed by 8 or 17 lowercase hex digits
/// (EC2 API reference, "Resource IDs"). Holding one proves the format.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VolumeId(String);

/// A string that is not an EBS volume id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an EBS volume id (vol- and 8 or 17 hex digits)")]
pub struct InvalidVolumeId(pub String);

impl VolumeId {
    /// Parses `id`.
    ///
    /// # Errors
    /// [`InvalidVolumeId`] when `id` is not `vol-` plus 8 or 17 lowercase
    /// hex digits.
    pub fn parse(id: &str) -> Result<Self, InvalidVolumeId> {
        let valid = id.strip_prefix("vol-").is_some_and(|hex| {
            matches!(hex.len(), 8 | 17) && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if valid {
            Ok(Self(id.to_owned()))
        } else {
            Err(InvalidVolumeId(id.to_owned()))
        }
    }

    /// The id as EC2 writes it, e.g. `vol-0123456789abcdef0`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id without its dash, e.g. `vol0123456789abcdef0`: the serial
    /// number EBS reports in the NVMe Identify Controller data.
    pub fn nvme_serial(&self) -> String {
        self.0.replacen('-', "", 1)
    }
}

impl TryFrom<String> for VolumeId {
    type Error = InvalidVolumeId;
    fn try_from(id: String) -> Result<Self, Self::Error> {
        Self::parse(&id)
    }
}

impl From<VolumeId> for String {
    fn from(id: VolumeId) -> Self {
        id.0
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_both_id_lengths() {
        for id in ["vol-0123abcd", "vol-0123456789abcdef0"] {
            assert_eq!(VolumeId::parse(id).unwrap().as_str(), id);
        }
        let id = VolumeId::parse("vol-0123456789abcdef0").unwrap();
        assert_eq!(id.nvme_serial(), "vol0123456789abcdef0");
    }

    #[test]
    fn refuses_everything_else() {
        for id in [
            "",
            "vol-",
            "vol-0123abc",
            "vol-0123456789ABCDEF0",
            "vol-0123456789abcdef",
            "vol-0123456789abcdef01",
            "snap-0123456789abcdef0",
            "vol-0123abcd/../x",
            "vol0123456789abcdef0",
        ] {
            assert!(VolumeId::parse(id).is_err(), "{id:?} accepted");
        }
    }
}
