//! Growing a mounted filesystem to the size of its device.
//!
//! ext2/3/4 grow in the kernel, by `EXT4_IOC_RESIZE_FS` on the mount root
//! the helper verified, in the runner process ([`crate::runner`]), which
//! holds the one capability the ioctl needs: no tool finds the mount point by a path
//! again (resize2fs scans `/proc/mounts` and opens the mount point by
//! name, which an agent could redirect: the re-audit's N4), and no tool
//! parses an image someone else wrote. XFS grows by `xfs_growfs`, which
//! gets that mount root as its fd 3. Either grows only when the superblock
//! the helper reads itself says the filesystem is smaller than its device
//! (XFS at every Expand: the re-audit's N3 is about images a Stage meets,
//! which are not fed to a tool without need).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use ebs_csi_helper_proto::{FsType, HelperError};
use rustix::fs::{Mode, OFlags};

use crate::device::VerifiedDevice;
use crate::error::Operation;
use crate::path::fd_path;
use crate::runner::{Runner, Work};
use crate::sys;

/// Grows the ext2/3/4 filesystem whose root is `root` (an `O_PATH` fd
/// the caller proved to be the mount root of the volume's device) to
/// `blocks` filesystem blocks, in the runner ([`resize`]); the kernel does
/// nothing when it has them already.
///
/// # Errors
/// [`HelperError::System`] with the ioctl's error (`EPERM` where the
/// helper was not given `CAP_SYS_RESOURCE`), or when the runner cannot be
/// reached.
pub fn resize_ext(runner: &Runner, root: BorrowedFd<'_>, blocks: u64) -> Result<(), HelperError> {
    tracing::info!(blocks, "resize ext filesystem");
    let (reply, _) = runner.call(&Work::ResizeExt { blocks }, &[root])?;
    reply.result.map(drop)
}

/// In the runner: opens `root` for the ioctl (through its fd, never a
/// name) and resizes; `CAP_SYS_RESOURCE` (`ext4_resize_begin`) and
/// `CAP_DAC_READ_SEARCH` (a root directory its owner made unreadable to
/// others) are the runner's.
///
/// # Errors
/// [`HelperError::System`] naming the mount and the block count.
pub(crate) fn resize(root: &OwnedFd, blocks: u64) -> Result<(), HelperError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    rustix::fs::openat(root, ".", flags, Mode::empty())
        .map_err(io::Error::from)
        .and_then(|dir| sys::ext4_resize_fs(dir.as_fd(), blocks))
        .map_err(|e| Operation::Grow(fd_path(root), blocks).failed(e))
}

/// The block count resize2fs would grow an ext filesystem of `block_size`
/// bytes per block to on a device of `device_bytes`: every whole block,
/// rounded down to whole 4 KiB pages (e2fsprogs `resize/main.c`, "Round
/// down to make sure we don't get extra blocks").
pub fn ext_target_blocks(device_bytes: u64, block_size: u64) -> u64 {
    let blocks = device_bytes / block_size.max(1);
    let per_page = (4096 / block_size.max(1)).max(1);
    blocks - blocks % per_page
}

/// The size of the `fs_type` filesystem on `device` as its superblock
/// says, `(blocks, block size in bytes)`, read from the device with
/// `O_DIRECT`, so that no page the block device cached before the
/// filesystem last wrote its superblock answers:
/// - ext2/3/4 (`struct ext4_super_block`, fs/ext4/ext4.h, little-endian, at
///   byte 1024): `s_magic` 0xEF53 at 0x38, `s_blocks_count_lo` at 0x4,
///   `s_log_block_size` at 0x18 (1024 << it), and with `INCOMPAT_64BIT`
///   (0x80 in `s_feature_incompat` at 0x60) `s_blocks_count_hi` at 0x150;
/// - XFS (`struct xfs_dsb`, xfs_format.h, big-endian, at byte 0): magic
///   "XFSB", `sb_blocksize` at 4, `sb_dblocks` at 8.
///
/// # Errors
/// [`HelperError::System`] when the superblock cannot be read or is not
/// one of that filesystem.
pub fn filesystem_size(device: &VerifiedDevice, fs_type: FsType) -> Result<(u64, u64), HelperError> {
    let error = |e: &dyn std::fmt::Display| Operation::ReadSuperblock(device.path()).failed(e);
    let flags = OFlags::RDONLY | OFlags::DIRECT | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let path = fd_path(&device.fd());
    let direct = rustix::fs::openat(rustix::fs::CWD, path.as_str(), flags, Mode::empty()).map_err(|e| error(&e))?;
    let mut block = Box::new(AlignedBlock([0; 4096]));
    let read = rustix::io::pread(&direct, &mut block.0, 0).map_err(|e| error(&e))?;
    let sb = block.0.get(..read).unwrap_or_default();
    let size = if fs_type == FsType::Xfs {
        (sb.get(..4) == Some(b"XFSB".as_slice()))
            .then(|| Some((be(sb, 8, 8)?, be(sb, 4, 4)?)))
            .flatten()
    } else {
        let ext = sb.get(1024..).unwrap_or_default();
        (le(ext, 0x38, 2) == Some(0xEF53))
            .then(|| {
                let high = if le(ext, 0x60, 4)? & 0x80 == 0 {
                    0
                } else {
                    le(ext, 0x150, 4)?
                };
                let log = le(ext, 0x18, 4).filter(|log| *log <= 6)?;
                Some((high << 32 | le(ext, 0x4, 4)?, 1024 << log))
            })
            .flatten()
    };
    size.ok_or_else(|| error(&format!("no {} superblock", fs_type.name())))
}

/// The little-endian unsigned integer of `len` bytes at `at` in `bytes`.
fn le(bytes: &[u8], at: usize, len: usize) -> Option<u64> {
    let field = bytes.get(at..at + len)?;
    Some(field.iter().rev().fold(0, |n, b| n << 8 | u64::from(*b)))
}

/// The big-endian unsigned integer of `len` bytes at `at` in `bytes`.
fn be(bytes: &[u8], at: usize, len: usize) -> Option<u64> {
    let field = bytes.get(at..at + len)?;
    Some(field.iter().fold(0, |n, b| n << 8 | u64::from(*b)))
}

/// One 4 KiB block aligned as `O_DIRECT` needs (any logical block size up
/// to 4 KiB).
#[repr(C, align(4096))]
struct AlignedBlock([u8; 4096]);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_integers_of_either_order() {
        let bytes = [0x53, 0xef, 0, 0, 0x12, 0x34];
        assert_eq!(le(&bytes, 0, 2), Some(0xef53));
        assert_eq!(be(&bytes, 4, 2), Some(0x1234));
        assert_eq!(le(&bytes, 4, 4), None, "past the end");
    }

    #[test]
    fn ext_targets_round_down_to_whole_pages() {
        assert_eq!(ext_target_blocks(128 << 20, 4096), 32768);
        assert_eq!(ext_target_blocks((128 << 20) + 4095, 4096), 32768);
        assert_eq!(ext_target_blocks((64 << 20) + 3 * 1024, 1024), 65536);
        assert_eq!(ext_target_blocks(64 << 20, 1024), 65536);
    }
}
