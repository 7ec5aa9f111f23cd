//! A file whose reads stall in a window, on a FUSE filesystem of the test's
//! own (`tests/fuse/stall.py`, mfusepy over libfuse 3): the third audit's
//! disk that stops answering (A12), which no loop device over a plain file
//! can play. A loop device over the file passes the helper's identity
//! checks as any loop volume does.
#![allow(clippy::expect_used, reason = "test support")]

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{make_dir, repository, venv_program, wait_until};

/// The mounted filesystem and its server, unmounted and stopped when
/// dropped (which ends every stalled read with an error).
pub struct StalledFile {
    server: Child,
    mountpoint: PathBuf,
    file: PathBuf,
    log: PathBuf,
}

impl StalledFile {
    /// Mounts, at `dir/mnt`, a filesystem holding `name`: `size` bytes of
    /// zeros but for `head` at its start, whose reads and writes reaching
    /// into `stalled` never answer (other writes are taken and forgotten).
    pub fn mount(dir: &Path, name: &str, size: u64, stalled: Range<u64>, head: &[u8]) -> Self {
        let mountpoint = dir.join("mnt");
        make_dir(&mountpoint);
        let log = dir.join("stall.log");
        let server = Command::new(venv_program("python"))
            .arg(repository().join("tests/fuse/stall.py"))
            .arg(&mountpoint)
            .arg(name)
            .args([size, stalled.start, stalled.end].map(|n| n.to_string()))
            .arg(head.iter().map(|b| format!("{b:02x}")).collect::<String>())
            .stdout(std::fs::File::create(&log).expect("stall.log"))
            .stderr(Stdio::null())
            .spawn()
            .expect("tests/fuse/stall.py");
        let file = mountpoint.join(name);
        wait_until("the stalling file", Duration::from_secs(20), || file.exists());
        Self {
            server,
            mountpoint,
            file,
            log,
        }
    }

    /// The file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// What the server saw: a `stalled read OFFSET` or `stalled write
    /// OFFSET` line per read or write it left unanswered, a `write OFFSET`
    /// line per write it took.
    pub fn seen(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for StalledFile {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH);
    }
}
