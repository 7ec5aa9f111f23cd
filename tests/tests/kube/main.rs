//! The driver on a real cluster (#43; `ebs_csi_tests::kube`): Kubernetes
//! v1.35.4 built from its module, the `standard` overlay installed from the
//! chart with the real sidecars, EC2 as moto behind serve.py with the attach
//! simulator playing the instance's hypervisor.
//!
//! One test on one cluster: a cluster and the chart take about 25 s to
//! start and only one can run on a machine, so the scenarios share them.
//! The chart's checks and the cluster's own come first; then the claims'
//! scenarios (`claims.rs`) run beside the volume's life and the refusals
//! (`volumes.rs`), each in a namespace of its own, with their checks of
//! what is left scoped to it; then the node's life (`node_life.rs`), one
//! scenario after another, since each disturbs the whole node. What no
//! scenario may leave (a PersistentVolume, a VolumeAttachment, a CSI
//! mount, a device) and the driver's logs are checked once all have ended.
//! Then the chart is upgraded to the `hardened` overlay with the helper on
//! the host (`hardened.rs`), every scenario runs again through it (the
//! host's helper restarted with the node pod), the same checks follow, and
//! the cluster, torn down, must leave nothing behind. Each step's time is
//! printed, for a run that fails.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

mod chart;
mod claims;
mod cluster;
mod hardened;
mod node_life;
mod volumes;

use std::time::{Duration, Instant};

use ebs_csi_tests::kube::{Cluster, Driver, driver_images, poll_until};
use ebs_csi_tests::{mounts_under, require_root};

#[test]
fn the_driver_serves_a_real_cluster_and_leaves_nothing() {
    require_root();
    let started = Instant::now();
    let step = |done: &str| eprintln!("kube: {:5.1} s: {done}", started.elapsed().as_secs_f64());
    // As on a new node: no /dev/termination-log (kubelet's default
    // termination message path). One left in the host's /dev by a container
    // that mounts it writable hid that the agent, whose /dev is the host's
    // read-only, could not start without it; none may be left after.
    let _ = std::fs::remove_file("/dev/termination-log");
    let before = cluster::outside_state();
    // kubelet mounts a new volume only once its Node's status names it,
    // looked at every 10 s by default: each new volume's pod waited for
    // that tick (make bench's P9, which keeps the default, measures it).
    let taints = chart::node_taints();
    let settings = [("NODE_TAINTS", taints.as_str()), ("NODE_STATUS_UPDATE_FREQUENCY", "1s")];
    let cluster = Cluster::up_with(&settings, &driver_images());
    let driver = Driver::install(&cluster);
    driver.wait_until_ready(&cluster);
    chart::installs_the_standard_overlay(&cluster, &driver);
    // Once the agent removed the startup taint, which no pod tolerates.
    cluster::runs_a_pod_that_reaches_its_api_server_and_pulls_nothing(&cluster);
    step("the cluster and the chart");

    every_claims_scenario(&cluster, &driver, "");
    step("the claims' scenarios");
    node_life::every_scenario(&cluster, &driver, "", &mut || {});
    step("the node's life");
    nothing_of_any_volume_is_left(&cluster, &driver);
    driver.assert_logs_are_clean(&cluster, &volumes::PROVOKED);

    let mut helper = hardened::upgrade_to_the_overlay_with_the_hosts_helper(&cluster, &driver);
    step("the upgrade to the hardened overlay");
    let volume = every_claims_scenario(&cluster, &driver, "-hardened");
    step("the claims' scenarios, hardened");
    node_life::every_scenario(&cluster, &driver, "-hardened", &mut || helper.restart());
    step("the node's life, hardened");
    helper.served(&volume);
    nothing_of_any_volume_is_left(&cluster, &driver);
    driver.assert_logs_are_clean(&cluster, &volumes::PROVOKED);
    cluster.helm(&["uninstall", "ebs-csi", "--namespace", "kube-system", "--wait"]);
    drop(driver); // moto and the attach simulator, whose arguments name the cluster's directory
    cluster::goes_and_leaves_nothing(cluster, &before);
    step("the teardown");
}

/// The claims' scenarios (`claims.rs`: a mounted claim's changes and
/// snapshots, the kinds of claims) beside the volume's life and the
/// refusals (`volumes.rs`), each in a namespace of its own, named with
/// `suffix`; returns the id of the volume whose life was followed.
fn every_claims_scenario(cluster: &Cluster, driver: &Driver, suffix: &str) -> String {
    cluster.kubectl_with(&["apply", "-f", "-"], claims::CLASSES);
    std::thread::scope(|scope| {
        let changes = scope.spawn(|| {
            claims::a_mounted_claim_grows_changes_its_class_and_is_restored_from_snapshots(
                &cluster.namespace(&format!("claims{suffix}")),
                driver,
            );
        });
        let kinds = scope.spawn(|| {
            claims::block_single_pod_and_fs_group_claims_reach_their_pods_as_asked(
                &cluster.namespace(&format!("claim-kinds{suffix}")),
            );
        });
        let volumes = scope.spawn(|| {
            let volume = volumes::a_dynamic_volume_keeps_its_data_across_pods_and_goes_with_its_claim(
                &cluster.namespace(&format!("volumes{suffix}")),
                driver,
            );
            volumes::refusals_reach_the_claims_and_pods_events_and_leave_nothing_in_ec2(
                &cluster.namespace(&format!("refusals{suffix}")),
                driver,
            );
            volume
        });
        let (changes, kinds) = (changes.join(), kinds.join());
        let volume = volumes.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        changes
            .and(kinds)
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        volume
    })
}

/// Once every claim is gone: no PersistentVolume or VolumeAttachment, no
/// CSI mount under kubelet's directory, and of the attach simulator's
/// device links only the instance's root volume's.
fn nothing_of_any_volume_is_left(cluster: &Cluster, driver: &Driver) {
    poll_until("no VolumeAttachment to be left", Duration::from_secs(60), || {
        cluster.kubectl(&["get", "volumeattachments", "-o", "name"]).is_empty()
    });
    assert_eq!(cluster.kubectl(&["get", "pv", "-o", "name"]), "");
    let csi_mounts: Vec<String> = mounts_under(&cluster.dir().join("kubelet"))
        .into_iter()
        .filter(|m| m.contains("/kubernetes.io~csi/") || m.contains("/plugins/kubernetes.io/csi/"))
        .collect();
    assert_eq!(csi_mounts, Vec::<String>::new());
    let links = driver.device_links();
    assert_eq!(links.len(), 1, "{links:?}");
}
