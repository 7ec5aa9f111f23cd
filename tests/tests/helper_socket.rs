//! The helper serves a socket handed over by systemd socket activation
//! (`LISTEN_FDS`), here from `systemd-socket-activate`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::process::{Command, Stdio};
use std::time::Duration;

use ebs_csi_helper_proto::{HelperClient, PROTOCOL_VERSION, Reply, Request};
use ebs_csi_tests::{AGENT_UID, Sandbox, binary, require_root, run_as, wait_until};

#[test]
fn serves_a_systemd_activated_socket() {
    if !require_root() {
        return;
    }
    if Command::new("systemd-socket-activate").arg("--help").output().is_err() {
        return eprintln!("skipped: systemd-socket-activate is not installed");
    }
    let sandbox = Sandbox::new();
    let socket = sandbox.path().join("activated.sock");
    let mut activator = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&socket)
        .arg(binary("ebs-csi-helper"))
        .args([
            "--socket",
            "/nonexistent/unused.sock",
            "--allowed-uid",
            &AGENT_UID.to_string(),
            "--allowed-root",
        ])
        .arg(sandbox.kubelet())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the activation socket", Duration::from_secs(10), || socket.exists());
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let reply = run_as(AGENT_UID, {
        let socket = socket.clone();
        move || HelperClient::new(socket, Duration::from_secs(10)).call(Request::Ping)
    });
    let _ = activator.kill();
    let _ = activator.wait();
    assert_eq!(
        reply.unwrap(),
        Reply::Pong {
            version: PROTOCOL_VERSION
        }
    );
    assert!(
        !std::path::Path::new("/nonexistent/unused.sock").exists(),
        "the helper bound its own socket"
    );
}
