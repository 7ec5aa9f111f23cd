//! `ebs-csi-bench` (`make bench`; `--smoke` inside `make test`). See
//! `ebs_csi_tests::bench` and `docs/performance.md`.
#![allow(clippy::expect_used, reason = "a benchmark: a failed step stops the run")]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use ebs_csi_helper::claim::Claims;
use ebs_csi_helper::device::{self, IdentityPolicy};
use ebs_csi_helper::layout::{Layout, Role};
use ebs_csi_helper::mounts::MountTables;
use ebs_csi_helper::path::AllowedRoots;
use ebs_csi_helper_proto::VolumeId;
use ebs_csi_linux::nvme::{EBS_MODEL, EBS_VENDOR_ID};
use ebs_csi_proto::v1::{GetPluginInfoRequest, NodeGetInfoRequest, ProbeRequest};
use ebs_csi_tests::bench::{self, Node, Row, Scale, summarize};
use ebs_csi_tests::children::PeakChildren;
use ebs_csi_tests::moto::Controller;
use ebs_csi_tests::trace;
use ebs_csi_tests::{LoopVolume, Sandbox, binary, link_ebs_device};

/// Measures stage latency, large-volume formatting, device wait,
/// footprint, concurrency and claims to pods, and writes `report.md` and `report.json`.
#[derive(Debug, Parser)]
struct Args {
    /// Tiny sizes and one repetition (the variant `make test` runs).
    #[arg(long)]
    smoke: bool,
    /// Where the report goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// EC2-call figures written by the controller's model benchmark, merged
    /// into the report when present.
    #[arg(long)]
    ec2_rows: Option<PathBuf>,
    /// Only these phases (1-6, repeatable; all when none): a quicker look
    /// at one figure while working on it.
    #[arg(long = "phase", value_parser = clap::value_parser!(u8).range(1..=6))]
    phases: Vec<u8>,
}

fn row(
    name: &str,
    samples: &[f64],
    unit: &'static str,
    baseline: Option<&[f64]>,
    target: &str,
    met: impl Fn(f64, Option<f64>) -> bool,
) -> Row {
    let (value, spread) = summarize(samples);
    let baseline = baseline.map(|b| summarize(b).0);
    Row {
        name: name.into(),
        value,
        spread,
        unit,
        baseline,
        target: target.into(),
        met: met(value, baseline),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        rustix::process::geteuid().is_root(),
        "the benchmarks need root (loop devices and mounts)"
    );
    let scale = if args.smoke { Scale::SMOKE } else { Scale::FULL };
    let mut rows = Vec::new();
    // A line per phase on stderr: a full run takes minutes.
    let phase = |number: u8, name: &str| {
        let run = args.phases.is_empty() || args.phases.contains(&number);
        if run {
            eprintln!("bench: {number}/6 {name}");
        }
        run
    };
    let mut breakdown = Vec::new();
    if phase(1, "stage latency") {
        let stage_rows;
        (stage_rows, breakdown) = stage_latency(scale).await;
        rows.extend(stage_rows);
        rows.extend(helper_checks(scale));
    }
    if phase(2, "large volumes") {
        rows.extend(large_volumes(scale).await);
    }
    if phase(3, "device wait") {
        rows.extend(device_wait(scale).await);
    }
    if phase(4, "footprint") {
        rows.extend(footprint(scale).await);
    }
    if phase(5, "concurrency") {
        rows.extend(concurrency(scale).await);
    }
    if phase(6, "claims to pods Running (a real cluster)") {
        rows.extend(tokio::task::spawn_blocking(move || bench::claims::claims_to_pods(scale)).await?);
    }
    if let Some(text) = args.ec2_rows.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        rows.extend(text.lines().filter_map(parse_ec2_row));
    }
    std::fs::create_dir_all(&args.out)?;
    let table = format!("{}\n{}", bench::markdown(&rows), trace::markdown(&breakdown));
    std::fs::write(args.out.join("report.md"), &table)?;
    std::fs::write(args.out.join("report.json"), bench::json(&rows))?;
    println!("{table}");
    println!("written to {}/report.md and report.json", args.out.display());
    Ok(())
}

/// 1. NodeStage + NodePublish through agent and helper, against the floor
///    and the Go driver's command sequence; and where its time goes, step
///    by step, for each filesystem (median over the repetitions).
async fn stage_latency(scale: Scale) -> (Vec<Row>, Vec<(&'static str, Vec<(String, f64)>)>) {
    let mut rows = Vec::new();
    let mut breakdown = Vec::new();
    for fs in ["ext4", "xfs"] {
        let mut node = Node::start(&[]).await;
        let mut ours = Vec::new();
        let mut traced = Vec::new();
        let (mut floor, mut go) = (Vec::new(), Vec::new());
        for _ in 0..scale.reps {
            let volume = node.volume(scale.volume_mib);
            let measured = node.stager.stage_publish(&volume.volume_id, fs).await;
            ours.push(bench::millis(measured.elapsed));
            traced.push((volume.volume_id.clone(), measured.stamps));
            node.stager.teardown(&volume.volume_id).await;
            let plain = node.plain_volume(scale.volume_mib);
            floor.push(bench::millis(bench::floor(&plain.device, node.sandbox.path(), fs)));
            let other = node.plain_volume(scale.volume_mib);
            go.push(bench::millis(bench::go_sequence(
                &other.device,
                node.sandbox.path(),
                fs,
            )));
        }
        let (agent_log, helper_log) = (node.agent.process.log(), node.helper.process.log());
        let runs: Vec<_> = traced
            .iter()
            .map(|(volume_id, stamps)| trace::steps(stamps, volume_id, &agent_log, &helper_log))
            .collect();
        for steps in &runs {
            // The logs' shape is part of what is measured: a step missing
            // means a log line changed and the breakdown would mislead.
            for expected in [
                "NodeStageVolume: agent: staging → helper: received",
                "NodeStageVolume: helper: received → helper: proved blank",
                "NodeStageVolume: helper: exec mkfs → helper: exited mkfs",
                "NodeStageVolume: helper: answered → agent: answered",
                "NodePublishVolume: helper: received → helper: create mount point",
                "NodePublishVolume: helper: answered → agent: answered",
            ] {
                assert!(
                    steps.iter().any(|(name, _)| name == expected),
                    "no step {expected:?} in {steps:?}"
                );
            }
        }
        breakdown.push((fs, trace::medians(&runs)));
        let size = scale.volume_mib;
        rows.push(row(
            &format!("NodeStage+NodePublish, {fs}, {size} MiB (vs floor)"),
            &ours,
            "ms",
            Some(&floor),
            "≤ 1.5× floor",
            |v, b| b.is_some_and(|b| v <= 1.5 * b),
        ));
        rows.push(row(
            &format!("NodeStage+NodePublish, {fs}, {size} MiB (vs the Go driver's sequence)"),
            &ours,
            "ms",
            Some(&go),
            "≤ 0.8× Go's sequence",
            |v, b| b.is_some_and(|b| v <= 0.8 * b),
        ));
        rows.push(row(
            &format!("Go driver's command sequence, {fs}, {size} MiB (vs floor)"),
            &go,
            "ms",
            Some(&floor),
            "peer baseline",
            |_, _| true,
        ));
    }
    (rows, breakdown)
}

/// 1b. The helper's checks before it proves the device blank, each alone,
///     in this process (µs per call, 200 calls): what the step "helper:
///     received → helper: proved blank" is made of, with the proof's reads. A loop device's identity proof reads
///     its backing file's name from sysfs; an EBS volume's is an NVMe
///     Identify Controller ioctl instead (the QEMU tests run it).
fn helper_checks(scale: Scale) -> Vec<Row> {
    const CALLS: usize = 200;
    let sandbox = Sandbox::new();
    let volume = LoopVolume::create(sandbox.path(), &format!("vol-{:017x}", 0xc4ec_u64), scale.volume_mib);
    let staging = sandbox.staging(&volume.volume_id);
    let staging = staging.to_string_lossy();
    let roots = AllowedRoots::open(&[sandbox.kubelet()], Layout::Kubelet).expect("allowed roots");
    let tables = MountTables::open(false).expect("the node's mount table");
    let policy = IdentityPolicy {
        nvme_vendor_id: EBS_VENDOR_ID,
        nvme_model: EBS_MODEL.into(),
        allow_loop_devices: true,
    };
    let volume_id = VolumeId::parse(&volume.volume_id).expect("volume id");
    let device = volume.device.to_string_lossy();
    let mounts = tables.read().expect("mountinfo");
    let time = |check: &mut dyn FnMut()| -> Vec<f64> {
        (0..CALLS)
            .map(|_| {
                let started = Instant::now();
                check();
                started.elapsed().as_secs_f64() * 1e6
            })
            .collect()
    };
    let checks: [(&str, Vec<f64>); 3] = [
        (
            "reading mountinfo (the helper's and PID 1's)",
            time(&mut || drop(tables.read().expect("mountinfo"))),
        ),
        (
            "resolving and opening the staging path beneath its root",
            time(&mut || {
                drop(
                    roots
                        .check(&staging, Role::Staging)
                        .and_then(|p| p.open())
                        .expect("staging path"),
                )
            }),
        ),
        (
            "proving the device's identity and that the host does not use it",
            time(&mut || {
                let verified = device::verify(&volume_id, &device, &policy, &roots, &mounts, &Claims::default());
                drop(verified.expect("verified"));
            }),
        ),
    ];
    checks
        .into_iter()
        .map(|(name, samples)| {
            row(
                &format!("helper check alone: {name}"),
                &samples,
                "µs",
                None,
                "report",
                |_, _| true,
            )
        })
        .collect()
}

/// 2. NodeStage of a 16 TiB-class device: our flags against the tools'
///    defaults, and the sectors each discards.
async fn large_volumes(scale: Scale) -> Vec<Row> {
    let mut rows = Vec::new();
    for fs in ["ext4", "xfs"] {
        let mut node = Node::start(&[]).await;
        let (mut ours, mut defaults, mut ours_discarded, mut default_discarded) = (vec![], vec![], vec![], vec![]);
        for _ in 0..scale.reps {
            let volume = node.volume(scale.large_mib);
            let before = bench::discarded_sectors(&volume.device);
            ours.push(bench::millis(
                node.stager.stage_publish(&volume.volume_id, fs).await.elapsed,
            ));
            ours_discarded.push(sectors(bench::discarded_sectors(&volume.device) - before));
            node.stager.teardown(&volume.volume_id).await;
            let file = volume.file.clone();
            drop(volume);
            let _ = std::fs::remove_file(file);
            let plain = node.plain_volume(scale.large_mib);
            let before = bench::discarded_sectors(&plain.device);
            defaults.push(bench::millis(bench::go_sequence(
                &plain.device,
                node.sandbox.path(),
                fs,
            )));
            default_discarded.push(sectors(bench::discarded_sectors(&plain.device) - before));
            let file = plain.file.clone();
            drop(plain);
            let _ = std::fs::remove_file(file);
        }
        let gib = scale.large_mib >> 10;
        rows.push(row(
            &format!("NodeStage+NodePublish, {fs}, {gib} GiB sparse (vs tool defaults)"),
            &ours,
            "ms",
            Some(&defaults),
            "≤ 2000 ms",
            |v, _| v <= 2000.0,
        ));
        rows.push(row(
            &format!("sectors discarded by NodeStage, {fs}, {gib} GiB (vs tool defaults)"),
            &ours_discarded,
            "sectors",
            Some(&default_discarded),
            "0",
            |v, _| v == 0.0,
        ));
    }
    rows
}

#[allow(clippy::cast_precision_loss, reason = "sector counts far below 2^52")]
fn sectors(count: u64) -> f64 {
    count as f64
}

/// 3. From the device appearing to NodeStage going on: event-driven
///    against a fixed 500 ms poll.
async fn device_wait(scale: Scale) -> Vec<Row> {
    let mut results = Vec::new();
    for flags in [&[][..], &["--device-poll-only"][..]] {
        let mut node = Node::start(flags).await;
        let mut samples = Vec::new();
        for _ in 0..scale.reps.max(3) {
            // The stage work itself, with the device already there.
            let ready = node.volume(64);
            let work = node.stager.stage_publish(&ready.volume_id, "ext4").await.elapsed;
            node.stager.teardown(&ready.volume_id).await;
            let id = node.volume_id();
            let file = node.sandbox.path().join(format!("{id}.img"));
            std::fs::File::create(&file)
                .and_then(|f| f.set_len(64 << 20))
                .expect("backing file");
            let mut staging = node.stager.clone();
            let request_id = id.clone();
            let waiting = tokio::spawn(async move { staging.stage_publish(&request_id, "ext4").await });
            tokio::time::sleep(Duration::from_millis(700)).await;
            let appeared = Instant::now();
            let volume = LoopVolume::attach_file(&id, &file);
            link_ebs_device(node.sandbox.path(), &volume);
            waiting.await.expect("stage task");
            samples.push(bench::millis(appeared.elapsed().saturating_sub(work)));
            node.stager.teardown(&id).await;
        }
        results.push(samples);
    }
    vec![row(
        "device wait: appearance → NodeStage goes on (vs 500 ms poll)",
        &results[0],
        "ms",
        Some(&results[1]),
        "≤ 50 ms",
        |v, _| v <= 50.0,
    )]
}

/// 5. Idle RSS after start and after 100 operations, start to first
///    Probe (each repetition a new helper and agent), stripped binary
///    sizes.
async fn footprint(scale: Scale) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut starts = Vec::new();
    let (node, mut identity) = loop {
        let started = Instant::now();
        let node = Node::start(&[]).await;
        let channel = ebs_csi_tests::channel(&node.agent.socket).await;
        let mut identity = ebs_csi_proto::v1::identity_client::IdentityClient::new(channel);
        while identity
            .probe(ProbeRequest {})
            .await
            .ok()
            .and_then(|r| r.into_inner().ready)
            != Some(true)
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        starts.push(bench::millis(started.elapsed()));
        if starts.len() == scale.reps {
            break (node, identity);
        }
    };
    let (agent_idle, helper_idle) = (
        bench::rss_mib(node.agent.process.pid()),
        bench::rss_mib(node.helper.process.pid()),
    );
    let mut client = node.agent.node().await;
    for _ in 0..100 {
        client.node_get_info(NodeGetInfoRequest {}).await.expect("NodeGetInfo");
        identity.probe(ProbeRequest {}).await.expect("Probe");
    }
    let (agent_pid, helper_pid) = (node.agent.process.pid(), node.helper.process.pid());
    let (agent_busy, helper_busy) = (bench::rss_mib(agent_pid), bench::rss_mib(helper_pid));
    rows.push(row(
        "agent RSS idle / after 100 Probe+NodeGetInfo",
        &[agent_idle, agent_busy],
        "MiB",
        None,
        "≤ 6 MiB",
        |_, _| agent_busy <= 6.0,
    ));
    rows.push(row(
        "helper RSS idle / after 100 Pings",
        &[helper_idle, helper_busy],
        "MiB",
        None,
        "≤ 2 MiB",
        |_, _| helper_busy <= 2.0,
    ));
    // The runner, forked by the helper at start, holds the tools'
    // capabilities: the helper's footprint is both processes'.
    let runner = *ebs_csi_tests::children::descendants_named(helper_pid, "ebs-csi-runner")
        .first()
        .expect("the helper's runner");
    let together = bench::pss_mib(helper_pid) + bench::pss_mib(runner);
    rows.push(row(
        "helper and its runner, PSS after 100 Pings",
        &[together],
        "MiB",
        None,
        "≤ 2 MiB",
        |_, _| together <= 2.0,
    ));
    for (name, pid) in [
        ("agent", agent_pid),
        ("helper", helper_pid),
        ("helper's runner", runner),
    ] {
        rows.push(anonymous_row(name, pid));
    }
    rows.push(row(
        "helper + agent start to first ready Probe",
        &starts,
        "ms",
        None,
        "≤ 20 ms",
        |v, _| v <= 20.0,
    ));
    rows.extend(controller_rss().await);
    for (name, limit) in [
        ("ebs-csi-agent", 6.0),
        ("ebs-csi-helper", 2.0),
        ("ebs-csi-controller", 16.0),
    ] {
        #[allow(clippy::cast_precision_loss, reason = "binary sizes far below 2^52")]
        let mib = std::fs::metadata(binary(name))
            .map(|m| m.len() as f64 / 1_048_576.0)
            .unwrap_or(0.0);
        rows.push(row(
            &format!("{name} binary size"),
            &[mib],
            "MiB",
            None,
            &format!("(RSS target {limit} MiB)"),
            |_, _| true,
        ));
    }
    rows
}

/// How much of a process's RSS is anonymous memory (the rest is mapped
/// program text, shared with every process running the same file).
fn anonymous_row(name: &str, pid: u32) -> Row {
    row(
        &format!("{name} RSS: of it anonymous (heap, stacks)"),
        &[bench::anonymous_mib(pid)],
        "MiB",
        None,
        "report",
        |_, _| true,
    )
}

/// The controller's RSS idle and after 100 GetPluginInfo (no EC2 call;
/// its EC2 endpoint is a closed port), and how much of it is anonymous.
async fn controller_rss() -> [Row; 2] {
    let sandbox = Sandbox::new();
    let controller = Controller::start_in(sandbox.path(), "http://127.0.0.1:9", "us-east-1", &[]);
    let idle = bench::rss_mib(controller.process.pid());
    let mut identity = controller.identity().await;
    for _ in 0..100 {
        identity
            .get_plugin_info(GetPluginInfoRequest {})
            .await
            .expect("GetPluginInfo");
    }
    let busy = bench::rss_mib(controller.process.pid());
    [
        row(
            "controller RSS idle / after 100 GetPluginInfo",
            &[idle, busy],
            "MiB",
            None,
            "≤ 16 MiB",
            |_, _| busy <= 16.0,
        ),
        anonymous_row("controller", controller.process.pid()),
    ]
}

/// 6. Volumes staged and published at once on one node (format limit 2, the default).
async fn concurrency(scale: Scale) -> Vec<Row> {
    const FORMAT_LIMIT: u16 = 2;
    let limit = FORMAT_LIMIT.to_string();
    let mut node = Node::start_with(&["--max-parallel-formats", &limit], &[]).await;
    let volumes: Vec<LoopVolume> = (0..scale.concurrent).map(|_| node.volume(64)).collect();
    let formats = PeakChildren::start(node.helper.process.pid(), "mkfs");
    let started = Instant::now();
    let tasks: Vec<_> = volumes
        .iter()
        .map(|v| {
            let mut client = node.stager.clone();
            let id = v.volume_id.clone();
            tokio::spawn(async move { bench::millis(client.stage_publish(&id, "ext4").await.elapsed) })
        })
        .collect();
    let mut per_volume = Vec::new();
    for task in tasks {
        per_volume.push(task.await.expect("stage task"));
    }
    let total = bench::millis(started.elapsed());
    #[allow(clippy::cast_precision_loss, reason = "a handful of processes")]
    let peak_formats = formats.stop() as f64;
    for v in &volumes {
        node.stager.teardown(&v.volume_id).await;
    }
    per_volume.sort_by(f64::total_cmp);
    let p99 = per_volume[(per_volume.len() * 99 / 100).min(per_volume.len() - 1)];
    let n = scale.concurrent;
    vec![
        row(
            &format!("{n} volumes staged+published at once: total"),
            &[total],
            "ms",
            None,
            "report",
            |_, _| true,
        ),
        row(
            &format!("{n} volumes staged+published at once: p99 per volume"),
            &[p99],
            "ms",
            None,
            "report",
            |_, _| true,
        ),
        row(
            &format!("{n} volumes staged+published at once: most mkfs running at once (sampled every 1 ms)"),
            &[peak_formats],
            "",
            None,
            &format!("≤ {limit} (--max-parallel-formats)"),
            |peak, _| peak <= f64::from(FORMAT_LIMIT),
        ),
    ]
}

/// A row line written by the controller's EC2 benchmark:
/// `name|median|min|max|unit|baseline|target|met`.
fn parse_ec2_row(line: &str) -> Option<Row> {
    let f: Vec<&str> = line.split('|').collect();
    let unit: &'static str = match *f.get(4)? {
        "calls" => "calls",
        "ms" => "ms",
        "s" => "s",
        "%" => "%",
        "RPCs" => "RPCs",
        _ => "",
    };
    Some(Row {
        name: f.first()?.to_string(),
        value: f.get(1)?.parse().ok()?,
        spread: (f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?),
        unit,
        baseline: f.get(5)?.parse().ok(),
        target: f.get(6)?.to_string(),
        met: *f.get(7)? == "true",
    })
}
