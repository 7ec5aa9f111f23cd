//! `tests/kube-api/serve.py`: the part of the Kubernetes API the agent
//! uses, answering as kube-apiserver does, on 127.0.0.1 over TLS.
#![allow(clippy::unwrap_used, reason = "test support: a failed step fails the test")]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use crate::{binary, repository, venv_program};

/// The node `tests/kube-api/node.json` describes.
pub const NODE_NAME: &str = "ip-10-0-1-23.eu-west-1.compute.internal";

/// Runs `ebs-csi-agent ARGS --metadata-sources kubernetes --kubeconfig
/// CONFIG metadata` for serve.py's node, with no in-cluster variable set.
pub fn agent_metadata(args: &[&str], config: &Path) -> Output {
    Command::new(binary("ebs-csi-agent"))
        .args(args)
        .args(["--metadata-sources", "kubernetes", "--kubeconfig"])
        .arg(config)
        .arg("metadata")
        .env("CSI_NODE_NAME", NODE_NAME)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .unwrap()
}

/// `tests/kube-api/serve.py` on 127.0.0.1: its CA bundle and token in
/// `dir`, killed on drop.
pub struct KubeApi {
    child: Child,
    /// The port it listens on.
    pub port: u16,
    dir: tempfile::TempDir,
}

impl KubeApi {
    /// With serve.py's defaults.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// With serve.py's options (`--taints`, `--unschedulable`, `--labels`,
    /// `--conflicts`, `--volume-attachments`).
    pub fn start_with(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(venv_program("python"))
            .arg(repository().join("tests/kube-api/serve.py"))
            .arg(dir.path())
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().unwrap();
        Self { child, port, dir }
    }

    /// The service account directory: `token` and `ca.crt`.
    pub fn service_account_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its log: one line per request.
    pub fn requests(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("requests.log")).unwrap_or_default()
    }

    /// The Node as the API server has it now.
    pub fn node(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.dir.path().join("node.json")).unwrap()).unwrap()
    }

    /// Makes `attachments` the VolumeAttachments the API server lists:
    /// written beside the file it reads and renamed over it, so that a
    /// list it answers meanwhile is the old one or the new, never a file
    /// cut short.
    pub fn set_volume_attachments(&self, attachments: &serde_json::Value) {
        let partial = self.dir.path().join(".volumeattachments.json.partial");
        std::fs::write(&partial, attachments.to_string()).unwrap();
        std::fs::rename(partial, self.dir.path().join("volumeattachments.json")).unwrap();
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
