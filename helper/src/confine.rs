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

use std::os::fd::{BorrowedFd, OwnedFd};

use landlock::{ABI, Access, AccessFs, BitFlags, PathBeneath, Ruleset, RulesetAttr, RulesetCreatedAttr};
use rustix::fs::{Mode, OFlags};

use crate::exec::Tool;

/// The newest Landlock ABI the tests run on (Linux 6.18: ABI 7). Every
/// filesystem right it knows is handled — denied unless a rule allows it —
/// as far as the running kernel knows it (the `landlock` crate's
/// best-effort compatibility: ABI 1 has 13 rights, 2 adds `REFER`, 3
/// `TRUNCATE`, 5 `IOCTL_DEV`; landlock(7), "Filesystem actions").
const HANDLED: ABI = ABI::V7;

/// The system's files every tool needs, and the rights on each.
const SYSTEM: [(&str, BitFlags<AccessFs>); 11] = {
    use landlock::make_bitflags;
    let programs = make_bitflags!(AccessFs::{ReadFile | ReadDir | Execute});
    let files = make_bitflags!(AccessFs::{ReadFile | ReadDir});
    [
        ("/usr", programs),
        ("/lib", programs),
        ("/lib64", programs),
        ("/bin", programs),
        ("/sbin", programs),
        ("/etc", files),
        ("/proc", files),
        ("/sys", files),
        ("/dev", make_bitflags!(AccessFs::{ReadDir})),
        ("/dev/null", make_bitflags!(AccessFs::{ReadFile | WriteFile})),
        ("/dev/urandom", make_bitflags!(AccessFs::{ReadFile})),
    ]
};

/// The rights `tool` has on the verified device.
fn on_device(tool: Tool) -> BitFlags<AccessFs> {
    match tool {
        Tool::Blkid | Tool::XfsGrowfs => AccessFs::ReadFile | AccessFs::IoctlDev,
        Tool::MkfsExt2 | Tool::MkfsExt3 | Tool::MkfsExt4 | Tool::MkfsXfs => {
            AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev
        }
    }
}

/// The ruleset `tool` execs under, acting on `device` and, for
/// `xfs_growfs`, on the mount's root `mount_root`; the child enforces it
/// right before the exec. `None` where the kernel has no Landlock (not
/// built in, or not enabled in `lsm=`): the tool runs without a ruleset,
/// as the helper says at start ([`available`]).
///
/// # Errors
/// The error opening a system directory (one that does not exist is left
/// out), creating the ruleset or adding a rule.
pub fn ruleset(
    tool: Tool,
    device: BorrowedFd<'_>,
    mount_root: Option<BorrowedFd<'_>>,
) -> Result<Option<OwnedFd>, Box<dyn std::error::Error + Send + Sync>> {
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(HANDLED))?
        .create()?;
    for (path, rights) in SYSTEM {
        match rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()) {
            Ok(fd) => ruleset = ruleset.add_rule(PathBeneath::new(fd, rights))?,
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    ruleset = ruleset.add_rule(PathBeneath::new(device, on_device(tool)))?;
    if let Some(root) = mount_root {
        // Open it, nothing beneath it.
        ruleset = ruleset.add_rule(PathBeneath::new(root, AccessFs::ReadDir))?;
    }
    Ok(ruleset.into())
}

/// Whether the running kernel enforces Landlock, asked at start (the
/// serving thread's seccomp filter does not allow the question).
pub fn available() -> bool {
    let created = Ruleset::default()
        .handle_access(AccessFs::from_all(HANDLED))
        .and_then(Ruleset::create);
    created.is_ok_and(|ruleset| Option::<OwnedFd>::from(ruleset).is_some())
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd};

    use super::*;

    /// As any user: a thread under blkid's ruleset reads the system's
    /// files and its device, and cannot write either or open a file
    /// beside the device.
    #[test]
    #[allow(unsafe_code, reason = "landlock_restrict_self, as the tool's child makes it")]
    fn a_tool_opens_the_system_and_its_device_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let (device, other) = (dir.path().join("device"), dir.path().join("other"));
        std::fs::write(&other, b"x").unwrap();
        let file = std::fs::File::create(&device).unwrap();
        let ruleset = ruleset(Tool::Blkid, file.as_fd(), None)
            .unwrap()
            .expect("Landlock in this machine's kernel");
        let opened = std::thread::spawn(move || {
            rustix::thread::set_no_new_privs(true).unwrap();
            // SAFETY: integers only.
            let result = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) };
            assert_eq!(result, 0, "{}", std::io::Error::last_os_error());
            let read = |path: &std::path::Path| std::fs::File::open(path).is_ok();
            let write = |path: &std::path::Path| std::fs::OpenOptions::new().append(true).open(path).is_ok();
            let passwd = std::path::Path::new("/etc/passwd");
            (read(passwd), write(passwd), read(&device), write(&device), read(&other))
        })
        .join()
        .unwrap();
        assert_eq!(
            opened,
            (true, false, true, false, false),
            "(read, write) /etc/passwd and the device; another file"
        );
    }
}
