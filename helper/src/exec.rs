//! The one way the helper runs another program.
//!
//! Only tools from a fixed table, by absolute path, with arguments the
//! caller built from validated types; no shell, an empty environment,
//! stdin from `/dev/null`, and no descriptor beyond stdio (the child
//! closes the rest before it execs). Tools run from executor threads,
//! started before the seccomp filter is installed on the serving threads,
//! so the filter binds the helper and not the tools. An executor's thread
//! count is the number of tools it runs at once.

use std::io;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex, PoisonError, mpsc};

use ebs_csi_helper_proto::HelperError;

use crate::error::system;
use crate::sys;

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
    /// `resize2fs` (e2fsprogs): grows a mounted ext2/3/4 filesystem.
    Resize2fs,
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
            Self::Resize2fs => "resize2fs",
            Self::XfsGrowfs => "xfs_growfs",
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
            .ok_or_else(|| system(format!("finding {}", self.file_name()), "not installed"))
    }
}

struct Job {
    path: String,
    args: Vec<String>,
    reply: mpsc::Sender<io::Result<Output>>,
}

/// A handle to a fixed pool of executor threads sharing one queue.
#[derive(Clone, Debug)]
pub struct Executor {
    jobs: mpsc::Sender<Job>,
}

impl Executor {
    /// Starts `threads` executor threads named `name`; at most that many
    /// tools run at once, later jobs wait in the queue. Call it before
    /// installing the seccomp filter: the threads, and so every tool, stay
    /// unfiltered.
    ///
    /// # Errors
    /// The error spawning a thread.
    pub fn start(name: &str, threads: usize) -> io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..threads.max(1) {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new().name(name.into()).spawn(move || {
                loop {
                    // The guard is a temporary: the queue is locked only
                    // while taking the next job, not while running it.
                    let next = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
                    let Ok(job) = next else { break };
                    let _ = job.reply.send(execute(&job));
                }
            })?;
        }
        Ok(Self { jobs })
    }

    /// Runs `tool` with `args` and returns its output, whatever its exit
    /// status.
    ///
    /// # Errors
    /// [`HelperError::System`] when the tool is missing or cannot be started.
    pub fn run(&self, tool: Tool, args: &[&str]) -> Result<Output, HelperError> {
        let path = tool.path()?;
        tracing::info!(tool = %path, ?args, "exec");
        let (reply, answer) = mpsc::channel();
        let job = Job {
            path: path.clone(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            reply,
        };
        self.jobs
            .send(job)
            .map_err(|_| system("exec", "the executor threads are gone"))?;
        answer
            .recv()
            .map_err(|_| system("exec", "the executor threads are gone"))?
            .map_err(|e| system(format!("starting {path}"), e))
    }

    /// Runs `tool` and requires exit status 0.
    ///
    /// # Errors
    /// As [`Executor::run`], plus [`HelperError::ToolFailed`] with the exit
    /// status and the end of stderr.
    pub fn run_checked(&self, tool: Tool, args: &[&str]) -> Result<Output, HelperError> {
        let output = self.run(tool, args)?;
        if output.status.success() {
            return Ok(output);
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: String = stderr
            .trim()
            .chars()
            .rev()
            .take(400)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        Err(HelperError::ToolFailed {
            tool: tool.path()?,
            detail: format!("{}: {tail}", output.status),
        })
    }
}

fn execute(job: &Job) -> io::Result<Output> {
    let mut command = Command::new(&job.path);
    command
        .args(&job.args)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    sys::close_fds_on_exec(&mut command);
    command.output()
}
