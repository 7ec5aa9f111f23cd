//! What each tool may open: a Landlock ruleset per exec (landlock(7)).
//!
//! A tool runs as uid 0, and a capability-less uid 0 is still root for file
//! ownership: without a ruleset a tool taken over through a hostile image
//! could rewrite `/etc/passwd` or a binary, or open another disk read-write
//! (the re-audit's N3). Under its ruleset a tool may read and execute the
//! system's programs, libraries and configuration, read `/proc` and `/sys`,
//! list `/dev`, use `/dev/null` and the random devices, and open the one
//! objects it acts on — the verified device (blkid and `xfs_growfs` read
//! it, mkfs writes it), and for `xfs_growfs` the verified mount's root —
//! and nothing else.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{Mode, OFlags};

use crate::exec::Tool;
use crate::sys;

/// `LANDLOCK_ACCESS_FS_*` (include/uapi/linux/landlock.h).
mod access {
    pub const EXECUTE: u64 = 1 << 0;
    pub const WRITE_FILE: u64 = 1 << 1;
    pub const READ_FILE: u64 = 1 << 2;
    pub const READ_DIR: u64 = 1 << 3;
    /// ABI 3.
    pub const TRUNCATE: u64 = 1 << 14;
    /// ABI 5.
    pub const IOCTL_DEV: u64 = 1 << 15;
}

/// The filesystem rights Landlock ABI `abi` knows, all handled (denied
/// unless a rule allows them): ABI 1 has bits 0–12, 2 adds `REFER`, 3
/// `TRUNCATE`, 5 `IOCTL_DEV` (landlock(7), "Filesystem actions").
fn handled(abi: u32) -> u64 {
    match abi {
        0 => 0,
        1 => (1 << 13) - 1,
        2 => (1 << 14) - 1,
        3 | 4 => (1 << 15) - 1,
        _ => (1 << 16) - 1,
    }
}

/// The system's files every tool needs, and the rights on each.
const SYSTEM: [(&str, u64); 11] = [
    ("/usr", access::READ_FILE | access::READ_DIR | access::EXECUTE),
    ("/lib", access::READ_FILE | access::READ_DIR | access::EXECUTE),
    ("/lib64", access::READ_FILE | access::READ_DIR | access::EXECUTE),
    ("/bin", access::READ_FILE | access::READ_DIR | access::EXECUTE),
    ("/sbin", access::READ_FILE | access::READ_DIR | access::EXECUTE),
    ("/etc", access::READ_FILE | access::READ_DIR),
    ("/proc", access::READ_FILE | access::READ_DIR),
    ("/sys", access::READ_FILE | access::READ_DIR),
    ("/dev", access::READ_DIR),
    ("/dev/null", access::READ_FILE | access::WRITE_FILE),
    ("/dev/urandom", access::READ_FILE),
];

/// The rights `tool` has on the verified device.
fn on_device(tool: Tool) -> u64 {
    match tool {
        Tool::Blkid | Tool::XfsGrowfs => access::READ_FILE | access::IOCTL_DEV,
        Tool::MkfsExt2 | Tool::MkfsExt3 | Tool::MkfsExt4 | Tool::MkfsXfs => {
            access::READ_FILE | access::WRITE_FILE | access::TRUNCATE | access::IOCTL_DEV
        }
    }
}

/// The rights a tool has on the verified mount's root, when it acts on
/// one (`xfs_growfs`): open it, nothing beneath it.
const ON_MOUNT_ROOT: u64 = access::READ_DIR;

/// The Landlock ABI version of the running kernel; `None` where Landlock
/// is not built in or not enabled (`lsm=`), where tools run without a
/// ruleset (the helper says so at start).
pub fn abi() -> Option<u32> {
    sys::landlock_abi().filter(|abi| *abi > 0)
}

/// The ruleset `tool` execs under, acting on `device` and, for
/// `xfs_growfs`, on the mount's root `mount_root`, on a kernel of Landlock
/// ABI `abi`; the child enforces it right before the exec.
///
/// # Errors
/// The error creating the ruleset or adding a rule.
pub fn ruleset(
    tool: Tool,
    device: BorrowedFd<'_>,
    mount_root: Option<BorrowedFd<'_>>,
    abi: u32,
) -> io::Result<OwnedFd> {
    let handled = handled(abi);
    let ruleset = sys::landlock_create_ruleset(handled)?;
    for (path, rights) in SYSTEM {
        match rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()) {
            Ok(fd) => sys::landlock_allow(ruleset.as_fd(), fd.as_fd(), rights & handled)?,
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    sys::landlock_allow(ruleset.as_fd(), device, on_device(tool) & handled)?;
    if let Some(root) = mount_root {
        sys::landlock_allow(ruleset.as_fd(), root, ON_MOUNT_ROOT & handled)?;
    }
    Ok(ruleset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_abi_handles_what_it_knows() {
        assert_eq!(handled(1), 0x1fff);
        assert_eq!(handled(3) & access::TRUNCATE, access::TRUNCATE);
        assert_eq!(handled(4) & access::IOCTL_DEV, 0);
        assert_eq!(handled(7), 0xffff);
    }
}
