//! FIPS 140-3 mode (`--fips`, the chart's `fips`): `--version` and the
//! start say it is on, and each kind of TLS client the binaries have
//! refuses a server that offers only a suite outside the FIPS module's
//! validation — ChaCha20-Poly1305, as `tests/kube-api/serve.py --ciphers`
//! serves it (TLS 1.2) — and connects to one that offers AES-GCM: the
//! agent's Kubernetes client, and the AWS SDK's client of the controller,
//! which builds its own TLS configuration. Every build is so, flag or not
//! (`ebs_csi_proto::fips`): without `--fips` the ChaCha20 server is
//! refused too.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::path::Path;
use std::process::{Command, Output};

use ebs_csi_proto::v1::CreateVolumeRequest;
use ebs_csi_tests::guest::mount_capability;
use ebs_csi_tests::kube_api::{self, KubeApi};
use ebs_csi_tests::{Sandbox, binary, spawn};

/// A TLS 1.2 suite outside FIPS 140-3 (serve.py's key is ECDSA P-256).
const CHACHA20: &str = "ECDHE-ECDSA-CHACHA20-POLY1305";
/// A TLS 1.2 suite the FIPS module is validated for.
const AES_GCM: &str = "ECDHE-ECDSA-AES128-GCM-SHA256";

/// serve.py offering only `suite`.
fn server_of(suite: &str) -> KubeApi {
    KubeApi::start_with(&["--ciphers", suite])
}

#[test]
fn the_version_and_the_start_say_that_fips_mode_is_on() {
    for program in ["ebs-csi-controller", "ebs-csi-agent"] {
        let version = |args: &[&str]| {
            let output = Command::new(binary(program)).args(args).output().unwrap();
            assert!(output.status.success(), "{program} {args:?}: {output:?}");
            String::from_utf8(output.stdout).unwrap()
        };
        let fips = version(&["--fips", "--version"]);
        assert!(fips.ends_with(",\n  \"fips\": true\n}\n"), "{program}: {fips}");
        let plain = version(&["--version"]);
        assert!(!plain.contains("fips"), "{program}: {plain}");
    }
    let sandbox = Sandbox::new();
    let socket = sandbox.path().join("controller.sock");
    let mut command = Command::new(binary("ebs-csi-controller"));
    command
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .arg("--fips")
        .env("AWS_REGION", "us-east-1");
    let controller = spawn("controller", command, sandbox.path().join("controller.log"), &socket);
    assert!(
        controller
            .log()
            .contains("FIPS 140-3 mode: TLS by the FIPS module's approved algorithms only"),
        "{}",
        controller.log()
    );
}

/// `ebs-csi-agent [--fips] … metadata` against `api`, with its token and
/// CA in a kubeconfig.
fn agent_metadata(api: &KubeApi, fips: bool) -> Output {
    let dir = api.service_account_dir();
    let config = dir.join("kubeconfig");
    std::fs::write(
        &config,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: \"https://127.0.0.1:{}\", \
             certificate-authority: ca.crt}}\nusers:\n- name: agent\n  user: {{tokenFile: token}}\ncontexts:\n\
             - name: test\n  context: {{cluster: test, user: agent}}\ncurrent-context: test\n",
            api.port
        ),
    )
    .unwrap();
    kube_api::agent_metadata(if fips { &["--fips"] } else { &[] }, &config)
}

#[test]
fn the_agents_kubernetes_client_refuses_chacha20() {
    let chacha = server_of(CHACHA20);
    let refused = agent_metadata(&chacha, true);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(stderr.contains("HandshakeFailure"), "{stderr}");
    assert_eq!(chacha.requests(), "", "a request went through");

    let refused = agent_metadata(&chacha, false);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("HandshakeFailure"),
        "without --fips: {refused:?}"
    );

    let aes = server_of(AES_GCM);
    let accepted = agent_metadata(&aes, true);
    assert!(accepted.status.success(), "AES-GCM in FIPS mode: {accepted:?}");
}

/// The controller (in FIPS mode with `fips`) with EC2's endpoint at `api` (whose CA the
/// SDK takes from `SSL_CERT_FILE`, as rustls-native-certs reads it), asked
/// for a volume: the answer's message.
async fn create_volume_through(api: &KubeApi, dir: &Path, fips: bool) -> String {
    let socket = dir.join("controller.sock");
    let mut command = Command::new(binary("ebs-csi-controller"));
    command
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .args(fips.then_some("--fips"));
    ebs_csi_tests::moto::aws_env(&mut command, &format!("https://127.0.0.1:{}", api.port), "us-east-1");
    command.env("SSL_CERT_FILE", api.service_account_dir().join("ca.crt"));
    let _controller = spawn("controller", command, dir.join("controller.log"), &socket);
    let mut client = ebs_csi_proto::v1::controller_client::ControllerClient::new(ebs_csi_tests::channel(&socket).await);
    let refused = client
        .create_volume(CreateVolumeRequest {
            name: "pvc-fips".into(),
            volume_capabilities: mount_capability("ext4").into_iter().collect(),
            ..Default::default()
        })
        .await
        .expect_err("serve.py is no EC2");
    refused.message().to_owned()
}

#[tokio::test]
async fn the_aws_sdks_client_refuses_chacha20() {
    let sandbox = Sandbox::new();
    let chacha = server_of(CHACHA20);
    for (fips, dir) in [(true, "chacha-fips"), (false, "chacha")] {
        let message = create_volume_through(&chacha, &sandbox.mkdir(dir), fips).await;
        assert_eq!(chacha.requests(), "", "a request went through: {message}");
    }

    let aes = server_of(AES_GCM);
    let message = create_volume_through(&aes, &sandbox.mkdir("aes"), true).await;
    assert!(aes.requests().starts_with("POST /"), "{message}: {}", aes.requests());
}
