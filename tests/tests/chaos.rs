//! The chaos run of `tests/src/chaos.rs`, short: `make test` runs 16
//! lifecycles; `make chaos` runs 300 (`EBS_CSI_CHAOS_LIFECYCLES`). The seed
//! is `EBS_CSI_CHAOS_SEED` or a new one, printed first: set it to replay a
//! run's faults and kills.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "integration tests")]

use std::time::Duration;

use ebs_csi_tests::chaos::{self, Settings};

fn from_env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycles_survive_ec2s_faults_and_controller_kills() {
    let seed = from_env("EBS_CSI_CHAOS_SEED").unwrap_or_else(|| {
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        u64::from(clock.subsec_nanos()) ^ clock.as_secs()
    });
    let lifecycles = from_env("EBS_CSI_CHAOS_LIFECYCLES").unwrap_or(16);
    eprintln!("chaos: EBS_CSI_CHAOS_SEED={seed} EBS_CSI_CHAOS_LIFECYCLES={lifecycles}");
    let settings = Settings {
        lifecycles,
        concurrency: 16.min(lifecycles),
        seed,
        faults: 0.05,
        kill_every: (3.0, 12.0),
        retry_budget: Duration::from_secs(300),
    };
    let report = chaos::run(&settings).await;
    for line in &report.lines {
        eprintln!("chaos: {line}");
    }
    assert!(report.broken.is_empty(), "seed {seed}: {:#?}", report.broken);
}
