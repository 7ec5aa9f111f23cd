//! Formatting options: the Go driver's StorageClass parameters, carried in
//! a volume's `volume_context` from the controller to the node (read and
//! written there by `ebs_csi_proto::format_context`, which the helper does
//! not link), and to the helper in a Stage request.

use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use crate::FsType;

/// Formatting options, named after the Go driver's StorageClass
/// parameters. `None` leaves the tool's default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormatOptions {
    /// `blockSize`: filesystem block size in bytes (ext: `-b`, xfs: `-b size=`).
    pub block_size: Option<u32>,
    /// `inodeSize`: inode size in bytes (ext: `-I`, xfs: `-i size=`).
    pub inode_size: Option<u32>,
    /// `bytesPerInode`: bytes of space per inode (ext only: `-i`).
    pub bytes_per_inode: Option<u32>,
    /// `numberOfInodes`: total inode count (ext only: `-N`).
    pub number_of_inodes: Option<u64>,
    /// `ext4BigAlloc`: enable the bigalloc feature (ext4 only: `-O bigalloc`).
    pub ext4_bigalloc: bool,
    /// `ext4ClusterSize`: cluster size in bytes with bigalloc (ext4 only: `-C`).
    pub ext4_cluster_size: Option<u32>,
    /// `ext4EncryptionSupport`: enable the encrypt feature, for fscrypt
    /// (ext4 only: `-O encrypt`). Added in protocol version 5, and sent only
    /// when set, so that older helpers refuse it rather than ignore it
    /// (the agent's `ebs_csi_helper_client::version`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ext4_encryption: bool,
    /// The node's `--legacy-xfs` (the Go driver's, for nodes whose kernel
    /// is 5.4 or older): XFS without the features those kernels cannot
    /// mount, `mkfs.xfs -m bigtime=0,inobtcount=0,reflink=0` as the Go
    /// driver formats it (`pkg/driver/node.go`). XFS only; added in protocol
    /// version 6 and sent only when set, as `ext4_encryption`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub xfs_legacy: bool,
}

impl FormatOptions {
    /// Checks the options against `fs`: each value in the range its tool
    /// accepts (mke2fs(8), mkfs.xfs(8)), ext-only options refused for XFS,
    /// bigalloc options for ext4 only.
    ///
    /// # Errors
    /// A message naming the option and its limit.
    pub fn validate(&self, fs: FsType) -> Result<(), String> {
        let ext = fs != FsType::Xfs;
        let check = |name: &str, value: Option<u64>, range: RangeInclusive<u64>, power_of_two: bool| match value {
            Some(v) if !range.contains(&v) || (power_of_two && !v.is_power_of_two()) => Err(format!(
                "{name}={v} is outside {}..={}{} for {}",
                range.start(),
                range.end(),
                if power_of_two { " or not a power of two" } else { "" },
                fs.name()
            )),
            _ => Ok(()),
        };
        let block_min = if ext { 1024 } else { 512 };
        let (inode_min, inode_max) = if ext { (128, 4096) } else { (256, 2048) };
        check("blockSize", self.block_size.map(u64::from), block_min..=65536, true)?;
        check("inodeSize", self.inode_size.map(u64::from), inode_min..=inode_max, true)?;
        check(
            "bytesPerInode",
            self.bytes_per_inode.map(u64::from),
            1024..=67_108_864,
            false,
        )?;
        check("numberOfInodes", self.number_of_inodes, 1..=u64::from(u32::MAX), false)?;
        check(
            "ext4ClusterSize",
            self.ext4_cluster_size.map(u64::from),
            2048..=268_435_456,
            true,
        )?;
        let only = |name: &str, set: bool, allowed: bool| {
            if set && !allowed {
                Err(format!("{name} is not supported for {}", fs.name()))
            } else {
                Ok(())
            }
        };
        only("bytesPerInode", self.bytes_per_inode.is_some(), ext)?;
        only("numberOfInodes", self.number_of_inodes.is_some(), ext)?;
        only("ext4BigAlloc", self.ext4_bigalloc, fs == FsType::Ext4)?;
        only("ext4EncryptionSupport", self.ext4_encryption, fs == FsType::Ext4)?;
        only("--legacy-xfs", self.xfs_legacy, fs == FsType::Xfs)?;
        only(
            "ext4ClusterSize",
            self.ext4_cluster_size.is_some(),
            fs == FsType::Ext4 && self.ext4_bigalloc,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_values_outside_the_tools_limits() {
        let cases: [(FsType, FormatOptions); 8] = [
            (
                FsType::Ext4,
                FormatOptions {
                    block_size: Some(3000),
                    ..Default::default()
                },
            ),
            (
                FsType::Ext4,
                FormatOptions {
                    block_size: Some(512),
                    ..Default::default()
                },
            ),
            (
                FsType::Xfs,
                FormatOptions {
                    inode_size: Some(128),
                    ..Default::default()
                },
            ),
            (
                FsType::Xfs,
                FormatOptions {
                    bytes_per_inode: Some(4096),
                    ..Default::default()
                },
            ),
            (
                FsType::Xfs,
                FormatOptions {
                    number_of_inodes: Some(10),
                    ..Default::default()
                },
            ),
            (
                FsType::Ext3,
                FormatOptions {
                    ext4_bigalloc: true,
                    ..Default::default()
                },
            ),
            (
                FsType::Ext4,
                FormatOptions {
                    ext4_cluster_size: Some(65536),
                    ..Default::default()
                },
            ),
            (
                FsType::Ext4,
                FormatOptions {
                    number_of_inodes: Some(0),
                    ..Default::default()
                },
            ),
        ];
        for (fs, options) in cases {
            assert!(options.validate(fs).is_err(), "{fs:?} {options:?}");
        }
        let encrypt = FormatOptions {
            ext4_encryption: true,
            ..Default::default()
        };
        assert_eq!(
            encrypt.validate(FsType::Xfs).unwrap_err(),
            "ext4EncryptionSupport is not supported for xfs"
        );
        let good = FormatOptions {
            block_size: Some(4096),
            inode_size: Some(256),
            ext4_bigalloc: true,
            ext4_cluster_size: Some(65536),
            ext4_encryption: true,
            ..Default::default()
        };
        good.validate(FsType::Ext4).unwrap();
    }
}
