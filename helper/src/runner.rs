//! The runner: the process that runs the tools and grows ext filesystems
//! (third audit A1), the OpenSSH monitor's shape turned around.
//!
//! `main` forks it while the helper is still one thread, once the
//! capabilities are reduced to [`crate::harden::KEPT`]: the runner keeps
//! those capabilities, its end of a `SOCK_SEQPACKET` socket pair (as fd 3)
//! and stdio, and closes every other descriptor (the listening socket, the
//! allowed roots, the mount table). The serving process then keeps
//! `CAP_SYS_ADMIN` alone, so no thread that reads an agent's request holds
//! `CAP_SETUID`, `CAP_SETGID` or the tools' capabilities, even permitted.
//!
//! Each job is one message on that socket: a [`Work`] in CBOR, with the
//! job's own socket and the objects it acts on (the verified device, a
//! mount's root) as `SCM_RIGHTS` descriptors — the runner never resolves a
//! path the helper names. The runner proves the device again by the
//! descriptor it was given ([`VerifiedDevice::adopt`], then
//! [`VerifiedDevice::reverify`] before each tool), closes its handles on
//! them, answers one [`Reply`] on the job's socket and closes it; for a
//! tool killed past its time limit, only once it has reaped it, so that
//! the helper keeps the device in its stalled set until then
//! ([`crate::exec`]). A message it cannot read ends it, and so the helper:
//! only the helper writes on that socket. The runner takes its tools from its fixed table and
//! its argument lists from the helper, which built them from validated
//! types; the serving process it trusts that far is the helper itself,
//! already holding `CAP_SYS_ADMIN`.
//!
//! The runner ends when the helper does (`PR_SET_PDEATHSIG`, and the end
//! of the socket), and the helper exits when the runner is gone, so that
//! the service manager starts both again.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use ebs_csi_helper_proto::HelperError;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use seccompiler::BpfProgram;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::device::{DeviceFacts, IdentityPolicy, VerifiedDevice};
use crate::error::Operation;
use crate::exec::{Job, Threads, Tool, ToolIds};
use crate::grow;
use crate::sys;

/// What the runner is asked to do.
#[derive(Debug, Serialize, Deserialize)]
pub enum Work {
    /// Run `tool` with `args` on the device the job's second descriptor
    /// opens (`device` what the helper's proof found); a third descriptor,
    /// `xfs_growfs`'s, is the root of a mount of it.
    Tool {
        /// The program, from the runner's own table.
        tool: Tool,
        /// Its arguments.
        args: Vec<String>,
        /// What the helper proved of the device.
        device: DeviceFacts,
    },
    /// Grow the ext filesystem whose mount root the second descriptor is
    /// to `blocks` ([`grow::resize`]).
    ResizeExt {
        /// Filesystem blocks.
        blocks: u64,
    },
}

/// The runner's answer to one job.
#[derive(Debug, Serialize, Deserialize)]
pub struct Reply {
    /// The tool's exit and output, or why it did not run or end.
    pub result: Result<Ran, HelperError>,
    /// A tool killed past its time limit is not reaped yet: the runner
    /// closes the job's socket once it is and its handle on the device is
    /// closed.
    pub settling: bool,
}

/// A tool's end: its raw wait status (`waitpid(2)`) and the first bytes
/// of its output (`exec::OUTPUT_LIMIT`); a growth's is all zero.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Ran {
    /// The wait status, as `ExitStatusExt::from_raw` takes it.
    pub status: i32,
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error.
    pub stderr: Vec<u8>,
}

/// What the runner is started with.
#[derive(Debug)]
pub struct RunnerConfig {
    /// Who the tools run as.
    pub ids: ToolIds,
    /// How long a tool may run (`--tool-timeout-seconds`).
    pub timeout: Duration,
    /// Formats at once (`--max-parallel-formats`): the formatter threads.
    pub formats: usize,
    /// The policy's `tools` denylist, installed by each tool before exec.
    pub tool_filter: BpfProgram,
    /// Which devices may stand for a volume, for the proofs again.
    pub policy: IdentityPolicy,
}

/// The helper's handle to the runner; clones share its socket.
#[derive(Clone, Debug)]
pub struct Runner {
    control: Arc<OwnedFd>,
}

/// The largest message either side sends, in bytes: a reply with both of
/// a tool's outputs at their limit, each byte at most two bytes of CBOR.
const MESSAGE_BYTES: usize = 80 << 10;

/// The most descriptors a job carries: its socket, the device, a mount root.
const JOB_FDS: usize = 3;

impl Runner {
    /// Forks the runner, which serves until the helper ends; the caller
    /// goes on as the helper. Call it from `main` while it is the only
    /// thread.
    ///
    /// # Errors
    /// The error making the socket pair or forking.
    pub fn start(config: RunnerConfig) -> io::Result<Self> {
        let (helper_end, runner_end) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
        if let Some(control) = sys::fork_keeping(runner_end.as_fd())? {
            // The other handles' descriptors are closed here, and nothing
            // returns.
            serve(&control, config)
        }
        drop(runner_end);
        Ok(Self {
            control: Arc::new(helper_end),
        })
    }

    /// Sends `work` with `fds` (after the job's socket) and waits for the
    /// runner's answer; returns it with the job's socket, which the runner
    /// closes when the job is wholly over.
    ///
    /// # Errors
    /// [`HelperError::System`] when the runner cannot be reached or
    /// answers nothing.
    pub fn call(&self, work: &Work, fds: &[BorrowedFd<'_>]) -> Result<(Reply, OwnedFd), HelperError> {
        let failed = |e: &dyn std::fmt::Display| Operation::Exec.failed(e);
        let (ours, theirs) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
                .map_err(|e| failed(&e))?;
        let sent: Vec<BorrowedFd<'_>> = std::iter::once(theirs.as_fd()).chain(fds.iter().copied()).collect();
        send(&self.control, work, &sent).map_err(|e| failed(&e))?;
        drop(theirs);
        match receive::<Reply>(&ours) {
            Ok(Some((reply, _))) => Ok((reply, ours)),
            Ok(None) => Err(failed(&"the runner ended the job without an answer")),
            Err(e) => Err(failed(&e)),
        }
    }

    /// Starts a thread that exits the helper when the runner is gone (its
    /// end of the socket closed: it never sends on it).
    ///
    /// # Errors
    /// The error spawning the thread.
    pub fn exit_with_it(&self) -> io::Result<()> {
        let control = Arc::clone(&self.control);
        std::thread::Builder::new().name("runner-watch".into()).spawn(move || {
            wait_closed(&control);
            tracing::error!("the runner process has ended; exiting");
            std::process::exit(1);
        })?;
        Ok(())
    }
}

/// The runner's life: serves jobs until the helper's end of the socket
/// closes, then exits.
fn serve(control: &OwnedFd, config: RunnerConfig) -> ! {
    let code = match run(control, config) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = %e, "the runner failed");
            1
        }
    };
    std::process::exit(code)
}

fn run(control: &OwnedFd, config: RunnerConfig) -> io::Result<()> {
    let helper = rustix::process::getppid();
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    if rustix::process::getppid() != helper {
        return Ok(());
    }
    sys::set_process_name(c"ebs-csi-runner")?;
    let (ids, timeout, filter) = (config.ids, config.timeout, Arc::new(config.tool_filter));
    let tools = Threads::start("tools", 1, timeout, ids, Arc::clone(&filter))?;
    let formatter = Threads::start("formatter", config.formats, timeout, ids, filter)?;
    while let Some((work, fds)) = receive::<Work>(control)? {
        let mut fds = fds.into_iter();
        let Some(socket) = fds.next() else { continue };
        let (first, second) = (fds.next(), fds.next());
        match work {
            Work::Tool { tool, args, device } => {
                let adopted = first
                    .ok_or_else(|| Operation::Exec.failed("no device"))
                    .and_then(|file| VerifiedDevice::adopt(device, file, &config.policy))
                    .and_then(|device| Ok((tool.path()?, device)));
                match adopted {
                    Ok((path, device)) => {
                        let job = Job {
                            tool,
                            path,
                            args,
                            device,
                            mount_root: second,
                            socket,
                        };
                        if tool.formats() {
                            formatter.queue(job);
                        } else {
                            tools.queue(job);
                        }
                    }
                    Err(e) => answer(&socket, Err(e), false),
                }
            }
            Work::ResizeExt { blocks } => {
                let Some(root) = first else { continue };
                std::thread::spawn(move || {
                    let result = grow::resize(&root, blocks);
                    // Closed before the answer: the helper may unmount next.
                    drop(root);
                    answer(&socket, result.map(|()| Ran::default()), false);
                });
            }
        }
    }
    Ok(())
}

/// Answers a job on its socket (a helper that has gone is not told).
pub(crate) fn answer(socket: &OwnedFd, result: Result<Ran, HelperError>, settling: bool) {
    if let Err(e) = send(socket, &Reply { result, settling }, &[]) {
        tracing::warn!(error = %e, "cannot answer the helper");
    }
}

/// Waits until the other end of `socket` is closed (nothing else is sent
/// on it then).
pub(crate) fn wait_closed(socket: &OwnedFd) {
    let mut byte = [0u8; 1];
    while let Ok((1, _)) | Err(rustix::io::Errno::INTR) = rustix::net::recv(socket, &mut byte, RecvFlags::empty()) {}
}

/// Sends `value` in CBOR as one message, with `fds` attached.
fn send(socket: &OwnedFd, value: &impl Serialize, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut bytes = Vec::new();
    ciborium::into_writer(value, &mut bytes).map_err(io::Error::other)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(JOB_FDS))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !ancillary.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors"));
    }
    rustix::net::sendmsg(socket, &[IoSlice::new(&bytes)], &mut ancillary, SendFlags::NOSIGNAL)?;
    Ok(())
}

/// Receives one message and the descriptors attached (close-on-exec);
/// `None` at the end of the socket.
fn receive<T: DeserializeOwned>(socket: &OwnedFd) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut bytes = vec![0u8; MESSAGE_BYTES];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(JOB_FDS))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let message = loop {
        match rustix::net::recvmsg(
            socket,
            &mut [IoSliceMut::new(&mut bytes)],
            &mut ancillary,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => {}
            other => break other?,
        }
    };
    let fds: Vec<OwnedFd> = ancillary
        .drain()
        .flat_map(|message| match message {
            RecvAncillaryMessage::ScmRights(fds) => fds.collect(),
            _ => Vec::new(),
        })
        .collect();
    if message.bytes == 0 {
        return Ok(None);
    }
    if message.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC) {
        return Err(io::Error::other("a message or its descriptors were cut short"));
    }
    let value = ciborium::from_reader(bytes.get(..message.bytes).unwrap_or_default()).map_err(io::Error::other)?;
    Ok(Some((value, fds)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest reply fits one message, and a socket pair carries it
    /// with descriptors both ways.
    #[test]
    fn a_reply_at_the_output_limit_fits_one_message() {
        let output = vec![0xffu8; usize::try_from(crate::exec::OUTPUT_LIMIT).unwrap()];
        let output_len = output.len();
        let reply = Reply {
            result: Ok(Ran {
                status: 256,
                stdout: output.clone(),
                stderr: output,
            }),
            settling: false,
        };
        let (a, b) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
        let file = tempfile::tempfile().unwrap();
        send(&a, &reply, &[file.as_fd()]).unwrap();
        let (got, fds) = receive::<Reply>(&b).unwrap().unwrap();
        assert_eq!(got.result.unwrap().stdout.len(), output_len);
        assert_eq!(fds.len(), 1);
        drop(a);
        assert!(receive::<Reply>(&b).unwrap().is_none(), "the end of the socket");
    }
}
