//! What both gRPC binaries share beyond listening (`listener`): the
//! Identity answers, the shutdown signal, logging.

use crate::DRIVER_NAME;
use crate::telemetry::{self, SpanExport};
use crate::v1::plugin_capability::{self, service};
use crate::v1::{GetPluginCapabilitiesResponse, GetPluginInfoResponse, PluginCapability};

/// Completes on SIGTERM or SIGINT (never, if the handlers cannot be set).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down");
}

/// GetPluginInfo's answer: the driver name and `version`.
pub fn plugin_info(version: &str) -> GetPluginInfoResponse {
    GetPluginInfoResponse {
        name: DRIVER_NAME.to_owned(),
        vendor_version: version.to_owned(),
        manifest: Default::default(),
    }
}

/// GetPluginCapabilities' answer: the given plugin services.
pub fn plugin_capabilities(services: &[service::Type]) -> GetPluginCapabilitiesResponse {
    GetPluginCapabilitiesResponse {
        capabilities: services
            .iter()
            .map(|kind| PluginCapability {
                r#type: Some(plugin_capability::Type::Service(plugin_capability::Service {
                    r#type: *kind as i32,
                })),
            })
            .collect(),
    }
}

/// How log lines are written (`--logging-format`, as the Go driver's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoggingFormat {
    /// One line of text per event, fields as `key=value`.
    #[default]
    Text,
    /// One JSON object per line, fields under `fields`.
    Json,
}

impl LoggingFormat {
    /// Parses `text` or `json` (a clap value parser).
    ///
    /// # Errors
    /// A message naming the accepted values.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("{other:?} is not a logging format: text or json")),
        }
    }
}

/// The log level of a klog verbosity (`-v`/`--v`, which the Go driver's
/// manifests pass): up to 3 `info`, 4 and 5 `debug`, above `trace` (klog's
/// convention: 4 is debug, 5 and more trace-level detail).
pub fn level_of(verbosity: u8) -> &'static str {
    match verbosity {
        0..=3 => "info",
        4..=5 => "debug",
        _ => "trace",
    }
}

/// This project's crates: the ones `-v` sets the level of.
const OWN_CRATES: [&str; 6] = [
    "ebs_csi_agent",
    "ebs_csi_controller",
    "ebs_csi_helper",
    "ebs_csi_helper_proto",
    "ebs_csi_linux",
    "ebs_csi_proto",
];

/// The filter directives of `verbosity`: this project's crates at its
/// level ([`level_of`]), every other crate at warn (at `-v 4` the HTTP/2
/// stack's frame logging would be most of the output), then `extra`
/// (e.g. `aws_smithy_runtime=debug`).
fn directives(verbosity: u8, extra: &[&str]) -> String {
    let level = level_of(verbosity);
    std::iter::once("warn".to_owned())
        .chain(OWN_CRATES.iter().map(|krate| format!("{krate}={level}")))
        .chain(extra.iter().map(|e| (*e).to_owned()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Logs to stderr at the level of `verbosity` ([`directives`]), or as
/// `RUST_LOG` says, in `format`; text has terminal colours only when stderr
/// is a terminal (journald and log files get plain text). With `spans`,
/// the spans of [`telemetry::SPANS`] go to that export too (never to the
/// log).
pub fn init_logging(format: LoggingFormat, verbosity: u8, extra: &[&str], spans: Option<&SpanExport>) {
    use std::io::IsTerminal;
    use tracing_subscriber::filter::{FilterExt, filter_fn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    let directives = directives(verbosity, extra);
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| directives.into())
        .and(filter_fn(|metadata| metadata.target() != telemetry::SPANS));
    let log = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let log = match format {
        LoggingFormat::Text => log
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter)
            .boxed(),
        LoggingFormat::Json => log.json().with_filter(filter).boxed(),
    };
    tracing_subscriber::registry()
        .with(spans.map(SpanExport::layer))
        .with(log)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_klog_verbosity_to_levels() {
        let levels: Vec<&str> = [0, 2, 3, 4, 5, 6, 10].into_iter().map(level_of).collect();
        assert_eq!(levels, ["info", "info", "info", "debug", "debug", "trace", "trace"]);
    }

    #[test]
    fn other_crates_stay_at_warn() {
        assert_eq!(
            directives(4, &["aws_smithy_runtime=debug"]),
            "warn,ebs_csi_agent=debug,ebs_csi_controller=debug,ebs_csi_helper=debug,ebs_csi_helper_proto=debug,\
             ebs_csi_linux=debug,ebs_csi_proto=debug,aws_smithy_runtime=debug"
        );
    }

    #[test]
    fn parses_logging_formats() {
        assert_eq!(LoggingFormat::parse("text"), Ok(LoggingFormat::Text));
        assert_eq!(LoggingFormat::parse("json"), Ok(LoggingFormat::Json));
        assert!(LoggingFormat::parse("JSON").is_err());
    }
}
