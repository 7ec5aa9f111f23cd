//! The per-volume in-flight guard: a second call for a volume that has an
//! operation in flight gets ABORTED (CSI spec, "Concurrency").

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::NodeError;

/// The set of volume ids with an operation in flight.
#[derive(Clone, Debug, Default)]
pub struct VolumeGuards {
    busy: Arc<Mutex<HashSet<String>>>,
}

/// Holds a volume until dropped.
#[derive(Debug)]
pub struct VolumeGuard {
    busy: Arc<Mutex<HashSet<String>>>,
    volume_id: String,
}

impl VolumeGuards {
    /// Claims `volume_id` for the caller.
    ///
    /// # Errors
    /// [`NodeError::Aborted`] (gRPC ABORTED) when it is already claimed.
    pub fn acquire(&self, volume_id: &str) -> Result<VolumeGuard, NodeError> {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if !busy.insert(volume_id.to_owned()) {
            return Err(NodeError::Aborted(volume_id.to_owned()));
        }
        Ok(VolumeGuard {
            busy: Arc::clone(&self.busy),
            volume_id: volume_id.to_owned(),
        })
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        self.busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.volume_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_second_claim_until_released() {
        let guards = VolumeGuards::default();
        let first = guards.acquire("vol-1").unwrap();
        assert!(matches!(guards.acquire("vol-1"), Err(NodeError::Aborted(_))));
        let _other = guards.acquire("vol-2").unwrap();
        drop(first);
        guards.acquire("vol-1").unwrap();
    }
}
