//! `--version` of the agent and the controller, the flag the Go driver's
//! images answer (`pkg/driver/version.go`): the JSON of `VersionInfo`, in
//! its keys' order and indentation (`ebs_csi_proto::version`'s unit test
//! holds the shape), printed before anything starts, exit status 0; and
//! the Go chart's arguments, which both binaries take.

use std::process::Command;

use ebs_csi_proto::version::VersionInfo;
use ebs_csi_tests::binary;

#[test]
fn both_binaries_answer_version_as_the_go_driver_does() {
    for name in ["ebs-csi-agent", "ebs-csi-controller"] {
        let output = Command::new(binary(name)).arg("--version").output().expect(name);
        assert!(output.status.success(), "{name}: {output:?}");
        let expected = format!("{}\n", VersionInfo::of_this_build().json());
        assert_eq!(String::from_utf8_lossy(&output.stdout), expected, "{name}");
        assert!(output.stderr.is_empty(), "{name}: {output:?}");
        let info: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
        assert_eq!(
            info["driverVersion"],
            format!("v{}", env!("CARGO_PKG_VERSION")),
            "{name}"
        );
    }
}

/// The arguments the Go driver's chart gives its one binary, every value
/// set (`charts/aws-ebs-csi-driver/templates/_node.tpl` and
/// `controller.yaml` at v1.64.0), its mode first: each binary here takes
/// its mode's — `--version` answers once the whole line has parsed — and
/// refuses the other's mode.
#[test]
fn both_binaries_take_the_go_charts_arguments() {
    let node = [
        "node",
        "--endpoint=unix:/csi/csi.sock",
        "--reserved-volume-attachments=2",
        "--http-endpoint=0.0.0.0:3302",
        "--csi-mount-point-prefix=/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/",
        "--volume-attach-limit=25",
        "--metadata-sources=imds,kubernetes",
        "--legacy-xfs=true",
        "--logging-format=text",
        "--v=2",
        "--enable-otel-tracing=true",
    ];
    let controller = [
        "controller",
        "--endpoint=unix:///var/lib/csi/sockets/pluginproxy/csi.sock",
        "--extra-tags=team=storage",
        "--k8s-tag-cluster-id=prod",
        "--aws-sdk-debug-log=true",
        "--warn-on-invalid-tag=true",
        "--http-endpoint=0.0.0.0:3301",
        "--batching=true",
        "--user-agent-extra=helm",
        "--logging-format=json",
        "--v=2",
        "--enable-otel-tracing=true",
    ];
    for (name, args, other) in [
        ("ebs-csi-agent", &node[..], "controller"),
        ("ebs-csi-controller", &controller[..], "node"),
    ] {
        let output = Command::new(binary(name))
            .args(args)
            .arg("--version")
            .output()
            .expect(name);
        assert!(output.status.success(), "{name} {args:?}: {output:?}");
        let refused = Command::new(binary(name))
            .args([other, "--version"])
            .output()
            .expect(name);
        assert!(!refused.status.success(), "{name} took the mode {other}: {refused:?}");
    }
}

/// Every flag the Go driver's binary registers for each mode
/// (`pkg/driver/options.go` `AddFlags` and `cmd/main.go` at v1.64.0), each
/// given its Go default as a templated manifest spells it (`--name=` for an
/// empty string, `-1` for "unset"): each binary starts with its mode's.
#[test]
fn both_binaries_take_every_flag_of_the_go_driver_at_its_default() {
    let common = [
        "--kubeconfig=",
        "--http-endpoint=",
        "--metrics-cert-file=",
        "--metrics-key-file=",
        "--enable-otel-tracing=false",
        "--metadata-sources=imds,kubernetes",
        "--logging-format=text",
        "--v=2",
        "--logtostderr",
    ];
    let node = [
        "--endpoint=unix:/csi/csi.sock",
        "--volume-attach-limit=-1",
        "--reserved-volume-attachments=-1",
        "--windows-host-process=false",
        "--legacy-xfs=false",
        "--csi-mount-point-prefix=",
    ];
    let controller = [
        "--endpoint=unix:///var/lib/csi/sockets/pluginproxy/csi.sock",
        "--extra-tags=",
        "--extra-volume-tags=",
        "--k8s-tag-cluster-id=",
        "--aws-sdk-debug-log=false",
        "--warn-on-invalid-tag=false",
        "--user-agent-extra=",
        "--batching=false",
        "--modify-volume-request-handler-timeout=2s",
        "--deprecated-metrics=false",
    ];
    for (name, mode, own) in [
        ("ebs-csi-agent", "node", &node[..]),
        ("ebs-csi-controller", "controller", &controller[..]),
    ] {
        let output = Command::new(binary(name))
            .arg(mode)
            .args(common)
            .args(own)
            .arg("--version")
            .output()
            .expect(name);
        assert!(output.status.success(), "{name}: {output:?}");
    }
}
