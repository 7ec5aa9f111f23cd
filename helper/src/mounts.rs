//! The mount tables a request is checked against.
//!
//! Under systemd the helper shares the host's mount namespace; in a
//! container it has its own, where a disk mounted only on the host (at
//! `/data`, say) would look unused. So the helper also keeps PID 1's
//! mountinfo open from start-up (opening another process's needs access to
//! it that the helper gives up with its capabilities) and reads both, each
//! mount once: mount ids are unique across namespaces.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::sync::{Mutex, PoisonError};

use ebs_csi_helper_proto::HelperError;
use ebs_csi_linux::mountinfo::{self, MountEntry};

use crate::error::system;

/// The helper's own mount table and, where it could open it at start, the
/// host's (PID 1's).
#[derive(Debug)]
pub struct MountTables {
    host: Option<Mutex<File>>,
}

impl MountTables {
    /// Opens PID 1's mountinfo; call it before lowering capabilities. When
    /// it cannot be opened (a `/proc` mounted with `hidepid`), only the
    /// helper's own table is read, and a warning says so.
    pub fn open() -> Self {
        let host = File::open("/proc/1/mountinfo")
            .inspect_err(|e| tracing::warn!(error = %e, "cannot open /proc/1/mountinfo: host-only mounts are not seen"))
            .ok();
        Self {
            host: host.map(Mutex::new),
        }
    }

    /// The helper's own mounts (`/proc/self/mountinfo`), then the host's
    /// that are not among them.
    ///
    /// # Errors
    /// [`HelperError::System`] when a table cannot be read.
    pub fn read(&self) -> Result<Vec<MountEntry>, HelperError> {
        let mut mounts = mountinfo::read().map_err(|e| system("reading mountinfo", e))?;
        if let Some(host) = &self.host {
            let mut file = host.lock().unwrap_or_else(PoisonError::into_inner);
            let mut text = String::new();
            file.seek(SeekFrom::Start(0))
                .and_then(|_| file.read_to_string(&mut text))
                .map_err(|e| system("reading PID 1's mountinfo", e))?;
            for entry in mountinfo::parse(&text) {
                if !mounts.iter().any(|m| m.mount_id == entry.mount_id) {
                    mounts.push(entry);
                }
            }
        }
        Ok(mounts)
    }
}
