//! client-go's credential plugins: the program a kubeconfig's
//! `users[].user.exec` names, run for a credential (Kubernetes docs,
//! "client-go credential plugins"; `client.authentication.k8s.io`
//! `ExecCredential`, v1 and v1beta1 — v1alpha1 is gone from client-go).
//! EKS's kubeconfigs run `aws eks get-token` so.
//!
//! The plugin gets the agent's environment with the entry's `env` added,
//! `KUBERNETES_EXEC_INFO` (an `ExecCredential` whose `spec` says it is not
//! interactive, with the cluster when the entry asks), no stdin, and
//! [`EXEC_TIMEOUT`] to answer on stdout with an `ExecCredential` of the
//! same `apiVersion` whose `status` has a `token`, or a
//! `clientCertificateData` and `clientKeyData`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Deserialize;

use super::KubernetesError;
use super::rest_config::ClientIdentity;

/// How long a plugin may take to answer; then it is killed.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// The `ExecCredential` versions client-go runs plugins with.
const API_VERSIONS: [&str; 2] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];

/// A credential plugin, as a kubeconfig's `exec` entry gives it.
#[derive(Debug)]
pub struct ExecPlugin {
    command: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    api_version: String,
    /// `KUBERNETES_EXEC_INFO`.
    info: String,
}

/// What a plugin gave.
pub enum Credential {
    /// A bearer token.
    Token(String),
    /// A client certificate chain and its key.
    Certificate(ClientIdentity),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecCredential {
    api_version: String,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(default)]
    token: String,
    #[serde(default)]
    client_certificate_data: String,
    #[serde(default)]
    client_key_data: String,
}

impl ExecPlugin {
    /// The plugin `command` with `args` and `env`, asked for an
    /// `ExecCredential` of `api_version`, told `cluster` (`spec.cluster`)
    /// when given.
    ///
    /// # Errors
    /// The message when `api_version` is not one client-go runs.
    pub fn new(
        command: PathBuf,
        args: Vec<String>,
        env: Vec<(String, String)>,
        api_version: &str,
        cluster: Option<serde_json::Value>,
    ) -> Result<Self, String> {
        if !API_VERSIONS.contains(&api_version) {
            return Err(format!(
                "exec apiVersion {api_version:?} is not one of {}",
                API_VERSIONS.join(", ")
            ));
        }
        let mut spec = serde_json::json!({"interactive": false});
        if let Some(cluster) = cluster {
            spec["cluster"] = cluster;
        }
        let info = serde_json::json!({"apiVersion": api_version, "kind": "ExecCredential", "spec": spec});
        Ok(Self {
            command,
            args,
            env,
            api_version: api_version.to_owned(),
            info: info.to_string(),
        })
    }

    /// Runs the plugin for a credential.
    ///
    /// # Errors
    /// [`KubernetesError::Exec`]: the plugin cannot start, exits with a
    /// failure (its stderr's last line given), runs past
    /// [`EXEC_TIMEOUT`] (killed), or answers with no `ExecCredential` of
    /// its `apiVersion` and a credential.
    pub async fn run(&self) -> Result<Credential, KubernetesError> {
        let failed = |message: String| KubernetesError::Exec {
            command: self.command.clone(),
            message,
        };
        let child = Command::new(&self.command)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("KUBERNETES_EXEC_INFO", &self.info)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed(e.to_string()))?;
        let pid = rustix::process::Pid::from_raw(child.id().cast_signed());
        let waiting = tokio::task::spawn_blocking(move || child.wait_with_output());
        let output = match tokio::time::timeout(EXEC_TIMEOUT, waiting).await {
            Ok(Ok(output)) => output.map_err(|e| failed(e.to_string()))?,
            Ok(Err(e)) => return Err(failed(e.to_string())),
            Err(_) => {
                // Not reaped yet (the waiting thread reaps it): the pid is
                // still the plugin's.
                if let Some(pid) = pid {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
                return Err(failed(format!("no answer in {} s; killed", EXEC_TIMEOUT.as_secs())));
            }
        };
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
            return Err(failed(format!("{}: {}", output.status, last.trim())));
        }
        self.credential(&output.stdout).map_err(failed)
    }

    /// The credential in the plugin's answer.
    fn credential(&self, stdout: &[u8]) -> Result<Credential, String> {
        let answer: ExecCredential =
            serde_json::from_slice(stdout).map_err(|e| format!("the answer is not an ExecCredential: {e}"))?;
        if answer.api_version != self.api_version {
            return Err(format!(
                "it answered apiVersion {:?}, not {:?}",
                answer.api_version, self.api_version
            ));
        }
        let status = answer.status.ok_or("the answer has no status")?;
        if !status.token.is_empty() {
            return Ok(Credential::Token(status.token));
        }
        if status.client_certificate_data.is_empty() || status.client_key_data.is_empty() {
            return Err("the answer has neither a token nor a client certificate and key".into());
        }
        super::kubeconfig::identity(
            status.client_certificate_data.as_bytes(),
            status.client_key_data.as_bytes(),
        )
        .map(Credential::Certificate)
    }
}
