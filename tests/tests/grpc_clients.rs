//! gRPC clients other than tonic, over both CSI unix sockets: grpcio
//! (gRPC C-core, PyPI) with its default options, which send the
//! percent-encoded socket path as `:authority`, and with the bare path (as
//! grpc-java sends it); grpc-go 1.33 (Debian bookworm) dialing the bare
//! path the way kubelet before 1.26 registers a plugin and calls it; and a
//! current grpc-go (tests/go/go.mod) dialing a `unix://` target as the CSI
//! sidecars do, with `localhost` as `:authority`. h2 alone resets the
//! path authorities with PROTOCOL_ERROR.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::path::Path;
use std::process::Command;

use ebs_csi_proto::v1::{GetPluginInfoResponse, NodeGetInfoResponse};
use ebs_csi_tests::moto::Controller;
use ebs_csi_tests::{Agent, Helper, Sandbox, go_tool, repository, require_root, venv_program};
use prost::Message;

const GET_PLUGIN_INFO: &str = "/csi.v1.Identity/GetPluginInfo";
const NODE_GET_INFO: &str = "/csi.v1.Node/NodeGetInfo";
/// The volume-modifier-for-k8s sidecar's first call, by the method name its
/// generated client sends (`pkg/rpc/modify_grpc.pb.go`).
const MODIFICATION_CAPABILITY: &str = "/modify.v1.Modify/GetCSIDriverModificationCapability";

/// The hex a client printed, as bytes.
fn response(output: std::process::Output, client: &str) -> Vec<u8> {
    assert!(
        output.status.success(),
        "{client}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let hex = String::from_utf8(output.stdout).unwrap();
    let hex = hex.trim();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// Calls `method` with grpcio from the tests' virtual environment (`make
/// test` installs it), with `authority` as grpc.default_authority if given.
fn grpcio(socket: &Path, method: &str, authority: Option<&str>) -> Vec<u8> {
    let mut command = Command::new(venv_program("python"));
    command
        .arg(repository().join("tests/grpc-python/call.py"))
        .arg(socket)
        .arg(method)
        .args(authority);
    response(command.output().unwrap(), &format!("grpcio, authority {authority:?}"))
}

/// Calls `method` with a current grpc-go (tests/go), as the CSI sidecars
/// dial.
fn grpc_go_current(socket: &Path, method: &str) -> Vec<u8> {
    response(
        Command::new(go_tool("grpc-dial"))
            .arg(socket)
            .arg(method)
            .output()
            .unwrap(),
        "grpc-go, current",
    )
}

/// Calls `method` with grpc-go, dialing the bare socket path.
fn grpc_go(socket: &Path, method: &str) -> Vec<u8> {
    response(
        Command::new(go_tool("kubelet-dial"))
            .arg(socket)
            .arg(method)
            .output()
            .unwrap(),
        "grpc-go",
    )
}

/// Each client's answer to `method` on `socket`.
fn every_client(socket: &Path, method: &str) -> Vec<(&'static str, Vec<u8>)> {
    let bare = socket.to_str().unwrap();
    vec![
        ("grpcio defaults", grpcio(socket, method, None)),
        ("grpcio, bare path", grpcio(socket, method, Some(bare))),
        ("grpc-go 1.33, bare path", grpc_go(socket, method)),
        ("grpc-go of tests/go, unix:// target", grpc_go_current(socket, method)),
    ]
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn the_node_socket_serves_every_client() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let agent = Agent::start(&sandbox, &helper);
    for (client, bytes) in every_client(&agent.socket, NODE_GET_INFO) {
        let info = NodeGetInfoResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(info.node_id, "i-0123456789abcdef0", "{client}");
    }
    for (client, bytes) in every_client(&agent.socket, GET_PLUGIN_INFO) {
        let info = GetPluginInfoResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(info.name, "ebs.csi.aws.com", "{client}");
    }
    let log = agent.process.log();
    let warnings: Vec<_> = log.lines().filter(|l| l.contains("serving it as localhost")).collect();
    let socket = agent.socket.display().to_string();
    // Eight connections, four with a path for authority: one warning (kubelet
    // opens a connection per call; the rest are counted in /metrics), with
    // the peer and the first one's authority, grpcio's percent-encoded path.
    assert_eq!(warnings.len(), 1, "{log}");
    let encoded = socket.trim_start_matches('/').replace('/', "%2F");
    assert!(
        warnings[0].contains(" WARN ") && warnings[0].contains("peer=pid ") && warnings[0].contains(&encoded),
        "{log}"
    );
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn the_controller_socket_serves_every_client() {
    require_root();
    let sandbox = Sandbox::new();
    // GetPluginInfo does not call EC2: an endpoint nothing listens on.
    let controller = Controller::start_in(sandbox.path(), "http://127.0.0.1:9", "us-east-1", &[]);
    for (client, bytes) in every_client(&controller.socket, GET_PLUGIN_INFO) {
        let info = GetPluginInfoResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(info.name, "ebs.csi.aws.com", "{client}");
    }
    // The Go driver's empty answer, to every client.
    for (client, bytes) in every_client(&controller.socket, MODIFICATION_CAPABILITY) {
        assert!(bytes.is_empty(), "{client}: {bytes:?}");
    }
}
