//! `--version` as the Go driver answers it: its `VersionInfo`
//! (`pkg/driver/version.go`) as JSON, indented by two spaces
//! (`json.MarshalIndent`), printed by `cmd/main.go` before anything else
//! starts — so that what reads the reference's answer reads ours.

use clap::Args;
use serde::Serialize;

/// The answer, in the Go struct's field order and JSON names.
#[derive(Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionInfo {
    /// `v` and the workspace's version, e.g. `v0.1.0`.
    pub driver_version: String,
    /// The commit built: `EBS_CSI_GIT_COMMIT` when the build was given it,
    /// else empty (as the Go driver's without its `-ldflags`).
    pub git_commit: String,
    /// When it was built, e.g. `2026-11-28T10:00:00Z`: `EBS_CSI_BUILD_DATE`
    /// when the build was given it, else empty.
    pub build_date: String,
    /// Go's `runtime.Version()`: empty, there is no Go here.
    pub go_version: String,
    /// `rustc`, where Go names its `gc`.
    pub compiler: String,
    /// Go's `GOOS/GOARCH` names for this build, e.g. `linux/amd64`,
    /// `linux/arm64`.
    pub platform: String,
    /// `true` in FIPS mode (`--fips` before `--version`,
    /// [`crate::fips`]); absent otherwise, as from the Go driver.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fips: bool,
}

impl VersionInfo {
    /// This build's.
    pub fn of_this_build() -> Self {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "powerpc64" => "ppc64",
            other => other,
        };
        Self {
            driver_version: format!("v{}", env!("CARGO_PKG_VERSION")),
            git_commit: option_env!("EBS_CSI_GIT_COMMIT").unwrap_or_default().to_owned(),
            build_date: option_env!("EBS_CSI_BUILD_DATE").unwrap_or_default().to_owned(),
            go_version: String::new(),
            compiler: "rustc".to_owned(),
            platform: format!("{}/{arch}", std::env::consts::OS),
            fips: crate::fips::is_enabled(),
        }
    }

    /// The JSON the Go driver prints: two-space indentation, no trailing
    /// newline.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// `--version`: print [`VersionInfo::json`] and exit 0 (a flag, not a
/// subcommand, as the Go driver's `--version`).
#[derive(Debug, Args)]
pub struct VersionFlag {
    /// Print the version as JSON (the Go driver's shape) and exit.
    #[arg(long)]
    version: bool,
}

impl VersionFlag {
    /// Prints the version and exits when `--version` was given.
    pub fn answer_if_asked(&self) {
        if self.version {
            println!("{}", VersionInfo::of_this_build().json());
            std::process::exit(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_has_the_go_drivers_keys_in_its_order_and_indentation() {
        let info = VersionInfo {
            driver_version: "v1.2.3".to_owned(),
            git_commit: "abc".to_owned(),
            build_date: "2026-11-28T10:00:00Z".to_owned(),
            go_version: String::new(),
            compiler: "rustc".to_owned(),
            platform: "linux/amd64".to_owned(),
            fips: false,
        };
        assert_eq!(
            info.json(),
            "{\n  \"driverVersion\": \"v1.2.3\",\n  \"gitCommit\": \"abc\",\n  \"buildDate\": \"2026-11-28T10:00:00Z\",\n  \"goVersion\": \"\",\n  \"compiler\": \"rustc\",\n  \"platform\": \"linux/amd64\"\n}"
        );
        let fips = VersionInfo { fips: true, ..info };
        assert!(
            fips.json()
                .ends_with("\"platform\": \"linux/amd64\",\n  \"fips\": true\n}")
        );
        let platform = VersionInfo::of_this_build().platform;
        assert!(
            ["linux/amd64", "linux/arm64"].contains(&platform.as_str()),
            "{platform}"
        );
    }
}
