//! Catching a tool the helper runs at the moment it starts. fanotify's
//! `FAN_OPEN_EXEC_PERM` (fanotify(7)) holds every exec of a watched program
//! until a listener answers; the gate stops the helper's tool, a child of
//! its runner process (SIGSTOP is then pending, so it stops before the tool's first instruction) and lets
//! the exec go on. Polling `/proc` for the child instead misses a tool that
//! finishes in a few milliseconds, as `mkfs.ext4` on a small volume does.
#![allow(clippy::expect_used, reason = "test support")]

use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::fanotify::{
    EventFFlags, Fanotify, FanotifyEvent, FanotifyResponse, InitFlags, MarkFlags, MaskFlags, Response,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rustix::event::{PollFd, PollFlags};

/// The format tools (on Debian `mkfs.ext4` links to `mke2fs`, whose inode
/// the mark lands on; the VM's initramfs holds a copy).
pub const MKFS: [&str; 2] = ["/usr/sbin/mkfs.ext4", "/usr/sbin/mkfs.xfs"];
/// `xfs_growfs`.
pub const XFS_GROWFS: [&str; 1] = ["/usr/sbin/xfs_growfs"];

/// Stops the first descendant of one process that execs a watched program.
pub struct ExecGate {
    caught: mpsc::Receiver<u32>,
    stop: Arc<AtomicBool>,
    listener: Option<JoinHandle<()>>,
}

impl ExecGate {
    /// Watches `programs` (absolute paths) until dropped: the first exec of
    /// one of them by a descendant of `parent` (the helper's tools are its
    /// runner's children) is stopped and reported; every
    /// other exec, on the whole machine, is let through at once.
    pub fn watch(parent: u32, programs: &[&str]) -> Self {
        let flags = InitFlags::FAN_CLASS_CONTENT | InitFlags::FAN_CLOEXEC | InitFlags::FAN_NONBLOCK;
        let fanotify = Fanotify::init(flags, EventFFlags::O_RDONLY).expect("fanotify_init (needs CAP_SYS_ADMIN)");
        for program in programs {
            let cwd = rustix::fs::CWD;
            fanotify
                .mark(
                    MarkFlags::FAN_MARK_ADD,
                    MaskFlags::FAN_OPEN_EXEC_PERM,
                    cwd,
                    Some(*program),
                )
                .unwrap_or_else(|e| panic!("fanotify_mark {program}: {e}"));
        }
        let (report, caught) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let listener = std::thread::spawn(move || {
            let mut reported = false;
            // Waits for events, looking at the stop flag every 50 ms.
            let timeout = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 50_000_000,
            };
            while !stopping.load(Ordering::SeqCst) {
                let mut ready = [PollFd::new(&fanotify, PollFlags::IN)];
                if !matches!(rustix::event::poll(&mut ready, Some(&timeout)), Ok(n) if n > 0) {
                    continue;
                }
                let Ok(events) = fanotify.read_events() else {
                    continue;
                };
                for event in events {
                    let pid = u32::try_from(event.pid()).unwrap_or_default();
                    if !reported && descends_from(pid, parent) {
                        reported = true;
                        let _ = kill(Pid::from_raw(event.pid()), Signal::SIGSTOP);
                        let _ = report.send(pid);
                    }
                    allow(&fanotify, &event);
                }
            }
        });
        Self {
            caught,
            stop,
            listener: Some(listener),
        }
    }

    /// The pid of the child caught, once it has stopped at the start of
    /// the tool; panics after `within`.
    pub fn caught(&self, within: Duration) -> u32 {
        let pid = self
            .caught
            .recv_timeout(within)
            .unwrap_or_else(|_| panic!("no watched exec within {within:?}"));
        crate::wait_until("the caught tool to stop", within, || state_of(pid) == Some('T'));
        pid
    }
}

impl Drop for ExecGate {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(listener) = self.listener.take() {
            let _ = listener.join();
        }
    }
}

fn allow(fanotify: &Fanotify, event: &FanotifyEvent) {
    if let Some(fd) = event.fd() {
        let _ = fanotify.write_response(FanotifyResponse::new(fd.as_fd(), Response::FAN_ALLOW));
    }
}

/// The fields of `/proc/PID/stat` after the command name: state first,
/// then the parent pid.
fn stat_of(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        stat.rsplit_once(") ")?
            .1
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    )
}

fn parent_of(pid: u32) -> Option<u32> {
    stat_of(pid)?.get(1)?.parse().ok()
}

/// Whether `ancestor` is `pid`'s parent, or its parent's, and so on.
fn descends_from(pid: u32, ancestor: u32) -> bool {
    std::iter::successors(parent_of(pid), |&p| parent_of(p).filter(|&next| next != p))
        .take_while(|&p| p > 1)
        .any(|p| p == ancestor)
}

fn state_of(pid: u32) -> Option<char> {
    stat_of(pid)?.first()?.chars().next()
}
