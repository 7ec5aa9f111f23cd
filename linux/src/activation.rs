//! systemd socket activation (sd_listen_fds(3)): the listening socket a
//! `.socket` unit creates and hands to its service as fd 3. Both the helper
//! and the agent are started this way under systemd, so systemd, not the
//! service, creates the socket file, its directory and its mode.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::FileType;
use rustix::net::{AddressFamily, SocketType};

/// `SD_LISTEN_FDS_START` (sd-daemon.h): the first passed descriptor.
const SD_LISTEN_FDS_START: RawFd = 3;

/// Whether fd 3 has been taken already (it can be owned only once).
static TAKEN: AtomicBool = AtomicBool::new(false);

/// The first socket passed by systemd socket activation: fd 3, when
/// `LISTEN_PID` names this process and `LISTEN_FDS` is at least 1.
/// Returns `Ok(None)` when the process was not socket-activated, and on
/// every call after the first.
///
/// # Errors
/// `InvalidInput` when fd 3 is not open or is not a listening `AF_UNIX`
/// stream socket (a unit that passes anything else is misconfigured).
pub fn listener_from_systemd() -> io::Result<Option<UnixListener>> {
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    let (Some(pid), Some(count)) = (var("LISTEN_PID"), var("LISTEN_FDS")) else {
        return Ok(None);
    };
    if pid != std::process::id() || count < 1 || TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(None);
    }
    // SAFETY: the borrow lives only for this fcntl(F_GETFD), which asks
    // whether fd 3 is open and touches nothing else.
    let open = rustix::io::fcntl_getfd(unsafe { BorrowedFd::borrow_raw(SD_LISTEN_FDS_START) }).is_ok();
    if !open {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "LISTEN_FDS is set but fd 3 is not open",
        ));
    }
    // SAFETY: with LISTEN_PID equal to our pid, systemd hands fd 3 (checked
    // open above) to this process and nothing else in it owns it; `TAKEN`
    // makes this the only place that takes ownership, exactly once.
    let fd = unsafe { OwnedFd::from_raw_fd(SD_LISTEN_FDS_START) };
    let is_listening_unix_socket = rustix::fs::fstat(&fd)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Socket)
        && rustix::net::sockopt::socket_domain(&fd).is_ok_and(|d| d == AddressFamily::UNIX)
        && rustix::net::sockopt::socket_type(&fd).is_ok_and(|t| t == SocketType::STREAM)
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
