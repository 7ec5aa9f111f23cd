//! Flags the Go driver's manifests and Helm chart still pass that mean
//! nothing here: klog's (k8s.io/klog/v2 `InitFlags`), Kubernetes
//! component-base's logging flags besides `--logging-format` and `-v`
//! (`pkg/driver/options.go`). A cluster switching drivers keeps its
//! manifests: each is accepted, hidden from `--help`, and named in a warning
//! at start with why it has no effect here, never a start-up failure.

use std::ffi::OsString;

use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};

/// One ignored flag: its name, the other spelling Go's flag parsing
/// (klog's underscores) or pflag's (dashes) accepts, and whether it takes
/// a value (else it is a boolean: `--flag` or `--flag=false`).
struct Ignored {
    name: &'static str,
    alias: Option<&'static str>,
    takes_value: bool,
}

/// Why they have no effect.
const WHY: &str = "logging is --logging-format and -v";

const fn flag(name: &'static str, alias: Option<&'static str>, takes_value: bool) -> Ignored {
    Ignored {
        name,
        alias,
        takes_value,
    }
}

/// klog v2's flags (`klog.InitFlags`) and component-base's logging
/// options (`k8s.io/component-base/logs/api/v1`).
const IGNORED: &[Ignored] = &[
    flag("logtostderr", None, false),
    flag("alsologtostderr", None, false),
    flag("add_dir_header", Some("add-dir-header"), false),
    flag("skip_headers", Some("skip-headers"), false),
    flag("skip_log_headers", Some("skip-log-headers"), false),
    flag("one_output", Some("one-output"), false),
    flag("log_dir", Some("log-dir"), true),
    flag("log_file", Some("log-file"), true),
    flag("log_file_max_size", Some("log-file-max-size"), true),
    flag("stderrthreshold", None, true),
    flag("vmodule", None, true),
    flag("log_backtrace_at", Some("log-backtrace-at"), true),
    flag("log-flush-frequency", None, true),
    flag("log-json-split-stream", None, false),
    flag("log-json-info-buffer-size", None, true),
    flag("log-text-split-stream", None, false),
    flag("log-text-info-buffer-size", None, true),
];

/// The Go driver's string flags whose default is empty
/// (`pkg/driver/options.go`, `cmd/main.go`): given empty (`--name=`, as a
/// templated manifest spells an unset value), each is unset, as for Go.
const EMPTY_BY_DEFAULT: &[&str] = &[
    "kubeconfig",
    "http-endpoint",
    "metrics-cert-file",
    "metrics-key-file",
    "extra-tags",
    "extra-volume-tags",
    "k8s-tag-cluster-id",
    "user-agent-extra",
    "csi-mount-point-prefix",
];

/// The command line `args` (the program's name first) as the Go driver
/// reads it: without its mode argument `mode` where it comes first — its
/// Deployment passes `controller` and its DaemonSet `node` before their
/// flags (`charts/aws-ebs-csi-driver/templates/_node.tpl`,
/// `controller.yaml`), and each binary here serves its one mode (another
/// mode, `all` or the other binary's, stays for the parser to refuse) —
/// and without the flags of [`EMPTY_BY_DEFAULT`] given empty.
pub fn as_the_go_driver_reads(args: impl IntoIterator<Item = OsString>, mode: &str) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.into_iter().collect();
    if args.get(1).is_some_and(|first| first == mode) {
        args.remove(1);
    }
    args.retain(|arg| {
        let unset = arg.to_str().and_then(|arg| arg.strip_prefix("--")?.strip_suffix('='));
        !unset.is_some_and(|name| EMPTY_BY_DEFAULT.contains(&name))
    });
    args
}

/// The ignored flags a command line gave, as `--name=value`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GoDriverFlags {
    given: Vec<String>,
}

impl GoDriverFlags {
    /// Logs a warning naming each ignored flag given (call once logging is
    /// set up).
    pub fn warn(&self) {
        for flag in &self.given {
            warn_ignored(flag, WHY);
        }
    }
}

/// Logs a warning that the Go driver's flag `flag` (as given,
/// `--name=value`) is ignored, and `why`.
pub fn warn_ignored(flag: &str, why: &str) {
    tracing::warn!(
        flag,
        "a flag of the Go driver that means nothing here is ignored: {why}"
    );
}

impl FromArgMatches for GoDriverFlags {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = Self::default();
        flags.update_from_arg_matches(matches)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        for ignored in IGNORED {
            if let Some(value) = matches.get_one::<String>(ignored.name) {
                self.given.push(format!("--{}={value}", ignored.name));
            }
        }
        Ok(())
    }
}

impl Args for GoDriverFlags {
    fn augment_args(command: Command) -> Command {
        IGNORED.iter().fold(command, |command, ignored| {
            let arg = Arg::new(ignored.name)
                .long(ignored.name)
                .hide(true)
                .action(ArgAction::Set);
            let arg = match ignored.takes_value {
                true => arg.num_args(1).allow_hyphen_values(true),
                false => arg.num_args(0..=1).require_equals(true).default_missing_value("true"),
            };
            command.arg(match ignored.alias {
                Some(alias) => arg.alias(alias),
                None => arg,
            })
        })
    }

    fn augment_args_for_update(command: Command) -> Command {
        Self::augment_args(command)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[arg(long, default_value_t = 2)]
        v: u8,
        #[command(flatten)]
        go: GoDriverFlags,
    }

    /// The Go driver's mode goes where its manifests put it, first; not
    /// elsewhere, and not another mode.
    #[test]
    fn drops_the_mode_only_where_it_comes_first() {
        let given = |args: &[&str]| args.iter().map(OsString::from).collect::<Vec<_>>();
        let node = given(&["ebs-csi-agent", "node", "--v=5"]);
        assert_eq!(as_the_go_driver_reads(node, "node"), given(&["ebs-csi-agent", "--v=5"]));
        for kept in [
            given(&["ebs-csi-agent", "--v=5", "node"]),
            given(&["ebs-csi-agent", "all", "--v=5"]),
            given(&["ebs-csi-agent"]),
        ] {
            assert_eq!(as_the_go_driver_reads(kept.clone(), "node"), kept);
        }
    }

    /// A string flag whose Go default is empty, given empty, is unset; any
    /// other flag given empty stays, for the parser to judge.
    #[test]
    fn drops_go_string_flags_given_empty() {
        let given = |args: &[&str]| args.iter().map(OsString::from).collect::<Vec<_>>();
        let line = given(&[
            "ebs-csi-controller",
            "--k8s-tag-cluster-id=",
            "--http-endpoint=",
            "--user-agent-extra=helm",
            "--endpoint=",
            "--v=",
        ]);
        assert_eq!(
            as_the_go_driver_reads(line, "controller"),
            given(&["ebs-csi-controller", "--user-agent-extra=helm", "--endpoint=", "--v="])
        );
    }

    /// The arguments of the Go driver's Helm chart and manifests, with
    /// Go's spellings: each accepted and recorded, none taking the next
    /// flag as its value.
    #[test]
    fn accepts_the_go_drivers_logging_flags() {
        let cli = Cli::try_parse_from([
            "ebs-csi",
            "--logtostderr",
            "--v=5",
            "--log_dir=/var/log",
            "--skip-headers=false",
            "--stderrthreshold=2",
            "--log-flush-frequency=5s",
        ])
        .unwrap();
        assert_eq!(cli.v, 5);
        assert_eq!(
            cli.go.given,
            [
                "--logtostderr=true",
                "--skip_headers=false",
                "--log_dir=/var/log",
                "--stderrthreshold=2",
                "--log-flush-frequency=5s",
            ]
        );
    }

    #[test]
    fn other_unknown_flags_still_fail() {
        let error = Cli::try_parse_from(["ebs-csi", "--no-such-flag"]).unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::UnknownArgument);
    }
}
