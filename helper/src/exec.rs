//! The one way the helper runs another program.
//!
//! Only tools from a fixed table, by absolute path, with arguments the
//! caller built from validated types; no shell, an empty environment,
//! stdin from `/dev/null`, and no descriptor beyond stdio except the
//! verified device, which the tool finds as fd 3 and names
//! [`DEVICE_ARG`]: a tool never resolves a name the agent sent. Right
//! before the exec the device is verified again
//! ([`VerifiedDevice::reverify`]). Each tool runs as a uid and gid of its
//! own, never root ([`ToolIds`]), with only the capabilities it needs
//! ([`Tool::capabilities`]), a Landlock ruleset that lets it open only the system's files and the
//! object it acts on ([`crate::confine`]) and the policy's `tools` seccomp
//! denylist, in its own process group, with a time limit; when it exits,
//! or on expiry, the whole group is killed. The agent is told no more of
//! a tool's stderr than [`stderr_excerpt`].
//!
//! Tools run from executor threads, started before the seccomp filter is
//! installed on the serving threads, so the filter binds the helper and
//! not the tools. An executor's thread count is the number of tools it
//! runs at once.

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use caps::Capability;
use ebs_csi_helper_proto::HelperError;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags, Signal};
use seccompiler::BpfProgram;

use crate::claim::{Claim, Claims};
use crate::confine;
use crate::device::VerifiedDevice;
use crate::error::Operation;
use crate::harden;
use crate::sys;

/// How a tool names what it acts on: the fd the helper passes it as fd 3
/// (`/dev/fd/3` is a link to this path; `/proc` is there even where
/// `/dev/fd` is not).
pub const DEVICE_ARG: &str = "/proc/self/fd/3";

/// What a tool acts on, given to it as fd 3. Either way the device is
/// verified again right before the exec.
#[derive(Clone, Copy, Debug)]
pub enum ToolTarget<'a> {
    /// The verified device itself (blkid, mkfs).
    Device(&'a VerifiedDevice),
    /// The root of a mount of the verified device (`xfs_growfs`, which
    /// takes a mount point).
    MountOf(&'a VerifiedDevice, BorrowedFd<'a>),
}

/// The programs the helper may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    /// `blkid` (util-linux): probes for filesystem and partition-table signatures.
    Blkid,
    /// `mkfs.ext2` (e2fsprogs).
    MkfsExt2,
    /// `mkfs.ext3` (e2fsprogs).
    MkfsExt3,
    /// `mkfs.ext4` (e2fsprogs).
    MkfsExt4,
    /// `mkfs.xfs` (xfsprogs).
    MkfsXfs,
    /// `xfs_growfs` (xfsprogs): grows a mounted XFS filesystem.
    XfsGrowfs,
}

/// Directories searched, in order, for each tool's file name. Fixed at
/// build time; never taken from the environment.
const TOOL_DIRS: [&str; 3] = ["/usr/sbin", "/sbin", "/usr/bin"];

impl Tool {
    fn file_name(self) -> &'static str {
        match self {
            Self::Blkid => "blkid",
            Self::MkfsExt2 => "mkfs.ext2",
            Self::MkfsExt3 => "mkfs.ext3",
            Self::MkfsExt4 => "mkfs.ext4",
            Self::MkfsXfs => "mkfs.xfs",
            Self::XfsGrowfs => "xfs_growfs",
        }
    }

    /// The capabilities the tool runs with, as a mask of capability bits,
    /// each measured (a tool run as uid 991 on a loop device, Debian 12):
    /// a tool opens its device again through [`DEVICE_ARG`], and a device
    /// node is root's, mode 0600 or 0660 for the `disk` group
    /// (devtmpfs, udev's `50-udev-default.rules`), so `blkid` reads it with
    /// `CAP_DAC_READ_SEARCH` and mkfs writes it with `CAP_DAC_OVERRIDE` —
    /// either limited by the tool's Landlock ruleset to the device and the
    /// system's files ([`crate::confine`]); `mkfs.xfs` also sets the
    /// device's block size (`BLKBSZSET`, block/ioctl.c `blkdev_bszset`:
    /// `CAP_SYS_ADMIN`), and `xfs_growfs` opens the mounted filesystem's
    /// root, whatever its mode, and grows it (XFS_IOC_FSGROWFSDATA:
    /// `CAP_SYS_ADMIN`). (ext filesystems grow without a tool, see
    /// [`crate::grow`].)
    pub fn capabilities(self) -> u64 {
        let (read, write, admin) = (
            Capability::CAP_DAC_READ_SEARCH.bitmask(),
            Capability::CAP_DAC_OVERRIDE.bitmask(),
            Capability::CAP_SYS_ADMIN.bitmask(),
        );
        match self {
            Self::Blkid => read,
            Self::MkfsExt2 | Self::MkfsExt3 | Self::MkfsExt4 => write,
            Self::MkfsXfs => admin | write,
            Self::XfsGrowfs => admin | read,
        }
    }

    /// The absolute path of the tool on this machine.
    ///
    /// # Errors
    /// [`HelperError::System`] when it is installed in none of the
    /// fixed directories.
    pub fn path(self) -> Result<String, HelperError> {
        TOOL_DIRS
            .iter()
            .map(|dir| format!("{dir}/{}", self.file_name()))
            .find(|p| Path::new(p).is_file())
            .ok_or_else(|| Operation::FindTool(self.file_name()).failed("not installed"))
    }
}

/// Who every tool runs as (`--tool-uid`, `--tool-gid`; third audit A1):
/// not root, so that a tool taken over through a hostile image owns no
/// root file and may signal, limit or trace no root process, and not the
/// agent, whose process it could otherwise trace.
#[derive(Clone, Copy, Debug)]
pub struct ToolIds {
    /// The uid; never 0 and never an `--allowed-uid`.
    pub uid: u32,
    /// The gid, the tool's only group.
    pub gid: u32,
}

struct Job {
    tool: Tool,
    path: String,
    args: Vec<String>,
    device: VerifiedDevice,
    fd3: OwnedFd,
    reply: mpsc::Sender<Result<Output, HelperError>>,
}

/// A handle to a fixed pool of executor threads sharing one queue.
#[derive(Clone, Debug)]
pub struct Executor {
    jobs: mpsc::Sender<Job>,
    /// How long a tool may run (`--tool-timeout-seconds`).
    pub timeout: Duration,
    /// Devices with a read that outlived its request (a killed tool not
    /// yet ended, the blank proof): no tool starts on them.
    pub stalled: Claims,
}

impl Executor {
    /// Starts `threads` executor threads named `name`; at most that many
    /// tools run at once, later jobs wait in the queue. A tool still
    /// running after `timeout` is killed with its process group. Each tool
    /// runs as `ids` and installs `tool_filter` (the policy's `tools`
    /// denylist) before it execs. A tool killed past its time limit is
    /// answered for at once and settled by a thread of its own, its device
    /// claimed in `stalled` meanwhile. Call it before installing the serving filter: the threads
    /// stay outside it, so the tools get the denylist instead.
    ///
    /// # Errors
    /// The error spawning a thread.
    pub fn start(
        name: &str,
        threads: usize,
        timeout: Duration,
        ids: ToolIds,
        tool_filter: Arc<BpfProgram>,
        stalled: Claims,
    ) -> io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..threads.max(1) {
            let (queue, filter, stalled) = (Arc::clone(&queue), Arc::clone(&tool_filter), stalled.clone());
            // A thread cannot give its child what it does not hold (some
            // sandboxes withhold capabilities even from root): each tool gets
            // what it needs of what this thread has. The thread itself uses
            // CAP_SYS_ADMIN (re-verification) and CAP_KILL (a tool's group,
            // another uid's, is killed from here); the rest stays permitted,
            // effective only in the child that needs it.
            harden::spawn_thread(name, &harden::TOOLS, &harden::EXECUTING, move |held| {
                loop {
                    // The guard is a temporary: the queue is locked only
                    // while taking the next job, not while running it.
                    let next = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
                    let Ok(job) = next else { break };
                    let (result, unreaped) = match start(&job, ids, held, &filter) {
                        Ok(tool) => finish(&job, tool, timeout),
                        Err(e) => (Err(e), None),
                    };
                    // Closed before the answer: fd 3 may be a mount's root
                    // (xfs_growfs), and the caller may unmount next.
                    drop(job.fd3);
                    // Claimed before the answer, so that a retry finds it.
                    let unreaped = unreaped.map(|tool| (tool, stalled.claim(job.device.number, &job.device.path())));
                    let _ = job.reply.send(result);
                    if let Some((tool, claim)) = unreaped {
                        settle(tool, job.device, claim.ok(), job.path);
                    }
                }
            })?;
        }
        Ok(Self { jobs, timeout, stalled })
    }

    /// Runs `tool` with `args` on `target` (its fd 3, [`DEVICE_ARG`]) and
    /// returns its output, whatever its exit status. Logs `exec` before and
    /// `exited` after, with the exit status and the milliseconds from the
    /// queue to the exit (`elapsed_ms`, a waiting turn included).
    ///
    /// # Errors
    /// [`HelperError::InProgress`] when a read of the device by an earlier
    /// request has not ended, [`HelperError::DeviceRefused`] when the
    /// device changed before the exec, [`HelperError::ToolFailed`] when the
    /// tool ran out of time, [`HelperError::System`] when it is missing or
    /// cannot be started.
    pub fn run(&self, tool: Tool, args: &[&str], target: ToolTarget<'_>) -> Result<Output, HelperError> {
        let path = tool.path()?;
        let (device, fd3) = match target {
            ToolTarget::Device(device) => (device, device.fd()),
            ToolTarget::MountOf(device, mount_root) => (device, mount_root),
        };
        self.stalled.check(device.number, &device.path())?;
        tracing::info!(tool = %path, ?args, device = ?device.path(), "exec");
        let fd3 = rustix::io::fcntl_dupfd_cloexec(fd3, 0).map_err(|e| Operation::Exec.failed(e))?;
        let (reply, answer) = mpsc::channel();
        let job = Job {
            tool,
            path,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            device: device.clone(),
            fd3,
            reply,
        };
        let started = Instant::now();
        self.jobs
            .send(job)
            .map_err(|_| Operation::Exec.failed("the executor threads are gone"))?;
        let output = answer
            .recv()
            .map_err(|_| Operation::Exec.failed("the executor threads are gone"))??;
        // Milliseconds to the microsecond, a number in any log format.
        let elapsed_ms = (started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
        tracing::info!(tool = tool.file_name(), status = %output.status, elapsed_ms, "exited");
        Ok(output)
    }

    /// Runs `tool` and requires exit status 0.
    ///
    /// # Errors
    /// As [`Executor::run`], plus [`HelperError::ToolFailed`] with the exit
    /// status and the end of stderr.
    pub fn run_checked(&self, tool: Tool, args: &[&str], target: ToolTarget<'_>) -> Result<Output, HelperError> {
        let output = self.run(tool, args, target)?;
        if output.status.success() {
            return Ok(output);
        }
        Err(HelperError::ToolFailed {
            tool: tool.path()?,
            detail: format!("{}: {}", output.status, stderr_excerpt(&output.stderr)),
        })
    }
}

/// The most of a tool's stderr the agent is told, in characters.
const STDERR_EXCERPT_CHARS: usize = 400;

/// What the agent is told of a tool's stderr (in
/// [`HelperError::ToolFailed`]): its last [`STDERR_EXCERPT_CHARS`]
/// characters once trimmed, every line break or tab a space and every
/// other character outside printable ASCII `?` — no terminal controls, and
/// no more than that of what a taken-over tool may have read (third audit
/// A1). The helper's log has nothing more: the tool's stderr goes nowhere
/// else.
pub fn stderr_excerpt(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let chars: Vec<char> = text.trim().chars().collect();
    chars[chars.len().saturating_sub(STDERR_EXCERPT_CHARS)..]
        .iter()
        .map(|&c| match c {
            '\n' | '\t' => ' ',
            ' '..='~' => c,
            _ => '?',
        })
        .collect()
}

/// Verifies the device again and starts `job`'s tool, confined.
fn start(job: &Job, ids: ToolIds, held: u64, tool_filter: &Arc<BpfProgram>) -> Result<Child, HelperError> {
    job.device.reverify()?;
    let mut command = Command::new(&job.path);
    command
        .args(&job.args)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mount_root = (job.tool == Tool::XfsGrowfs).then(|| job.fd3.as_fd());
    let ruleset = confine::ruleset(job.tool, job.device.fd(), mount_root)
        .map_err(|e| Operation::Confine(job.path.clone()).failed(e))?;
    sys::set_up_tool_child(
        &mut command,
        job.fd3.as_raw_fd(),
        ids,
        job.tool.capabilities() & held,
        ruleset.as_ref().map(AsRawFd::as_raw_fd),
        Arc::clone(tool_filter),
    );
    command
        .spawn()
        .map_err(|e| Operation::Start(job.path.clone()).failed(e))
}

/// Waits for `child` at most `timeout` and kills its process group; reaps
/// it when it ended in time, else returns it unreaped, for [`settle`].
fn finish(job: &Job, mut child: Child, timeout: Duration) -> (Result<Output, HelperError>, Option<Child>) {
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let in_time = wait_for_exit(&child, timeout);
    // Whether it ended or ran out of time, the tool's process group goes
    // with it: what it started (it can leave neither its group nor its
    // session: the tools' seccomp filter) would otherwise stay as root
    // (third audit A7). Before the tool is reaped, so that the group's id,
    // its pid, cannot name another process's group yet.
    kill_group(&child);
    let waiting = |e| Operation::Wait(job.path.clone()).failed(e);
    match in_time {
        Ok(true) => {
            let output = child.wait().map_err(waiting).map(|status| Output {
                status,
                stdout: drained(&stdout, &job.path),
                stderr: drained(&stderr, &job.path),
            });
            (output, None)
        }
        Ok(false) => {
            let detail = format!("still running after {} s; killed", timeout.as_secs());
            let tool = job.path.clone();
            (Err(HelperError::ToolFailed { tool, detail }), Some(child))
        }
        Err(e) => (Err(waiting(e)), Some(child)),
    }
}

/// Settles a tool killed past its time limit, on a thread of its own,
/// however long it takes: reaps it (a read of a device that does not
/// answer can hold it where a kill does not end it; until reaped, its pid
/// names its process group, which no other process can take); waits until
/// `device` is the last handle on the device's file and closes it (a read
/// it left stalled may hold a page of the device locked, and the last
/// close of a block device waits for every such page, holding the disk's
/// open mutex: `blkdev_flush_mapping`); then releases the device's
/// `claim` in the executor's `stalled` set.
fn settle(mut child: Child, device: VerifiedDevice, claim: Option<Claim>, tool: String) {
    let settling = std::thread::Builder::new().spawn(move || {
        let status = child.wait();
        while !device.is_last_handle() {
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(device);
        drop(claim);
        tracing::info!(tool, ?status, "a tool killed past its time limit has ended");
    });
    if let Err(e) = settling {
        tracing::warn!(error = %e, "cannot start a thread to settle a tool past its time limit");
    }
}

/// How long the executor waits, after the tool has exited, for its pipes
/// to reach their end. A process of its group that a kill does not end at
/// once (in uninterruptible sleep, on a device that does not answer) holds
/// them open; the executor goes on without the rest of its output, and the
/// reading thread ends when that process does.
const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// The most of a tool's stdout or stderr the helper keeps, in bytes (blkid's
/// answer is a few lines); the rest is read and dropped.
const OUTPUT_LIMIT: u64 = 64 << 10;

/// Reads a child's pipe to its end on a thread of its own, so a chatty
/// tool never blocks on a full pipe while the executor waits for it; keeps
/// the first [`OUTPUT_LIMIT`] bytes, so that a taken-over tool cannot fill
/// the helper's memory.
fn drain(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (bytes, received) = mpsc::channel();
    std::thread::spawn(move || {
        let mut read = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.by_ref().take(OUTPUT_LIMIT).read_to_end(&mut read);
            let _ = io::copy(&mut pipe, &mut io::sink());
        }
        let _ = bytes.send(read);
    });
    received
}

/// What [`drain`] read, waiting at most [`DRAIN_DEADLINE`]; nothing when
/// the pipe is still open then (logged).
fn drained(pipe: &mpsc::Receiver<Vec<u8>>, tool: &str) -> Vec<u8> {
    pipe.recv_timeout(DRAIN_DEADLINE).unwrap_or_else(|_| {
        tracing::warn!(
            tool,
            "a process of the tool's group holds its output open; going on without it"
        );
        Vec::new()
    })
}

/// Whether `child` exited within `timeout` (a pidfd becomes readable when
/// its process exits).
fn wait_for_exit(child: &Child, timeout: Duration) -> io::Result<bool> {
    let pid = Pid::from_child(child);
    let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty())?;
    let timeout = Timespec::try_from(timeout).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    loop {
        let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(ready) => return Ok(ready > 0),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Kills the tool and everything it started (its process group; a group
/// whose only member is the tool's zombie takes the signal too).
fn kill_group(child: &Child) {
    let pid = Pid::from_child(child);
    if let Err(e) = rustix::process::kill_process_group(pid, Signal::KILL) {
        tracing::warn!(pid = pid.as_raw_nonzero().get(), error = %e, "cannot kill a tool's process group");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_is_told_a_bounded_printable_excerpt_of_stderr() {
        assert_eq!(
            stderr_excerpt(b"  mkfs: bad\n\tsize\x1b[2J\xff\n"),
            "mkfs: bad  size?[2J?"
        );
        let excerpt = stderr_excerpt(format!("{}end", "x".repeat(1000)).as_bytes());
        assert_eq!((excerpt.len(), &excerpt[397..]), (STDERR_EXCERPT_CHARS, "end"));
    }
}
