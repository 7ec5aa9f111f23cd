//! The in-flight guard both CSI services use: a second call for a key
//! (a volume id, a volume name, a volume and node pair) that has an
//! operation in flight is refused, and the caller answers ABORTED (CSI
//! spec, "Concurrency").

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// The set of keys with an operation in flight.
#[derive(Clone, Debug, Default)]
pub struct InFlight {
    busy: Arc<Mutex<HashSet<String>>>,
}

/// Holds a key until dropped.
#[derive(Debug)]
pub struct InFlightGuard {
    busy: Arc<Mutex<HashSet<String>>>,
    key: String,
}

/// The key already has an operation in flight.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("an operation for {0} is already in progress")]
pub struct AlreadyInFlight(pub String);

impl InFlight {
    /// Claims `key` for the caller until the guard is dropped.
    ///
    /// # Errors
    /// [`AlreadyInFlight`] when it is already claimed.
    pub fn acquire(&self, key: &str) -> Result<InFlightGuard, AlreadyInFlight> {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if !busy.insert(key.to_owned()) {
            return Err(AlreadyInFlight(key.to_owned()));
        }
        Ok(InFlightGuard {
            busy: Arc::clone(&self.busy),
            key: key.to_owned(),
        })
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_second_claim_until_released() {
        let inflight = InFlight::default();
        let first = inflight.acquire("vol-1").unwrap();
        assert_eq!(inflight.acquire("vol-1").unwrap_err(), AlreadyInFlight("vol-1".into()));
        let _other = inflight.acquire("vol-2").unwrap();
        drop(first);
        inflight.acquire("vol-1").unwrap();
    }
}
