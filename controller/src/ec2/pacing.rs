//! Client-side pacing of EC2 calls: a call waits here for a token of its
//! action's bucket ([`super::limits`]) instead of being sent into EC2's
//! throttling, and a call EC2 throttles anyway is sent again (a throttled
//! call did nothing, so sending it again is safe; CreateVolume carries its
//! client token too).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::limits::{Bucket, Limits};
use super::{
    CreateSnapshotInput, CreateVolumeInput, Ec2, Ec2Error, Instance, Modification, ModifyVolumeInput, Selector,
    Snapshot, SnapshotLock, Tags, Volume, VolumeHealth, Zone,
};

/// When calls are sent, and sent again after `RequestLimitExceeded`.
pub trait Policy: Send + Sync + 'static {
    /// Waits until a call of `action` may be sent.
    fn before(&self, action: &'static str) -> impl Future<Output = ()> + Send;
    /// After the `attempt`-th throttled answer (from 1) to a call of
    /// `action`: how long to wait before the next attempt (which
    /// [`Policy::before`] paces too), or `None` to give up.
    fn throttled(&self, action: &'static str, attempt: u32) -> Option<Duration>;
    /// After an answer other than `RequestLimitExceeded` to a call of
    /// `action` that was throttled `throttled` times before.
    fn answered(&self, _action: &'static str, _throttled: u32) {}
}

/// Times a throttled call is sent again before the RPC gives up with
/// UNAVAILABLE (which the CO retries). Each attempt has passed the SDK's own
/// retries first.
const THROTTLED_ATTEMPTS: u32 = 10;

/// The controller's policy: a token bucket per action that stays inside
/// EC2's. EC2 adds its refill "every second" (the guide's words) at a phase
/// the client cannot see, while this bucket refills continuously; holding
/// back one second of refill keeps every call here inside EC2's bucket
/// whatever that phase is. A throttled answer means something else in the
/// account drew on the same bucket: this one is emptied, so the next call
/// waits for refill.
pub struct RequestBuckets {
    limits: Limits,
    buckets: Mutex<HashMap<&'static str, ClientBucket>>,
}

/// Tokens may go below zero: each waiting call has reserved its token, and
/// the debt is repaid by refill in the order the calls came.
struct ClientBucket {
    tokens: f64,
    at: Instant,
}

impl RequestBuckets {
    /// Buckets for `limits`, full.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            buckets: Mutex::default(),
        }
    }

    /// With `bucket` of `action`, refilled until now: `f` of its state.
    fn with<T>(&self, action: &'static str, f: impl FnOnce(&mut ClientBucket, Bucket) -> T) -> T {
        let limit = self.limits.bucket(action);
        let capacity = (limit.capacity - limit.refill_per_second).max(1.0);
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = buckets.entry(action).or_insert(ClientBucket {
            tokens: capacity,
            at: now,
        });
        let refill = now.duration_since(bucket.at).as_secs_f64() * limit.refill_per_second;
        bucket.tokens = (bucket.tokens + refill).min(capacity);
        bucket.at = now;
        f(bucket, limit)
    }
}

impl Policy for RequestBuckets {
    async fn before(&self, action: &'static str) {
        let wait = self.with(action, |bucket, limit| {
            bucket.tokens -= 1.0;
            if bucket.tokens >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-bucket.tokens / limit.refill_per_second)
            }
        });
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    fn throttled(&self, action: &'static str, attempt: u32) -> Option<Duration> {
        self.with(action, |bucket, _| bucket.tokens = bucket.tokens.min(0.0));
        (attempt < THROTTLED_ATTEMPTS).then_some(Duration::ZERO)
    }
}

/// An [`Ec2`] whose calls follow a [`Policy`].
pub struct Paced<E, P> {
    inner: E,
    policy: P,
}

impl<E: Ec2, P: Policy> Paced<E, P> {
    /// `inner`, paced by `policy`.
    pub const fn new(inner: E, policy: P) -> Self {
        Self { inner, policy }
    }

    /// The EC2 behind the pacing.
    #[cfg(test)]
    pub const fn inner(&self) -> &E {
        &self.inner
    }

    /// Sends `call` of `action` when the policy lets it, again while EC2
    /// throttles it and the policy allows another attempt.
    async fn call<T, F, Fut>(&self, action: &'static str, call: F) -> Result<T, Ec2Error>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, Ec2Error>>,
    {
        let mut attempt = 0;
        loop {
            self.policy.before(action).await;
            match call().await {
                Err(Ec2Error::Throttled(message)) => {
                    attempt += 1;
                    let pause = self
                        .policy
                        .throttled(action, attempt)
                        .ok_or(Ec2Error::Throttled(message))?;
                    tokio::time::sleep(pause).await;
                }
                other => {
                    self.policy.answered(action, attempt);
                    return other;
                }
            }
        }
    }
}

impl<E: Ec2, P: Policy> Ec2 for Paced<E, P> {
    async fn create_volume(&self, input: CreateVolumeInput) -> Result<Volume, Ec2Error> {
        self.call("CreateVolume", || self.inner.create_volume(input.clone()))
            .await
    }

    async fn copy_volume(&self, source_volume_id: &str, input: CreateVolumeInput) -> Result<Volume, Ec2Error> {
        self.call("CopyVolumes", || {
            self.inner.copy_volume(source_volume_id, input.clone())
        })
        .await
    }

    async fn describe_volume_status(&self, volume_id: &str) -> Result<Option<VolumeHealth>, Ec2Error> {
        self.call("DescribeVolumeStatus", || self.inner.describe_volume_status(volume_id))
            .await
    }

    async fn delete_volume(&self, volume_id: &str) -> Result<(), Ec2Error> {
        self.call("DeleteVolume", || self.inner.delete_volume(volume_id)).await
    }

    async fn describe_volumes(&self, selector: Selector) -> Result<Vec<Volume>, Ec2Error> {
        self.call("DescribeVolumes", || self.inner.describe_volumes(selector.clone()))
            .await
    }

    async fn attach_volume(
        &self,
        volume_id: &str,
        instance_id: &str,
        device: &str,
        ebs_card: Option<i32>,
    ) -> Result<(), Ec2Error> {
        self.call("AttachVolume", || {
            self.inner.attach_volume(volume_id, instance_id, device, ebs_card)
        })
        .await
    }

    async fn ebs_cards(&self, instance_type: &str) -> Result<Option<i32>, Ec2Error> {
        self.call("DescribeInstanceTypes", || self.inner.ebs_cards(instance_type))
            .await
    }

    async fn detach_volume(&self, volume_id: &str, instance_id: &str) -> Result<(), Ec2Error> {
        self.call("DetachVolume", || self.inner.detach_volume(volume_id, instance_id))
            .await
    }

    async fn describe_instances(&self, ids: Vec<String>) -> Result<Vec<Instance>, Ec2Error> {
        self.call("DescribeInstances", || self.inner.describe_instances(ids.clone()))
            .await
    }

    async fn create_snapshot(&self, volume_id: &str, input: CreateSnapshotInput) -> Result<Snapshot, Ec2Error> {
        self.call("CreateSnapshot", || {
            self.inner.create_snapshot(volume_id, input.clone())
        })
        .await
    }

    async fn create_snapshots(
        &self,
        instance_id: &str,
        excluded_volume_ids: Vec<String>,
        tags: Tags,
    ) -> Result<Vec<Snapshot>, Ec2Error> {
        self.call("CreateSnapshots", || {
            self.inner
                .create_snapshots(instance_id, excluded_volume_ids.clone(), tags.clone())
        })
        .await
    }

    async fn lock_snapshot(&self, snapshot_id: &str, lock: &SnapshotLock) -> Result<(), Ec2Error> {
        self.call("LockSnapshot", || self.inner.lock_snapshot(snapshot_id, lock))
            .await
    }

    async fn enable_fast_snapshot_restores(
        &self,
        snapshot_id: &str,
        zones: &[String],
    ) -> Result<Vec<String>, Ec2Error> {
        self.call("EnableFastSnapshotRestores", || {
            self.inner.enable_fast_snapshot_restores(snapshot_id, zones)
        })
        .await
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), Ec2Error> {
        self.call("DeleteSnapshot", || self.inner.delete_snapshot(snapshot_id))
            .await
    }

    async fn describe_snapshots(&self, selector: Selector) -> Result<Vec<Snapshot>, Ec2Error> {
        self.call("DescribeSnapshots", || self.inner.describe_snapshots(selector.clone()))
            .await
    }

    async fn modify_volume(&self, volume_id: &str, input: ModifyVolumeInput) -> Result<(), Ec2Error> {
        self.call("ModifyVolume", || self.inner.modify_volume(volume_id, input.clone()))
            .await
    }

    async fn describe_volumes_modifications(&self, ids: Vec<String>) -> Result<Vec<Modification>, Ec2Error> {
        self.call("DescribeVolumesModifications", || {
            self.inner.describe_volumes_modifications(ids.clone())
        })
        .await
    }

    async fn create_tags(&self, resource_id: &str, tags: Tags) -> Result<(), Ec2Error> {
        self.call("CreateTags", || self.inner.create_tags(resource_id, tags.clone()))
            .await
    }

    async fn delete_tags(&self, resource_id: &str, keys: Vec<String>) -> Result<(), Ec2Error> {
        self.call("DeleteTags", || self.inner.delete_tags(resource_id, keys.clone()))
            .await
    }

    async fn describe_availability_zones(&self) -> Result<Vec<Zone>, Ec2Error> {
        self.call("DescribeAvailabilityZones", || self.inner.describe_availability_zones())
            .await
    }

    async fn max_iops(
        &self,
        volume_type: &str,
        zone: &str,
        size_gib: i32,
        tags: &Tags,
    ) -> Result<Option<i32>, Ec2Error> {
        self.call("CreateVolume", || {
            self.inner.max_iops(volume_type, zone, size_gib, tags)
        })
        .await
    }

    async fn dry_run(&self) -> Result<(), Ec2Error> {
        self.call("DescribeAvailabilityZones", || self.inner.dry_run()).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::ec2::model::{Behaviour, Model};

    /// 300 DescribeInstances at once against EC2's default bucket (100,
    /// refill 20 per second): none is throttled, the first 80 go at once
    /// (one second's refill held back) and the rest at 20 per second.
    #[tokio::test(start_paused = true)]
    async fn calls_wait_for_tokens_instead_of_being_throttled() {
        let model = Model::new(Behaviour {
            request_limits: true,
            ..Behaviour::default()
        });
        let paced = Arc::new(Paced::new(model, RequestBuckets::new(Limits::default())));
        let start = Instant::now();
        let calls: Vec<_> = (0..300)
            .map(|_| {
                let paced = Arc::clone(&paced);
                tokio::spawn(async move { paced.describe_instances(Vec::new()).await.map(|_| start.elapsed()) })
            })
            .collect();
        let mut times = Vec::new();
        for call in calls {
            times.push(call.await.unwrap().unwrap());
        }
        times.sort();
        assert_eq!(paced.inner().throttled(), 0);
        assert_eq!(paced.inner().calls("DescribeInstances"), 300);
        assert_eq!(times.iter().filter(|t| t.is_zero()).count(), 80);
        assert!((times[299].as_secs_f64() - 11.0).abs() < 1e-6, "{:?}", times[299]);
    }

    /// Something else in the account drained the bucket: the throttled
    /// call is sent again once this side's bucket has refilled, and the
    /// RPC never sees the throttling.
    #[tokio::test(start_paused = true)]
    async fn a_throttled_call_is_sent_again_after_refill() {
        let model = Model::new(Behaviour::default());
        model.throttle(3);
        let paced = Paced::new(model, RequestBuckets::new(Limits::default()));
        let start = Instant::now();
        paced.describe_availability_zones().await.unwrap();
        assert_eq!(paced.inner().calls("DescribeAvailabilityZones"), 4);
        let waited = start.elapsed().as_secs_f64();
        assert!(
            (waited - 0.150).abs() < 1e-6,
            "three tokens at 20 per second: {waited} s"
        );
    }
}
