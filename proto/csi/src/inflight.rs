//! The in-flight guard both CSI services use: a second call for a key
//! (a volume id, a volume name, a volume and node pair) that has an
//! operation in flight is refused, and the caller answers ABORTED (CSI
//! spec, "Concurrency") — unless it is the very same request, which may
//! wait for the first to end ([`InFlight::acquire_or_wait`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

/// An operation in flight: what it was asked, and a channel that closes
/// when it ends.
#[derive(Debug)]
struct Operation {
    request: Option<String>,
    ended: watch::Receiver<()>,
}

/// The set of keys with an operation in flight.
#[derive(Clone, Debug, Default)]
pub struct InFlight {
    busy: Arc<Mutex<HashMap<String, Operation>>>,
}

/// Holds a key until dropped.
#[derive(Debug)]
pub struct InFlightGuard {
    busy: Arc<Mutex<HashMap<String, Operation>>>,
    key: String,
    /// Dropped after the key is released: wakes the waiting callers.
    _ended: watch::Sender<()>,
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
        self.try_acquire(key, None).map_err(|_| AlreadyInFlight(key.to_owned()))
    }

    /// Claims `key` for a call described by `request` (a canonical text of
    /// everything the call asks, secrets left out). While a call with the
    /// same `request` holds the key, waits for it to end and claims the key
    /// then, so a caller that retries a request still running (Nomad
    /// retries on its own deadline, and takes ABORTED as final) gets the
    /// outcome of doing it once more, which for an idempotent operation is
    /// the first's.
    ///
    /// # Errors
    /// [`AlreadyInFlight`] when a different request holds the key.
    pub async fn acquire_or_wait(&self, key: &str, request: &str) -> Result<InFlightGuard, AlreadyInFlight> {
        loop {
            match self.try_acquire(key, Some(request)) {
                Ok(guard) => return Ok(guard),
                Err(Some(mut ended)) => {
                    // Err once the holder's sender is dropped, even if it
                    // was dropped before this wait began.
                    let _ = ended.changed().await;
                }
                Err(None) => return Err(AlreadyInFlight(key.to_owned())),
            }
        }
    }

    /// Claims `key`, or returns the channel of the same `request` holding
    /// it (`Some`), or `None` when another request holds it.
    fn try_acquire(&self, key: &str, request: Option<&str>) -> Result<InFlightGuard, Option<watch::Receiver<()>>> {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = busy.get(key) {
            let same = request.is_some() && running.request.as_deref() == request;
            return Err(same.then(|| running.ended.clone()));
        }
        let (ended_tx, ended) = watch::channel(());
        busy.insert(
            key.to_owned(),
            Operation {
                request: request.map(str::to_owned),
                ended,
            },
        );
        Ok(InFlightGuard {
            busy: Arc::clone(&self.busy),
            key: key.to_owned(),
            _ended: ended_tx,
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
    use std::time::Duration;

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

    #[tokio::test]
    async fn the_same_request_waits_for_the_first_and_a_different_one_is_refused() {
        let inflight = InFlight::default();
        let first = inflight.acquire_or_wait("vol-1", "stage /a").await.unwrap();
        assert_eq!(
            inflight.acquire_or_wait("vol-1", "stage /b").await.unwrap_err(),
            AlreadyInFlight("vol-1".into())
        );
        assert_eq!(inflight.acquire("vol-1").unwrap_err(), AlreadyInFlight("vol-1".into()));
        let waiter = {
            let inflight = inflight.clone();
            tokio::spawn(async move { inflight.acquire_or_wait("vol-1", "stage /a").await.map(|_| ()) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "waits while the first runs");
        drop(first);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        // Released again by the waiter's guard.
        inflight.acquire("vol-1").unwrap();
    }

    #[tokio::test]
    async fn a_request_that_merely_acquired_is_never_joined() {
        let inflight = InFlight::default();
        let _first = inflight.acquire("vol-1").unwrap();
        assert_eq!(
            inflight.acquire_or_wait("vol-1", "").await.unwrap_err(),
            AlreadyInFlight("vol-1".into())
        );
    }
}
