//! The main job end to end, the same code `make demo` runs: create, attach,
//! stage, publish, write, expand, snapshot, restore, group snapshot, the
//! changed blocks between two snapshots, tear down.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use ebs_csi_tests::lifecycle::{self, Report};
use ebs_csi_tests::require_root;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn a_volume_lives_its_whole_life_on_one_machine() {
    require_root();
    let mut report = Report::new(false);
    if let Err(f) = lifecycle::run(&mut report).await {
        panic!(
            "step {:?} failed ({:?}): {}\n{}\n{}",
            f.step,
            f.component,
            f.error,
            f.log_tail,
            report.summary()
        );
    }
    eprintln!("{}", report.summary());
    assert_eq!(report.steps.len(), 48, "{}", report.summary());
}
