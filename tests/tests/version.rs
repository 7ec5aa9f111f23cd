//! `--version` of the agent and the controller, the flag the Go driver's
//! images answer (`pkg/driver/version.go`): the JSON of `VersionInfo`, in
//! its keys' order and indentation (`ebs_csi_proto::version`'s unit test
//! holds the shape), printed before anything starts, exit status 0.

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
