//! Every `unsafe` block of the project: the NVMe admin ioctl and
//! `BLKGETDISKSEQ`, taking ownership of a socket inherited from systemd,
//! closing inherited descriptors and clearing the environment at start,
//! and setting up a tool's descriptors in the child before it execs.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::process::Command;

use rustix::fs::FileType;
use rustix::ioctl::{Getter, Opcode, Updater, ioctl, opcode};
use rustix::net::AddressFamily;

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

/// The first socket passed by systemd socket activation (`LISTEN_FDS`,
/// sd_listen_fds(3)): fd 3, when `LISTEN_PID` names this process.
/// Returns `Ok(None)` when the process was not socket-activated.
///
/// # Errors
/// `InvalidInput` when fd 3 is not a listening `AF_UNIX` stream socket
/// (a unit that passes anything else is misconfigured).
pub fn listener_from_systemd() -> io::Result<Option<UnixListener>> {
    const SD_LISTEN_FDS_START: RawFd = 3;
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    let (Some(pid), Some(count)) = (var("LISTEN_PID"), var("LISTEN_FDS")) else {
        return Ok(None);
    };
    if pid != std::process::id() || count < 1 {
        return Ok(None);
    }
    // SAFETY: fcntl(F_GETFD) only asks whether fd 3 is open; it touches no
    // memory and takes no ownership.
    let open = unsafe { libc::fcntl(SD_LISTEN_FDS_START, libc::F_GETFD) } >= 0;
    if !open {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "LISTEN_FDS is set but fd 3 is not open",
        ));
    }
    // SAFETY: with LISTEN_PID equal to our pid, systemd hands fd 3 (checked
    // open above) to this process and nothing else in it owns it; we take
    // ownership exactly once (the environment is cleared right after
    // start-up so this cannot run twice).
    let fd = unsafe { OwnedFd::from_raw_fd(SD_LISTEN_FDS_START) };
    let is_listening_unix_socket = rustix::fs::fstat(&fd)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Socket)
        && rustix::net::sockopt::socket_domain(&fd).is_ok_and(|d| d == AddressFamily::UNIX)
        && rustix::net::sockopt::socket_type(&fd).is_ok_and(|t| t == rustix::net::SocketType::STREAM)
        && rustix::net::sockopt::socket_acceptconn(&fd).unwrap_or(false);
    if !is_listening_unix_socket {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "fd 3 from systemd is not a listening AF_UNIX stream socket",
        ));
    }
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)?;
    Ok(Some(UnixListener::from(fd)))
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

/// The descriptor number a tool finds the verified device at.
pub(crate) const TOOL_DEVICE_FD: RawFd = 3;

/// Makes `command`'s child close every descriptor beyond stdio before it
/// execs, whatever the parent has open, except `fd`, which the child finds
/// as [`TOOL_DEVICE_FD`] (without close-on-exec).
pub(crate) fn set_up_tool_fds(command: &mut Command, fd: RawFd) {
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe calls are allowed; it makes raw syscalls
    // (fcntl, dup2, close_range) on integers and allocates nothing. The
    // parent keeps `fd` open until the child has exited.
    unsafe {
        command.pre_exec(move || {
            let moved = if fd == TOOL_DEVICE_FD {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, TOOL_DEVICE_FD)
            };
            if moved < 0 {
                return Err(io::Error::last_os_error());
            }
            close_from(4)
        });
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
        assert_eq!(BLKGETDISKSEQ as u64, 0x8008_1280);
    }
}
