//! `--kubeconfig`, the Go driver's flag, gives the agent its Kubernetes
//! client outside a cluster: `ebs-csi-agent metadata` reads the Node object
//! of `tests/kube-api/serve.py` (kube-apiserver's answers over TLS) with no
//! in-cluster variable set, as a kubeconfig's current context says — a
//! token file and a CA file at paths relative to the kubeconfig, a client
//! certificate and CA given as data, and an exec credential plugin whose
//! first token the server refuses (the plugin runs again, as client-go's
//! after a 401). What the agent cannot use is refused naming the field,
//! before any request. (The real cluster's test reads its Node with the
//! cluster's own kubeconfig, `tests/tests/kube/chart.rs`.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use ebs_csi_tests::kube_api::{KubeApi, NODE_NAME, agent_metadata};

/// What `ebs-csi-agent metadata` prints of serve.py's Node (m5.xlarge:
/// 27 attachments, the root volume's reserved).
const NODE_SUMMARY: &str =
    "instance id\ti-0fedcba9876543210\navailability zone\teu-west-1b\ninstance type\tm5.xlarge\nmax volumes\t26\n";

/// [`agent_metadata`] with no other flag.
fn metadata_with(config: &Path) -> Output {
    agent_metadata(&[], config)
}

/// A kubeconfig of one context, `test`, with `cluster` and `user` (YAML
/// flow mappings, as kubeadm's and `tests/kube/cluster.sh`'s).
fn kubeconfig(cluster: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{{cluster}}}\n\
         users:\n- name: agent\n  user: {{{user}}}\ncontexts:\n- name: test\n  context: {{cluster: test, user: agent}}\n\
         current-context: test\n"
    )
}

fn base64(path: &Path) -> String {
    let output = Command::new("base64").arg("-w0").arg(path).output().unwrap();
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn a_kubeconfig_gives_the_client_outside_a_cluster() {
    let api = KubeApi::start();
    let accounts = api.service_account_dir();
    let dir = tempfile::tempdir().unwrap();
    let server = format!("server: \"https://127.0.0.1:{}\"", api.port);

    // Files relative to the kubeconfig's directory.
    std::fs::create_dir(dir.path().join("pki")).unwrap();
    std::fs::copy(accounts.join("ca.crt"), dir.path().join("pki/ca.crt")).unwrap();
    std::fs::copy(accounts.join("token"), dir.path().join("token")).unwrap();
    let files = dir.path().join("files.kubeconfig");
    std::fs::write(
        &files,
        kubeconfig(
            &format!("{server}, certificate-authority: pki/ca.crt"),
            "tokenFile: token",
        ),
    )
    .unwrap();
    let output = metadata_with(&files);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), NODE_SUMMARY);

    // A client certificate, and the CA, as data.
    let data = dir.path().join("data.kubeconfig");
    std::fs::write(
        &data,
        kubeconfig(
            &format!(
                "{server}, certificate-authority-data: {}",
                base64(&accounts.join("ca.crt"))
            ),
            &format!(
                "client-certificate-data: {}, client-key-data: {}",
                base64(&accounts.join("client.crt")),
                base64(&accounts.join("client.key"))
            ),
        ),
    )
    .unwrap();
    let output = metadata_with(&data);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), NODE_SUMMARY);

    // An exec plugin (EKS's `aws eks get-token` is one): its first token is
    // refused, and the agent runs it again. It gets the entry's env and
    // KUBERNETES_EXEC_INFO, with the cluster as asked.
    let plugin = dir.path().join("bin/get-token");
    std::fs::create_dir(dir.path().join("bin")).unwrap();
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\nset -e\ncd \"$(dirname \"$0\")\"\nprintf '%s %s\\n' \"$1\" \"$CLUSTER_NAME\" >> runs\n\
             printf '%s' \"$KUBERNETES_EXEC_INFO\" > info\n\
             if [ \"$(wc -l < runs)\" -eq 1 ]; then token=expired; else token=$(cat {token}); fi\n\
             printf '{{\"apiVersion\": \"client.authentication.k8s.io/v1beta1\", \"kind\": \"ExecCredential\", \"status\": {{\"token\": \"%s\"}}}}' \"$token\"\n",
            token = accounts.join("token").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exec = dir.path().join("exec.kubeconfig");
    std::fs::write(
        &exec,
        kubeconfig(
            &format!("{server}, certificate-authority: pki/ca.crt"),
            "exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: ./bin/get-token, args: [token], \
             env: [{name: CLUSTER_NAME, value: test}], interactiveMode: Never, provideClusterInfo: true}",
        ),
    )
    .unwrap();
    let output = metadata_with(&exec);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), NODE_SUMMARY);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("bin/runs")).unwrap(),
        "token test\ntoken test\n"
    );
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("bin/info")).unwrap()).unwrap();
    assert_eq!(info["kind"], "ExecCredential");
    assert_eq!(info["apiVersion"], "client.authentication.k8s.io/v1beta1");
    assert_eq!(info["spec"]["interactive"], false);
    assert_eq!(
        info["spec"]["cluster"]["server"],
        format!("https://127.0.0.1:{}", api.port)
    );

    let token = std::fs::read_to_string(accounts.join("token")).unwrap();
    let path = format!("/api/v1/nodes/{NODE_NAME}");
    assert_eq!(
        api.requests(),
        format!(
            "GET {path} Bearer {token}\nGET {path} certificate system:node:{NODE_NAME}\n\
             GET {path} Bearer expired\nGET {path} Bearer {token}\n"
        )
    );
}

/// What the agent cannot use is refused naming what, and no request is
/// sent.
#[test]
fn a_kubeconfig_the_agent_cannot_use_is_refused_naming_what() {
    let api = KubeApi::start();
    let dir = tempfile::tempdir().unwrap();
    let ca = api.service_account_dir().join("ca.crt");
    let server = format!(
        "server: \"https://127.0.0.1:{}\", certificate-authority: {}",
        api.port,
        ca.display()
    );
    let plugin = |exec: &str| format!("exec: {{command: /bin/true, {exec}}}");
    let cases = [
        (
            "apiVersion: v1\nkind: Config\nclusters: []\n".to_owned(),
            "current-context is not set",
        ),
        (
            kubeconfig(&server, "token: t").replace("context: {cluster: test", "context: {cluster: other"),
            "cluster \"other\" was not found for context \"test\"",
        ),
        (
            kubeconfig(&server, "token: t").replace("current-context: test", "current-context: prod"),
            "context \"prod\" is not defined",
        ),
        (
            kubeconfig("server: \"http://127.0.0.1:8080\"", "token: t"),
            "the server \"http://127.0.0.1:8080\" is not an https:// URL",
        ),
        (
            kubeconfig(&format!("{server}, insecure-skip-tls-verify: true"), "token: t"),
            "insecure-skip-tls-verify is not supported: the API server is always verified",
        ),
        (
            kubeconfig(&format!("{server}, proxy-url: \"http://proxy:3128\""), "token: t"),
            "proxy-url is not supported",
        ),
        (
            kubeconfig(&format!("{server}, certificate-authority-data: AAAA"), "token: t"),
            "certificate-authority and certificate-authority-data are both set",
        ),
        (
            kubeconfig(&server, "auth-provider: {name: gcp}"),
            "auth-provider (client-go's are gone: use exec) is not supported",
        ),
        (
            kubeconfig(&server, "username: admin, password: secret"),
            "username (basic authentication) is not supported",
        ),
        (
            kubeconfig(&server, "token: t, as: admin"),
            "as (impersonation) is not supported",
        ),
        (
            kubeconfig(&server, "client-certificate-data: Y2VydGlmaWNhdGU="),
            "client-certificate without client-key",
        ),
        (
            kubeconfig(
                &server,
                &format!("token: t, {}", plugin("apiVersion: client.authentication.k8s.io/v1")),
            ),
            "exec and a token are both set: one way to authenticate",
        ),
        (
            kubeconfig(&server, &plugin("apiVersion: client.authentication.k8s.io/v1alpha1")),
            "exec apiVersion \"client.authentication.k8s.io/v1alpha1\" is not one of \
             client.authentication.k8s.io/v1, client.authentication.k8s.io/v1beta1",
        ),
        (
            kubeconfig(
                &server,
                &plugin("apiVersion: client.authentication.k8s.io/v1, interactiveMode: Always"),
            ),
            "exec with interactiveMode Always needs a terminal, which the agent has not",
        ),
    ];
    for (i, (text, reason)) in cases.iter().enumerate() {
        let config = dir.path().join(format!("{i}.kubeconfig"));
        std::fs::write(&config, text).unwrap();
        let output = metadata_with(&config);
        assert!(!output.status.success(), "{text}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let expected = format!(
            "no metadata source knows this node: kubernetes: kubeconfig {}: {reason}",
            config.display()
        );
        assert!(stderr.contains(&expected), "{text}\nexpected {expected}\nin {stderr}");
    }
    // A plugin that fails: its exit status and the last line of its stderr.
    let failing = dir.path().join("failing.kubeconfig");
    std::fs::write(
        &failing,
        kubeconfig(
            &server,
            "exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, \
             args: [-c, 'echo starting >&2; echo \"no credentials for profile prod\" >&2; exit 3']}",
        ),
    )
    .unwrap();
    let stderr = String::from_utf8_lossy(&metadata_with(&failing).stderr).into_owned();
    assert!(
        stderr.contains(
            "no metadata source knows this node: kubernetes: credential plugin /bin/sh: exit status: 3: no credentials for profile prod"
        ),
        "{stderr}"
    );
    assert_eq!(api.requests(), "");
}
