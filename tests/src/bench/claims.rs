//! P9: a claim to its pod Running through a real cluster (`crate::kube`:
//! Kubernetes v1.35.4, the chart's `standard` overlay with the real
//! csi-provisioner and csi-attacher, kubelet), beside the time EC2 itself
//! took for the same volumes in the same run.
//!
//! EC2 is serve.py with the EC2 model's state changes of P7 (`creating`
//! 1.5 s, `attaching` 2.5 s, each times 0.5–1.5 drawn per volume), and
//! its GET /_history gives how long each volume spent in each. One claim
//! at a time, each with its pod (WaitForFirstConsumer, as a user's
//! Deployment would), timed from `kubectl apply` to the pod's phase
//! Running as seen every 50 ms: what is left beyond EC2's time is the
//! cluster's own path (scheduler, provisioner, attacher, kubelet's volume
//! manager) and the driver's.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::kube::{self, Cluster, Driver, Namespace, driver_images, poll_until};
use crate::{kubelet_staging_hash, mounts_under, sha256_hex};

use super::{Row, Scale};

/// The class of the claims.
const CLASS: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: bench-gp3}
provisioner: ebs.csi.aws.com
volumeBindingMode: WaitForFirstConsumer
parameters: {type: gp3, csi.storage.k8s.io/fstype: ext4}
"#;

/// The target: the median within a second of EC2's (issue #43, P9).
const TARGET_MS: f64 = 1000.0;

/// The steps from a claim to its pod running, each ended by what the
/// bench sees change (every 50 ms): the scheduler's first pass gave the
/// claim its node (`volume.kubernetes.io/selected-node`); the provisioner
/// made the volume and its PersistentVolume is bound; the scheduler bound
/// the pod to the node; the attacher's VolumeAttachment is attached;
/// kubelet's staging mount is there (seen in the mount table); kubelet
/// published the volume and started the container (phase Running).
const STEPS: [(&str, Option<usize>); 6] = [
    ("scheduler's first pass (claim to selected node)", None),
    ("provisioning (selected node to claim Bound)", Some(CREATING)),
    ("pod bound to the node (claim Bound to pod scheduled)", None),
    (
        "attaching (pod scheduled to VolumeAttachment attached)",
        Some(ATTACHING),
    ),
    ("kubelet sees it attached, stages (attached to staging mount)", None),
    (
        "kubelet publishes, starts the container (staging mount to Running)",
        None,
    ),
];

/// EC2's states of a new volume P9 sets its steps beside, as indexes of
/// [`ec2_ms`]'s answer.
const CREATING: usize = 0;
/// See [`CREATING`].
const ATTACHING: usize = 1;

/// Runs `scale.claims` claims to their pods and returns P9's rows: the
/// median (target: EC2's median + 1 s) and the 99th percentile of the
/// whole, each beside EC2's `creating` + `attaching` time of the same
/// volumes, then the median of each of [`STEPS`] (beside EC2's time of its
/// state, where EC2 has one), ms.
///
/// # Panics
/// When the cluster does not start or a pod does not run within 3 min.
pub fn claims_to_pods(scale: Scale) -> Vec<Row> {
    let cluster = Cluster::up_with(&[], &driver_images());
    let driver = Driver::install_with(&cluster, &["--create", "1.5", "--attach", "2.5"]);
    driver.wait_until_ready(&cluster);
    let ns = cluster.namespace("bench");
    ns.apply(CLASS);
    let (mut runs, mut ec2) = (Vec::new(), Vec::new());
    for i in 0..scale.claims {
        let run = to_running(&ns, &cluster.dir().join("kubelet"), &format!("claim-{i}"));
        ec2.push(ec2_ms(&driver, &run.volume_id));
        runs.push(run);
    }
    ns.kubectl(&["delete", "pods", "--all", "--wait"]);
    ns.kubectl(&["delete", "pvc", "--all", "--wait"]);
    poll_until("the claims' volumes to go", Duration::from_secs(180), || {
        cluster.kubectl(&["get", "pv", "-o", "name"]).is_empty()
            && cluster.kubectl(&["get", "volumeattachments", "-o", "name"]).is_empty()
    });
    cluster.helm(&["uninstall", "ebs-csi", "--namespace", "kube-system", "--wait"]);
    drop(driver);
    cluster.down();

    let whole: Vec<f64> = runs.iter().map(|r| r.ends[STEPS.len() - 1]).collect();
    let ec2_whole: Vec<f64> = ec2.iter().map(|e| e.iter().sum()).collect();
    let row = |name: String, samples: &[f64], p: usize, baseline: Option<f64>, target: &str, met: bool| Row {
        name,
        value: percentile(samples, p),
        spread: (percentile(samples, 0), percentile(samples, 100)),
        unit: "ms",
        baseline,
        target: target.into(),
        met,
    };
    let (median, ec2_median) = (percentile(&whole, 50), percentile(&ec2_whole, 50));
    let mut rows = vec![
        row(
            format!("P9 claim to pod Running, p50 of {} (real cluster)", scale.claims),
            &whole,
            50,
            Some(ec2_median),
            "≤ EC2's creating + attaching + 1 s",
            median <= ec2_median + TARGET_MS,
        ),
        row(
            format!("P9 claim to pod Running, p99 of {}", scale.claims),
            &whole,
            99,
            Some(percentile(&ec2_whole, 99)),
            "reported",
            true,
        ),
    ];
    // Per step, how long it took for each claim.
    let took: Vec<Vec<f64>> = (0..STEPS.len())
        .map(|step| {
            runs.iter()
                .map(|r| r.ends[step] - step.checked_sub(1).map_or(0.0, |s| r.ends[s]))
                .collect()
        })
        .collect();
    for (step, (name, state)) in STEPS.iter().enumerate() {
        let baseline = state.map(|state| percentile(&ec2.iter().map(|e| e[state]).collect::<Vec<_>>(), 50));
        rows.push(row(
            format!("P9 step: {name}, p50"),
            &took[step],
            50,
            baseline,
            "reported",
            true,
        ));
    }
    // What the driver's RPCs add to EC2's own time, per claim: each step
    // EC2 has a state for, beyond that state's time.
    let beyond: Vec<f64> = ec2
        .iter()
        .enumerate()
        .map(|(claim, times)| {
            STEPS
                .iter()
                .enumerate()
                .filter_map(|(step, (_, state))| state.map(|state| took[step][claim] - times[state]))
                .sum()
        })
        .collect();
    let share = percentile(&beyond, 50);
    rows.push(row(
        "P9 provisioning and attaching beyond EC2's creating and attaching (sidecars and driver), p50".into(),
        &beyond,
        50,
        None,
        "≤ 1 s",
        share <= TARGET_MS,
    ));
    rows
}

/// One claim's way to its pod.
struct Run {
    /// When each of [`STEPS`] ended, ms after the claim and pod were applied.
    ends: [f64; STEPS.len()],
    /// The claim's EBS volume.
    volume_id: String,
}

/// Applies the claim `name` and its pod, and times [`STEPS`] until the pod
/// runs.
fn to_running(ns: &Namespace<'_>, kubelet: &Path, name: &str) -> Run {
    let claim = format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}}}\n\
         spec: {{accessModes: [ReadWriteOnce], storageClassName: bench-gp3, resources: {{requests: {{storage: 1Gi}}}}}}\n"
    );
    // busybox's sh as PID 1 ends at SIGTERM only through a trap.
    let pod = kube::pod(
        name,
        "trap 'exit 0' TERM; while true; do sleep 1; done",
        &[(name, "/data")],
        &serde_json::json!({}),
    );
    let start = Instant::now();
    ns.apply(&format!("{claim}---\n{pod}"));
    let mut ends = [None; STEPS.len()];
    let mut attachment = None;
    let mut volume_id = String::new();
    while ends[STEPS.len() - 1].is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "pod {name} is not Running after 3 min:\n{}",
            ns.events(name)
        );
        let claim_and_pod = [format!("pvc/{name}"), format!("pod/{name}")];
        let objects = claim_and_pod.iter().chain(&attachment).map(String::as_str);
        let args: Vec<&str> = ["get", "--ignore-not-found", "-o", "json"]
            .into_iter()
            .chain(objects)
            .collect();
        let listed: serde_json::Value = serde_json::from_str(&ns.kubectl(&args)).expect("kubectl's JSON");
        let now = start.elapsed().as_secs_f64() * 1e3;
        for object in listed["items"].as_array().into_iter().flatten() {
            let seen = match object["kind"].as_str() {
                Some("PersistentVolumeClaim") => [
                    (
                        0,
                        !object["metadata"]["annotations"]["volume.kubernetes.io/selected-node"].is_null(),
                    ),
                    (1, object["status"]["phase"] == "Bound"),
                ],
                Some("Pod") => [
                    (2, !object["spec"]["nodeName"].is_null()),
                    (5, object["status"]["phase"] == "Running"),
                ],
                _ => [(3, object["status"]["attached"] == true), (3, false)],
            };
            for (step, done) in seen {
                if done && ends[step].is_none() {
                    ends[step] = Some(now);
                }
            }
        }
        if ends[4].is_none() && ends[1].is_some() {
            let staging = kubelet_staging_hash(&volume_id);
            if mounts_under(kubelet).iter().any(|m| m.contains(&staging)) {
                ends[4] = Some(now);
            }
        }
        if ends[1].is_some() && attachment.is_none() {
            let pv = ns.get("pvc", name, "{.spec.volumeName}");
            volume_id = ns.get("pv", &pv, "{.spec.csi.volumeHandle}");
            attachment = Some(format!("volumeattachment/{}", attachment_name(&volume_id)));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // A step seen together with a later one ended no later than it.
    let mut ends = ends.map(Option::unwrap_or_default);
    for step in (0..STEPS.len() - 1).rev() {
        if ends[step] == 0.0 || ends[step] > ends[step + 1] {
            ends[step] = ends[step + 1];
        }
    }
    Run { ends, volume_id }
}

/// The VolumeAttachment kubelet's attach-detach controller names for the
/// volume on the node: `csi-` and the hex SHA-256 of the volume handle, the
/// driver's name and the node's (kubernetes pkg/volume/csi/csi_attacher.go,
/// `getAttachmentName`).
fn attachment_name(volume_id: &str) -> String {
    format!(
        "csi-{}",
        sha256_hex(&format!("{volume_id}ebs.csi.aws.com{}", kube::NODE_NAME))
    )
}

/// How long EC2 kept `volume_id` `creating` and `attaching`, ms
/// (serve.py's GET /_history).
fn ec2_ms(driver: &Driver, volume_id: &str) -> [f64; 2] {
    let history: serde_json::Value =
        serde_json::from_str(&driver.moto.http("GET", "/_history", "").expect("serve.py's history")).expect("JSON");
    let volume = history["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["id"] == volume_id))
        .unwrap_or_else(|| panic!("{volume_id} is not in serve.py's history"));
    ["creating", "attaching"].map(|state| {
        volume["state_seconds"][state]
            .as_f64()
            .unwrap_or_else(|| panic!("{volume_id}: no {state} time"))
            * 1e3
    })
}

/// The `p`th percentile of `samples` (nearest rank; 0 the smallest).
fn percentile(samples: &[f64], p: usize) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (p * sorted.len()).div_ceil(100);
    sorted.get(rank.saturating_sub(1)).copied().unwrap_or(0.0)
}
