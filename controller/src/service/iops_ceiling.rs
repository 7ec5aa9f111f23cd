//! The highest IOPS EC2 takes for a volume type in a zone, found as the Go
//! driver finds it (`getVolumeLimits` in `pkg/cloud/cloud.go`): a dry-run
//! CreateVolume asking for more than any type allows, whose refusal names
//! the maximum. Kept for 12 hours per type and zone (Go's
//! `iopsLimitCacheForgetDelay`); where EC2's answer names none, or the call
//! fails, the EC2 API Reference's figure in [`crate::volume_type`] stands.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::ec2::{Ec2, Tags};
use crate::volume_type::VolumeType;

/// How long a discovered maximum is used.
const KEEP: Duration = Duration::from_secs(12 * 60 * 60);

/// A maximum EC2 named (`None`: its answer named none), and when.
type Found = (Instant, Option<i32>);

/// Discovered maxima by (volume type, zone).
#[derive(Debug, Default)]
pub struct IopsCeilings {
    found: Mutex<HashMap<(&'static str, String), Found>>,
}

impl IopsCeilings {
    /// `kind` with its IOPS maximum as EC2 gives it in `zone`, asked with
    /// the `tags` of the volume it is for; a type without provisioned IOPS
    /// is returned as it is, without a call.
    pub async fn in_zone<E: Ec2>(&self, ec2: &E, kind: VolumeType, zone: &str, tags: &Tags) -> VolumeType {
        let Some(limits) = kind.iops else {
            return kind;
        };
        let key = (kind.name, zone.to_owned());
        let cached = self
            .found
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .filter(|(at, _)| at.elapsed() < KEEP)
            .map(|(_, max)| *max);
        let max = match cached {
            Some(max) => max,
            None => match ec2.max_iops(kind.name, zone, kind.max_gib, tags).await {
                Ok(max) => {
                    tracing::info!(volume_type = kind.name, zone, max_iops = ?max, "IOPS maximum from EC2");
                    self.found
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(key, (Instant::now(), max));
                    max
                }
                Err(e) => {
                    tracing::warn!(volume_type = kind.name, zone, error = %e, "no IOPS maximum from EC2; using the documented one");
                    None
                }
            },
        };
        kind.with_max_iops(max.unwrap_or(limits.max))
    }
}
