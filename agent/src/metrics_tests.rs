#![allow(clippy::unwrap_used, reason = "tests: a failed step fails the test")]

use super::*;

fn text(families: &[MetricFamily]) -> String {
    let mut out = Vec::new();
    TextEncoder::new().encode(families, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn busy() -> Statistics {
    statistics::parse(&statistics::tests::page("busy")).unwrap()
}

#[test]
fn a_volume_gets_the_go_driver_series_in_seconds() {
    let rendered = text(&volume_families(
        "i-0a1b2c3d4e5f60718",
        &[("vol-0aaaaaaaaaaaaaaa1".into(), busy())],
    ));
    let labels = r#"instance_id="i-0a1b2c3d4e5f60718",volume_id="vol-0aaaaaaaaaaaaaaa1""#;
    for line in [
        format!("aws_ebs_csi_read_ops_total{{{labels}}} 1234567"),
        format!("aws_ebs_csi_write_bytes_total{{{labels}}} 3135209472"),
        format!("aws_ebs_csi_read_seconds_total{{{labels}}} 987.654321"),
        format!("aws_ebs_csi_exceeded_iops_seconds_total{{{labels}}} 12.5"),
        format!("aws_ebs_csi_ec2_exceeded_iops_seconds_total{{{labels}}} 0.25"),
        format!("aws_ebs_csi_ec2_exceeded_tp_seconds_total{{{labels}}} 0"),
        format!("aws_ebs_csi_volume_queue_length{{{labels}}} 7"),
        "# TYPE aws_ebs_csi_read_io_latency_seconds histogram".to_owned(),
        format!("aws_ebs_csi_read_io_latency_seconds_bucket{{{labels},le=\"0.000128\"}} 1000"),
        format!("aws_ebs_csi_read_io_latency_seconds_bucket{{{labels},le=\"0.000512\"}} 1101000"),
        format!("aws_ebs_csi_read_io_latency_seconds_bucket{{{labels},le=\"0.002048\"}} 1235567"),
        format!("aws_ebs_csi_read_io_latency_seconds_bucket{{{labels},le=\"+Inf\"}} 1235567"),
        format!("aws_ebs_csi_read_io_latency_seconds_count{{{labels}}} 1235567"),
        format!("aws_ebs_csi_write_io_latency_seconds_bucket{{{labels},le=\"0.001024\"}} 765432"),
    ] {
        assert!(rendered.lines().any(|l| l == line), "no line {line:?} in\n{rendered}");
    }
}

#[test]
fn no_volume_no_volume_families() {
    assert!(volume_families("i-0a1b2c3d4e5f60718", &[]).is_empty());
}
