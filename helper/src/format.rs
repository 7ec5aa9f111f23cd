//! Probing a device for existing data and creating a filesystem on a
//! blank one.
//!
//! A device is formatted only when it is proven blank: `blkid -p`, run on
//! the verified fd, finds no signature at all (no filesystem, no partition
//! table, nothing else) and prints nothing on stderr, and the helper itself
//! reads the device's first and last MiB through the same fd without
//! error. blkid's "nothing found" status (2) is also what it answers for a
//! path it cannot open or read (util-linux misc-utils/blkid.c), so that
//! status alone proves nothing. The mkfs flags avoid work that makes
//! formatting a large EBS volume slow: no discard of the whole device (ext
//! `nodiscard`, xfs `-K`) and lazy inode-table and journal initialisation
//! on ext.

use std::os::fd::BorrowedFd;
use std::process::Output;

use ebs_csi_helper_proto::{FormatOptions, FsType, HelperError};

use crate::device::VerifiedDevice;
use crate::error::system;
use crate::exec::{DEVICE_ARG, Executor, Tool, ToolTarget};

/// What a device holds, according to `blkid -p`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Contents {
    /// No signature of any kind, and readable at both ends: safe to format.
    Blank,
    /// A filesystem of the named type (`ext4`, `xfs`, …).
    Filesystem(String),
    /// A partition table or a non-filesystem signature (LUKS, RAID
    /// member, …), described.
    Other(String),
}

/// How much of each end of the device the helper reads itself before it
/// calls the device blank, in bytes: more than where any filesystem or
/// partition table keeps its signatures at the start (GPT, ext, XFS, LVM,
/// LUKS) or at the end (the backup GPT, md 0.9/1.0 superblocks).
pub const BLANK_PROOF_BYTES: u64 = 1 << 20;

/// Probes `device` with `blkid -p -o export` (low-level probe, no cache)
/// on its verified fd.
///
/// # Errors
/// [`HelperError::ToolFailed`] when blkid fails, or answers "nothing
/// found" with something on stderr; [`HelperError::System`] when the
/// device cannot be read at both ends; [`HelperError::DeviceRefused`] when
/// the device changed before blkid ran.
pub fn probe(executor: &Executor, device: &VerifiedDevice) -> Result<Contents, HelperError> {
    let output = executor.run(
        Tool::Blkid,
        &["-p", "-o", "export", "--", DEVICE_ARG],
        ToolTarget::Device(device),
    )?;
    interpret_blkid(&output, || read_both_ends(device.fd(), device.size_bytes()?))
}

/// blkid's answer, with "nothing found" accepted only when `read_ends`
/// proves the device readable.
fn interpret_blkid(
    output: &Output,
    read_ends: impl FnOnce() -> Result<(), HelperError>,
) -> Result<Contents, HelperError> {
    match output.status.code() {
        Some(0) => Ok(parse_blkid(&String::from_utf8_lossy(&output.stdout))),
        Some(2) if output.stderr.is_empty() && output.stdout.is_empty() => read_ends().map(|()| Contents::Blank),
        _ => Err(HelperError::ToolFailed {
            tool: Tool::Blkid.path()?,
            detail: format!("{}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim()),
        }),
    }
}

/// Reads the first and the last [`BLANK_PROOF_BYTES`] of a device of
/// `size` bytes through `fd`.
///
/// # Errors
/// [`HelperError::System`] on a read error or a short read (EOF early).
pub fn read_both_ends(fd: BorrowedFd<'_>, size: u64) -> Result<(), HelperError> {
    if size == 0 {
        return Err(system("proving the device blank", "the device is empty"));
    }
    let len = BLANK_PROOF_BYTES.min(size);
    let mut buffer = vec![0u8; usize::try_from(len).map_err(|e| system("proving the device blank", e))?];
    for offset in [0, size - len] {
        let mut done = 0;
        while done < buffer.len() {
            let at = offset + done as u64;
            match rustix::io::pread(fd, &mut buffer[done..], at) {
                Ok(0) => return Err(system("proving the device blank", format!("end of data at byte {at}"))),
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(system("proving the device blank", format!("reading byte {at}: {e}"))),
            }
        }
    }
    Ok(())
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

/// The tool and argv that create `fs` with `options` (already validated
/// with [`FormatOptions::validate`]) on the device the tool gets as fd 3.
pub fn mkfs_command(fs: FsType, options: &FormatOptions) -> (Tool, Vec<String>) {
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
            let features: Vec<&str> = [
                (options.ext4_bigalloc, "bigalloc"),
                (options.ext4_encryption, "encrypt"),
            ]
            .into_iter()
            .filter_map(|(on, feature)| on.then_some(feature))
            .collect();
            if !features.is_empty() {
                args.extend(["-O".into(), features.join(",")]);
            }
            match ext {
                FsType::Ext2 => Tool::MkfsExt2,
                FsType::Ext3 => Tool::MkfsExt3,
                _ => Tool::MkfsExt4,
            }
        }
    };
    args.extend(["--".to_owned(), DEVICE_ARG.to_owned()]);
    (tool, args)
}

/// Creates `fs` on the blank `device`, then verifies the device again.
///
/// # Errors
/// [`HelperError::ToolFailed`] when mkfs fails or runs out of time;
/// [`HelperError::DeviceRefused`] when the device changed before or
/// during the format.
pub fn format(
    executor: &Executor,
    fs: FsType,
    options: &FormatOptions,
    device: &VerifiedDevice,
) -> Result<(), HelperError> {
    let (tool, args) = mkfs_command(fs, options);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    executor.run_checked(tool, &args, ToolTarget::Device(device))?;
    device.reverify()
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

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
            ext4_encryption: true,
        };
        let (tool, args) = mkfs_command(FsType::Ext4, &options);
        assert_eq!(tool, Tool::MkfsExt4);
        assert_eq!(
            args.join(" "),
            "-q -F -m0 -E nodiscard,lazy_itable_init=1,lazy_journal_init=1 -b 4096 -I 256 -i 16384 -N 1000 -C 65536 -O bigalloc,encrypt -- /proc/self/fd/3"
        );
        let xfs = FormatOptions {
            block_size: Some(4096),
            inode_size: Some(512),
            ..FormatOptions::default()
        };
        let (tool, args) = mkfs_command(FsType::Xfs, &xfs);
        assert_eq!(tool, Tool::MkfsXfs);
        assert_eq!(args.join(" "), "-q -K -b size=4096 -i size=512 -- /proc/self/fd/3");
    }

    fn blkid_output(code: i32, stdout: &str, stderr: &str) -> Output {
        use std::os::unix::process::ExitStatusExt;
        Output {
            status: std::process::ExitStatus::from_raw(code << 8),
            stdout: stdout.into(),
            stderr: stderr.into(),
        }
    }

    /// blkid's "nothing found" is blank only when the helper's own read of
    /// both ends worked and blkid said nothing else.
    #[test]
    fn nothing_found_is_blank_only_when_proven() {
        let readable = || Ok(());
        let unreadable = || Err(system("proving the device blank", "EIO"));
        assert_eq!(interpret_blkid(&blkid_output(2, "", ""), readable), Ok(Contents::Blank));
        assert_eq!(
            interpret_blkid(&blkid_output(2, "", ""), unreadable),
            Err(system("proving the device blank", "EIO"))
        );
        let open_failed = interpret_blkid(
            &blkid_output(2, "", "blkid: error: /x: No such file or directory"),
            readable,
        );
        assert!(
            matches!(open_failed, Err(HelperError::ToolFailed { ref detail, .. }) if detail.contains("No such file")),
            "{open_failed:?}"
        );
        assert!(matches!(
            interpret_blkid(&blkid_output(4, "", ""), readable),
            Err(HelperError::ToolFailed { .. })
        ));
        assert_eq!(
            interpret_blkid(&blkid_output(0, "TYPE=xfs\nUSAGE=filesystem\n", ""), unreadable),
            Ok(Contents::Filesystem("xfs".into()))
        );
    }

    /// The helper's own read fails on what cannot be read to the stated
    /// size: a missing device's stand-in (/dev/null reads nothing), a
    /// directory, a file shorter than it claims.
    #[test]
    fn reading_both_ends_fails_on_what_cannot_be_read() {
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(
            read_both_ends(null.as_fd(), 4 << 20),
            Err(system("proving the device blank", "end of data at byte 0"))
        );
        let dir = tempfile::tempdir().unwrap();
        let directory = std::fs::File::open(dir.path()).unwrap();
        assert!(matches!(
            read_both_ends(directory.as_fd(), 4 << 20),
            Err(HelperError::System { .. })
        ));
        let file = dir.path().join("short");
        std::fs::write(&file, vec![0u8; 3 << 20]).unwrap();
        let short = std::fs::File::open(&file).unwrap();
        assert_eq!(
            read_both_ends(short.as_fd(), 8 << 20),
            Err(system(
                "proving the device blank",
                format!("end of data at byte {}", 7 << 20)
            ))
        );
        read_both_ends(short.as_fd(), 3 << 20).unwrap();
        assert!(read_both_ends(short.as_fd(), 0).is_err());
    }
}
