#![allow(clippy::unwrap_used, reason = "tests: a failed step fails the test")]

use super::*;

/// A page of `agent/data/statistics/` (see its generate.py).
pub(crate) fn page(name: &str) -> Vec<u8> {
    let hex = match name {
        "busy" => include_str!("../data/statistics/busy.hex"),
        "idle-v1" => include_str!("../data/statistics/idle-v1.hex"),
        "foreign" => include_str!("../data/statistics/foreign.hex"),
        other => panic!("no page {other}"),
    };
    let hex = hex.trim();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn bin(lower_us: u64, upper_us: u64, count: u64) -> Bin {
    Bin {
        lower_us,
        upper_us,
        count,
    }
}

#[test]
fn a_busy_volume_page_gives_every_counter_and_both_histograms() {
    let page = page("busy");
    assert_eq!(page.len(), 4096);
    assert_eq!(
        parse(&page).unwrap(),
        Statistics {
            read_ops: 1_234_567,
            write_ops: 765_432,
            read_bytes: 5_056_790_528,
            write_bytes: 3_135_209_472,
            read_time_us: 987_654_321,
            write_time_us: 456_789_012,
            ebs_iops_exceeded_us: 12_500_000,
            ebs_throughput_exceeded_us: 3_000_000,
            ec2_iops_exceeded_us: 250_000,
            ec2_throughput_exceeded_us: 0,
            queue_length: 7,
            read_latency: vec![
                bin(0, 128, 1000),
                bin(128, 256, 200_000),
                bin(256, 512, 900_000),
                bin(512, 1024, 130_000),
                bin(1024, 2048, 4567),
            ],
            write_latency: vec![bin(0, 256, 500_000), bin(256, 512, 250_000), bin(512, 1024, 15_432)],
        }
    );
}

#[test]
fn a_newer_page_version_still_parses() {
    // The version shares the first u64 with the magic: a reader taking the
    // magic as a u64 would refuse this page.
    assert_eq!(parse(&page("idle-v1")).unwrap(), Statistics::default());
}

#[test]
fn pages_that_are_not_ebs_statistics_are_refused() {
    assert_eq!(parse(&page("foreign")), Err(ParseError::Magic(0x1234_5678)));
    assert_eq!(parse(&page("busy")[..3599]), Err(ParseError::Short(3599)));
    let mut claims_65 = page("busy");
    claims_65[2056..2064].copy_from_slice(&65u64.to_le_bytes());
    assert_eq!(parse(&claims_65), Err(ParseError::Bins(65)));
    assert_eq!(
        ParseError::Magic(0x1234_5678).to_string(),
        "the log page's magic is 0x12345678, not 0x3c23b510"
    );
}
