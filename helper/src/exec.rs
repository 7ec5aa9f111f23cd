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
//! The helper asks ([`Executor`]); the runner process
//! ([`crate::runner`]), the only one that holds the tools' capabilities,
//! runs each tool from one of its pools of threads
//! ([`Tool::formats`]), whose thread count is the number of tools it runs
//! at once. The serving
//! process's seccomp filter binds neither the runner nor the tools, which
//! get the denylist instead.

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use ebs_csi_helper_proto::HelperError;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags, Signal};
use rustix::thread::CapabilitySet;
use seccompiler::BpfProgram;
use serde::{Deserialize, Serialize};

use crate::claim::{Claim, Claims};
use crate::confine;
use crate::device::VerifiedDevice;
use crate::error::Operation;
use crate::runner::{self, Ran, Runner, Work};
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

    /// The capabilities the tool runs with, each measured (a tool run as uid 991 on a loop device, Debian 12):
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
    pub fn capabilities(self) -> CapabilitySet {
        let (read, write, admin) = (
            CapabilitySet::DAC_READ_SEARCH,
            CapabilitySet::DAC_OVERRIDE,
            CapabilitySet::SYS_ADMIN,
        );
        match self {
            Self::Blkid => read,
            Self::MkfsExt2 | Self::MkfsExt3 | Self::MkfsExt4 => write,
            Self::MkfsXfs => admin | write,
            Self::XfsGrowfs => admin | read,
        }
    }

    /// Whether it makes a filesystem: the runner's `formatter` threads run
    /// it (`--max-parallel-formats` at once), the one `tools` thread every
    /// other tool.
    pub fn formats(self) -> bool {
        matches!(self, Self::MkfsExt2 | Self::MkfsExt3 | Self::MkfsExt4 | Self::MkfsXfs)
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

/// The helper's handle to the runner's tools.
#[derive(Clone, Debug)]
pub struct Executor {
    runner: Runner,
    /// How long a tool may run (`--tool-timeout-seconds`).
    pub timeout: Duration,
    /// Devices with a read that outlived its request (a killed tool not
    /// yet ended, the blank proof): no tool starts on them.
    pub stalled: Claims,
}

impl Executor {
    /// Runs tools in `runner`, each killed with its process group after
    /// `timeout` (the runner's limit, given it too). A tool killed past its
    /// time limit is answered for at once; its device is in `stalled` until
    /// the runner has reaped it.
    pub fn new(runner: Runner, timeout: Duration, stalled: Claims) -> Self {
        Self {
            runner,
            timeout,
            stalled,
        }
    }

    /// Runs `tool` with `args` on `target` (its fd 3, [`DEVICE_ARG`]) and
    /// returns its output, whatever its exit status. Logs `exec` before and
    /// `exited` after, with the exit status and the milliseconds from the
    /// request to the runner to the exit (`elapsed_ms`, a waiting turn
    /// included).
    ///
    /// # Errors
    /// [`HelperError::InProgress`] when a read of the device by an earlier
    /// request has not ended, [`HelperError::DeviceRefused`] when the
    /// device changed before the exec, [`HelperError::ToolFailed`] when the
    /// tool ran out of time, [`HelperError::System`] when it is missing or
    /// cannot be started, or the runner cannot be reached.
    pub fn run(&self, tool: Tool, args: &[&str], target: ToolTarget<'_>) -> Result<Output, HelperError> {
        let (device, mount_root) = match target {
            ToolTarget::Device(device) => (device, None),
            ToolTarget::MountOf(device, mount_root) => (device, Some(mount_root)),
        };
        let path = tool.path()?;
        self.stalled.check(device.number, &device.path())?;
        tracing::info!(tool = %path, ?args, device = ?device.path(), "exec");
        let work = Work::Tool {
            tool,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            device: device.facts(),
        };
        let fds: Vec<BorrowedFd<'_>> = std::iter::once(device.fd()).chain(mount_root).collect();
        let started = Instant::now();
        let (reply, job) = self.runner.call(&work, &fds)?;
        if reply.settling {
            // Claimed before the answer, so that a retry finds it.
            let claim = self.stalled.claim(device.number, &device.path()).ok();
            settle(job, device.clone(), claim, path);
        }
        let ran = reply.result?;
        let output = Output {
            status: ExitStatus::from_raw(ran.status),
            stdout: ran.stdout,
            stderr: ran.stderr,
        };
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

/// Settles, in the helper, a tool the runner killed past its time limit,
/// on a thread of its own, however long it takes: waits until the runner
/// has reaped it (it closes the job's socket then; it closed its handle on
/// the device before it answered), then until `device` is the helper's
/// last handle, and
/// closes it — the last close of the device's file, made here and not by
/// a request: a read the tool left stalled may hold a page of the device
/// locked, and the last close of a block device waits for every such
/// page, holding the disk's open mutex (`blkdev_flush_mapping`); then
/// releases the device's `claim` in the `stalled` set.
fn settle(job: OwnedFd, device: VerifiedDevice, claim: Option<Claim>, tool: String) {
    let settling = std::thread::Builder::new().spawn(move || {
        runner::wait_closed(&job);
        while !device.is_last_handle() {
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(device);
        drop(claim);
        tracing::info!(tool, "a tool killed past its time limit has ended");
    });
    if let Err(e) = settling {
        tracing::warn!(error = %e, "cannot start a thread to settle a tool past its time limit");
    }
}

/// A tool to run, in the runner: the device the helper proved, adopted
/// from the descriptor it passed.
#[derive(Debug)]
pub(crate) struct Job {
    pub tool: Tool,
    /// The tool's absolute path, from the runner's table.
    pub path: String,
    pub args: Vec<String>,
    pub device: VerifiedDevice,
    /// `xfs_growfs`'s fd 3 in place of the device: the root of a mount of
    /// it.
    pub mount_root: Option<OwnedFd>,
    /// Where the answer goes.
    pub socket: OwnedFd,
}

/// A fixed pool of the runner's threads sharing one queue: at most that
/// many of its tools run at once, later jobs wait in the queue.
pub(crate) struct Threads {
    jobs: mpsc::Sender<Job>,
}

impl Threads {
    /// Starts `threads` threads named `name`. A tool still running after
    /// `timeout` is killed with its process group. Each tool runs as `ids`
    /// and installs `tool_filter` (the policy's `tools` denylist) before
    /// it execs.
    ///
    /// # Errors
    /// The error reading the capabilities or spawning a thread.
    pub fn start(
        name: &str,
        threads: usize,
        timeout: Duration,
        ids: ToolIds,
        tool_filter: Arc<BpfProgram>,
    ) -> io::Result<Self> {
        // A tool cannot be given what the runner does not hold (some
        // sandboxes withhold capabilities even from root).
        let held = rustix::thread::capabilities(None)?.permitted;
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..threads.max(1) {
            let (queue, filter) = (Arc::clone(&queue), Arc::clone(&tool_filter));
            std::thread::Builder::new().name(name.into()).spawn(move || {
                loop {
                    // The guard is a temporary: the queue is locked only
                    // while taking the next job, not while running it.
                    let next = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
                    let Ok(job) = next else { break };
                    run_job(job, ids, held, &filter, timeout);
                }
            })?;
        }
        Ok(Self { jobs })
    }

    /// Queues `job`.
    pub fn queue(&self, job: Job) {
        // The threads live as long as the runner; were they gone, the job's
        // socket would close unanswered, which the helper reports.
        let _ = self.jobs.send(job);
    }
}

/// On a runner thread: verifies the device again, runs the tool, answers,
/// and settles a tool killed past its time limit.
fn run_job(job: Job, ids: ToolIds, held: CapabilitySet, tool_filter: &Arc<BpfProgram>, timeout: Duration) {
    let (result, unreaped) = match start(&job, ids, held, tool_filter) {
        Ok(tool) => finish(&job, tool, timeout),
        Err(e) => (Err(e), None),
    };
    let Job {
        path,
        device,
        mount_root,
        socket,
        ..
    } = job;
    // Closed before the answer: a mount's root (xfs_growfs) would keep the
    // mount busy when the helper unmounts next, and the device's last close
    // is the helper's (see `settle`).
    drop(mount_root);
    drop(device);
    let result = result.map(|output| Ran {
        status: output.status.into_raw(),
        stdout: output.stdout,
        stderr: output.stderr,
    });
    runner::answer(&socket, result, unreaped.is_some());
    if let Some(tool) = unreaped {
        reap(tool, socket, path);
    }
}

/// Reaps, in the runner, a tool killed past its time limit, on a thread of
/// its own, however long it takes (a read of a device that does not answer
/// can hold it where a kill does not end it; until reaped, its pid names
/// its process group, which no other process can take); then closes the
/// job's socket, which tells the helper ([`settle`]).
fn reap(mut child: Child, socket: OwnedFd, tool: String) {
    let reaping = std::thread::Builder::new().spawn(move || {
        let status = child.wait();
        drop(socket);
        tracing::info!(tool, ?status, "reaped a tool killed past its time limit");
    });
    if let Err(e) = reaping {
        tracing::warn!(error = %e, "cannot start a thread to reap a tool past its time limit");
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
fn start(job: &Job, ids: ToolIds, held: CapabilitySet, tool_filter: &Arc<BpfProgram>) -> Result<Child, HelperError> {
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
    let mount_root = job.mount_root.as_ref().map(AsFd::as_fd);
    let ruleset = confine::ruleset(job.tool, job.device.fd(), mount_root)
        .map_err(|e| Operation::Confine(job.path.clone()).failed(e))?;
    sys::set_up_tool_child(
        &mut command,
        mount_root.unwrap_or(job.device.fd()).as_raw_fd(),
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
/// it when it ended in time, else returns it unreaped, for [`reap`].
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

/// How long the executor waits, after the tool has exited, for its pipes
/// to reach their end. A process of its group that a kill does not end at
/// once (in uninterruptible sleep, on a device that does not answer) holds
/// them open; the executor goes on without the rest of its output, and the
/// reading thread ends when that process does.
const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// The most of a tool's stdout or stderr the runner keeps, in bytes
/// (blkid's answer is a few lines, and the agent is told at most
/// [`STDERR_EXCERPT_CHARS`] of stderr); the rest is read and dropped. Both
/// at this limit fit one message to the helper ([`crate::runner`]).
pub(crate) const OUTPUT_LIMIT: u64 = 16 << 10;

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
