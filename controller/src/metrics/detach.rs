//! `aws_ebs_csi_ec2_detach_pending_seconds_total`: how long the controller
//! has waited for a volume to detach, per attachment, as the Go driver's
//! `pkg/metrics/async.go` (labels `volume_id`, `instance_id`,
//! `attachment_state`; only detachments pending longer than 60 s; an entry
//! no ControllerUnpublishVolume has looked at for 15 minutes is forgotten),
//! and the collector's own `aws_ebs_csi_ec2_collector_scrapes_total` and
//! `aws_ebs_csi_ec2_collector_duration_seconds` (each scrape counted and
//! timed, Go's buckets), which dashboards made for the Go driver read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{CounterVec, Histogram, HistogramOpts, IntCounter, Opts};

use crate::ec2::AttachmentState;

/// Detachments shorter than this are not reported (the Go driver's
/// `InitializeAsyncEC2Metrics(60 * time.Second)`).
const THRESHOLD: Duration = Duration::from_secs(60);
/// The buckets of `aws_ebs_csi_ec2_collector_duration_seconds`, seconds
/// (the Go driver's `InitializeAsyncEC2Metrics`).
const DURATION_BUCKETS: [f64; 7] = [0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0];
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
    scrapes: IntCounter,
    duration: Histogram,
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
        let scrapes = IntCounter::with_opts(Opts::new(
            "aws_ebs_csi_ec2_collector_scrapes_total",
            "Total number of async EC2 collector scrapes.",
        ))
        .unwrap_or_else(|e| unreachable!("a fixed metric name: {e}"));
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "aws_ebs_csi_ec2_collector_duration_seconds",
                "Histogram of async EC2 collector scrape duration in seconds.",
            )
            .buckets(DURATION_BUCKETS.to_vec()),
        )
        .unwrap_or_else(|e| unreachable!("a fixed metric name and buckets: {e}"));
        Self {
            pending: Arc::default(),
            threshold,
            family,
            scrapes,
            duration,
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

    /// The pending detachments longer than the threshold, forgetting the
    /// entries no ControllerUnpublishVolume has looked at for
    /// [`FORGET_AFTER`].
    fn collect_pending(&self) -> Vec<MetricFamily> {
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

impl Collector for DetachPending {
    fn desc(&self) -> Vec<&Desc> {
        [self.family.desc(), self.scrapes.desc(), self.duration.desc()].concat()
    }

    /// The pending detachments, then the scrape's own count and duration.
    fn collect(&self) -> Vec<MetricFamily> {
        self.scrapes.inc();
        let started = Instant::now();
        let mut families = self.collect_pending();
        self.duration.observe(started.elapsed().as_secs_f64());
        families.extend(self.duration.collect());
        families.extend(self.scrapes.collect());
        families
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

    /// Each scrape is counted and timed, as the Go driver's collector does.
    #[test]
    fn each_scrape_is_counted_and_timed() {
        let tracker = DetachPending::default();
        tracker.render();
        let text = tracker.render();
        for line in [
            "aws_ebs_csi_ec2_collector_scrapes_total 2\n",
            "aws_ebs_csi_ec2_collector_duration_seconds_count 2\n",
            "aws_ebs_csi_ec2_collector_duration_seconds_bucket{le=\"0.01\"} 2\n",
            "aws_ebs_csi_ec2_collector_duration_seconds_bucket{le=\"10\"} 2\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }

    #[test]
    fn short_detachments_are_not_reported() {
        let tracker = DetachPending::default();
        tracker.track("vol-1", "i-1", Some(AttachmentState::Detaching));
        assert!(!tracker.render().contains("vol-1"));
    }
}
