//! Stopping on SIGTERM and SIGINT: how systemd, kubelet (through the
//! container runtime) and a terminal ask the helper to stop.
//!
//! The helper blocks both signals before it starts any thread, so every
//! thread inherits the mask (pthread_sigmask(3)) and the signals stay
//! pending until one thread takes them with sigwait(3). Blocked, they reach
//! the helper even as PID 1 of a PID namespace (a container's first
//! process), where the kernel discards a signal whose action is the
//! default (pid_namespaces(7), "The namespace init process"; a blocked
//! signal is never discarded, kernel/signal.c `sig_ignored`). A mask
//! survives exec (signal(7)); a tool's child empties it before the exec
//! (`sys::set_up_tool_child`, third audit A8).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{SigSet, Signal};

const STOPPING: &str = "stopping: no new connections; requests in flight may finish";

/// The stop signals, blocked in the thread that made this and in every
/// thread it starts afterwards.
pub struct StopSignals(SigSet);

impl StopSignals {
    /// Blocks SIGTERM and SIGINT in the calling thread. Call it before
    /// starting any thread.
    ///
    /// # Errors
    /// The error of `pthread_sigmask(3)`.
    pub fn block() -> io::Result<Self> {
        let signals = SigSet::from(Signal::SIGTERM) | Signal::SIGINT;
        signals.thread_block()?;
        Ok(Self(signals))
    }

    /// Starts a thread (`signals`) that waits for the first stop signal,
    /// sets `stopping` and logs it. Under the serving seccomp filter it
    /// needs `rt_sigtimedwait`, sigwait(3)'s system call.
    ///
    /// # Errors
    /// The error starting the thread.
    pub fn on_signal(self, stopping: Arc<AtomicBool>) -> io::Result<()> {
        std::thread::Builder::new().name("signals".into()).spawn(move || {
            let signal = self.0.wait();
            // Set before the line is logged: whoever reads the line knows
            // no new connection is served.
            stopping.store(true, Ordering::SeqCst);
            match signal {
                Ok(Signal::SIGINT) => tracing::info!(signal = "SIGINT", "{STOPPING}"),
                Ok(_) => tracing::info!(signal = "SIGTERM", "{STOPPING}"),
                Err(error) => tracing::error!(%error, "stopping: sigwait failed"),
            }
        })?;
        Ok(())
    }
}
