//! `ebs-csi-controller`: the CSI Controller service of ebs-csi, the only
//! component that holds AWS credentials and calls EC2.

mod devices;
mod ec2;
mod error;
mod https;
mod labeler;
mod metrics;
mod parameters;
mod service;
mod snapshot_metadata;
mod tags;
mod template;
mod volume_type;

use ebs_csi_proto::endpoint::LoggingFormat;
use ebs_csi_proto::go_flags::{self, GoDriverFlags};
use ebs_csi_proto::metrics_http::{self, MetricsFlags};
use ebs_csi_proto::telemetry::{self, SpanExport, TracingFlags};
use ebs_csi_proto::version::{VersionFlag, VersionInfo};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use ebs_csi_kube::{ApiClient, ApiSource};
use ebs_csi_proto::fips;
use ebs_csi_proto::listener::{self, Endpoint, Listener};
use ebs_csi_proto::modify::modify_server::ModifyServer;
use ebs_csi_proto::v1::controller_server::ControllerServer;
use ebs_csi_proto::v1::group_controller_server::GroupControllerServer;
use ebs_csi_proto::v1::identity_server::IdentityServer;
use ebs_csi_proto::v1::snapshot_metadata_server::SnapshotMetadataServer;

use crate::ec2::Ec2;
use crate::ec2::batch::BatchConfig;
use crate::ec2::limits::Limits;
use crate::ec2::pacing::{Paced, RequestBuckets};
use crate::ec2::sdk::SdkEc2;
use crate::labeler::lease::Lease;
use crate::metrics::ApiMetrics;
use crate::service::identity::{CONTROLLER_SERVICES, SNAPSHOT_METADATA_SERVICES};
use crate::service::{ControllerService, IdentityService, Settings};
use crate::snapshot_metadata::SnapshotMetadataService;
use crate::snapshot_metadata::blocks::SdkBlocks;
use crate::tags::InvalidTags;

/// The Go driver's mode for its metadata labeler, the first argument of
/// its chart's `metadata-labeler` container.
const LABELER_MODE: &str = "metadata-labeler";

/// The in-cluster configuration's service account directory (client-go's).
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The CSI Controller service for Amazon EBS (flag names follow the Go
/// driver's where they exist), or with `metadata-labeler` first its
/// metadata labeler.
#[derive(Debug, Parser)]
#[command(disable_version_flag = true)]
struct Args {
    /// CSI endpoint to serve: `unix:///path`, or `tcp://host:port` as the
    /// Go driver takes it (named in a warning: CSI has no authentication).
    #[arg(
        long,
        default_value = "unix:///var/lib/csi/sockets/pluginproxy/csi.sock",
        env = "CSI_ENDPOINT"
    )]
    endpoint: String,
    /// Where to serve the SnapshotMetadata service (changed-block
    /// tracking) with an Identity service of its own, for the
    /// external-snapshot-metadata sidecar: `unix:///…`. Unset: not served.
    #[arg(long, env = "SNAPSHOT_METADATA_ENDPOINT")]
    snapshot_metadata_endpoint: Option<String>,
    /// AWS region (default: AWS_REGION, the profile, or IMDS).
    #[arg(long)]
    region: Option<String>,
    /// Tags added to every volume and snapshot: key=value,key2=value2.
    #[arg(long, default_value = "")]
    extra_tags: String,
    /// The Go driver's deprecated `--extra-volume-tags`, which its
    /// controller parses and tags nothing with (`pkg/driver/options.go`,
    /// v1.64): accepted and ignored with a warning (--extra-tags tags).
    #[arg(long)]
    extra_volume_tags: Option<String>,
    /// Leave an invalid tag out with a warning naming it, where the request
    /// (or the start, for --extra-tags) would be refused: a tagSpecification
    /// whose template fails or whose key is reserved, such an --extra-tags
    /// key (the Go driver's flag; Go's spellings).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set)]
    warn_on_invalid_tag: bool,
    /// Cluster id: tags resources kubernetes.io/cluster/<id>=owned.
    #[arg(long)]
    k8s_tag_cluster_id: Option<String>,
    /// Merge concurrent Describe calls into one call per 500 ms window
    /// (`--batching=false` to not; Go's spellings, as every boolean here).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set)]
    batching: bool,
    /// EC2 request limits raised for this account above EC2's defaults, as
    /// Action=CAPACITY/REFILL pairs (tokens, tokens per second), e.g.
    /// AttachVolume=100/10,DetachVolume=100/10. Calls wait for a token of
    /// their action's bucket instead of being throttled.
    #[arg(long, default_value = "", value_parser = Limits::parse)]
    ec2_request_limits: Limits,
    /// How long modification requests for one volume are collected into one
    /// ModifyVolume, e.g. 2s or 500ms.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    modify_volume_request_handler_timeout: Duration,
    /// Appended to the driver's name and version in every EC2 call's
    /// User-Agent (`exec-env/aws-ebs-csi-driver-<version>-<extra>`).
    #[arg(long)]
    user_agent_extra: Option<String>,
    /// Log format: `text` (plain lines) or `json` (one object per line).
    #[arg(long, default_value = "text", value_parser = LoggingFormat::parse)]
    logging_format: LoggingFormat,
    /// Log verbosity as klog's `-v`, which the Go driver's manifests pass:
    /// up to 3 info, 4–5 debug, more trace (`RUST_LOG` overrides it).
    #[arg(short = 'v', long = "v", default_value_t = 2)]
    v: u8,
    /// Log the AWS SDK's requests and retries at debug level too
    /// (`--aws-sdk-debug-log` or `=true`, as the Go driver's chart passes it).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set)]
    aws_sdk_debug_log: bool,
    #[command(flatten)]
    metrics: MetricsFlags,
    #[command(flatten)]
    tracing: TracingFlags,
    /// FIPS 140-3 mode (the Go driver's FIPS mode, its chart's `fips`):
    /// the start fails unless AWS-LC's FIPS module, which makes every TLS
    /// connection here (EC2, EBS, the credential providers, the metrics
    /// endpoint, the OTLP exporter) with its approved algorithms only, is in
    /// FIPS mode; `--version` and the log say it is.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set)]
    fips: bool,
    /// Serve every EC2 call's series also under the Kubernetes in-tree
    /// cloud provider's names, `cloudprovider_aws_api_*` (the Go driver's
    /// deprecated flag; `--deprecated-metrics` or `=true`).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set)]
    deprecated_metrics: bool,
    /// The Go driver's instance metadata sources, which its controller
    /// reads the region from: accepted and ignored with a warning (the
    /// region is --region's, else the SDK's: AWS_REGION, the profile, IMDS).
    #[arg(long)]
    metadata_sources: Option<String>,
    /// A kubeconfig file for the metadata labeler's Kubernetes client
    /// (`metadata-labeler` mode; else the in-cluster configuration), as the
    /// Go driver's flag. The CSI service has no Kubernetes client: there it
    /// is accepted and ignored with a warning.
    #[arg(long)]
    kubeconfig: Option<String>,
    /// klog's and other flags of the Go driver's manifests, ignored.
    #[command(flatten)]
    go_driver: GoDriverFlags,
    /// `--version`, answered as the Go driver answers it.
    #[command(flatten)]
    version: VersionFlag,
}

/// Parses `2s`, `500ms` or a number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("{text:?} is not a duration such as 2s or 500ms");
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse().map(Duration::from_millis).map_err(|_| invalid());
    }
    text.strip_suffix('s')
        .unwrap_or(text)
        .parse::<f64>()
        .ok()
        .filter(|s| *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(invalid)
}

fn main() -> anyhow::Result<()> {
    let labeler = std::env::args_os().nth(1).is_some_and(|mode| mode == LABELER_MODE);
    let mode = if labeler { LABELER_MODE } else { "controller" };
    let args = Args::parse_from(go_flags::as_the_go_driver_reads(std::env::args_os(), mode));
    if args.fips {
        fips::enable().context("--fips")?;
    }
    args.version.answer_if_asked();
    name_the_driver_in_the_user_agent(args.user_agent_extra.as_deref());
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run(args, labeler))
}

/// Names the driver in every EC2 call's User-Agent as the Go driver does:
/// `AWS_EXECUTION_ENV=aws-ebs-csi-driver-<version>[-<extra>]`, which the
/// SDK sends as `exec-env/<value>` (the Go driver's `pkg/cloud/cloud.go`,
/// `newEC2Cloud`, sets the same variable; aws-runtime's user-agent
/// interceptor reads it at each call). Any `--user-agent-extra` the Go
/// driver takes is taken: a character a header cannot carry (a control
/// character, or beyond ASCII) becomes `_`. Call it before any thread
/// starts.
fn name_the_driver_in_the_user_agent(extra: Option<&str>) {
    let version = VersionInfo::of_this_build().driver_version;
    let value = match extra {
        Some(extra) => format!("aws-ebs-csi-driver-{version}-{extra}"),
        None => format!("aws-ebs-csi-driver-{version}"),
    };
    let value: String = value
        .chars()
        .map(|c| if c == ' ' || c.is_ascii_graphic() { c } else { '_' })
        .collect();
    #[allow(
        unsafe_code,
        reason = "the SDK reads the user agent's execution environment from the process's"
    )]
    // SAFETY: called from `main` before the runtime or any other thread
    // starts, so nothing reads or writes the environment meanwhile.
    unsafe {
        std::env::set_var("AWS_EXECUTION_ENV", value);
    }
}

async fn run(args: Args, labeler: bool) -> anyhow::Result<()> {
    let sdk_debug: &[&str] = if args.aws_sdk_debug_log {
        &["aws_smithy_runtime=debug", "aws_sdk_ec2=debug", "aws_config=debug"]
    } else {
        &[]
    };
    let spans = SpanExport::start(&args.tracing).context("--enable-otel-tracing")?;
    ebs_csi_proto::endpoint::init_logging(args.logging_format, args.v, sdk_debug, spans.as_ref());
    fips::log_mode();
    let served = if labeler {
        label_nodes(args).await
    } else {
        serve(args).await
    };
    if let Some(spans) = spans {
        spans.flush_at_exit().await;
    }
    served
}

/// Serves the controller's endpoints until SIGTERM or SIGINT.
async fn serve(args: Args) -> anyhow::Result<()> {
    args.go_driver.warn();
    if let Some(sources) = &args.metadata_sources {
        go_flags::warn_ignored(
            &format!("--metadata-sources={sources}"),
            "the region is --region's, else AWS_REGION's, the profile's or IMDS's",
        );
    }
    if let Some(tags) = &args.extra_volume_tags {
        go_flags::warn_ignored(
            &format!("--extra-volume-tags={tags}"),
            "deprecated, and the Go driver tags nothing with it either: --extra-tags tags volumes and snapshots",
        );
    }
    if let Some(kubeconfig) = &args.kubeconfig {
        go_flags::warn_ignored(
            &format!("--kubeconfig={kubeconfig}"),
            "the CSI service has no Kubernetes client: it calls EC2 only, and the sidecars read the cluster \
             (the metadata-labeler mode uses it)",
        );
    }
    let endpoint = Endpoint::parse(&args.endpoint)?;
    let config = aws_config(args.region.clone()).await;
    let metrics = ApiMetrics::new(args.deprecated_metrics).context("metrics")?;
    let served = metrics.clone();
    metrics_http::start(&args.metrics, move || {
        let metrics = served.clone();
        async move { metrics.render() }
    })
    .await
    .context("--http-endpoint")?;
    let ec2 = ec2_client(&config, metrics.clone(), args.ec2_request_limits.clone());
    let invalid_tags = match args.warn_on_invalid_tag {
        true => InvalidTags::Skip,
        false => InvalidTags::Refuse,
    };
    let settings = Settings {
        cluster_id: args.k8s_tag_cluster_id,
        extra_tags: tags::parse_extra(&args.extra_tags, invalid_tags)
            .map_err(anyhow::Error::msg)
            .context("--extra-tags")?,
        invalid_tags,
        batch: BatchConfig {
            enabled: args.batching,
            ..BatchConfig::default()
        },
        modify_window: args.modify_volume_request_handler_timeout,
        detach_pending: metrics.detach_pending(),
        ..Settings::default()
    };
    // Bound before the CSI socket, whose appearance says the controller is
    // ready.
    let metadata = match &args.snapshot_metadata_endpoint {
        Some(address) => Some(serve_snapshot_metadata(address, &ec2, &config, metrics)?),
        None => None,
    };
    // The socket passed in (the Nomad job's systemd-socket-activate), or
    // `endpoint` bound here.
    let listening = listener::listen(&endpoint)
        .await
        .with_context(|| format!("listening on {}", args.endpoint))?;
    let on = if listening.passed {
        "the socket passed in"
    } else {
        args.endpoint.as_str()
    };
    tracing::info!(endpoint = %on, region = ?config.region(), "serving CSI Identity, Controller and GroupController, and volume-modifier-for-k8s's Modify");
    let controller = Arc::new(ControllerService::new(Arc::clone(&ec2), settings));
    let router = tonic::transport::Server::builder()
        .trace_fn(telemetry::rpc_span)
        .add_service(IdentityServer::new(IdentityService::new(ec2, CONTROLLER_SERVICES)))
        .add_service(ControllerServer::from_arc(Arc::clone(&controller)))
        .add_service(GroupControllerServer::from_arc(Arc::clone(&controller)))
        .add_service(ModifyServer::from_arc(controller));
    listener::serve(router, listening.listener).await?;
    if let Some(metadata) = metadata {
        metadata.await??;
    }
    Ok(())
}

/// The AWS SDK's configuration: `region`, else the SDK's (AWS_REGION, the
/// profile, IMDS), and this process's HTTPS client.
async fn aws_config(region: Option<String>) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(https::https_client());
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region));
    }
    loader.load().await
}

/// The EC2 client: the SDK's, its calls counted in `metrics` and paced by
/// `limits`.
fn ec2_client(
    config: &aws_config::SdkConfig,
    metrics: ApiMetrics,
    limits: Limits,
) -> Arc<Paced<SdkEc2, RequestBuckets>> {
    Arc::new(Paced::new(SdkEc2::new(config, metrics), RequestBuckets::new(limits)))
}

/// The `metadata-labeler` mode (the Go driver's, run by its chart's
/// `sidecars.metadataLabeler` container): labels the cluster's Nodes
/// ([`labeler`]) while this replica holds the Lease
/// `metadata-labeler-ebs.csi.aws.com` in its namespace (`POD_NAMESPACE`,
/// else its service account's, else `default`, as csi-lib-utils'), as the
/// candidate named by its host name (the pod's name).
///
/// # Errors
/// The Kubernetes client's configuration unusable, or the lease lost
/// (the container starts again, as the Go driver's).
async fn label_nodes(args: Args) -> anyhow::Result<()> {
    args.go_driver.warn();
    let config = aws_config(args.region.clone()).await;
    let metrics = ApiMetrics::new(args.deprecated_metrics).context("metrics")?;
    let ec2 = ec2_client(&config, metrics, args.ec2_request_limits.clone());
    let source = match &args.kubeconfig {
        Some(path) => ApiSource::Kubeconfig(path.into()),
        None => ApiSource::InCluster(SERVICE_ACCOUNT_DIR.into()),
    };
    let api = ApiClient::connect(&source)
        .await
        .context("the Kubernetes API's client")?;
    let namespace = std::env::var("POD_NAMESPACE")
        .or_else(|_| std::fs::read_to_string(format!("{SERVICE_ACCOUNT_DIR}/namespace")))
        .map_or_else(|_| "default".to_owned(), |namespace| namespace.trim().to_owned());
    let identity = std::fs::read_to_string("/proc/sys/kernel/hostname").context("the host name")?;
    let lease_name = format!("{LABELER_MODE}-{}", ebs_csi_proto::DRIVER_NAME);
    let lease = Lease::new(&api, &namespace, &lease_name, identity.trim());
    tracing::info!(namespace, lease = lease_name, identity = identity.trim(), region = ?config.region(), "metadata labeler: waiting for the lease");
    Err(labeler::run(&api, ec2, &lease).await.into())
}

/// Binds `address` and serves Identity (advertising only
/// SNAPSHOT_METADATA_SERVICE) and SnapshotMetadata on it, until SIGTERM or
/// SIGINT.
///
/// # Errors
/// An invalid address, or the error binding it.
fn serve_snapshot_metadata<E: Ec2>(
    address: &str,
    ec2: &Arc<E>,
    config: &aws_config::SdkConfig,
    metrics: ApiMetrics,
) -> anyhow::Result<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>> {
    let socket = listener::socket_path(address)?;
    let bound = listener::bind(&socket).with_context(|| format!("listening on {}", socket.display()))?;
    tracing::info!(socket = %socket.display(), "serving CSI Identity and SnapshotMetadata");
    let service = SnapshotMetadataService::new(Arc::clone(ec2), Arc::new(SdkBlocks::new(config, metrics)));
    let router = tonic::transport::Server::builder()
        .trace_fn(telemetry::rpc_span)
        .add_service(IdentityServer::new(IdentityService::new(
            Arc::clone(ec2),
            SNAPSHOT_METADATA_SERVICES,
        )))
        .add_service(SnapshotMetadataServer::new(service));
    Ok(tokio::spawn(listener::serve(router, Listener::Unix(bound))))
}
