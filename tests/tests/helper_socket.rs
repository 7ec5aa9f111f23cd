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

#[test]
fn the_helper_runs_with_least_privilege() {
    if !require_root() {
        return;
    }
    let sandbox = Sandbox::new();
    let helper = ebs_csi_tests::Helper::start(&sandbox, &[]);
    let pid = helper.process.pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .trim()
            .to_owned()
    };
    // CAP_SYS_ADMIN (21) and CAP_SYS_RESOURCE (24), where the machine grants them.
    let allowed: u64 = (1 << 21) | (1 << 24);
    for set in ["CapEff:", "CapPrm:", "CapBnd:"] {
        let bits = u64::from_str_radix(&field(set), 16).unwrap();
        assert_eq!(
            bits & !allowed,
            0,
            "{set} {bits:x} holds more than CAP_SYS_ADMIN and CAP_SYS_RESOURCE"
        );
        assert_ne!(bits & (1 << 21), 0, "{set} lost CAP_SYS_ADMIN");
    }
    assert_eq!(u64::from_str_radix(&field("CapInh:"), 16).unwrap(), 0);
    assert_eq!(u64::from_str_radix(&field("CapAmb:"), 16).unwrap(), 0);
    assert_eq!(field("NoNewPrivs:"), "1");
    assert_eq!(field("Seccomp:"), "2", "the serving thread runs under a seccomp filter");
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| std::fs::read_link(e.unwrap().path()).unwrap().display().to_string())
        .collect();
    assert!(fds.len() <= 6, "unexpected descriptors: {fds:?}");
}
