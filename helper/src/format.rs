//! Probing a device for existing data and creating a filesystem on a
//! blank one.
//!
//! A device is formatted only when it is proven blank: the helper reads,
//! on the verified fd, every byte libblkid's probers may look at on a
//! device without signatures ([`PROBED_BYTES`] at each end), and finds them
//! all zero, with no read error. There blkid would find nothing, so it is
//! not run (a new EBS volume reads as zeros). Otherwise `blkid -p` names
//! what the device holds (a volume restored from a snapshot holds a
//! filesystem); its "nothing found" status (2) then means data no prober
//! recognises — also what blkid answers for a device it cannot open, and
//! when one prober's read fails, libblkid aborts the whole probe, silently
//! and with that same status (util-linux
//! `libblkid/src/superblocks/superblocks.c`, `superblocks_probe`: a
//! negative prober result breaks the loop) — and is never taken for
//! blank. The mkfs flags avoid work that makes formatting a large EBS
//! volume slow: no discard of the whole device (ext `nodiscard`, xfs `-K`)
//! and lazy inode-table and journal initialisation on ext.

use std::os::fd::{AsFd, BorrowedFd};
use std::process::Output;
use std::sync::mpsc;
use std::time::Duration;

use ebs_csi_helper_proto::{FormatOptions, FsType, HelperError};

use crate::claim::Claim;
use crate::device::VerifiedDevice;
use crate::error::Operation;
use crate::exec::{self, DEVICE_ARG, Executor, Tool, ToolTarget};

/// What a device holds, according to the helper's own read and `blkid -p`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Contents {
    /// No signature of any kind, and every probed byte readable and zero:
    /// safe to format.
    Blank,
    /// A filesystem of the named type (`ext4`, `xfs`, …).
    Filesystem(String),
    /// A partition table, a non-filesystem signature (LUKS, RAID member,
    /// …) or data no prober recognises, described.
    Other(String),
}

/// How much of each end of a device the helper reads itself, and requires
/// to be zero, before it calls the device blank, in bytes: every offset a
/// prober of libblkid (util-linux 2.38–2.41, `libblkid/src/superblocks/`
/// and `partitions/`) reads on a device without signatures lies in the
/// first or the last 8 MiB. The farthest from the start are the LUKS2
/// secondary headers (`luks.c`, `secondary_offsets`: 16 KiB to 4 MiB, each
/// a 4 KiB header), VMFS (`vmfs.c`, magic at 2 MiB), UDF's anchor at block
/// 256 (`udf.c`, up to 1 MiB with 4 KiB blocks); from the end, ZFS labels
/// (`zfs.c`, L2 512 KiB and the size modulo 256 KiB before the end: at
/// most the last 768 KiB), md 0.90 and 1.0 superblocks
/// (`linux_raid.c`, the last 128 KiB), the vendor RAID metadata (`ddf_raid.c`,
/// `isw_raid.c`, …, the last sectors) and the backup GPT (`gpt.c`, the last
/// LBA). Every other read of a prober follows a magic found in these
/// ranges, so with them all zero it never happens (the test
/// `a_signature_where_a_prober_looks_is_never_blank` plants each). On a new
/// gp3 volume (125 MiB/s baseline) reading both takes about 130 ms, once
/// per format; a device that holds anything is read to its first non-zero
/// chunk ([`READ_CHUNK`]).
pub const PROBED_BYTES: u64 = 8 << 20;

/// How much the proof reads at a time, in bytes.
const READ_CHUNK: usize = 1 << 20;

/// Probes `device`: proves it blank with [`prove_zero`], which has as long
/// as a tool (the executor's time limit, `--tool-timeout-seconds`: third
/// audit A12); when it is not, runs `blkid -p -o export` (low-level probe,
/// no cache) on its verified fd to name what it holds.
///
/// # Errors
/// [`HelperError::System`] when the device cannot be read where libblkid
/// looks, or not within the time limit; [`HelperError::ToolFailed`] when
/// blkid fails, or answers "nothing found" with something on stderr;
/// [`HelperError::DeviceRefused`] when the device changed before blkid
/// ran.
pub fn probe(executor: &Executor, device: &VerifiedDevice) -> Result<Contents, HelperError> {
    let size = device.size_bytes()?;
    let claim = executor.stalled.claim(device.number, &device.path())?;
    let not_blank = match prove_zero_within(device, size, executor.timeout, claim) {
        Ok(Contents::Blank) => return Ok(Contents::Blank),
        Ok(contents) => contents,
        Err(e) => return Err(e.into_error(&device.volume_id.to_string(), &device.path())),
    };
    let output = executor.run(
        Tool::Blkid,
        &["-p", "-o", "export", "--", DEVICE_ARG],
        ToolTarget::Device(device),
    )?;
    interpret_blkid(&output, not_blank)
}

/// [`prove_zero`] on a thread of its own, waited for at most `limit`: a
/// device whose reads stall holds its Stage no longer than a tool may run. The thread, blocked in a read, ends when the read does,
/// and releases the device's `claim` then (no tool or proof starts on it
/// meanwhile).
fn prove_zero_within(device: &VerifiedDevice, size: u64, limit: Duration, claim: Claim) -> Result<Contents, NotProven> {
    let fd = device.fd().try_clone_to_owned().map_err(|e| NotProven::Unreadable {
        offset: 0,
        reason: e.to_string(),
    })?;
    let (answer, proof) = mpsc::channel();
    // The request's span goes with it: what the proof logs is the request's.
    let span = tracing::Span::current();
    std::thread::spawn(move || {
        let _request = span.enter();
        let verdict = prove_zero(fd.as_fd(), size);
        drop(fd);
        drop(claim);
        let _ = answer.send(verdict);
    });
    proof
        .recv_timeout(limit)
        .unwrap_or(Err(NotProven::Stalled(limit.as_secs())))
}

/// blkid's answer on a device not proven blank: "nothing found", with
/// nothing printed, is `not_blank`, the proof's description of the data.
fn interpret_blkid(output: &Output, not_blank: Contents) -> Result<Contents, HelperError> {
    match output.status.code() {
        Some(0) => Ok(parse_blkid(&String::from_utf8_lossy(&output.stdout))),
        Some(2) if output.stderr.is_empty() && output.stdout.is_empty() => Ok(not_blank),
        _ => Err(HelperError::ToolFailed {
            tool: Tool::Blkid.path()?,
            detail: format!("{}: {}", output.status, exec::stderr_excerpt(&output.stderr)),
        }),
    }
}

/// Why [`prove_zero`] did not prove a device blank.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotProven {
    /// The device has no bytes.
    #[error("the device is empty")]
    Empty,
    /// The reads did not end within the time limit, in seconds.
    #[error("the reads did not end within {0} s")]
    Stalled(u64),
    /// A read failed, or ended early, at this byte offset.
    #[error("reading byte {offset}: {reason}")]
    Unreadable {
        /// Offset of the failed read, in bytes from the start.
        offset: u64,
        /// The OS error, or "end of data".
        reason: String,
    },
}

impl NotProven {
    /// [`HelperError::System`] naming the volume, the device and the
    /// offset (INTERNAL at the agent: the orchestrator retries, and a
    /// device that stays unreadable is never formatted).
    fn into_error(self, volume_id: &str, device: &str) -> HelperError {
        Operation::ProveBlank(volume_id.to_owned()).failed(format!("{device}: {self}"))
    }
}

/// Reads the first and the last [`PROBED_BYTES`] of a device of `size`
/// bytes through `fd` and returns [`Contents::Blank`] when every byte is
/// zero (logged as `proved blank`, with `bytes_read`, a step of `make
/// bench`'s breakdown), or [`Contents::Other`] naming the first byte that
/// is not.
///
/// # Errors
/// [`NotProven::Empty`] or [`NotProven::Unreadable`] (a read error or a
/// short read): nothing is proven, so nothing may be formatted.
pub fn prove_zero(fd: BorrowedFd<'_>, size: u64) -> Result<Contents, NotProven> {
    if size == 0 {
        return Err(NotProven::Empty);
    }
    let head = 0..PROBED_BYTES.min(size);
    let tail = size.saturating_sub(PROBED_BYTES).max(head.end)..size;
    let bytes_read = head.end + (tail.end - tail.start);
    let mut buffer = vec![0u8; READ_CHUNK];
    for range in [head, tail] {
        let mut offset = range.start;
        while offset < range.end {
            let len = usize::try_from(range.end - offset).map_or(READ_CHUNK, |left| left.min(READ_CHUNK));
            let chunk = &mut buffer[..len];
            read_exact_at(fd, chunk, offset)?;
            if chunk.iter().fold(0, |any, byte| any | byte) != 0 {
                let first = chunk.iter().position(|byte| *byte != 0).unwrap_or_default();
                return Ok(Contents::Other(format!(
                    "data no prober recognises (byte {} is not zero)",
                    offset + first as u64
                )));
            }
            offset += len as u64;
        }
    }
    tracing::info!(bytes_read, "proved blank");
    Ok(Contents::Blank)
}

/// Fills `buffer` from `fd` at `offset`.
fn read_exact_at(fd: BorrowedFd<'_>, buffer: &mut [u8], offset: u64) -> Result<(), NotProven> {
    let mut done = 0;
    while done < buffer.len() {
        let at = offset + done as u64;
        let unreadable = |reason: String| NotProven::Unreadable { offset: at, reason };
        match rustix::io::pread(fd, &mut buffer[done..], at) {
            Ok(0) => return Err(unreadable("end of data".to_owned())),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(unreadable(std::io::Error::from(e).to_string())),
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
            if options.xfs_legacy {
                args.extend(["-m", "bigtime=0,inobtcount=0,reflink=0"].map(String::from));
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
            xfs_legacy: false,
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
        // The node's --legacy-xfs, as the Go driver formats with it.
        let legacy = FormatOptions {
            xfs_legacy: true,
            ..FormatOptions::default()
        };
        let (_, args) = mkfs_command(FsType::Xfs, &legacy);
        assert_eq!(
            args.join(" "),
            "-q -K -m bigtime=0,inobtcount=0,reflink=0 -- /proc/self/fd/3"
        );
    }

    fn blkid_output(code: i32, stdout: &str, stderr: &str) -> Output {
        use std::os::unix::process::ExitStatusExt;
        Output {
            status: std::process::ExitStatus::from_raw(code << 8),
            stdout: stdout.into(),
            stderr: stderr.into(),
        }
    }

    /// blkid, asked only of a device not proven blank, names what it
    /// finds; its "nothing found" is the proof's description of the data,
    /// and never blank; anything else it says is its failure.
    #[test]
    fn blkid_names_what_the_proof_found() {
        let data = || Contents::Other("data no prober recognises (byte 7 is not zero)".into());
        assert_eq!(interpret_blkid(&blkid_output(2, "", ""), data()), Ok(data()));
        let open_failed = interpret_blkid(
            &blkid_output(2, "", "blkid: error: /x: No such file or directory"),
            data(),
        );
        assert!(
            matches!(open_failed, Err(HelperError::ToolFailed { ref detail, .. }) if detail.contains("No such file")),
            "{open_failed:?}"
        );
        assert!(matches!(
            interpret_blkid(&blkid_output(4, "", ""), data()),
            Err(HelperError::ToolFailed { .. })
        ));
        assert_eq!(
            interpret_blkid(&blkid_output(0, "TYPE=xfs\nUSAGE=filesystem\n", ""), data()),
            Ok(Contents::Filesystem("xfs".into()))
        );
    }

    /// Where libblkid's probers look, each with its magic (util-linux
    /// `libblkid/src/`): on a 64 MiB device, a signature at any of them is
    /// found by the proof, so blkid is asked. A prober that looks beyond
    /// [`PROBED_BYTES`] of either end fails this test.
    #[test]
    fn a_signature_where_a_prober_looks_is_never_blank() {
        const SIZE: u64 = 64 << 20;
        let end = |back: u64| SIZE - back;
        // (where, from which file, offset, magic)
        let signatures: [(&str, u64, &[u8]); 13] = [
            ("xfs.c: XFSB at 0", 0, b"XFSB"),
            ("ext.c: 0xEF53 at 1 KiB + 0x38", 1024 + 0x38, &[0x53, 0xef]),
            ("iso9660.c: CD001 at 32 KiB + 1", (32 << 10) + 1, b"CD001"),
            ("btrfs.c: _BHRfS_M at 64 KiB + 0x40", (64 << 10) + 0x40, b"_BHRfS_M"),
            ("udf.c: anchor at block 256 of 4 KiB", 256 * 4096, &[2, 0]),
            (
                "vmfs.c: VMFS_volume_member at 1 MiB",
                1 << 20,
                &[0x0d, 0xd0, 0x01, 0xc0],
            ),
            ("vmfs.c: VMFS at 2 MiB", 2 << 20, &[0x5e, 0xf1, 0xab, 0x2f]),
            (
                "luks.c: the last LUKS2 secondary header at 4 MiB",
                4 << 20,
                b"SKUL\xba\xbe",
            ),
            (
                "zfs.c: L2's uberblocks, 512 KiB from the end + 128 KiB",
                end(512 << 10) + (128 << 10),
                &[0x0c, 0xb1, 0xba],
            ),
            (
                "linux_raid.c: md 0.90, the last 64 KiB",
                end(64 << 10),
                &[0xfc, 0x4e, 0x2b, 0xa9],
            ),
            (
                "linux_raid.c: md 1.0, 8 KiB from the end",
                end(8 << 10),
                &[0xfc, 0x4e, 0x2b, 0xa9],
            ),
            (
                "ddf_raid.c: the anchor in the last sector",
                end(512),
                &[0xde, 0x11, 0xde, 0x11],
            ),
            ("gpt.c: the backup header at the last LBA", end(512), b"EFI PART"),
        ];
        let dir = tempfile::tempdir().unwrap();
        for (place, offset, magic) in signatures {
            let file = file_of(&dir, &[(offset, magic)], SIZE);
            assert_eq!(
                prove_zero(file.as_fd(), SIZE),
                Ok(Contents::Other(format!(
                    "data no prober recognises (byte {offset} is not zero)"
                ))),
                "{place}"
            );
        }
    }

    fn file_of(dir: &tempfile::TempDir, bytes: &[(u64, &[u8])], len: u64) -> std::fs::File {
        use std::os::unix::fs::FileExt;
        let file = tempfile::tempfile_in(dir.path()).unwrap();
        file.set_len(len).unwrap();
        for (offset, data) in bytes {
            file.write_all_at(data, *offset).unwrap();
        }
        file
    }

    /// Zeros at both ends prove a device blank; one non-zero byte anywhere
    /// in the first or last 8 MiB is named by its offset; bytes between the
    /// two ranges are not read.
    #[test]
    fn only_zeros_where_probers_read_are_blank() {
        let dir = tempfile::tempdir().unwrap();
        let size = 64 << 20;
        let blank = file_of(&dir, &[], size);
        assert_eq!(prove_zero(blank.as_fd(), size), Ok(Contents::Blank));
        for offset in [0, 2 << 20, 4 << 20, PROBED_BYTES - 1, size - PROBED_BYTES, size - 1] {
            let file = file_of(&dir, &[(offset, b"x")], size);
            assert_eq!(
                prove_zero(file.as_fd(), size),
                Ok(Contents::Other(format!(
                    "data no prober recognises (byte {offset} is not zero)"
                ))),
                "a byte at {offset}"
            );
        }
        let between = file_of(&dir, &[(PROBED_BYTES, b"x"), (size - PROBED_BYTES - 1, b"x")], size);
        assert_eq!(prove_zero(between.as_fd(), size), Ok(Contents::Blank));
        // A device smaller than both ranges is read once, whole.
        let small = file_of(&dir, &[(3 << 20, b"x")], 5 << 20);
        assert_eq!(
            prove_zero(small.as_fd(), 5 << 20),
            Ok(Contents::Other(
                "data no prober recognises (byte 3145728 is not zero)".into()
            ))
        );
    }

    /// The proof fails on what cannot be read to the stated size: a
    /// missing device's stand-in (/dev/null reads nothing), a directory, a
    /// file shorter than it claims, an empty device.
    #[test]
    fn the_proof_fails_on_what_cannot_be_read() {
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(
            prove_zero(null.as_fd(), 4 << 20),
            Err(NotProven::Unreadable {
                offset: 0,
                reason: "end of data".into()
            })
        );
        let dir = tempfile::tempdir().unwrap();
        let directory = std::fs::File::open(dir.path()).unwrap();
        assert!(matches!(
            prove_zero(directory.as_fd(), 4 << 20),
            Err(NotProven::Unreadable { offset: 0, .. })
        ));
        let short = file_of(&dir, &[], 3 << 20);
        assert_eq!(
            prove_zero(short.as_fd(), 32 << 20),
            Err(NotProven::Unreadable {
                offset: 3 << 20,
                reason: "end of data".into()
            })
        );
        assert_eq!(prove_zero(short.as_fd(), 3 << 20), Ok(Contents::Blank));
        assert_eq!(prove_zero(short.as_fd(), 0), Err(NotProven::Empty));
        assert_eq!(
            NotProven::Empty.into_error("vol-1", "/dev/loop9"),
            Operation::ProveBlank("vol-1".into()).failed("/dev/loop9: the device is empty")
        );
    }
}
