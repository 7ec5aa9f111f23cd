//! The driver on a real cluster (#43; `ebs_csi_tests::kube`): Kubernetes
//! v1.35.4 built from its module, the `standard` overlay installed from the
//! chart with the real sidecars, EC2 as moto behind serve.py with the attach
//! simulator playing the instance's hypervisor.
//!
//! One test on one cluster: a cluster and the chart take about 35 s to
//! start and only one can run on a machine, so the scenarios share them.
//! The chart's checks and the cluster's own come first; then the claims'
//! scenarios (`claims.rs`) run beside the volume's life and the refusals
//! (`volumes.rs`), each in a namespace of its own, with their checks of
//! what is left scoped to it; what no scenario may leave (a
//! PersistentVolume, a VolumeAttachment, a CSI mount, a device) and the
//! driver's logs are checked once all have ended. Last, the chart is
//! upgraded to the `hardened` overlay with the helper on the host
//! (`hardened.rs`), the claims' scenarios, the volume's life and the
//! refusals run again through it, the same checks follow, and the
//! cluster, torn down, must leave nothing behind.
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

use std::time::Duration;

use ebs_csi_tests::kube::{Cluster, Driver, driver_images, poll_until};
use ebs_csi_tests::{mounts_under, require_root};

#[test]
fn the_driver_serves_a_real_cluster_and_leaves_nothing() {
    require_root();
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

    every_claims_scenario(&cluster, &driver, "");
    node_life::kubelet_restarted_keeps_a_mounted_volume(&cluster, &driver);
    node_life::the_node_pod_replaced_as_a_volume_attaches(&cluster, &driver);
    node_life::a_drain_keeps_the_node_pod_until_its_volume_detaches(&cluster, &driver);
    nothing_of_any_volume_is_left(&cluster, &driver);
    driver.assert_logs_are_clean(&cluster, &volumes::PROVOKED);
    let helper = hardened::upgrade_to_the_overlay_with_the_hosts_helper(&cluster, &driver);
    let volume = every_claims_scenario(&cluster, &driver, "-hardened");
    hardened::the_hosts_helper_served(helper, &volume);
    nothing_of_any_volume_is_left(&cluster, &driver);
    driver.assert_logs_are_clean(&cluster, &volumes::PROVOKED);
    cluster.helm(&["uninstall", "ebs-csi", "--namespace", "kube-system", "--wait"]);
    drop(driver); // moto and the attach simulator, whose arguments name the cluster's directory
    cluster::goes_and_leaves_nothing(cluster, &before);
}

/// The claims' scenarios (`claims.rs`) beside the volume's life and the
/// refusals (`volumes.rs`), each in a namespace of its own, named with
/// `suffix`; returns the id of the volume whose life was followed.
fn every_claims_scenario(cluster: &Cluster, driver: &Driver, suffix: &str) -> String {
    std::thread::scope(|scope| {
        let claims = scope.spawn(|| {
            claims::what_a_claim_asks_for_reaches_its_pod(&cluster.namespace(&format!("claims{suffix}")), driver);
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
        let claims = claims.join();
        let volume = volumes.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        claims.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
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
