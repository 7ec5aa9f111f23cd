//! `ebs-csi-agent`: the unprivileged CSI Node service of ebs-csi.

mod devices;
mod discovery;
mod error;
mod helper;
mod identity;
mod limits;
mod metadata;
mod metrics;
mod mount_prefix;
mod node;
mod plugin_dir;
mod pre_stop;
mod request;
mod server;
mod statistics;
mod stats;
mod taint;

use ebs_csi_proto::endpoint::LoggingFormat;
use ebs_csi_proto::fips;
use ebs_csi_proto::go_flags::{self, GoDriverFlags};
use ebs_csi_proto::listener::Endpoint;
use ebs_csi_proto::metrics_http::{self, MetricsFlags};
use ebs_csi_proto::telemetry::{SpanExport, TracingFlags};
use ebs_csi_proto::version::VersionFlag;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::discovery::DeviceFinder;
use crate::helper::Helper;
use crate::identity::IdentityService;
use crate::limits::{LimitSettings, XenInstance};
use crate::metadata::kubernetes::{ApiSource, NodeApi};
use crate::metadata::{Found, NodeMetadata, Settings, Source};
use crate::metrics::NodeMetrics;
use crate::mount_prefix::MountPointPrefix;
use crate::node::NodeService;

/// The CSI Node service for Amazon EBS. Runs without privilege: every
/// mount, format and resize is done by ebs-csi-helper.
#[derive(Debug, Parser)]
#[command(disable_version_flag = true)]
struct Args {
    /// CSI endpoint to serve: `unix:///path`, or `tcp://host:port` as the
    /// Go driver takes it (named in a warning: CSI has no authentication).
    #[arg(long, default_value = "unix:///csi/csi.sock", env = "CSI_ENDPOINT")]
    endpoint: String,
    /// The helper's socket.
    #[arg(long, default_value = "/run/ebs-csi/helper.sock")]
    helper_socket: PathBuf,
    /// Seconds to wait for the helper to answer one request.
    #[arg(long, default_value_t = 300)]
    helper_timeout_seconds: u64,
    /// EC2 instance id reported as the node id (default: from the
    /// metadata sources).
    #[arg(long)]
    node_id: Option<String>,
    /// Availability zone reported as topology (default: from the metadata
    /// sources).
    #[arg(long)]
    availability_zone: Option<String>,
    /// Availability zone id reported as `topology.k8s.aws/zone-id`, e.g.
    /// `use1-az1` (default: from the metadata sources, where they have it).
    #[arg(long)]
    availability_zone_id: Option<String>,
    /// Instance type, for the attachment limit (default: from the metadata
    /// sources).
    #[arg(long)]
    instance_type: Option<String>,
    /// Where to read what the three flags above do not give, tried in
    /// order: `imds` (instance metadata service), `kubernetes` (this node's
    /// Node object; needs CSI_NODE_NAME and a token allowed to get Nodes),
    /// `dmi` (SMBIOS in sysfs: id and type, no zone); the Go driver's
    /// `metadata-labeler` is the Node object with the interface and volume
    /// counts `ebs-csi-controller metadata-labeler` puts in its labels.
    #[arg(long, value_delimiter = ',', default_value = "imds,kubernetes,dmi", value_parser = Source::parse)]
    metadata_sources: Vec<Source>,
    /// The Kubernetes service account directory (`token`, `ca.crt`) of
    /// the in-cluster configuration: the client of the `kubernetes`
    /// metadata source, the startup taint's removal and `pre-stop`.
    #[arg(long, default_value = "/var/run/secrets/kubernetes.io/serviceaccount")]
    service_account_dir: PathBuf,
    /// A kubeconfig file for that client instead, as the Go driver's flag
    /// (outside a cluster): its current context's server and credentials
    /// (token, token file, client certificate, or an exec plugin such as
    /// `aws eks get-token`).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Maximum volumes per node to report, overriding the instance type's
    /// (-1, the Go driver's default: the instance type's).
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..=i64::from(u32::MAX)))]
    volume_attach_limit: Option<i64>,
    /// Attachments taken by volumes the instance boots with, root included
    /// (default, or -1 as the Go driver's: the root and IMDS's
    /// block-device-mapping EBS volumes).
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..=i64::from(u32::MAX)))]
    reserved_volume_attachments: Option<i64>,
    /// Seconds NodeStageVolume and block NodePublishVolume wait for the
    /// volume's device to appear.
    #[arg(long, default_value_t = 60)]
    device_wait_seconds: u64,
    /// Find devices by polling every 500 ms only, without watching the
    /// device tree with inotify (for device trees that do not support it).
    #[arg(long)]
    device_poll_only: bool,
    /// The device tree.
    #[arg(long, default_value = "/dev")]
    dev_dir: PathBuf,
    /// The sysfs mount.
    #[arg(long, default_value = "/sys")]
    sys_dir: PathBuf,
    /// Prometheus metrics: EBS performance statistics of the node's volumes.
    #[command(flatten)]
    metrics: MetricsFlags,
    #[command(flatten)]
    tracing: TracingFlags,
    /// FIPS 140-3 mode (the Go driver's FIPS mode, its chart's `fips`):
    /// the start fails unless AWS-LC's FIPS module, which makes every TLS
    /// connection here (the Kubernetes API, the metrics endpoint, the OTLP
    /// exporter; instance metadata is plain HTTP on the instance) with its
    /// approved algorithms only, is in FIPS mode; `--version` and the log
    /// say it is.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set)]
    fips: bool,
    /// Report the statistics only of volumes mounted beneath this path (as
    /// the Go driver's flag; default: of every EBS volume).
    #[arg(long, value_parser = |p: &str| Ok::<_, String>(MountPointPrefix::new(p)))]
    csi_mount_point_prefix: Option<MountPointPrefix>,
    /// Format XFS for nodes whose kernel is 5.4 or older, as the Go
    /// driver's flag (`--legacy-xfs` or `--legacy-xfs=true`): without the
    /// features such kernels cannot mount (bigtime, inobtcount, reflink).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set)]
    legacy_xfs: bool,
    /// The Go driver's flag for a Windows node's privileged container:
    /// accepted (`=false` as its Linux manifests may spell it), ignored with
    /// a warning if true (the agent serves Linux nodes only).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set)]
    windows_host_process: bool,
    /// klog's and other flags of the Go driver's manifests, ignored.
    #[command(flatten)]
    go_driver: GoDriverFlags,
    /// `--version`, answered as the Go driver answers it.
    #[command(flatten)]
    version: VersionFlag,
    /// Log format: `text` (plain lines) or `json` (one object per line).
    #[arg(long, default_value = "text", value_parser = LoggingFormat::parse)]
    logging_format: LoggingFormat,
    /// Log verbosity as klog's `-v`, which the Go driver's manifests pass:
    /// up to 3 info, 4–5 debug, more trace (`RUST_LOG` overrides it).
    #[arg(short = 'v', long = "v", default_value_t = 2)]
    v: u8,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the EBS volumes visible on this node and exit.
    Devices,
    /// Print the node's metadata as NodeGetInfo would report it and exit.
    Metadata,
    /// The step before the agent stops (the DaemonSet's preStop hook,
    /// systemd's ExecStop): when this node is being drained (unschedulable,
    /// or tainted by a drain, Cluster Autoscaler or Karpenter) or its Node
    /// is gone, wait until no VolumeAttachment of this driver names it.
    /// Uses CSI_NODE_NAME and --kubeconfig or the in-cluster
    /// configuration; with neither --kubeconfig nor KUBERNETES_SERVICE_HOST
    /// there is nothing to wait for. Also under the Go driver's name,
    /// `pre-stop-hook`.
    #[command(alias = "pre-stop-hook")]
    PreStop {
        /// Give up after this many seconds (exit 1, naming the attachments
        /// left); by default the pod's grace period or systemd's
        /// TimeoutStopSec ends the wait.
        #[arg(long)]
        timeout_seconds: Option<u64>,
    },
    /// Make the agent's user the owner of the directory its socket goes in
    /// (kubelet creates it root's), then exit. Needs CAP_CHOWN.
    PluginDir {
        /// The directory; a symlink is refused.
        path: PathBuf,
        /// The agent's uid.
        #[arg(long, default_value_t = 990)]
        uid: u32,
        /// The agent's gid.
        #[arg(long, default_value_t = 990)]
        gid: u32,
    },
}

impl Args {
    /// Where the Kubernetes client finds the API server: the kubeconfig
    /// when `--kubeconfig` names one, else the in-cluster configuration.
    fn api_source(&self) -> ApiSource {
        match &self.kubeconfig {
            Some(path) => ApiSource::Kubeconfig(path.clone()),
            None => ApiSource::InCluster(self.service_account_dir.clone()),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse_from(go_flags::as_the_go_driver_reads(std::env::args_os(), "node"));
    if args.fips {
        fips::enable().context("--fips")?;
    }
    args.version.answer_if_asked();
    let spans = SpanExport::start(&args.tracing).context("--enable-otel-tracing")?;
    ebs_csi_proto::endpoint::init_logging(args.logging_format, args.v, &[], spans.as_ref());
    fips::log_mode();
    args.go_driver.warn();
    if args.windows_host_process {
        go_flags::warn_ignored("--windows-host-process=true", "the agent serves Linux nodes only");
    }
    // 1. A command: do it and exit.
    if let Some(command) = &args.command {
        return run(command, &args).await;
    }
    // 2. The node's facts: its metadata (the flags, then the metadata
    //    sources) and its attachment limit.
    let node = Node::find(&args).await?;
    // 3. The helper's client and the metrics endpoint; 4. the Node service,
    //    the start-up taint removed once it and the helper answer; 5. at
    //    exit, the spans not yet exported sent.
    let served = serve(args, node).await;
    if let Some(spans) = spans {
        spans.flush_at_exit().await;
    }
    served
}

/// Runs a one-shot `command`.
async fn run(command: &Command, args: &Args) -> anyhow::Result<()> {
    match command {
        Command::Devices => print!("{}", devices::table(&devices::list(&args.sys_dir, &args.dev_dir))),
        Command::PreStop { timeout_seconds } => {
            let source = args.api_source();
            if !source.is_configured() {
                tracing::info!(
                    "pre-stop: not on Kubernetes (neither KUBERNETES_SERVICE_HOST nor --kubeconfig is set); nothing to wait for"
                );
                return Ok(());
            }
            let api = NodeApi::connect(&source).await.context("pre-stop")?;
            pre_stop::run(&api, timeout_seconds.map(Duration::from_secs))
                .await
                .context("pre-stop")?;
        }
        Command::PluginDir { path, uid, gid } => {
            plugin_dir::give(path, *uid, *gid).with_context(|| format!("giving {} to {uid}:{gid}", path.display()))?
        }
        Command::Metadata => println!("{}", Node::find(args).await?.summary()),
    }
    Ok(())
}

/// What the agent reports of its node.
struct Node {
    metadata: NodeMetadata,
    limit: LimitSettings,
    /// The volumes it may hold, or why NodeGetInfo fails.
    max_volumes: Result<u32, XenInstance>,
}

impl Node {
    /// The flags' facts, completed from the metadata sources, and the
    /// attachment limit for the instance type they give.
    async fn find(args: &Args) -> anyhow::Result<Self> {
        let flags = Found {
            instance_id: args.node_id.clone(),
            availability_zone: args.availability_zone.clone(),
            availability_zone_id: args.availability_zone_id.clone(),
            instance_type: args.instance_type.clone(),
            ..Found::default()
        };
        let settings = Settings {
            sources: args.metadata_sources.clone(),
            api: args.api_source(),
            dmi_dir: args.sys_dir.join("class/dmi/id"),
        };
        let metadata = metadata::resolve(flags, &settings).await.context("node metadata")?;
        let limit = LimitSettings {
            fixed: args.volume_attach_limit.and_then(|n| u32::try_from(n).ok()),
            reserved: args
                .reserved_volume_attachments
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(1 + metadata.boot_volumes),
        };
        let max_volumes = limit.max_volumes(&metadata.instance_type, metadata.network_interfaces.unwrap_or(1));
        Ok(Self {
            metadata,
            limit,
            max_volumes,
        })
    }

    /// `ebs-csi-agent metadata`'s answer: a line per fact, name and value
    /// separated by a tab.
    fn summary(&self) -> String {
        let max_volumes = self
            .max_volumes
            .as_ref()
            .map_or_else(ToString::to_string, ToString::to_string);
        let m = &self.metadata;
        format!(
            "instance id\t{}\navailability zone\t{}\ninstance type\t{}\nmax volumes\t{max_volumes}",
            m.instance_id, m.availability_zone, m.instance_type
        )
    }
}

/// Serves the CSI Identity and Node services on `--endpoint` for `node`,
/// with the metrics endpoint when `--http-endpoint` is given, until the
/// process is stopped.
async fn serve(args: Args, node: Node) -> anyhow::Result<()> {
    let Node {
        metadata,
        limit,
        max_volumes,
    } = node;
    if let Err(e) = &max_volumes {
        tracing::error!(error = %e, "NodeGetInfo will fail: kubelet does not register the driver on this node");
    }
    let endpoint = Endpoint::parse(&args.endpoint)?;
    let api = args.api_source();
    tracing::info!(node_id = %metadata.instance_id, zone = %metadata.availability_zone, instance_type = %metadata.instance_type, max_volumes = max_volumes.as_ref().ok(), "node");
    let helper = Helper::new(args.helper_socket, Duration::from_secs(args.helper_timeout_seconds));
    if args.metrics.http_endpoint.is_some() {
        let (sys_dir, instance_id) = (args.sys_dir.clone(), metadata.instance_id.clone());
        let metrics = NodeMetrics::new(helper.clone(), sys_dir, instance_id, args.csi_mount_point_prefix)?;
        metrics_http::start(&args.metrics, move || {
            let metrics = metrics.clone();
            async move { metrics.render().await }
        })
        .await
        .context("--http-endpoint")?;
    }
    let finder = DeviceFinder::new(args.dev_dir, args.sys_dir, !args.device_poll_only);
    let wait = Duration::from_secs(args.device_wait_seconds);
    let node = NodeService::new(helper.clone(), finder, metadata, limit, wait, args.legacy_xfs);
    let (info_answered, helper_answers) = (node.info_answered(), helper.clone());
    taint::remove_when_ready(api, async move {
        info_answered.await;
        while !helper_answers.is_ready().await {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    server::serve(&endpoint, IdentityService::new(helper), node).await?;
    Ok(())
}
