//! `make bench`: the controller's EC2 figures, against the EC2 model with
//! state changes that take realistic time (DESIGN.md §5: `creating` →
//! `available` 1.5 s, `attaching` → `attached` 2.5 s, detach 1.5 s). Not
//! tests (`--ignored`): each appends `name|median|min|max|unit|baseline|target|met`
//! lines to the file named by `EBS_CSI_BENCH_EC2` (prints them otherwise);
//! with `EBS_CSI_BENCH_SMOKE` set they run small, so they cannot rot. Their
//! samples go to CSV files beside that file for tests/bench/plot.py.

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ebs_csi_proto::v1::{ControllerUnpublishVolumeRequest, DeleteVolumeRequest};
use tokio::time::Instant;

use super::{Mode, capability, publish, request};
use crate::ec2::Ec2;
use crate::ec2::batch::BatchConfig;
use crate::ec2::limits::{Limits, default_bucket};
use crate::ec2::model::{Behaviour, Model};
use crate::ec2::pacing::{Paced, Policy, RequestBuckets};
use crate::error::ControllerError;
use crate::service::{ControllerService, Settings};

/// The model's state changes: CreateVolume, AttachVolume, DetachVolume.
const CREATE: Duration = Duration::from_millis(1500);
const ATTACH: Duration = Duration::from_millis(2500);
const DETACH: Duration = Duration::from_millis(1500);

/// The RPCs of one volume's life, in order.
const RPCS: [&str; 4] = [
    "CreateVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "DeleteVolume",
];

fn smoke() -> bool {
    std::env::var_os("EBS_CSI_BENCH_SMOKE").is_some()
}

fn model(request_limits: bool) -> Model {
    Model::new(behaviour(request_limits))
}

fn behaviour(request_limits: bool) -> Behaviour {
    Behaviour {
        create_delay: CREATE,
        attach_delay: Some(ATTACH),
        detach_delay: DETACH,
        request_limits,
        ..Behaviour::default()
    }
}

fn emit(lines: &[String]) {
    let text = lines.join("\n") + "\n";
    match std::env::var_os("EBS_CSI_BENCH_EC2") {
        Some(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .unwrap(),
        None => print!("{text}"),
    }
}

/// Writes `header` and `rows` to the CSV file `name` beside the file of
/// `EBS_CSI_BENCH_EC2`; nothing without one.
fn csv(name: &str, header: &str, rows: impl IntoIterator<Item = String>) {
    let Some(beside) = std::env::var_os("EBS_CSI_BENCH_EC2") else {
        return;
    };
    let lines: Vec<String> = std::iter::once(header.to_owned()).chain(rows).collect();
    std::fs::write(
        std::path::Path::new(&beside).with_file_name(name),
        lines.join("\n") + "\n",
    )
    .unwrap();
}

/// What one lifecycle run measured.
struct Run {
    /// Per RPC of [`RPCS`]: milliseconds from its first attempt to its
    /// success, one sample per volume.
    per_rpc: [Vec<f64>; 4],
    /// RPC attempts that failed.
    failed: usize,
    wall: Duration,
}

fn percentile(samples: &[f64], p: usize) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// Sends an RPC until it succeeds, after each failure waiting as the CSI
/// sidecars do (external-provisioner and external-attacher
/// `--retry-interval-start` 1 s, doubling up to `--retry-interval-max`
/// 5 min): its result and the milliseconds to it.
async fn retried<T, F, Fut>(failed: &AtomicUsize, rpc: F) -> (T, f64)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, ControllerError>>,
{
    let start = Instant::now();
    let mut pause = Duration::from_secs(1);
    loop {
        match rpc().await {
            Ok(reply) => return (reply, start.elapsed().as_secs_f64() * 1000.0),
            Err(_) => {
                failed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(300));
            }
        }
    }
}

/// `volumes` volumes created, attached (to instances `i-0`… `i-{nodes-1}`
/// in turn), detached and deleted, all at once.
async fn lifecycle<E: Ec2>(service: Arc<ControllerService<E>>, volumes: usize, nodes: usize) -> Run {
    let failed = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..volumes)
        .map(|i| {
            let (service, failed) = (Arc::clone(&service), Arc::clone(&failed));
            tokio::spawn(async move {
                let (name, node) = (format!("pvc-{i}"), format!("i-{}", i % nodes));
                let cap = || capability(Mode::SingleNodeWriter, false);
                let (created, create) = retried(&failed, || service.create(request(&name, &[], cap()))).await;
                let id = created.volume.unwrap().volume_id;
                let (_, attach) = retried(&failed, || service.publish(publish(&id, &node, cap()))).await;
                let unpublish = || ControllerUnpublishVolumeRequest {
                    volume_id: id.clone(),
                    node_id: node.clone(),
                    ..Default::default()
                };
                let (_, detach) = retried(&failed, || service.unpublish(unpublish())).await;
                let delete = || DeleteVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                };
                let (_, deleted) = retried(&failed, || service.delete(delete())).await;
                [create, attach, detach, deleted]
            })
        })
        .collect();
    let mut per_rpc: [Vec<f64>; 4] = Default::default();
    for task in tasks {
        for (samples, ms) in per_rpc.iter_mut().zip(task.await.unwrap()) {
            samples.push(ms);
        }
    }
    Run {
        per_rpc,
        failed: failed.load(Ordering::Relaxed),
        wall: started.elapsed(),
    }
}

/// `make bench`, P7: RPC latency against the model's state-change times,
/// and EC2 calls per volume, for volumes created, attached, detached and
/// deleted at once; batching on and off.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark, run by make bench"]
async fn bench_rpc_latency_and_calls_per_volume() {
    let volumes = if smoke() { 20 } else { 100 };
    let mut lines = Vec::new();
    let mut calls = Vec::new();
    for batching in [true, false] {
        eprintln!("bench P7: {volumes} volumes, batching {batching}");
        let model = Arc::new(model(false));
        for i in 0..4 {
            model.add_instance(&format!("i-{i}"), "us-east-1a");
        }
        let settings = Settings {
            batch: BatchConfig {
                enabled: batching,
                ..BatchConfig::default()
            },
            ..Settings::default()
        };
        let service = Arc::new(ControllerService::new(Arc::clone(&model), settings));
        let run = lifecycle(service, volumes, 4).await;
        #[allow(clippy::cast_precision_loss, reason = "small counts")]
        calls.push(model.total_calls() as f64 / volumes as f64);
        let mode = if batching { "batching" } else { "no batching" };
        let wall = run.wall.as_secs_f64() * 1000.0;
        lines.push(format!(
            "{volumes}-volume lifecycle wall time, {mode}|{wall}|{wall}|{wall}|ms||report|true"
        ));
        if batching {
            let samples = RPCS.iter().zip(&run.per_rpc);
            let rows = samples.flat_map(|(rpc, ms)| ms.iter().map(move |ms| format!("{rpc},{ms}")));
            csv("p7-latency.csv", "rpc,ms", rows);
        }
        let changes = [Some(CREATE), Some(ATTACH), Some(DETACH), None];
        for ((rpc, samples), change) in RPCS.iter().zip(&run.per_rpc).zip(changes) {
            let (p50, p99) = (percentile(samples, 50), percentile(samples, 99));
            let (baseline, target, met) = match change {
                Some(change) if batching => {
                    let change = change.as_secs_f64() * 1000.0;
                    (change.to_string(), "≤ 1.15× state change", p50 <= 1.15 * change)
                }
                _ => (String::new(), "report", true),
            };
            lines.push(format!(
                "{rpc} p50 (min–max: p50–p99), {mode}|{p50}|{p50}|{p99}|ms|{baseline}|{target}|{met}"
            ));
        }
    }
    let (with, without) = (calls[0], calls[1]);
    lines.insert(
        0,
        format!(
            "EC2 calls per volume, {volumes} volumes, batching (vs off)|{with}|{with}|{with}|calls|{without}|≤ 4.5 and ≤ 0.5× off|{}",
            with <= 4.5 && with <= 0.5 * without
        ),
    );
    emit(&lines);
}

/// The earliest `volumes` volumes can all be created, attached, detached
/// and deleted under EC2's default request buckets (full at the start,
/// refilled every whole second): each volume's calls in order, each at the
/// first moment its volume is ready and its action's bucket has a token,
/// followed by its state change. Tokens go to volumes in the order they
/// become ready and none is lost to a full bucket, so no schedule is
/// faster.
fn bucket_floor(volumes: usize) -> Duration {
    let mut ready = vec![Duration::ZERO; volumes];
    for (action, change) in [
        ("CreateVolume", CREATE),
        ("AttachVolume", ATTACH),
        ("DetachVolume", DETACH),
        ("DeleteVolume", Duration::ZERO),
    ] {
        let bucket = default_bucket(action);
        ready.sort();
        for (k, at) in ready.iter_mut().enumerate() {
            #[allow(clippy::cast_precision_loss, reason = "thousands")]
            let beyond_burst = (k + 1) as f64 - bucket.capacity;
            let token = Duration::from_secs_f64((beyond_burst / bucket.refill_per_second).ceil().max(0.0));
            *at = (*at).max(token) + change;
        }
    }
    ready.into_iter().max().unwrap_or_default()
}

/// The Go driver's handling of EC2 throttling, for comparison
/// (pkg/cloud/retry_manager.go: aws-sdk-go-v2's adaptive retry mode, one
/// retryer per mutating API, 50 attempts). Before attempt n + 1 it waits
/// 2ⁿ s plus up to 1 s of jitter, 20 s from the fifth on
/// (aws/retry/jitter_backoff.go); each retry takes 5 of the retryer's
/// quota of 500 and a retry that succeeds gives them back; without quota
/// the call fails (aws/retry/standard.go). Not simulated: the adaptive
/// mode's send-rate limiter (aws/retry/adaptive_ratelimit.go), which slows
/// sends only after throttling has begun.
#[derive(Default)]
struct GoRetries {
    quota: Mutex<HashMap<&'static str, u32>>,
    jitter: AtomicU64,
}

const GO_ATTEMPTS: u32 = 50;
const GO_QUOTA: u32 = 500;
const GO_RETRY_COST: u32 = 5;

impl GoRetries {
    /// A number in [0, 1) (xorshift from a fixed seed).
    #[allow(clippy::cast_precision_loss, reason = "53 bits are enough")]
    fn jitter(&self) -> f64 {
        let mut x = self.jitter.load(Ordering::Relaxed) ^ 0x9e37_79b9_7f4a_7c15;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter.store(x, Ordering::Relaxed);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    fn quota(&self, action: &'static str, change: impl FnOnce(&mut u32) -> bool) -> bool {
        let mut quota = self.quota.lock().unwrap_or_else(PoisonError::into_inner);
        change(quota.entry(action).or_insert(GO_QUOTA))
    }
}

impl Policy for GoRetries {
    async fn before(&self, _action: &'static str) {}

    fn throttled(&self, action: &'static str, attempt: u32) -> Option<Duration> {
        let paid = attempt < GO_ATTEMPTS
            && self.quota(action, |left| {
                let paid = *left >= GO_RETRY_COST;
                if paid {
                    *left -= GO_RETRY_COST;
                }
                paid
            });
        let backoff = if attempt > 4 {
            20.0
        } else {
            self.jitter() + f64::from(1u32 << attempt)
        };
        paid.then(|| Duration::from_secs_f64(backoff))
    }

    fn answered(&self, action: &'static str, throttled: u32) {
        if throttled > 0 {
            self.quota(action, |left| {
                *left = (*left + GO_RETRY_COST).min(GO_QUOTA);
                true
            });
        }
    }
}

/// What a throttled run measured.
struct Throttled {
    run: Run,
    calls: usize,
    throttled: usize,
    /// Calls answered 500 `InternalError` (each sent again by the SDK).
    server_errors: usize,
    /// Per whole second of EC2 time: calls answered, calls throttled.
    per_second: Vec<(usize, usize)>,
}

async fn throttled_run<P: Policy>(policy: P, batch: BatchConfig, volumes: usize) -> Throttled {
    throttled_run_on(Model::new(behaviour(true)), policy, batch, volumes).await
}

async fn throttled_run_on<P: Policy>(model: Model, policy: P, batch: BatchConfig, volumes: usize) -> Throttled {
    let ec2 = Arc::new(Paced::new(model, policy));
    // 20 volumes per instance, within its 28 attachments.
    let nodes = volumes.div_ceil(20);
    for i in 0..nodes {
        ec2.inner().add_instance(&format!("i-{i}"), "us-east-1a");
    }
    let settings = Settings {
        batch,
        ..Settings::default()
    };
    let service = Arc::new(ControllerService::new(Arc::clone(&ec2), settings));
    let run = lifecycle(service, volumes, nodes).await;
    let mut per_second = Vec::new();
    for (at, throttled) in ec2.inner().call_log() {
        let second = usize::try_from(at.as_secs()).unwrap();
        if per_second.len() <= second {
            per_second.resize(second + 1, (0, 0));
        }
        if throttled {
            per_second[second].1 += 1;
        } else {
            per_second[second].0 += 1;
        }
    }
    Throttled {
        run,
        calls: ec2.inner().total_calls(),
        throttled: ec2.inner().throttled(),
        server_errors: ec2.inner().server_errors(),
        per_second,
    }
}

/// `make bench`, P6: 1,000 volumes created, attached, detached and deleted
/// at once against EC2's documented request limits, with this
/// controller's pacing and with the Go driver's retries; in EC2 time
/// (tokio's paused clock), against the floor the buckets impose.
#[tokio::test(start_paused = true)]
#[ignore = "a benchmark, run by make bench"]
async fn bench_throttled_lifecycle() {
    let volumes = if smoke() { 200 } else { 1000 };
    let floor = bucket_floor(volumes).as_secs_f64();
    let go_window = BatchConfig {
        window: Duration::from_millis(500),
        linger: Duration::from_millis(500),
        ..BatchConfig::default()
    };
    eprintln!("bench P6: {volumes} volumes, ebs-csi's pacing");
    let ours = throttled_run(RequestBuckets::new(Limits::default()), BatchConfig::default(), volumes).await;
    eprintln!("bench P6: {volumes} volumes, the Go driver's retries");
    let go = throttled_run(GoRetries::default(), go_window, volumes).await;
    let runs = [("ebs-csi", ours), ("the Go driver's retries", go)];
    let rows = runs.iter().flat_map(|(who, t)| {
        let seconds = t.per_second.iter().enumerate();
        seconds.map(move |(second, (answered, throttled))| format!("{who},{second},{answered},{throttled}"))
    });
    csv("p6-calls.csv", "policy,second,answered,throttled", rows);
    let mut lines = Vec::new();
    for (i, (who, t)) in runs.iter().enumerate() {
        let name = format!("{volumes} volumes under EC2's request limits, {who}");
        let ours = i == 0;
        let failed = t.run.failed;
        #[allow(clippy::cast_precision_loss, reason = "counts of calls")]
        let (share, per_volume) = (
            100.0 * t.throttled as f64 / t.calls as f64,
            t.calls as f64 / volumes as f64,
        );
        let wall = t.run.wall.as_secs_f64();
        let (failed_target, share_target) = if ours { ("0", "< 1 %") } else { ("report", "report") };
        lines.extend([
            format!(
                "{name}: failed RPCs|{failed}|{failed}|{failed}|RPCs||{failed_target}|{}",
                !ours || failed == 0
            ),
            format!(
                "{name}: EC2 calls throttled|{share}|{share}|{share}|%||{share_target}|{}",
                !ours || share < 1.0
            ),
            format!("{name}: wall time in EC2 time (vs the buckets' floor)|{wall}|{wall}|{wall}|s|{floor}|report|true"),
            format!("{name}: EC2 calls per volume|{per_volume}|{per_volume}|{per_volume}|calls||report|true"),
        ]);
        for (rpc, samples) in RPCS.iter().zip(&t.run.per_rpc) {
            let (p50, p99) = (percentile(samples, 50) / 1000.0, percentile(samples, 99) / 1000.0);
            lines.push(format!(
                "{name}: {rpc} p50 (min–max: p50–p99)|{p50}|{p50}|{p99}|s||report|true"
            ));
        }
    }
    emit(&lines);
}

/// `make bench`, P8: P6's run (ebs-csi's pacing) against an EC2 that is
/// eventually consistent — new volumes unlisted and changes shown late for
/// about 1 s (Amazon EC2 Developer Guide, "Eventual consistency in the
/// Amazon EC2 API"), every delay spread 0.5–1.5× — and answers 1 % of the
/// calls 500 `InternalError`, which the SDK's retry sends again; against
/// the same run with neither. Targets: no RPC fails (the waits and the
/// SDK absorb both), wall time at most 1.2× the run without faults.
#[tokio::test(start_paused = true)]
#[ignore = "a benchmark, run by make bench"]
async fn bench_faulty_lifecycle() {
    let volumes = if smoke() { 200 } else { 1000 };
    let run = |visibility_lag: Duration, server_errors: f64| {
        let model = Model::new(Behaviour {
            visibility_lag,
            server_errors,
            ..behaviour(true)
        });
        throttled_run_on(
            model,
            RequestBuckets::new(Limits::default()),
            BatchConfig::default(),
            volumes,
        )
    };
    eprintln!("bench P8: {volumes} volumes, consistent EC2 without faults");
    let clean = run(Duration::ZERO, 0.0).await;
    eprintln!("bench P8: {volumes} volumes, 1 s visibility lags and 1 % 500 answers");
    let faulty = run(Duration::from_secs(1), 0.01).await;
    let name = format!("{volumes} volumes under EC2's request limits, visibility lags and 1 % 5xx");
    let (wall, baseline) = (faulty.run.wall.as_secs_f64(), clean.run.wall.as_secs_f64());
    let (failed, failed_clean) = (faulty.run.failed, clean.run.failed);
    let answered_500 = faulty.server_errors;
    emit(&[
        format!(
            "{name}: calls answered 500 InternalError|{answered_500}|{answered_500}|{answered_500}|calls||report|true"
        ),
        format!("{name}: failed RPCs|{failed}|{failed}|{failed}|RPCs||0|{}", failed == 0),
        format!("{name}: failed RPCs without faults|{failed_clean}|{failed_clean}|{failed_clean}|RPCs||report|true"),
        format!(
            "{name}: wall time in EC2 time (vs the same run without faults)|{wall}|{wall}|{wall}|s|{baseline}|≤ 1.2×|{}",
            wall <= 1.2 * baseline
        ),
        format!("{name}: wall time without faults|{baseline}|{baseline}|{baseline}|s||report|true"),
    ]);
}

/// The floor follows from EC2's buckets alone: for 1,000 volumes the
/// AttachVolume bucket (50, then 5 per second) and DetachVolume's decide.
#[test]
fn the_floor_is_set_by_the_slowest_bucket() {
    // CreateVolume: 100 at once, the 1,000th at 180 s, available 181.5 s.
    // AttachVolume: the 1,000th token at 190 s, attached 192.5 s;
    // DetachVolume then (its 1,000th token at 190 s), gone 194 s; DeleteVolume
    // has tokens by then.
    assert_eq!(bucket_floor(1000), Duration::from_secs(194));
    assert_eq!(bucket_floor(10), CREATE + ATTACH + DETACH);
}
