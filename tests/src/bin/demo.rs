//! `ebs-csi-demo` (`make demo`): a whole volume lifecycle on this machine,
//! printed step by step with latencies. See `ebs_csi_tests::lifecycle`.

use std::process::ExitCode;

use ebs_csi_tests::lifecycle::{self, Report};

#[tokio::main]
async fn main() -> ExitCode {
    if !rustix::process::geteuid().is_root() {
        eprintln!("the demo needs root: it creates loop devices and mounts (run: sudo make demo)");
        return ExitCode::FAILURE;
    }
    println!("ebs-csi demo: moto as EC2, loop devices as EBS volumes, the real controller, helper and agent\n");
    let mut report = Report::new(true);
    let outcome = tokio::select! {
        outcome = lifecycle::run(&mut report) => Some(outcome),
        _ = tokio::signal::ctrl_c() => None,
    };
    match outcome {
        Some(Ok(())) => {
            println!("\n{}", report.summary());
            println!("demo passed: every step above ran for real; everything it made has been removed");
            ExitCode::SUCCESS
        }
        Some(Err(failure)) => {
            println!("\n{}", report.summary());
            eprintln!(
                "demo FAILED at step \"{}\" ({:?}): {}\n{}",
                failure.step, failure.component, failure.error, failure.log_tail
            );
            ExitCode::FAILURE
        }
        None => {
            eprintln!("\ninterrupted: stopped the processes and removed mounts, loop devices and files");
            ExitCode::from(130)
        }
    }
}
