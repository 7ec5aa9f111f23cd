//! The devices busy beyond one request's lock.
//!
//! Stage's probe and format run outside the handler's exclusive lock (so
//! several volumes can be probed and formatted at once, and a device whose
//! reads stall holds no other volume's request); the device is claimed
//! meanwhile, and every request that names a claimed device is refused
//! with [`HelperError::InProgress`] rather than probing or mounting a
//! half-written filesystem. The executor keeps a second set: devices with
//! a read that outlived its request (a killed tool not yet ended, the
//! blank proof's thread), on which no tool or proof starts until it ends.

use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ebs_csi_helper_proto::HelperError;

/// A block device number: (major, minor).
pub type DeviceNumber = (u32, u32);

/// The set of claimed devices; clones share it.
#[derive(Clone, Debug, Default)]
pub struct Claims {
    devices: Arc<(Mutex<HashSet<DeviceNumber>>, Condvar)>,
}

/// A claim on one device, released when dropped (on any thread).
#[derive(Debug)]
pub struct Claim {
    claims: Claims,
    device: DeviceNumber,
}

impl Claims {
    /// Claims `device`, named `path` in the error.
    ///
    /// # Errors
    /// [`HelperError::InProgress`] when it is already claimed.
    pub fn claim(&self, device: DeviceNumber, path: &str) -> Result<Claim, HelperError> {
        if self.lock().insert(device) {
            Ok(Claim {
                claims: self.clone(),
                device,
            })
        } else {
            Err(in_progress(path))
        }
    }

    /// Checks that `device` is not claimed.
    ///
    /// # Errors
    /// [`HelperError::InProgress`] when it is.
    pub fn check(&self, device: DeviceNumber, path: &str) -> Result<(), HelperError> {
        if self.lock().contains(&device) {
            Err(in_progress(path))
        } else {
            Ok(())
        }
    }

    /// Checks that `device` is not claimed, waiting at most `limit` for
    /// its claim to be released.
    ///
    /// # Errors
    /// [`HelperError::InProgress`] when it is still claimed then.
    pub fn check_within(&self, device: DeviceNumber, path: &str, limit: Duration) -> Result<(), HelperError> {
        let (_, released) = &*self.devices;
        let (claimed, _) = released
            .wait_timeout_while(self.lock(), limit, |claimed| claimed.contains(&device))
            .unwrap_or_else(PoisonError::into_inner);
        if claimed.contains(&device) {
            Err(in_progress(path))
        } else {
            Ok(())
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<DeviceNumber>> {
        self.devices.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.claims.lock().remove(&self.device);
        self.claims.devices.1.notify_all();
    }
}

fn in_progress(path: &str) -> HelperError {
    HelperError::InProgress {
        device: path.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_device_is_refused_until_released() {
        let claims = Claims::default();
        let claim = claims.claim((259, 1), "/dev/nvme1n1").unwrap();
        let busy = HelperError::InProgress {
            device: "/dev/nvme1n1".into(),
        };
        assert_eq!(claims.claim((259, 1), "/dev/nvme1n1").unwrap_err(), busy);
        assert_eq!(claims.check((259, 1), "/dev/nvme1n1").unwrap_err(), busy);
        claims.check((259, 2), "/dev/nvme2n1").unwrap();
        drop(claim);
        claims.check((259, 1), "/dev/nvme1n1").unwrap();
        drop(claims.claim((259, 1), "/dev/nvme1n1").unwrap());
    }
}
