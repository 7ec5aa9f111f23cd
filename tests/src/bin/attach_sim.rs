//! `ebs-csi-attach-sim`: the local attach simulator (test support, not
//! shipped). See `ebs_csi_tests::attach_sim`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use ebs_csi_tests::attach_sim::{SimConfig, Simulator};

/// Plays the EC2 hypervisor for one instance with loop devices. EC2 is
/// reached through the SDK's standard settings (AWS_ENDPOINT_URL_EC2, …).
#[derive(Debug, Parser)]
struct Args {
    /// The instance whose attachments are simulated.
    #[arg(long)]
    instance_id: String,
    /// The device tree to populate (the agent's --dev-dir).
    #[arg(long)]
    dev_dir: PathBuf,
    /// Where backing files live.
    #[arg(long)]
    data_dir: PathBuf,
    /// Poll interval in milliseconds.
    #[arg(long, default_value_t = 100)]
    poll_ms: u64,
    /// Written once the simulator runs.
    #[arg(long)]
    ready_file: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    // moto, over plain HTTP on the loopback.
    let http = aws_smithy_http_client::Builder::new().build_http();
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(http)
        .load()
        .await;
    let sim_config = SimConfig {
        instance_id: args.instance_id,
        dev_dir: args.dev_dir,
        data_dir: args.data_dir,
        poll: Duration::from_millis(args.poll_ms),
    };
    let sim = Simulator::new(aws_sdk_ec2::Client::new(&config), sim_config).map_err(anyhow::Error::msg)?;
    std::fs::write(&args.ready_file, b"ready")?;
    sim.run(ebs_csi_proto::endpoint::shutdown_signal()).await;
    Ok(())
}
