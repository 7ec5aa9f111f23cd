//! The chaos run (`make chaos`, and a short one in `make test`): volume
//! lifecycles driven through the real controller binary the way
//! external-provisioner, -attacher, -resizer and -snapshotter drive them —
//! each RPC sent again with the same arguments until it succeeds — while
//! `tests/ec2/serve.py` plays EC2 with its timing and eventual consistency,
//! its request limits, and faults on a share of the calls (500
//! `InternalError`, 503 `Unavailable`, `RequestLimitExceeded`, slow
//! answers, connections dropped before or after EC2 acted), and the
//! controller is killed with SIGKILL at random moments and started again.
//!
//! What it assumes of its world, and where that is broken: EC2 answers at
//! once (serve.py's lags break it), calls succeed (its faults), the
//! controller lives (SIGKILL), an answer means the request reached EC2
//! once (drops after EC2 acted make the SDK send it again).
//!
//! The seed fixes every fault (serve.py draws each from the seed and the
//! request itself) and every kill time; the interleaving of concurrent
//! lifecycles is the scheduler's, so a seed replays the same faults, not
//! always the same order.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ebs_csi_proto::v1::controller_client::ControllerClient;
use ebs_csi_proto::v1::volume_capability::access_mode::Mode;
use ebs_csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use ebs_csi_proto::v1::*;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::moto::{Controller, Moto};
use crate::{Sandbox, channel};

const REGION: &str = "us-east-1";
const ZONE: &str = "us-east-1a";
const GIB: i64 = 1 << 30;

/// How a run goes.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Volume lifecycles, each two volumes and a snapshot.
    pub lifecycles: usize,
    /// Lifecycles under way at once.
    pub concurrency: usize,
    /// Seeds serve.py's timing and faults and the kill times.
    pub seed: u64,
    /// Share of EC2 calls answered with a fault.
    pub faults: f64,
    /// The controller is killed after a pause drawn from this range, again
    /// and again, in seconds.
    pub kill_every: (f64, f64),
    /// How long the CO sends one RPC again before it gives up (the
    /// sidecars' default timeout with their retries: minutes).
    pub retry_budget: Duration,
}

/// What a run found: its figures and each broken invariant.
#[derive(Debug, Default)]
pub struct Report {
    /// One line per figure and invariant, for printing.
    pub lines: Vec<String>,
    /// The invariants that did not hold, each with its evidence.
    pub broken: Vec<String>,
}

/// What the CO side saw, shared by the lifecycles.
#[derive(Default)]
struct Seen {
    /// Every volume id a DeleteVolume RPC named (sent, not only answered).
    delete_rpcs: BTreeSet<String>,
    /// Volume id CreateVolume answered, by CSI name.
    created: BTreeMap<String, String>,
    /// RPCs that ran out of the retry budget, with their last error.
    gave_up: Vec<String>,
    /// RPC attempts, and those that failed.
    attempts: usize,
    failed_attempts: usize,
}

/// The CO: sends an RPC again, backing off from 100 ms to 2 s, until it
/// succeeds or the budget is spent.
struct Co {
    client: ControllerClient<Channel>,
    seen: Arc<Mutex<Seen>>,
    budget: Duration,
}

impl Co {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn until_ok<T, F, Fut>(&self, what: &str, mut rpc: F) -> Option<T>
    where
        F: FnMut(ControllerClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = Instant::now() + self.budget;
        let mut pause = Duration::from_millis(100);
        loop {
            let result = rpc(self.client.clone()).await;
            {
                let mut seen = self.seen();
                seen.attempts += 1;
                match result {
                    Ok(answer) => return Some(answer.into_inner()),
                    Err(status) => {
                        seen.failed_attempts += 1;
                        if Instant::now() + pause > deadline {
                            seen.gave_up
                                .push(format!("{what}: {:?} {}", status.code(), status.message()));
                            return None;
                        }
                    }
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    async fn create(&self, name: &str, source: Option<volume_content_source::Type>) -> Option<String> {
        let request = CreateVolumeRequest {
            name: name.to_owned(),
            capacity_range: Some(CapacityRange {
                required_bytes: GIB,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability()],
            parameters: HashMap::from([("type".to_owned(), "gp3".to_owned())]),
            accessibility_requirements: Some(TopologyRequirement {
                requisite: vec![],
                preferred: vec![Topology {
                    segments: HashMap::from([("topology.kubernetes.io/zone".to_owned(), ZONE.to_owned())]),
                }],
            }),
            volume_content_source: source.map(|t| VolumeContentSource { r#type: Some(t) }),
            ..Default::default()
        };
        let created = self
            .until_ok(&format!("CreateVolume {name}"), |mut c| {
                let request = request.clone();
                async move { c.create_volume(request).await }
            })
            .await?;
        let id = created.volume?.volume_id;
        self.seen().created.insert(name.to_owned(), id.clone());
        Some(id)
    }

    async fn delete(&self, volume_id: &str) -> Option<()> {
        self.seen().delete_rpcs.insert(volume_id.to_owned());
        let request = DeleteVolumeRequest {
            volume_id: volume_id.to_owned(),
            ..Default::default()
        };
        self.until_ok(&format!("DeleteVolume {volume_id}"), |mut c| {
            let request = request.clone();
            async move { c.delete_volume(request).await }
        })
        .await
        .map(drop)
    }

    /// One lifecycle: create, publish, expand, snapshot, restore,
    /// unpublish, delete both volumes and the snapshot. `None` where an
    /// RPC ran out of budget (the rest is skipped).
    async fn lifecycle(&self, i: usize, node: &str) -> Option<()> {
        let name = format!("pvc-chaos-{i}");
        let volume = self.create(&name, None).await?;
        let publish = ControllerPublishVolumeRequest {
            volume_id: volume.clone(),
            node_id: node.to_owned(),
            volume_capability: Some(capability()),
            ..Default::default()
        };
        self.until_ok(&format!("ControllerPublishVolume {volume}"), |mut c| {
            let request = publish.clone();
            async move { c.controller_publish_volume(request).await }
        })
        .await?;
        let expand = ControllerExpandVolumeRequest {
            volume_id: volume.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 2 * GIB,
                limit_bytes: 0,
            }),
            volume_capability: Some(capability()),
            ..Default::default()
        };
        self.until_ok(&format!("ControllerExpandVolume {volume}"), |mut c| {
            let request = expand.clone();
            async move { c.controller_expand_volume(request).await }
        })
        .await?;
        let snapshot_request = CreateSnapshotRequest {
            source_volume_id: volume.clone(),
            name: format!("snapshot-chaos-{i}"),
            ..Default::default()
        };
        let snapshot = self
            .until_ok(&format!("CreateSnapshot of {volume}"), |mut c| {
                let request = snapshot_request.clone();
                async move { c.create_snapshot(request).await }
            })
            .await?
            .snapshot?
            .snapshot_id;
        let source = volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
            snapshot_id: snapshot.clone(),
        });
        let restored = self.create(&format!("{name}-restored"), Some(source)).await?;
        let unpublish = ControllerUnpublishVolumeRequest {
            volume_id: volume.clone(),
            node_id: node.to_owned(),
            ..Default::default()
        };
        self.until_ok(&format!("ControllerUnpublishVolume {volume}"), |mut c| {
            let request = unpublish.clone();
            async move { c.controller_unpublish_volume(request).await }
        })
        .await?;
        self.delete(&restored).await?;
        self.delete(&volume).await?;
        let delete_snapshot = DeleteSnapshotRequest {
            snapshot_id: snapshot.clone(),
            ..Default::default()
        };
        self.until_ok(&format!("DeleteSnapshot {snapshot}"), |mut c| {
            let request = delete_snapshot.clone();
            async move { c.delete_snapshot(request).await }
        })
        .await
        .map(drop)
    }
}

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

/// Runs the lifecycles and checks the invariants.
///
/// # Panics
/// If serve.py or the controller cannot be started, or serve.py's history
/// cannot be read: the run's own machinery, not what it checks.
pub async fn run(settings: &Settings) -> Report {
    let sandbox = Sandbox::new();
    let seed = settings.seed.to_string();
    let faults = settings.faults.to_string();
    let moto = Moto::start_seeded(
        &seed,
        &[
            "--faults", &faults, "--lag", "1", "--create", "1", "--attach", "1.5", "--detach", "1",
        ],
    );
    moto.request_limits();
    let node = moto.run_instance(REGION, ZONE);
    let args: [&str; 0] = [];
    let controller = Arc::new(Mutex::new(Controller::start(&sandbox, &moto, REGION, &args)));
    let socket = controller.lock().unwrap_or_else(PoisonError::into_inner).socket.clone();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let co = Arc::new(Co {
        client: ControllerClient::new(channel(&socket).await),
        seen: Arc::clone(&seen),
        budget: settings.retry_budget,
    });

    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let (stop, controller, dir, endpoint) = (
            Arc::clone(&stop),
            Arc::clone(&controller),
            sandbox.path().to_path_buf(),
            moto.endpoint.clone(),
        );
        let (mut draws, (low, high)) = (fastrand::Rng::with_seed(settings.seed), settings.kill_every);
        std::thread::spawn(move || {
            let mut kills = 0;
            loop {
                let pause = Instant::now() + Duration::from_secs_f64(low + (high - low) * draws.f64());
                while Instant::now() < pause {
                    if stop.load(Ordering::Relaxed) {
                        return kills;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                kills += 1;
                let log = format!("controller-{kills}.log");
                let mut controller = controller.lock().unwrap_or_else(PoisonError::into_inner);
                controller.kill_and_restart(&dir, &endpoint, REGION, &args, &log);
            }
        })
    };

    let started = Instant::now();
    let permits = Arc::new(tokio::sync::Semaphore::new(settings.concurrency));
    let mut lifecycles = tokio::task::JoinSet::new();
    for i in 0..settings.lifecycles {
        let (co, node, permits) = (Arc::clone(&co), node.clone(), Arc::clone(&permits));
        lifecycles.spawn(async move {
            let _permit = permits.acquire().await;
            co.lifecycle(i, &node).await.is_some()
        });
    }
    let completed = lifecycles.join_all().await.into_iter().filter(|done| *done).count();
    let wall = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let kills = killer.join().unwrap_or_default();
    // EC2 has caught up with every change once its lag has passed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let history: serde_json::Value =
        serde_json::from_str(&moto.http("GET", "/_history", "").expect("serve.py's history")).expect("JSON");
    let throttled = moto.throttled_by_limits();
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    check(
        settings,
        &history,
        &seen,
        Run {
            completed,
            wall,
            kills,
            throttled,
        },
    )
}

/// The run's own figures.
struct Run {
    completed: usize,
    wall: Duration,
    kills: usize,
    throttled: usize,
}

fn check(settings: &Settings, history: &serde_json::Value, seen: &Seen, run: Run) -> Report {
    let mut report = Report::default();
    let list = |key: &str| history[key].as_array().cloned().unwrap_or_default();
    let (volumes, snapshots) = (list("volumes"), list("snapshots"));
    let calls = history["calls"].as_u64().unwrap_or_default();
    report.lines.push(format!(
        "seed {}: {} of {} lifecycles completed in {:.0} s, {} controller kills, {} EC2 calls, {} RPC attempts ({} failed and sent again)",
        settings.seed,
        run.completed,
        settings.lifecycles,
        run.wall.as_secs_f64(),
        run.kills,
        calls,
        seen.attempts,
        seen.failed_attempts
    ));
    let mut invariant = |holds: bool, statement: String, evidence: String| {
        report
            .lines
            .push(format!("{} {statement}", if holds { "holds:" } else { "BROKEN:" }));
        if !holds {
            report.broken.push(format!("{statement}: {evidence}"));
        }
    };
    let tag = |v: &serde_json::Value, key: &str| v["tags"][key].as_str().map(str::to_owned);
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for v in &volumes {
        if let Some(name) = tag(v, "CSIVolumeName") {
            by_name
                .entry(name)
                .or_default()
                .push(v["id"].as_str().unwrap_or_default().to_owned());
        }
    }
    let doubled: Vec<_> = by_name.iter().filter(|(_, ids)| ids.len() != 1).collect();
    invariant(
        doubled.is_empty() && by_name.len() == seen.created.len(),
        format!(
            "every PVC name maps to exactly one volume ({} names, {} volumes)",
            by_name.len(),
            volumes.len()
        ),
        format!("{doubled:?}; names the CO got an answer for: {}", seen.created.len()),
    );
    let deleted = |v: &serde_json::Value| v["deleted"].as_bool().unwrap_or_default();
    let id = |v: &serde_json::Value| v["id"].as_str().unwrap_or_default().to_owned();
    let unasked: Vec<String> = volumes
        .iter()
        .filter(|v| deleted(v) && !seen.delete_rpcs.contains(&id(v)))
        .map(id)
        .collect();
    invariant(
        unasked.is_empty(),
        "no volume was deleted that no DeleteVolume RPC named".into(),
        format!("{unasked:?}"),
    );
    let left: Vec<String> = volumes
        .iter()
        .chain(&snapshots)
        .filter(|r| !deleted(r))
        .map(id)
        .chain(
            volumes
                .iter()
                .filter(|v| !v["attachment"].is_null())
                .map(|v| format!("attachment of {}", id(v))),
        )
        .collect();
    invariant(
        left.is_empty() || run.completed < settings.lifecycles,
        format!(
            "no volume, snapshot or attachment is left over after its delete ({} volumes, {} snapshots made)",
            volumes.len(),
            snapshots.len()
        ),
        format!("{left:?}"),
    );
    invariant(
        seen.gave_up.is_empty(),
        format!(
            "every RPC succeeded within the CO's retry budget ({} s)",
            settings.retry_budget.as_secs()
        ),
        format!("{:?}", seen.gave_up),
    );
    #[allow(clippy::cast_precision_loss, reason = "counts of calls")]
    let share = 100.0 * run.throttled as f64 / calls.max(1) as f64;
    invariant(
        share < 1.0,
        format!(
            "EC2's request limits throttled {} of {calls} calls ({share:.2} %, P6's target < 1 %)",
            run.throttled
        ),
        String::new(),
    );
    report
}
