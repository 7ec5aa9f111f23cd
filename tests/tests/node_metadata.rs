//! Without metadata flags the agent reads its identity from IMDSv2; here
//! a small IMDSv2 stub on 127.0.0.1 stands in for the instance metadata
//! service.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use ebs_csi_proto::v1::{NodeGetInfoRequest, NodeGetInfoResponse};
use ebs_csi_tests::{Agent, Helper, Sandbox, require_root};

const TOKEN: &str = "stub-token";

/// Serves IMDSv2 on loopback: a session token from `PUT /latest/api/token`
/// (with the TTL header aws-config requires), then metadata paths only
/// with that token. Returns the address and the log of requests.
fn start_imds_stub() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let served = Arc::clone(&log);
    std::thread::spawn(move || {
        for stream in listener.incoming().take(50) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push(line.trim_end().to_owned());
            }
            let request_line = head.first().cloned().unwrap_or_default();
            let has_token = head
                .iter()
                .any(|h| h.to_ascii_lowercase() == format!("x-aws-ec2-metadata-token: {TOKEN}"));
            served.lock().unwrap().push(request_line.clone());
            let (status, extra, body) = match (request_line.split(' ').next(), request_line.split(' ').nth(1)) {
                (Some("PUT"), Some("/latest/api/token")) => {
                    ("200 OK", "x-aws-ec2-metadata-token-ttl-seconds: 21600\r\n", TOKEN)
                }
                (Some("GET"), Some(_)) if !has_token => ("401 Unauthorized", "", ""),
                (Some("GET"), Some("/latest/meta-data/instance-id")) => ("200 OK", "", "i-0fedcba9876543210"),
                (Some("GET"), Some("/latest/meta-data/placement/availability-zone")) => ("200 OK", "", "eu-west-1b"),
                (Some("GET"), Some("/latest/meta-data/instance-type")) => ("200 OK", "", "m5.xlarge"),
                (Some("GET"), Some("/latest/meta-data/network/interfaces/macs/")) => {
                    ("200 OK", "", "0a:00:00:00:00:01/\n0a:00:00:00:00:02/")
                }
                // One entry per line: `ami`, `root`, `ebsN` for each EBS
                // volume besides the root, `ephemeralN` (EC2 User Guide,
                // "Instance metadata categories", block-device-mapping/).
                (Some("GET"), Some("/latest/meta-data/block-device-mapping/")) => {
                    ("200 OK", "", "ami\nebs1\nebs2\nephemeral0\nroot")
                }
                _ => ("404 Not Found", "", ""),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    (address, log)
}

async fn node_info(agent: &Agent) -> NodeGetInfoResponse {
    let mut node = agent.node().await;
    node.node_get_info(NodeGetInfoRequest {}).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread")]
async fn node_info_comes_from_imds_when_flags_are_absent() {
    if !require_root() {
        return;
    }
    let (endpoint, log) = start_imds_stub();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let agent = Agent::spawn(
        &sandbox,
        &helper,
        &[],
        &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", &endpoint)],
    );
    let info = node_info(&agent).await;
    assert_eq!(info.node_id, "i-0fedcba9876543210");
    // m5.xlarge: EC2's MaximumEbsAttachments is 27 (shared); minus the
    // second ENI, the root and the two boot EBS volumes.
    assert_eq!(info.max_volumes_per_node, 23);
    assert_eq!(
        info.accessible_topology
            .unwrap()
            .segments
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("eu-west-1b")
    );
    let log = log.lock().unwrap();
    assert!(
        log.iter().any(|l| l.starts_with("PUT /latest/api/token")),
        "IMDSv2 session token used: {log:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn flags_win_over_imds_and_the_limit_flag_over_the_table() {
    if !require_root() {
        return;
    }
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let args = [&Agent::NODE_FLAGS[..], &["--volume-attach-limit", "7"]].concat();
    // An unreachable IMDS: the agent must not need it.
    let agent = Agent::spawn(
        &sandbox,
        &helper,
        &args,
        &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9")],
    );
    let info = node_info(&agent).await;
    assert_eq!(info.node_id, "i-0123456789abcdef0");
    assert_eq!(info.max_volumes_per_node, 7);
}

#[tokio::test(flavor = "multi_thread")]
async fn reserved_attachments_flag_replaces_the_boot_volumes() {
    if !require_root() {
        return;
    }
    let (endpoint, _) = start_imds_stub();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let agent = Agent::spawn(
        &sandbox,
        &helper,
        &["--reserved-volume-attachments", "5"],
        &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", &endpoint)],
    );
    let info = node_info(&agent).await;
    // m5.xlarge: 27, minus the second ENI, minus the 5 reserved.
    assert_eq!(info.max_volumes_per_node, 21);
}
