//! Every `unsafe` block of the project: the NVMe admin ioctl, taking
//! ownership of a socket inherited from systemd, closing inherited
//! descriptors and clearing the environment at start, and closing
//! descriptors in a child before it execs a tool.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::process::Command;

use rustix::ioctl::{Opcode, Updater, ioctl, opcode};

/// `struct nvme_admin_cmd` (alias `nvme_passthru_cmd`) from the kernel's
/// `include/uapi/linux/nvme_ioctl.h`: 72 bytes, natural alignment.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct NvmeAdminCmd {
    pub opcode: u8,
    pub flags: u8,
    pub rsvd1: u16,
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    pub metadata: u64,
    pub addr: u64,
    pub metadata_len: u32,
    pub data_len: u32,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
    pub timeout_ms: u32,
    pub result: u32,
}

/// `NVME_IOCTL_ADMIN_CMD = _IOWR('N', 0x41, struct nvme_admin_cmd)`, which
/// is 0xC0484E41 on Linux (nvme_ioctl.h).
pub(crate) const NVME_IOCTL_ADMIN_CMD: Opcode = opcode::read_write::<NvmeAdminCmd>(b'N', 0x41);

/// Sends `cmd` (whose `addr`/`data_len` must describe `buffer`) to the
/// controller behind `fd`: a `/dev/nvmeN` controller or a `/dev/nvmeNnM`
/// namespace.
pub(crate) fn nvme_admin_command(fd: BorrowedFd<'_>, cmd: &mut NvmeAdminCmd, buffer: &mut [u8]) -> io::Result<()> {
    cmd.addr = buffer.as_mut_ptr() as u64;
    cmd.data_len =
        u32::try_from(buffer.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "buffer too large"))?;
    // SAFETY: NVME_IOCTL_ADMIN_CMD takes a `struct nvme_admin_cmd`, which
    // NvmeAdminCmd mirrors field for field (size asserted in a test). The
    // kernel writes at most `data_len` bytes to `addr`, which points at
    // `buffer`, exclusively borrowed and alive for the whole call.
    unsafe {
        let updater = Updater::<NVME_IOCTL_ADMIN_CMD, NvmeAdminCmd>::new(cmd);
        ioctl(fd, updater)?;
    }
    Ok(())
}

/// The first socket passed by systemd socket activation (`LISTEN_FDS`,
/// sd_listen_fds(3)): fd 3, when `LISTEN_PID` names this process.
/// Returns `None` when the process was not socket-activated.
pub fn listener_from_systemd() -> Option<UnixListener> {
    const SD_LISTEN_FDS_START: RawFd = 3;
    let pid = std::env::var("LISTEN_PID").ok()?.parse::<u32>().ok()?;
    let count = std::env::var("LISTEN_FDS").ok()?.parse::<u32>().ok()?;
    if pid != std::process::id() || count < 1 {
        return None;
    }
    // SAFETY: with LISTEN_PID equal to our pid, systemd guarantees fd 3 is
    // an open listening socket handed to this process and owned by nobody
    // else in it; we take ownership exactly once (the environment is
    // cleared right after start-up so this cannot run twice).
    let fd = unsafe { OwnedFd::from_raw_fd(SD_LISTEN_FDS_START) };
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC).ok()?;
    Some(UnixListener::from(fd))
}

/// Closes every descriptor from `first` up (`close_range(2)`, Linux
/// ≥ 5.9).
fn close_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range takes plain integers and touches no memory; the
    // callers guarantee nothing in this process owns the descriptors
    // closed (see `close_inherited_fds` and `close_fds_on_exec`).
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

/// Removes every environment variable. Must run in `main` before any
/// other thread exists.
pub fn clear_environment() {
    for (key, _) in std::env::vars_os() {
        // SAFETY: called from `main` before the helper starts any thread,
        // so no other thread can read the environment concurrently.
        unsafe { std::env::remove_var(key) };
    }
}

/// Makes `command`'s child close every descriptor beyond stdio before it
/// execs, whatever the parent has open.
pub(crate) fn close_fds_on_exec(command: &mut Command) {
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe calls are allowed; it makes one raw syscall
    // and allocates nothing.
    unsafe {
        command.pre_exec(|| close_from(3));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_command_matches_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<NvmeAdminCmd>(), 72);
        assert_eq!(std::mem::offset_of!(NvmeAdminCmd, metadata), 16);
        assert_eq!(std::mem::offset_of!(NvmeAdminCmd, addr), 24);
        assert_eq!(std::mem::offset_of!(NvmeAdminCmd, data_len), 36);
        assert_eq!(std::mem::offset_of!(NvmeAdminCmd, cdw10), 40);
        assert_eq!(std::mem::offset_of!(NvmeAdminCmd, timeout_ms), 64);
        assert_eq!(std::mem::offset_of!(NvmeAdminCmd, result), 68);
        assert_eq!(NVME_IOCTL_ADMIN_CMD as u64, 0xC048_4E41);
    }
}
