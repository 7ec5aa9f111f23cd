//! A kubeconfig file (`--kubeconfig`), read as the Go driver's
//! `clientcmd.BuildConfigFromFlags("", path)` reads it: that one file
//! (not `KUBECONFIG`'s list), its `current-context`, that context's
//! cluster and user (client-go `tools/clientcmd/api/v1`, the fields'
//! names; Kubernetes docs, "Organizing Cluster Access Using kubeconfig
//! Files").
//!
//! - cluster: `server` (`https://` only), `certificate-authority` or
//!   `certificate-authority-data` (without either, the system's roots, as
//!   client-go);
//! - user: `token` or `tokenFile` (read again at each request, as
//!   client-go's cached file token source), `client-certificate(-data)`
//!   with `client-key(-data)`, or an `exec` credential plugin
//!   ([`super::exec_plugin`]).
//!
//! A relative file path is the file's directory's, as client-go resolves
//! it, and so is the plugin's command when it names a directory. What
//! would weaken or bypass the API server's verification
//! (`insecure-skip-tls-verify`, `proxy-url`, `tls-server-name`) and what
//! client-go dropped or this client does not do (`auth-provider`, basic
//! auth, impersonation) is refused by name, never ignored.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use serde::de::IgnoredAny;

use super::KubernetesError;
use super::exec_plugin::{Credential, ExecPlugin};
use super::rest_config::{self, ClientIdentity, RestConfig, Token};

#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(rename = "current-context", default)]
    current_context: String,
    #[serde(default)]
    clusters: Vec<NamedCluster>,
    #[serde(default)]
    contexts: Vec<NamedContext>,
    #[serde(default)]
    users: Vec<NamedUser>,
}

#[derive(Deserialize)]
struct NamedCluster {
    name: String,
    cluster: Cluster,
}

#[derive(Deserialize)]
struct NamedContext {
    name: String,
    context: Context,
}

#[derive(Deserialize)]
struct NamedUser {
    name: String,
    user: User,
}

#[derive(Deserialize)]
struct Context {
    cluster: String,
    #[serde(default)]
    user: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Cluster {
    #[serde(default)]
    server: String,
    certificate_authority: Option<PathBuf>,
    certificate_authority_data: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
    proxy_url: Option<IgnoredAny>,
    tls_server_name: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct User {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
    client_certificate: Option<PathBuf>,
    client_certificate_data: Option<String>,
    client_key: Option<PathBuf>,
    client_key_data: Option<String>,
    exec: Option<ExecConfig>,
    auth_provider: Option<IgnoredAny>,
    username: Option<IgnoredAny>,
    #[serde(rename = "as")]
    impersonate: Option<IgnoredAny>,
}

/// `users[].user.exec` (client-go `ExecConfig`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecConfig {
    api_version: String,
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    #[serde(default)]
    interactive_mode: String,
    #[serde(default)]
    provide_cluster_info: bool,
}

#[derive(Deserialize)]
struct EnvVar {
    name: String,
    value: String,
}

/// The client's configuration from the kubeconfig at `path`; an `exec`
/// plugin is run once here (and again by the client after a 401).
///
/// # Errors
/// [`KubernetesError::Kubeconfig`] naming the file and what in it cannot
/// be used (a file unreadable or not a kubeconfig, no current context, a
/// context, cluster or user not defined, a field refused); what the
/// plugin's run gives ([`ExecPlugin::run`]).
pub(super) async fn load(path: &Path) -> Result<RestConfig, KubernetesError> {
    let invalid = |message: String| KubernetesError::Kubeconfig {
        path: path.to_owned(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
    let config: Kubeconfig = serde_saphyr::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let (cluster, user) = config.current().map_err(invalid)?;
    let server = server(cluster).map_err(invalid)?;
    let ca = pem_source(
        base,
        "certificate-authority",
        &cluster.certificate_authority,
        &cluster.certificate_authority_data,
    )
    .map_err(invalid)?;
    let roots = match &ca {
        Some(pem) => Some(rest_config::roots(pem).map_err(|e| invalid(format!("certificate-authority: {e}")))?),
        None => None,
    };
    refuse_unsupported(user).map_err(invalid)?;
    let mut identity = client_identity(base, user).map_err(invalid)?;
    let token = match (&user.exec, &user.token, &user.token_file) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err(invalid("exec and a token are both set: one way to authenticate".into()));
        }
        (Some(exec), None, None) => {
            let plugin = plugin(base, exec, &server, ca.as_deref()).map_err(invalid)?;
            match plugin.run().await? {
                Credential::Token(token) => Token::Exec(plugin, std::sync::Mutex::new(token)),
                Credential::Certificate(given) => {
                    identity = Some(given);
                    Token::None
                }
            }
        }
        // client-go: a token file takes precedence over a token.
        (None, _, Some(file)) => Token::File(base.join(file)),
        (None, Some(token), None) => Token::Fixed(token.clone()),
        (None, None, None) => Token::None,
    };
    Ok(RestConfig {
        server,
        roots,
        identity,
        token,
    })
}

impl Kubeconfig {
    /// The current context's cluster and user (a user the context does
    /// not name, or names without an entry, has no credentials, as in
    /// client-go).
    fn current(&self) -> Result<(&Cluster, &User), String> {
        static NO_USER: User = User {
            token: None,
            token_file: None,
            client_certificate: None,
            client_certificate_data: None,
            client_key: None,
            client_key_data: None,
            exec: None,
            auth_provider: None,
            username: None,
            impersonate: None,
        };
        let name = &self.current_context;
        if name.is_empty() {
            return Err("current-context is not set".into());
        }
        let context = &self
            .contexts
            .iter()
            .find(|c| &c.name == name)
            .ok_or_else(|| format!("context {name:?} is not defined"))?
            .context;
        let cluster = &self
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .ok_or_else(|| format!("cluster {:?} was not found for context {name:?}", context.cluster))?
            .cluster;
        let user = match self.users.iter().find(|u| u.name == context.user) {
            Some(user) => &user.user,
            None if context.user.is_empty() => &NO_USER,
            None => return Err(format!("user {:?} was not found for context {name:?}", context.user)),
        };
        Ok((cluster, user))
    }
}

/// The cluster's `server`, an `https://` URL without a trailing `/`.
fn server(cluster: &Cluster) -> Result<String, String> {
    if cluster.insecure_skip_tls_verify {
        return Err("insecure-skip-tls-verify is not supported: the API server is always verified".into());
    }
    if cluster.proxy_url.is_some() {
        return Err("proxy-url is not supported".into());
    }
    if cluster.tls_server_name.is_some() {
        return Err("tls-server-name is not supported: the server's name is the one in its URL".into());
    }
    match cluster.server.strip_prefix("https://") {
        Some(rest) if !rest.is_empty() => Ok(cluster.server.trim_end_matches('/').to_owned()),
        _ => Err(format!("the server {:?} is not an https:// URL", cluster.server)),
    }
}

/// What client-go dropped or this client does not do, refused by name.
fn refuse_unsupported(user: &User) -> Result<(), String> {
    for (given, field) in [
        (
            user.auth_provider.is_some(),
            "auth-provider (client-go's are gone: use exec)",
        ),
        (user.username.is_some(), "username (basic authentication)"),
        (user.impersonate.is_some(), "as (impersonation)"),
    ] {
        if given {
            return Err(format!("{field} is not supported"));
        }
    }
    Ok(())
}

/// The user's client certificate chain and key, when it has both.
fn client_identity(base: &Path, user: &User) -> Result<Option<ClientIdentity>, String> {
    let chain = pem_source(
        base,
        "client-certificate",
        &user.client_certificate,
        &user.client_certificate_data,
    )?;
    let key = pem_source(base, "client-key", &user.client_key, &user.client_key_data)?;
    match (chain, key) {
        (Some(chain), Some(key)) => identity(&chain, &key).map(Some),
        (None, None) => Ok(None),
        (Some(_), None) => Err("client-certificate without client-key".into()),
        (None, Some(_)) => Err("client-key without client-certificate".into()),
    }
}

/// A certificate chain and its private key from their PEM texts.
pub(super) fn identity(chain: &[u8], key: &[u8]) -> Result<ClientIdentity, String> {
    let chain = CertificateDer::pem_slice_iter(chain)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("client certificate: {e}"))?;
    if chain.is_empty() {
        return Err("client certificate: no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("client key: {e}"))?;
    Ok(ClientIdentity { chain, key })
}

/// The PEM bytes of `field`: its `-data` form (base64), or the file it
/// names (relative to `base`); both set is refused, as client-go's
/// validation does.
fn pem_source(
    base: &Path,
    field: &str,
    file: &Option<PathBuf>,
    data: &Option<String>,
) -> Result<Option<Vec<u8>>, String> {
    match (file, data) {
        (Some(_), Some(_)) => Err(format!("{field} and {field}-data are both set")),
        (Some(file), None) => {
            let path = base.join(file);
            std::fs::read(&path)
                .map(Some)
                .map_err(|e| format!("{field} {}: {e}", path.display()))
        }
        (None, Some(data)) => STANDARD
            .decode(data.trim())
            .map(Some)
            .map_err(|e| format!("{field}-data: {e}")),
        (None, None) => Ok(None),
    }
}

/// The `exec` entry as a plugin to run: its command relative to `base`
/// when it names a directory (client-go), told the cluster when the entry
/// asks (`provideClusterInfo`).
fn plugin(base: &Path, exec: &ExecConfig, server: &str, ca: Option<&[u8]>) -> Result<ExecPlugin, String> {
    if exec.interactive_mode == "Always" {
        return Err("exec with interactiveMode Always needs a terminal, which the agent has not".into());
    }
    let command = if exec.command.contains('/') {
        base.join(&exec.command)
    } else {
        PathBuf::from(&exec.command)
    };
    let cluster = exec.provide_cluster_info.then(|| {
        let mut cluster = serde_json::json!({"server": server});
        if let Some(ca) = ca {
            cluster["certificate-authority-data"] = STANDARD.encode(ca).into();
        }
        cluster
    });
    ExecPlugin::new(
        command,
        exec.args.clone(),
        exec.env.iter().map(|v| (v.name.clone(), v.value.clone())).collect(),
        &exec.api_version,
        cluster,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests: a failed step fails the test")]
mod tests {
    use super::*;

    /// Block style, a trailing `/` on the server, no CA (the system's
    /// roots), and both token forms: the file, relative to the kubeconfig,
    /// wins (client-go's precedence); a context without a user has no
    /// credentials.
    #[tokio::test]
    async fn a_token_file_relative_to_the_kubeconfig_wins_over_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        let text = "clusters:\n- name: c\n  cluster:\n    server: https://api.example:6443/\n\
                    contexts:\n- name: x\n  context: {cluster: c, user: u}\n- name: anonymous\n  context: {cluster: c}\n\
                    users:\n- name: u\n  user:\n    token: fixed\n    tokenFile: secrets/token\n\
                    current-context: x\n";
        std::fs::write(&path, text).unwrap();
        let config = load(&path).await.unwrap();
        assert_eq!(config.server, "https://api.example:6443");
        assert!(config.roots.is_none() && config.identity.is_none());
        assert!(matches!(&config.token, Token::File(file) if *file == dir.path().join("secrets/token")));

        std::fs::write(&path, text.replace("current-context: x", "current-context: anonymous")).unwrap();
        assert!(matches!(load(&path).await.unwrap().token, Token::None));
    }
}
