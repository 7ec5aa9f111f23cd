//! Watching a process's descendants: which tools the helper is running
//! now, and the most it ran at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// The pids of `pid`'s descendants (children of any of its threads, their
/// children, and so on: the helper's tools are its runner's children)
/// whose command name (`/proc/PID/comm`) starts with `prefix`.
pub fn descendants_named(pid: u32, prefix: &str) -> Vec<u32> {
    let mut descendants = children(pid);
    let mut next = 0;
    while let Some(&child) = descendants.get(next) {
        descendants.extend(children(child));
        next += 1;
    }
    descendants
        .into_iter()
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/comm")).is_ok_and(|comm| comm.starts_with(prefix))
        })
        .collect()
}

/// The pids of `pid`'s children, of any of its threads.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Whether process `pid` has exited (gone, or a zombie nobody reaped yet).
pub fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'))
    })
}

/// Samples [`descendants_named`] every millisecond on a thread until
/// [`PeakChildren::stop`].
pub struct PeakChildren {
    stop: Arc<AtomicBool>,
    sampler: JoinHandle<usize>,
}

impl PeakChildren {
    /// Starts sampling `pid`'s children named `prefix…`.
    pub fn start(pid: u32, prefix: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let sampler = std::thread::spawn(move || {
            let mut peak = 0;
            while !stopped.load(Ordering::Relaxed) {
                peak = peak.max(descendants_named(pid, prefix).len());
                std::thread::sleep(Duration::from_millis(1));
            }
            peak
        });
        Self { stop, sampler }
    }

    /// Stops sampling; the most children seen at once.
    pub fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.sampler.join().unwrap_or_default()
    }
}

/// A child a test started, killed and reaped when the guard goes, so that a
/// failed assertion leaves no process behind.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
