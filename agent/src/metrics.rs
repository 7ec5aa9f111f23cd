//! The agent's `/metrics` (`--http-endpoint`): EBS detailed performance
//! statistics of every EBS volume on the node, with the Go driver's metric
//! names (pkg/metrics/nvme.go) so existing dashboards keep working.
//!
//! Each scrape asks the helper for each volume's log page 0xD0 (a
//! read-only request on a device it proves to be the volume) and parses
//! the bytes here, unprivileged. Series carry `volume_id` and the
//! constant `instance_id`. A volume whose device has no such page (not an
//! EBS controller, e.g. QEMU's) or that the helper refuses (the root
//! volume, in use by the host) has no series and is not an error;
//! anything else counts in `aws_ebs_csi_nvme_collector_errors_total`.
//! With `--csi-mount-point-prefix`, only the volumes mounted beneath it
//! are reported, as the Go driver does ([`MountPointPrefix`]).

use std::path::PathBuf;
use std::time::Instant;

use ebs_csi_helper_client::{ClientError, volume_of_serial};
use ebs_csi_helper_proto::{HelperError, PerformanceStatisticsRequest, VolumeId};
use ebs_csi_linux::mountinfo;
use prometheus::proto::{Bucket, Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, Histogram, HistogramOpts, IntCounter, Opts, Registry, TextEncoder};

use crate::discovery;
use crate::error::NodeError;
use crate::helper::Helper;
use crate::mount_prefix::{self, MountPointPrefix};
use crate::statistics::{self, Bin, Statistics};

/// Microseconds in a second: the page's times are in microseconds.
const MICROSECONDS: f64 = 1e6;

/// Buckets of the scrape duration, in seconds (the Go driver's).
const DURATION_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The node's metrics: the collector's own counters, and each scrape's
/// per-volume statistics.
#[derive(Clone, Debug)]
pub struct NodeMetrics {
    helper: Helper,
    sys_dir: PathBuf,
    instance_id: String,
    prefix: Option<MountPointPrefix>,
    registry: Registry,
    scrapes: IntCounter,
    errors: IntCounter,
    duration: Histogram,
}

impl NodeMetrics {
    /// The metrics of node `instance_id`, whose NVMe controllers are in
    /// `sys_dir`, read through `helper`: of every EBS volume, or of those
    /// mounted beneath `prefix` when given.
    ///
    /// # Errors
    /// A registration error (never for these fixed names).
    pub fn new(
        helper: Helper,
        sys_dir: PathBuf,
        instance_id: String,
        prefix: Option<MountPointPrefix>,
    ) -> prometheus::Result<Self> {
        let registry = Registry::new_custom(None, Some([("instance_id".to_owned(), instance_id.clone())].into()))?;
        let scrapes = IntCounter::with_opts(Opts::new(
            "aws_ebs_csi_nvme_collector_scrapes_total",
            "Total number of NVMe collector scrapes.",
        ))?;
        let errors = IntCounter::with_opts(Opts::new(
            "aws_ebs_csi_nvme_collector_errors_total",
            "Total number of NVMe collector scrape errors.",
        ))?;
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "aws_ebs_csi_nvme_collector_duration_seconds",
                "Histogram of NVMe collector scrape duration in seconds.",
            )
            .buckets(DURATION_BUCKETS.to_vec()),
        )?;
        registry.register(Box::new(scrapes.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        Ok(Self {
            helper,
            sys_dir,
            instance_id,
            prefix,
            registry,
            scrapes,
            errors,
            duration,
        })
    }

    /// One scrape, in Prometheus text format 0.0.4.
    pub async fn render(&self) -> String {
        self.scrapes.inc();
        let started = Instant::now();
        let volumes = self.volumes().await;
        self.duration.observe(started.elapsed().as_secs_f64());
        let mut families = self.registry.gather();
        families.extend(volume_families(&self.instance_id, &volumes));
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
            tracing::warn!(error = %e, "encoding the metrics");
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Each reported volume's id and statistics. With a prefix, a mount
    /// table that cannot be read is an error, and no volume is reported.
    async fn volumes(&self) -> Vec<(String, Statistics)> {
        let mounts = match self.prefix.as_ref().map(|_| mountinfo::read()).transpose() {
            Ok(mounts) => mounts,
            Err(e) => {
                tracing::warn!(error = %e, "reading the mount table for --csi-mount-point-prefix");
                self.errors.inc();
                return Vec::new();
            }
        };
        let mut volumes = Vec::new();
        for controller in discovery::nvme_controllers(&self.sys_dir) {
            let (Some(volume_id), Some(namespace)) = (volume_of_serial(&controller.serial), controller.namespace)
            else {
                continue;
            };
            if let (Some(prefix), Some(mounts)) = (&self.prefix, &mounts) {
                let number = mount_prefix::device_number(&self.sys_dir, &namespace);
                if !prefix.holds(mounts, &namespace, number) {
                    continue;
                }
            }
            if let Some(statistics) = self.read(&volume_id, format!("/dev/{namespace}")).await {
                volumes.push((volume_id.to_string(), statistics));
            }
        }
        volumes
    }

    /// The statistics of `volume_id` on `device`; `None` when it has none
    /// or cannot be read (counted as an error unless it has none).
    async fn read(&self, volume_id: &VolumeId, device: String) -> Option<Statistics> {
        let request = PerformanceStatisticsRequest {
            volume_id: volume_id.clone(),
            device,
        };
        let failure = match self.helper.performance_statistics(request).await {
            Ok(page) => match statistics::parse(&page) {
                Ok(statistics) => return Some(statistics),
                Err(e) => e.to_string(),
            },
            // A helper one protocol version older does not know the request.
            Err(NodeError::Helper(ClientError::Helper(
                e @ (HelperError::StatisticsUnavailable { .. }
                | HelperError::DeviceRefused { .. }
                | HelperError::UnsupportedVersion(_)),
            ))) => {
                tracing::debug!(%volume_id, error = %e, "no performance statistics");
                return None;
            }
            Err(e) => e.to_string(),
        };
        tracing::warn!(%volume_id, error = %failure, "reading performance statistics");
        self.errors.inc();
        None
    }
}

/// The per-volume families, each with one series per volume; none when
/// there is no volume (a family without series cannot be encoded).
fn volume_families(instance_id: &str, volumes: &[(String, Statistics)]) -> Vec<MetricFamily> {
    if volumes.is_empty() {
        return Vec::new();
    }
    type Value = fn(&Statistics) -> f64;
    let counters: [(&str, &str, Value); 10] = [
        (
            "read_ops_total",
            "The total number of completed read operations.",
            |s| s.read_ops as f64,
        ),
        (
            "write_ops_total",
            "The total number of completed write operations.",
            |s| s.write_ops as f64,
        ),
        ("read_bytes_total", "The total number of read bytes transferred.", |s| {
            s.read_bytes as f64
        }),
        (
            "write_bytes_total",
            "The total number of write bytes transferred.",
            |s| s.write_bytes as f64,
        ),
        (
            "read_seconds_total",
            "The total time spent, in seconds, by all completed read operations.",
            |s| seconds(s.read_time_us),
        ),
        (
            "write_seconds_total",
            "The total time spent, in seconds, by all completed write operations.",
            |s| seconds(s.write_time_us),
        ),
        (
            "exceeded_iops_seconds_total",
            "The total time, in seconds, that IOPS demand exceeded the volume's provisioned IOPS performance.",
            |s| seconds(s.ebs_iops_exceeded_us),
        ),
        (
            "exceeded_tp_seconds_total",
            "The total time, in seconds, that throughput demand exceeded the volume's provisioned throughput performance.",
            |s| seconds(s.ebs_throughput_exceeded_us),
        ),
        (
            "ec2_exceeded_iops_seconds_total",
            "The total time, in seconds, that the EBS volume exceeded the attached Amazon EC2 instance's maximum IOPS performance.",
            |s| seconds(s.ec2_iops_exceeded_us),
        ),
        (
            "ec2_exceeded_tp_seconds_total",
            "The total time, in seconds, that the EBS volume exceeded the attached Amazon EC2 instance's maximum throughput performance.",
            |s| seconds(s.ec2_throughput_exceeded_us),
        ),
    ];
    let mut families: Vec<MetricFamily> = counters
        .iter()
        .map(|(name, help, value)| {
            family(name, help, MetricType::COUNTER, instance_id, volumes, |metric, s| {
                let mut counter = Counter::default();
                counter.set_value(value(s));
                metric.set_counter(counter);
            })
        })
        .collect();
    families.push(family(
        "volume_queue_length",
        "The number of read and write operations waiting to be completed.",
        MetricType::GAUGE,
        instance_id,
        volumes,
        |metric, s| {
            let mut gauge = Gauge::default();
            gauge.set_value(s.queue_length as f64);
            metric.set_gauge(gauge);
        },
    ));
    type Bins = fn(&Statistics) -> &[Bin];
    let histograms: [(&str, &str, Bins); 2] = [
        (
            "read_io_latency_seconds",
            "The number of read operations completed within each latency bin, in seconds.",
            |s| &s.read_latency,
        ),
        (
            "write_io_latency_seconds",
            "The number of write operations completed within each latency bin, in seconds.",
            |s| &s.write_latency,
        ),
    ];
    for (name, help, bins) in histograms {
        families.push(family(
            name,
            help,
            MetricType::HISTOGRAM,
            instance_id,
            volumes,
            |metric, s| {
                metric.set_histogram(histogram(bins(s)));
            },
        ));
    }
    families
}

/// A family `aws_ebs_csi_<name>` with one series per volume, each filled
/// by `fill`.
fn family(
    name: &str,
    help: &str,
    kind: MetricType,
    instance_id: &str,
    volumes: &[(String, Statistics)],
    fill: impl Fn(&mut Metric, &Statistics),
) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(format!("aws_ebs_csi_{name}"));
    family.set_help(help.to_owned());
    family.set_field_type(kind);
    for (volume_id, statistics) in volumes {
        let mut metric = Metric::default();
        metric.set_label(vec![label("instance_id", instance_id), label("volume_id", volume_id)]);
        fill(&mut metric, statistics);
        family.mut_metric().push(metric);
    }
    family
}

/// `us` microseconds in seconds.
fn seconds(us: u64) -> f64 {
    us as f64 / MICROSECONDS
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut pair = LabelPair::default();
    pair.set_name(name.to_owned());
    pair.set_value(value.to_owned());
    pair
}

/// The page's bins as a Prometheus histogram: cumulative counts at each
/// bin's upper bound, in seconds (the sum is not on the page: 0, as the
/// Go driver reports it).
fn histogram(bins: &[Bin]) -> prometheus::proto::Histogram {
    let mut cumulative = 0;
    let buckets = bins
        .iter()
        .map(|bin| {
            cumulative += bin.count;
            let mut bucket = Bucket::default();
            bucket.set_upper_bound(seconds(bin.upper_us));
            bucket.set_cumulative_count(cumulative);
            bucket
        })
        .collect();
    let mut histogram = prometheus::proto::Histogram::default();
    histogram.set_sample_count(cumulative);
    histogram.set_sample_sum(0.0);
    histogram.set_bucket(buckets);
    histogram
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
