//! `aws_ebs_csi_ec2_detach_pending_seconds_total`: how long the controller
//! has waited for a volume to detach, per attachment, as the Go driver's
//! `pkg/metrics/async.go` (labels `volume_id`, `instance_id`,
//! `attachment_state`; only detachments pending longer than 60 s; an entry
//! no ControllerUnpublishVolume has looked at for 15 minutes is forgotten).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{CounterVec, Opts};

use crate::ec2::AttachmentState;

/// Detachments shorter than this are not reported (the Go driver's
/// `InitializeAsyncEC2Metrics(60 * time.Second)`).
const THRESHOLD: Duration = Duration::from_secs(60);
/// An entry not updated for this long is dropped (the Go driver's
/// `cacheCleanupInterval`): its ControllerUnpublishVolume gave up, or
/// another controller took over.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

/// One detachment being waited for.
#[derive(Clone, Copy, Debug)]
struct Pending {
    since: Instant,
    checked: Instant,
    state: &'static str,
}

/// The detachments the controller waits for, keyed by (volume id,
/// instance id); a cheap handle to shared state.
#[derive(Clone, Debug)]
pub struct DetachPending {
    pending: Arc<Mutex<HashMap<(String, String), Pending>>>,
    threshold: Duration,
    family: CounterVec,
}

impl Default for DetachPending {
    fn default() -> Self {
        Self::with_threshold(THRESHOLD)
    }
}

impl DetachPending {
    /// A tracker that reports detachments pending longer than `threshold`.
    pub fn with_threshold(threshold: Duration) -> Self {
        let family = CounterVec::new(
            Opts::new(
                "aws_ebs_csi_ec2_detach_pending_seconds_total",
                "Seconds the driver has been waiting for a volume to detach from an instance; \
                 attachment_state is the state last seen",
            ),
            &["volume_id", "instance_id", "attachment_state"],
        )
        .unwrap_or_else(|e| unreachable!("fixed metric name and labels: {e}"));
        Self {
            pending: Arc::default(),
            threshold,
            family,
        }
    }

    /// Records the state a detachment was last seen in; `Detached` (or no
    /// attachment any more) ends it.
    pub fn track(&self, volume_id: &str, instance_id: &str, state: Option<AttachmentState>) {
        let key = (volume_id.to_owned(), instance_id.to_owned());
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let state = match state {
            None | Some(AttachmentState::Detached) => {
                pending.remove(&key);
                return;
            }
            Some(AttachmentState::Attaching) => "attaching",
            Some(AttachmentState::Attached) => "attached",
            Some(AttachmentState::Detaching) => "detaching",
            Some(AttachmentState::Busy) => "busy",
        };
        let now = Instant::now();
        let since = pending.get(&key).map_or(now, |p| p.since);
        pending.insert(
            key,
            Pending {
                since,
                checked: now,
                state,
            },
        );
    }
}

impl Collector for DetachPending {
    fn desc(&self) -> Vec<&Desc> {
        self.family.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.retain(|_, p| p.checked.elapsed() < FORGET_AFTER);
        self.family.reset();
        for ((volume_id, instance_id), p) in pending.iter() {
            let waited = p.since.elapsed();
            if waited > self.threshold {
                self.family
                    .with_label_values(&[volume_id.as_str(), instance_id.as_str(), p.state])
                    .inc_by(waited.as_secs_f64());
            }
        }
        self.family.collect()
    }
}

#[cfg(test)]
impl DetachPending {
    /// The series in Prometheus text format, as `/metrics` shows them.
    pub fn render(&self) -> String {
        let registry = prometheus::Registry::new();
        registry
            .register(Box::new(self.clone()))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &registry.gather(), &mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&out).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_a_pending_detachment_until_it_ends() {
        let tracker = DetachPending::with_threshold(Duration::ZERO);
        tracker.track("vol-1", "i-1", Some(AttachmentState::Detaching));
        std::thread::sleep(Duration::from_millis(5));
        tracker.track("vol-1", "i-1", Some(AttachmentState::Busy));
        let text = tracker.render();
        assert!(
            text.contains(
                r#"aws_ebs_csi_ec2_detach_pending_seconds_total{attachment_state="busy",instance_id="i-1",volume_id="vol-1"} "#
            ),
            "{text}"
        );
        tracker.track("vol-1", "i-1", Some(AttachmentState::Detached));
        assert!(!tracker.render().contains("vol-1"));
    }

    #[test]
    fn short_detachments_are_not_reported() {
        let tracker = DetachPending::default();
        tracker.track("vol-1", "i-1", Some(AttachmentState::Detaching));
        assert!(!tracker.render().contains("vol-1"));
    }
}
