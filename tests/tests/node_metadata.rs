//! Without metadata flags the agent reads its identity from its metadata
//! sources: IMDSv2 (a small IMDSv2 stub on 127.0.0.1 stands in for the
//! instance metadata service) and, when IMDS does not answer, its Node
//! object in the Kubernetes API (`tests/kube-api/serve.py`, answering as
//! kube-apiserver does). The `dmi` source is read from a real kernel's
//! SMBIOS tables in the NVMe VM (`tests/tests/nvme_vm.rs`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use ebs_csi_proto::v1::{NodeGetInfoRequest, NodeGetInfoResponse};
use ebs_csi_tests::http_proxy::HttpProxy;
use ebs_csi_tests::kube_api::{KubeApi, NODE_NAME};
use ebs_csi_tests::{Agent, Helper, Sandbox, binary, require_root, wait_until};

const TOKEN: &str = "stub-token";

/// The IMDS stub: its address, the log of requests, and the MAC addresses
/// of the instance's network interfaces it lists (one per line, as
/// `network/interfaces/macs/`), which a test may change.
struct ImdsStub {
    address: String,
    log: Arc<Mutex<Vec<String>>>,
    macs: Arc<Mutex<String>>,
}

/// Serves IMDSv2 on loopback: a session token from `PUT /latest/api/token`
/// (with the TTL header aws-config requires), then metadata paths only
/// with that token.
fn start_imds_stub() -> ImdsStub {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let macs = Arc::new(Mutex::new("0a:00:00:00:00:01/\n0a:00:00:00:00:02/".to_owned()));
    let (served, listed) = (Arc::clone(&log), Arc::clone(&macs));
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
            let macs_now = listed.lock().unwrap().clone();
            let (status, extra, body) = match (request_line.split(' ').next(), request_line.split(' ').nth(1)) {
                (Some("PUT"), Some("/latest/api/token")) => {
                    ("200 OK", "x-aws-ec2-metadata-token-ttl-seconds: 21600\r\n", TOKEN)
                }
                (Some("GET"), Some(_)) if !has_token => ("401 Unauthorized", "", ""),
                (Some("GET"), Some("/latest/meta-data/instance-id")) => ("200 OK", "", "i-0fedcba9876543210"),
                (Some("GET"), Some("/latest/meta-data/placement/availability-zone")) => ("200 OK", "", "eu-west-1b"),
                (Some("GET"), Some("/latest/meta-data/placement/availability-zone-id")) => ("200 OK", "", "euw1-az3"),
                // An instance on an Outpost (EC2 User Guide, "Instance
                // metadata categories": outpost-arn).
                (Some("GET"), Some("/latest/meta-data/outpost-arn")) => (
                    "200 OK",
                    "",
                    "arn:aws:outposts:eu-west-1:111122223333:outpost/op-0123456789abcdef0",
                ),
                (Some("GET"), Some("/latest/meta-data/instance-type")) => ("200 OK", "", "m5.xlarge"),
                (Some("GET"), Some("/latest/meta-data/network/interfaces/macs/")) => ("200 OK", "", macs_now.as_str()),
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
    ImdsStub { address, log, macs }
}

async fn node_info(agent: &Agent) -> NodeGetInfoResponse {
    let mut node = agent.node().await;
    node.node_get_info(NodeGetInfoRequest {}).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn node_info_comes_from_imds_when_flags_are_absent() {
    require_root();
    let ImdsStub {
        address: endpoint,
        log,
        macs,
    } = start_imds_stub();
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
    // The VPC CNI attaches a third interface: it takes a slot at the next
    // NodeGetInfo (kubelet asks again every nodeAllocatableUpdatePeriodSeconds).
    macs.lock().unwrap().push_str("\n0a:00:00:00:00:03/");
    assert_eq!(node_info(&agent).await.max_volumes_per_node, 22);
    let segments = info.accessible_topology.unwrap().segments;
    assert_eq!(
        segments.get("topology.kubernetes.io/zone").map(String::as_str),
        Some("eu-west-1b")
    );
    assert_eq!(
        segments.get("topology.k8s.aws/zone-id").map(String::as_str),
        Some("euw1-az3")
    );
    for (key, value) in [
        ("topology.ebs.csi.aws.com/outpost-id", "op-0123456789abcdef0"),
        ("topology.ebs.csi.aws.com/account-id", "111122223333"),
        ("topology.ebs.csi.aws.com/region", "eu-west-1"),
        ("topology.ebs.csi.aws.com/partition", "aws"),
    ] {
        assert_eq!(segments.get(key).map(String::as_str), Some(value), "{key}");
    }
    let log = log.lock().unwrap();
    assert!(
        log.iter().any(|l| l.starts_with("PUT /latest/api/token")),
        "IMDSv2 session token used: {log:?}"
    );
}

/// The agent asks IMDS directly, even where `HTTP_PROXY` and `HTTPS_PROXY`
/// name a proxy and `NO_PROXY` does not list IMDS's address: only the
/// instance's own link-local address answers for the instance
/// (agent/src/metadata/imds.rs). proxy.py, a real forwarding proxy, logs
/// each request it forwards.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn imds_is_asked_directly_never_through_a_proxy() {
    require_root();
    let imds = start_imds_stub();
    let proxy = HttpProxy::start();
    let url = proxy.url.as_str();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let env = [
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.address.as_str()),
        ("HTTP_PROXY", url),
        ("HTTPS_PROXY", url),
        ("NO_PROXY", ""),
    ];
    let agent = Agent::spawn(&sandbox, &helper, &[], &env);
    assert_eq!(node_info(&agent).await.node_id, "i-0fedcba9876543210");
    assert!(
        imds.log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("PUT /latest/api/token")),
        "the stub was asked"
    );
    let host = imds.address.trim_start_matches("http://");
    assert!(!proxy.log().contains(host), "{}", proxy.log());
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn flags_win_over_imds_and_the_limit_flag_over_the_table() {
    require_root();
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
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn reserved_attachments_flag_replaces_the_boot_volumes() {
    require_root();
    let endpoint = start_imds_stub().address;
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

/// Runs `ebs-csi-agent [args] metadata` with the in-cluster variables for
/// `api`, node `node_name`, the service account directory `accounts` and
/// IMDS at `imds`.
fn agent_metadata(api: &KubeApi, accounts: &Path, node_name: &str, imds: &str, args: &[&str]) -> Output {
    Command::new(binary("ebs-csi-agent"))
        .args(args)
        .arg("--service-account-dir")
        .arg(accounts)
        .arg("metadata")
        .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds)
        .env("CSI_NODE_NAME", node_name)
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", api.port.to_string())
        .output()
        .unwrap()
}

/// The error line the agent prints for a source that failed.
fn failure(output: &Output) -> String {
    assert!(!output.status.success(), "the agent succeeded: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    stderr
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("no metadata source knows this node"))
        .unwrap_or_else(|| panic!("no metadata error in {stderr}"))
        .to_owned()
}

#[test]
fn a_pod_that_cannot_reach_imds_reads_its_node_object() {
    let api = KubeApi::start();
    // IMDS as a pod sees it with hop limit 1: the connection opens, the
    // session token's answer never arrives.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let imds = format!("http://{}", silent.local_addr().unwrap());
    let output = agent_metadata(&api, api.service_account_dir(), NODE_NAME, &imds, &[]);
    assert!(output.status.success(), "{output:?}");
    // m5.xlarge: 27 (shared); the root volume reserved; one interface
    // assumed (only IMDS counts them).
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "instance id\ti-0fedcba9876543210\navailability zone\teu-west-1b\ninstance type\tm5.xlarge\nmax volumes\t26\n"
    );
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("INFO ebs_csi_agent::metadata: node metadata source failed, trying the next source=imds"),
        "{output:?}"
    );
    let token = std::fs::read_to_string(api.service_account_dir().join("token")).unwrap();
    assert_eq!(
        api.requests(),
        format!("GET /api/v1/nodes/{NODE_NAME} Bearer {token}\n")
    );
}

/// The Go driver's `--metadata-sources metadata-labeler`: the Node object,
/// as `kubernetes`, with the network interfaces and the volumes besides the
/// root that the controller's metadata labeler puts in its labels (3 and 2:
/// m5.xlarge's 26 slots for one interface and the root lose 2 more
/// interfaces and 2 volumes); `kubernetes` alone does not read them.
#[test]
fn the_go_drivers_metadata_labeler_source_reads_the_labelers_counts() {
    let labels = r#"{"ebs.csi.aws.com/enis-count": "3", "ebs.csi.aws.com/non-csi-ebs-volumes-count": "2"}"#;
    let api = KubeApi::start_with(&["--labels", labels]);
    let read = |source: &str| {
        let output = agent_metadata(
            &api,
            api.service_account_dir(),
            NODE_NAME,
            "http://127.0.0.1:9",
            &["--metadata-sources", source],
        );
        assert!(output.status.success(), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("node metadata read source={source}")) && !stderr.contains("WARN"),
            "{stderr}"
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let node = "instance id\ti-0fedcba9876543210\navailability zone\teu-west-1b\ninstance type\tm5.xlarge\n";
    assert_eq!(read("metadata-labeler"), format!("{node}max volumes\t22\n"));
    assert_eq!(read("kubernetes"), format!("{node}max volumes\t26\n"));
}

#[test]
fn api_server_refusals_are_reported_with_its_message() {
    let api = KubeApi::start();
    let base = format!("kubernetes: GET https://127.0.0.1:{}/api/v1/nodes", api.port);
    let only_kubernetes = ["--metadata-sources", "kubernetes"];
    let accounts = api.service_account_dir();
    let forbidden = agent_metadata(&api, accounts, "forbidden", "http://127.0.0.1:9", &only_kubernetes);
    assert_eq!(
        failure(&forbidden),
        format!(
            "no metadata source knows this node: {base}/forbidden: 403: nodes \"forbidden\" is forbidden: \
             User \"system:serviceaccount:kube-system:ebs-csi-node-sa\" cannot get resource \"nodes\" in API group \"\" at the cluster scope"
        )
    );
    let missing = agent_metadata(&api, accounts, "ip-10-9-9-9", "http://127.0.0.1:9", &only_kubernetes);
    assert_eq!(
        failure(&missing),
        format!("no metadata source knows this node: {base}/ip-10-9-9-9: 404: nodes \"ip-10-9-9-9\" not found")
    );
    let injected = agent_metadata(&api, accounts, "../namespaces", "http://127.0.0.1:9", &only_kubernetes);
    assert_eq!(
        failure(&injected),
        "no metadata source knows this node: kubernetes: CSI_NODE_NAME \"../namespaces\" is not a Node name"
    );
    // Another token: 401. Another cluster's CA: the TLS handshake fails.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("token"), "another-token").unwrap();
    std::fs::copy(accounts.join("ca.crt"), other.path().join("ca.crt")).unwrap();
    let unauthorized = agent_metadata(&api, other.path(), NODE_NAME, "http://127.0.0.1:9", &only_kubernetes);
    assert_eq!(
        failure(&unauthorized),
        format!("no metadata source knows this node: {base}/{NODE_NAME}: 401: Unauthorized")
    );
    let other_cluster = KubeApi::start();
    let untrusted = agent_metadata(
        &api,
        other_cluster.service_account_dir(),
        NODE_NAME,
        "http://127.0.0.1:9",
        &only_kubernetes,
    );
    // Both CAs are named `kubernetes` (kubeadm's name too): the other
    // cluster's CA is found by name and its signature does not verify.
    assert_eq!(
        failure(&untrusted),
        format!(
            "no metadata source knows this node: {base}/{NODE_NAME}: client error (Connect): invalid peer certificate: BadSignature"
        )
    );
    // Forbidden, missing and unauthorized reached the server; the bad name
    // and the untrusted server did not send a request.
    let requests = api.requests();
    assert_eq!(requests.lines().count(), 3, "{requests}");
}

/// The startup taint `ebs.csi.aws.com/agent-not-ready` (the Go driver's;
/// Karpenter's and EKS's docs set it as a startup taint) stays until the
/// agent has answered NodeGetInfo (kubelet registers a plugin with it) and
/// the helper answers; then the agent removes it and keeps every other
/// taint, reading the Node again when another writer changed it between
/// the read and the patch (kube-apiserver answers the failed `test` 422).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn the_startup_taint_goes_once_the_node_is_ready() {
    require_root();
    let other = serde_json::json!({"key": "example.com/dedicated", "value": "storage", "effect": "NoSchedule"});
    let taints = serde_json::json!([{"key": "ebs.csi.aws.com/agent-not-ready", "effect": "NoExecute"}, other]);
    let api = KubeApi::start_with(&["--taints", &taints.to_string(), "--conflicts", "1"]);
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let (port, accounts) = (
        api.port.to_string(),
        api.service_account_dir().to_str().unwrap().to_owned(),
    );
    let agent = Agent::spawn(
        &sandbox,
        &helper,
        &[&Agent::NODE_FLAGS[..], &["--service-account-dir", &accounts]].concat(),
        &[
            ("CSI_NODE_NAME", NODE_NAME),
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", &port),
        ],
    );
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(
        !api.requests().contains("PATCH"),
        "patched before NodeGetInfo: {}",
        api.requests()
    );
    node_info(&agent).await;
    wait_until("the startup taint to go", std::time::Duration::from_secs(10), || {
        api.node()["spec"]["taints"] == serde_json::json!([other])
    });
    let requests = api.requests();
    let patches: Vec<&str> = requests.lines().filter(|l| l.starts_with("PATCH")).collect();
    assert_eq!(
        patches.len(),
        2,
        "one lost to the other writer, one applied: {requests}"
    );
    assert!(
        patches
            .iter()
            .all(|p| p.contains("application/json-patch+json") && p.contains(r#""op":"test""#)),
        "{requests}"
    );
    // The stub stores the patched Node before it answers, so the agent
    // logs the removal a moment after the Node shows it.
    wait_until(
        "the agent to log the removal",
        std::time::Duration::from_secs(10),
        || agent.process.log().contains("removed the startup taint"),
    );
}

/// On a Xen instance type the helper can prove no device (no NVMe serial),
/// so NodeGetInfo fails FAILED_PRECONDITION saying why: kubelet does not
/// register the driver there, rather than offering 39 slots no volume can
/// use. (The Go driver reports 39 and stages through `devicePath`.)
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn a_xen_node_is_not_offered_to_kubelet() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let args = [
        "--node-id",
        "i-0123456789abcdef0",
        "--availability-zone",
        "eu-west-1a",
        "--instance-type",
        "m4.xlarge",
    ];
    let agent = Agent::spawn(&sandbox, &helper, &args, &[]);
    let mut node = agent.node().await;
    let status = node.node_get_info(NodeGetInfoRequest {}).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        status.message(),
        "instance type m4.xlarge runs on Xen: its EBS volumes are not NVMe devices, so the helper cannot prove a device is the volume named, and no volume is staged on this node; use a Nitro instance type"
    );
    assert!(
        agent.process.log().contains("NodeGetInfo will fail"),
        "{}",
        agent.process.log()
    );
}
