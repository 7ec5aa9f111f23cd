//! The HTTP client of every AWS call the controller makes: EC2, the EBS
//! direct APIs, and STS and the other credential providers. It is the
//! client the AWS SDK's `default-https-client` feature would build, given
//! here instead so that the SDK's crates are built without that feature
//! and the longest compile of the build does not wait for the TLS stack
//! (the workspace's Cargo.toml).

use aws_smithy_http_client::proxy::ProxyConfig;
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
use aws_smithy_http_client::{Builder, ConnectorBuilder};
use aws_smithy_runtime_api::client::http::SharedHttpClient;

/// An HTTPS (and HTTP, for a local endpoint) client on rustls with aws-lc
/// (AWS-LC's FIPS module: the workspace builds rustls with `fips`),
/// taking the SDK's connect and read timeouts and its sleep, through the
/// proxy `HTTPS_PROXY`/`HTTP_PROXY` name unless `NO_PROXY` excludes the
/// host: what the SDK's default client does from behavior version
/// 2025-08-07 on (aws-smithy-runtime 1.16, `client::http::default_https_client`).
pub fn https_client() -> SharedHttpClient {
    Builder::new().build_with_connector_fn(|settings, components| {
        let mut connector = ConnectorBuilder::default().tls_provider(Provider::Rustls(CryptoMode::AwsLc));
        connector.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            connector.set_sleep_impl(components.sleep_impl());
        }
        connector.set_proxy_config(Some(ProxyConfig::from_env()));
        connector.build()
    })
}
