//! Probing a device for existing data and creating a filesystem on a
//! blank one.
//!
//! A device is formatted only when `blkid -p` finds no signature at all:
//! no filesystem, no partition table, nothing else. The flags avoid work
//! that makes formatting a large EBS volume slow: no discard of the whole
//! device (ext `nodiscard`, xfs `-K`) and lazy inode-table and journal
//! initialisation on ext.

use ebs_csi_helper_proto::{FormatOptions, FsType, HelperError};

use crate::exec::{Executor, Tool};

/// What a device holds, according to `blkid -p`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Contents {
    /// No signature of any kind: safe to format.
    Blank,
    /// A filesystem of the named type (`ext4`, `xfs`, …).
    Filesystem(String),
    /// A partition table or a non-filesystem signature (LUKS, RAID
    /// member, …), described.
    Other(String),
}

/// Probes `device` with `blkid -p -o export` (low-level probe, no cache).
///
/// # Errors
/// [`HelperError::ToolFailed`] when blkid fails or is ambivalent (exit
/// status other than 0, or 2 meaning "nothing found").
pub fn probe(executor: &Executor, device: &str) -> Result<Contents, HelperError> {
    let output = executor.run(Tool::Blkid, &["-p", "-o", "export", "--", device])?;
    match output.status.code() {
        Some(0) => Ok(parse_blkid(&String::from_utf8_lossy(&output.stdout))),
        Some(2) => Ok(Contents::Blank),
        _ => Err(HelperError::ToolFailed {
            tool: Tool::Blkid.path()?,
            detail: format!("{}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim()),
        }),
    }
}

fn parse_blkid(export: &str) -> Contents {
    let value = |key: &str| {
        export
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_owned)
    };
    match (value("PTTYPE"), value("TYPE"), value("USAGE")) {
        (Some(table), _, _) => Contents::Other(format!("a {table} partition table")),
        (None, Some(fs), Some(usage)) if usage == "filesystem" => Contents::Filesystem(fs),
        (None, Some(kind), _) => Contents::Other(format!("a {kind} signature")),
        (None, None, _) => Contents::Other("an unidentified signature".to_owned()),
    }
}

/// The tool and argv that create `fs` on `device` with `options`
/// (already validated with [`FormatOptions::validate`]).
pub fn mkfs_command(fs: FsType, options: &FormatOptions, device: &str) -> (Tool, Vec<String>) {
    let mut args: Vec<String> = Vec::new();
    let tool = match fs {
        FsType::Xfs => {
            args.extend(["-q", "-K"].map(String::from));
            if let Some(size) = options.block_size {
                args.extend(["-b".into(), format!("size={size}")]);
            }
            if let Some(size) = options.inode_size {
                args.extend(["-i".into(), format!("size={size}")]);
            }
            Tool::MkfsXfs
        }
        ext => {
            let lazy = if ext == FsType::Ext2 {
                "nodiscard,lazy_itable_init=1"
            } else {
                "nodiscard,lazy_itable_init=1,lazy_journal_init=1"
            };
            args.extend(["-q", "-F", "-m0", "-E", lazy].map(String::from));
            let flags = [
                ("-b", options.block_size.map(u64::from)),
                ("-I", options.inode_size.map(u64::from)),
                ("-i", options.bytes_per_inode.map(u64::from)),
                ("-N", options.number_of_inodes),
                ("-C", options.ext4_cluster_size.map(u64::from)),
            ];
            for (flag, value) in flags {
                if let Some(value) = value {
                    args.extend([flag.to_owned(), value.to_string()]);
                }
            }
            if options.ext4_bigalloc {
                args.extend(["-O".into(), "bigalloc".into()]);
            }
            match ext {
                FsType::Ext2 => Tool::MkfsExt2,
                FsType::Ext3 => Tool::MkfsExt3,
                _ => Tool::MkfsExt4,
            }
        }
    };
    args.extend(["--".to_owned(), device.to_owned()]);
    (tool, args)
}

/// Creates `fs` on the blank `device`.
///
/// # Errors
/// [`HelperError::ToolFailed`] when mkfs fails.
pub fn format(executor: &Executor, fs: FsType, options: &FormatOptions, device: &str) -> Result<(), HelperError> {
    let (tool, args) = mkfs_command(fs, options, device);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    executor.run_checked(tool, &args).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_blkid_export_output() {
        assert_eq!(
            parse_blkid("DEVNAME=/dev/loop0\nUUID=x\nTYPE=ext4\nUSAGE=filesystem\n"),
            Contents::Filesystem("ext4".into())
        );
        assert_eq!(
            parse_blkid("DEVNAME=/dev/loop0\nPTUUID=x\nPTTYPE=gpt\n"),
            Contents::Other("a gpt partition table".into())
        );
        assert_eq!(
            parse_blkid("TYPE=crypto_LUKS\nUSAGE=crypto\n"),
            Contents::Other("a crypto_LUKS signature".into())
        );
        assert_eq!(
            parse_blkid("DEVNAME=/dev/loop0\n"),
            Contents::Other("an unidentified signature".into())
        );
    }

    #[test]
    fn builds_argv_without_discard_and_with_lazy_init() {
        let options = FormatOptions {
            block_size: Some(4096),
            inode_size: Some(256),
            bytes_per_inode: Some(16384),
            number_of_inodes: Some(1000),
            ext4_bigalloc: true,
            ext4_cluster_size: Some(65536),
        };
        let (tool, args) = mkfs_command(FsType::Ext4, &options, "/dev/nvme1n1");
        assert_eq!(tool, Tool::MkfsExt4);
        assert_eq!(
            args.join(" "),
            "-q -F -m0 -E nodiscard,lazy_itable_init=1,lazy_journal_init=1 -b 4096 -I 256 -i 16384 -N 1000 -C 65536 -O bigalloc -- /dev/nvme1n1"
        );
        let xfs = FormatOptions {
            block_size: Some(4096),
            inode_size: Some(512),
            ..FormatOptions::default()
        };
        let (tool, args) = mkfs_command(FsType::Xfs, &xfs, "/dev/nvme1n1");
        assert_eq!(tool, Tool::MkfsXfs);
        assert_eq!(args.join(" "), "-q -K -b size=4096 -i size=512 -- /dev/nvme1n1");
    }
}
