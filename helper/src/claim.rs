//! The devices being formatted right now.
//!
//! A format runs outside the handler's exclusive lock (so several volumes
//! can be formatted at once); its device is claimed meanwhile, and every
//! request that names a claimed device is refused with
//! [`HelperError::InProgress`] rather than probing or mounting a
//! half-written filesystem.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use ebs_csi_helper_proto::HelperError;

/// A block device number: (major, minor).
pub type DeviceNumber = (u32, u32);

/// The set of claimed devices.
#[derive(Debug, Default)]
pub struct Claims {
    devices: Mutex<HashSet<DeviceNumber>>,
}

/// A claim on one device, released when dropped.
#[derive(Debug)]
pub struct Claim<'a> {
    claims: &'a Claims,
    device: DeviceNumber,
}

impl Claims {
    /// Claims `device`, named `path` in the error.
    ///
    /// # Errors
    /// [`HelperError::InProgress`] when it is already claimed.
    pub fn claim(&self, device: DeviceNumber, path: &str) -> Result<Claim<'_>, HelperError> {
        if self.lock().insert(device) {
            Ok(Claim { claims: self, device })
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<DeviceNumber>> {
        self.devices.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.claims.lock().remove(&self.device);
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
