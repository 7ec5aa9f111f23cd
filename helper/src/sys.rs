//! Every `unsafe` block of the helper: `BLKGETDISKSEQ`,
//! `EXT4_IOC_RESIZE_FS`, `mount_setattr` (which rustix does not wrap),
//! closing inherited descriptors, clearing the environment and forking the
//! runner at start, and setting up a tool's descriptors, capabilities,
//! Landlock ruleset and seccomp filter in the child before it execs. (The
//! NVMe admin ioctl and taking the socket systemd passes are in
//! `ebs-csi-linux`, which the agent shares; Landlock rulesets are made by
//! the `landlock` crate, the peer's credentials and the stop signals taken
//! by `nix`.)
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;

use rustix::ioctl::{Getter, Opcode, Setter, ioctl, opcode};
use rustix::process::{Gid, Uid};
use rustix::thread::{CapabilitySet, CapabilitySets};
use seccompiler::BpfProgram;

use crate::exec::ToolIds;

/// `BLKGETDISKSEQ = _IOR(0x12, 128, __u64)` (include/uapi/linux/fs.h,
/// Linux ≥ 5.15): the disk sequence number, unique to each disk the kernel
/// creates (or each loop attachment) since boot.
const BLKGETDISKSEQ: Opcode = opcode::read::<u64>(0x12, 128);

/// The disk sequence number of the disk behind `fd`; `None` on kernels
/// without it (`ENOTTY`).
pub(crate) fn disk_sequence(fd: BorrowedFd<'_>) -> io::Result<Option<u64>> {
    // SAFETY: BLKGETDISKSEQ writes one u64, which Getter provides.
    match unsafe { ioctl(fd, Getter::<BLKGETDISKSEQ, u64>::new()) } {
        Ok(seq) => Ok(Some(seq)),
        Err(rustix::io::Errno::NOTTY) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `EXT4_IOC_RESIZE_FS = _IOW('f', 16, __u64)` (fs/ext4/ext4.h): grows a
/// mounted ext2/3/4 filesystem to the block count the u64 names.
const EXT4_IOC_RESIZE_FS: Opcode = opcode::write::<u64>(b'f', 16);

/// Grows the ext filesystem that `dir` (an open directory of it) is on to
/// `blocks` blocks; needs `CAP_SYS_RESOURCE` (`ext4_resize_begin`).
pub(crate) fn ext4_resize_fs(dir: BorrowedFd<'_>, blocks: u64) -> io::Result<()> {
    // SAFETY: EXT4_IOC_RESIZE_FS reads one u64, which Setter passes by
    // pointer for the call.
    unsafe { ioctl(dir, Setter::<EXT4_IOC_RESIZE_FS, u64>::new(blocks)) }.map_err(io::Error::from)
}

/// Sets the attributes `set` and clears `clear` (`MOUNT_ATTR_*` bits,
/// include/uapi/linux/mount.h; `clear` first) on the mount whose root is
/// `mount`, that mount alone (`mount_setattr(2)` with `AT_EMPTY_PATH`, not
/// `AT_RECURSIVE`; Linux ≥ 5.12).
pub(crate) fn mount_setattr(mount: BorrowedFd<'_>, set: u64, clear: u64) -> io::Result<()> {
    let attributes = libc::mount_attr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: the path is a NUL-terminated empty string and `attributes` a
    // `struct mount_attr` (MOUNT_ATTR_SIZE_VER0) that outlive the call,
    // which only reads them.
    let result = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &raw const attributes,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Closes every descriptor from `first` up (`close_range(2)`, Linux
/// ≥ 5.9).
fn close_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range takes plain integers and touches no memory; the
    // callers guarantee nothing in this process that runs again owns the
    // descriptors closed (see `close_inherited_fds`, `fork_keeping` and
    // `set_up_tool_child`).
    let result = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Closes every descriptor the process inherited beyond stdio — and
/// beyond fd 3 when `keep_listen_fd` (the systemd socket). Must run first
/// in `main`, before anything opens a descriptor.
///
/// # Errors
/// The close_range error.
pub fn close_inherited_fds(keep_listen_fd: bool) -> io::Result<()> {
    close_from(if keep_listen_fd { 4 } else { 3 })
}

/// Forks the process, which must have one thread (`main`, before it
/// starts any), for the runner ([`crate::runner`]). In the child `keep`
/// becomes fd 3 and every other descriptor beyond stdio is closed, so the
/// runner holds nothing of the helper's, and no descriptor it opens later
/// is fd 3, where a tool's child puts its device; the child must never
/// return to code that owns a closed descriptor (it ends with
/// `process::exit`). Returns fd 3 in the child, `None` in the parent.
///
/// # Errors
/// fork's error, or in the child dup2's or close_range's.
pub(crate) fn fork_keeping(keep: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    // SAFETY: the caller has one thread, so no lock or allocator state can
    // be held by another thread at the fork, and the child goes on in Rust
    // as the parent would.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            // SAFETY: dup2 takes integers; `keep` is open.
            if unsafe { libc::dup2(keep.as_raw_fd(), TOOL_DEVICE_FD) } < 0 {
                return Err(io::Error::last_os_error());
            }
            close_from(4)?;
            // SAFETY: fd 3 is open (the dup2 above), and the caller owns no
            // other handle on it that it will use or close: every handle
            // it held beyond stdio named a descriptor closed here.
            Ok(Some(unsafe { OwnedFd::from_raw_fd(TOOL_DEVICE_FD) }))
        }
        _ => Ok(None),
    }
}

/// Names the calling thread, the process's name when it is the first
/// (`/proc/<pid>/comm`, at most 15 bytes: `PR_SET_NAME`).
pub(crate) fn set_process_name(name: &CStr) -> io::Result<()> {
    rustix::thread::set_name(name).map_err(io::Error::from)
}

/// Removes every environment variable. Must run in `main` before any
/// other thread exists.
pub fn clear_environment() {
    for (key, _) in std::env::vars_os() {
        // SAFETY: called from `main` before the helper starts any thread,
        // so no other thread can read the environment concurrently.
        unsafe { std::env::remove_var(key) };
    }
}

/// The descriptor number a tool finds the verified device at.
pub(crate) const TOOL_DEVICE_FD: RawFd = 3;

/// Sets up `command`'s child before it execs: it is killed when the
/// runner dies (`PR_SET_PDEATHSIG`; the runner dies with the helper, so a
/// crashed helper leaves no tool holding a device), it blocks no signal, `fd` becomes its [`TOOL_DEVICE_FD`] (without
/// close-on-exec), every other descriptor beyond stdio is closed, it runs as
/// `ids` (uid and gid, no supplementary group: third audit A1) with exactly
/// the capabilities `capabilities` (raised into the ambient set, which is how a non-root uid keeps a capability across
/// an exec: capabilities(7), "Transformation of capabilities during
/// execve()"; `no_new_privs` keeps the exec from adding any), it enforces
/// the Landlock `ruleset` (when the kernel has Landlock) and installs the
/// seccomp `filter`; the exec keeps all of them. The forking thread must
/// hold `CAP_SETUID` and `CAP_SETGID` permitted, and every capability of
/// `capabilities`.
pub(crate) fn set_up_tool_child(
    command: &mut Command,
    fd: RawFd,
    ids: ToolIds,
    capabilities: CapabilitySet,
    ruleset: Option<RawFd>,
    filter: Arc<BpfProgram>,
) {
    let runner = rustix::process::getpid();
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe calls are allowed; it makes raw syscalls
    // (prctl, getppid, sigprocmask, fcntl, dup2, capset, setgroups,
    // setresgid, setresuid, landlock_restrict_self, seccomp, close_range) on
    // integers, stack values and the filter compiled before the fork, and
    // allocates nothing. The parent keeps `fd` open until
    // the child has exited.
    unsafe {
        command.pre_exec(move || {
            // No signal blocked: the helper's threads block SIGTERM and
            // SIGINT (stop.rs), and a mask survives exec (signal(7)).
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut none);
            if libc::sigprocmask(libc::SIG_SETMASK, &raw const none, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let moved = if fd == TOOL_DEVICE_FD {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, TOOL_DEVICE_FD)
            };
            if moved < 0 {
                return Err(io::Error::last_os_error());
            }
            switch_identity(ids, capabilities)?;
            // The death signal follows the forking thread, a runner
            // thread that lives as long as the runner, and is set after the
            // switch, which clears it (prctl(2), PR_SET_PDEATHSIG); if the
            // runner died before it was set, the child is already orphaned.
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            if rustix::process::getppid() != Some(runner) {
                return Err(io::Error::from(io::ErrorKind::BrokenPipe));
            }
            if let Some(ruleset) = ruleset
                && libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The filter was compiled before the fork; installing it makes
            // two system calls and allocates nothing.
            seccompiler::apply_filter(&filter).map_err(|_| io::Error::from_raw_os_error(libc::EPERM))?;
            close_from(4)
        });
    }
}

/// Makes the calling thread `ids` with exactly `kept` (effective,
/// permitted, inheritable and ambient), each step one raw system call that
/// allocates nothing: `CAP_SETUID` and `CAP_SETGID` made effective for the
/// switch, no supplementary group, the gid, then the uid with
/// `PR_SET_KEEPCAPS` (without it the switch from uid 0 empties the permitted
/// set; it empties the effective set either way), then the sets.
fn switch_identity(ids: ToolIds, kept: CapabilitySet) -> io::Result<()> {
    let switching = CapabilitySet::SETUID | CapabilitySet::SETGID;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: switching,
            permitted: kept | switching,
            inheritable: CapabilitySet::empty(),
        },
    )?;
    rustix::thread::set_keep_capabilities(true)?;
    rustix::thread::set_thread_groups(&[])?;
    let (uid, gid) = (Uid::from_raw(ids.uid), Gid::from_raw(ids.gid));
    rustix::thread::set_thread_res_gid(gid, gid, gid)?;
    rustix::thread::set_thread_res_uid(uid, uid, uid)?;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: kept,
            permitted: kept,
            inheritable: kept,
        },
    )?;
    for capability in kept.iter() {
        rustix::thread::configure_capability_in_ambient_set(capability, true)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_match_the_kernel_headers() {
        assert_eq!(BLKGETDISKSEQ as u64, 0x8008_1280);
        assert_eq!(EXT4_IOC_RESIZE_FS as u64, 0x4008_6610);
    }
}
