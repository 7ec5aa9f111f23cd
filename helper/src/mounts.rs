//! The mount tables a request is checked against.
//!
//! Under systemd the helper shares the host's mount namespace; in a
//! container it has its own, where a disk mounted only on the host (at
//! `/data`, say) would look unused. So the helper also keeps PID 1's
//! mountinfo open from start-up (opening another process's needs access to
//! it that the helper gives up with its capabilities) and reads both, each
//! mount once: mount ids are unique across namespaces. PID 1 is the node's
//! init only in the node's PID namespace: a helper in a PID namespace of its
//! own (a Kubernetes pod without `hostPID: true`) would read its own
//! container's table there, so it refuses to start.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::sync::{Mutex, PoisonError};

use ebs_csi_helper_proto::HelperError;
use ebs_csi_linux::mountinfo::{self, MountEntry};

use crate::error::Operation;

/// The initial PID namespace's `/proc/<pid>/ns/pid` link
/// (`PROC_PID_INIT_INO` = 0xEFFFFFFC, include/linux/proc_ns.h): the node's
/// own, where PID 1 is the node's init.
pub const INITIAL_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Why the helper cannot see the node's mount table; it does not start.
#[derive(Debug, thiserror::Error)]
pub enum MountTablesError {
    /// The helper runs in a PID namespace of its own.
    #[error(
        "the helper's PID namespace is {0}, not the node's ({INITIAL_PID_NAMESPACE}): PID 1 is not the node's init, \
         so disks mounted only on the host would look unused; run it in the node's PID namespace \
         (hostPID: true in Kubernetes), or pass --nested-pid-namespace on a node that is itself a container"
    )]
    OwnPidNamespace(String),
    /// `/proc/self/ns/pid` or `/proc/1/mountinfo` cannot be read (no
    /// `/proc`, or one mounted with `hidepid`).
    #[error("{0}: {1}")]
    Unreadable(&'static str, std::io::Error),
}

/// The helper's own mount table and the node's (PID 1's).
#[derive(Debug)]
pub struct MountTables {
    host: Mutex<File>,
}

impl MountTables {
    /// Opens PID 1's mountinfo; call it before lowering capabilities.
    /// `nested_pid_namespace` accepts a PID namespace other than the
    /// initial one, for a node that is itself a container (kind), whose PID
    /// 1 is that node's init.
    ///
    /// # Errors
    /// [`MountTablesError::OwnPidNamespace`] in a PID namespace of its own,
    /// [`MountTablesError::Unreadable`] when the table cannot be opened.
    pub fn open(nested_pid_namespace: bool) -> Result<Self, MountTablesError> {
        let namespace = std::fs::read_link("/proc/self/ns/pid")
            .map_err(|e| MountTablesError::Unreadable("/proc/self/ns/pid", e))?
            .to_string_lossy()
            .into_owned();
        if namespace != INITIAL_PID_NAMESPACE {
            if !nested_pid_namespace {
                return Err(MountTablesError::OwnPidNamespace(namespace));
            }
            tracing::warn!(pid_namespace = %namespace, "--nested-pid-namespace: PID 1 is taken to be the node's init");
        }
        let host = File::open("/proc/1/mountinfo").map_err(|e| MountTablesError::Unreadable("/proc/1/mountinfo", e))?;
        Ok(Self { host: Mutex::new(host) })
    }

    /// The helper's own mounts (`/proc/self/mountinfo`), then the node's
    /// that are not among them.
    ///
    /// # Errors
    /// [`HelperError::System`] when a table cannot be read.
    pub fn read(&self) -> Result<Vec<MountEntry>, HelperError> {
        let mut mounts = mountinfo::read().map_err(|e| Operation::ReadMountinfo.failed(e))?;
        let mut file = self.host.lock().unwrap_or_else(PoisonError::into_inner);
        let mut text = String::new();
        file.seek(SeekFrom::Start(0))
            .and_then(|_| file.read_to_string(&mut text))
            .map_err(|e| Operation::ReadHostMountinfo.failed(e))?;
        for entry in mountinfo::parse(&text) {
            if !mounts.iter().any(|m| m.mount_id == entry.mount_id) {
                mounts.push(entry);
            }
        }
        Ok(mounts)
    }
}
