//! The shipped units under real systemd and real udev: a QEMU VM (TCG)
//! per Debian suite, systemd 252 (bookworm) and 257 (trixie), boots with
//! systemd as PID 1; its one own unit installs ebs-csi's Debian packages
//! from a payload disk with apt, as docs/install-systemd.md says (the
//! node's of an earlier commit, `make previous-package`, which the first
//! scenario upgrades to this build's, `make deb`), and runs
//! `ebs-csi-vm-systemd`,
//! whose scenarios drive the agent's CSI socket while EBS-style NVMe disks
//! are hot-plugged through QMP.
//!
//! `make vm` builds the root disks (mmdebstrap, cached by the hash of their
//! inputs), the payload and the kernel into `target/vm`; `make test` sets
//! `EBS_CSI_VM_DIR` to it. Built without the variable the tests are reported
//! ignored with that reason; with it, missing files fail the test. Each
//! suite's scenario lines, the guest's uptime at the end of each step, its
//! boot time and its run time go to `report-<suite>.txt` there; a suite that fails prints the end of the
//! guest's console (kernel and systemd), a guest that stopped answering
//! too.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use ebs_csi_tests::qemu;

/// A suite's time limit, boot included: long enough for a guest that
/// shares the machine's two cores (under TCG a suite takes about 4 minutes
/// alone, 5 to 6 beside the other suite, `make test`'s way), short enough
/// to report a guest that hangs. How fast it goes is `make bench`'s
/// business, not this limit's.
const SUITE_LIMIT: Duration = Duration::from_secs(600);
/// The longest boot accepted, from the kernel's start to the test unit's
/// (seconds of guest uptime).
const BOOT_LIMIT_SECONDS: f64 = 90.0;
/// The scenarios `ebs-csi-vm-systemd` reports.
const SCENARIOS: usize = 7;

#[test]
#[cfg_attr(no_vm, ignore = "needs EBS_CSI_VM_DIR: make test sets it after make vm")]
fn debian_12_systemd_252() {
    run_suite("bookworm");
}

#[test]
#[cfg_attr(no_vm, ignore = "needs EBS_CSI_VM_DIR: make test sets it after make vm")]
fn debian_13_systemd_257() {
    run_suite("trixie");
}

fn run_suite(suite: &str) {
    let vm_dir = PathBuf::from(std::env::var_os("EBS_CSI_VM_DIR").expect("EBS_CSI_VM_DIR: built with it, run without"));
    let (kernel, root, payload) = (
        vm_dir.join("vmlinuz"),
        vm_dir.join(format!("systemd-{suite}.img")),
        vm_dir.join("payload.img"),
    );
    for file in [&kernel, &root, &payload] {
        assert!(file.is_file(), "{} is missing: run `make vm` first", file.display());
    }
    let dir = qemu::scratch();
    let mut vm = qemu::command(dir.path(), 1024);
    // The console (kernel, systemd; not quiet, so that a boot that hangs
    // shows how far it got) to a file; the guest's protocol on the
    // second serial port. One NVMe controller at boot, so that the root
    // disk is nvme0n1 (namespace 1; the payload is namespace 2, read-only);
    // every EBS-style disk is hot-plugged.
    let console = dir.path().join("console.log");
    // One vCPU: the guest's work (apt, dpkg, systemd) is one thing after
    // another, and TCG gives a vCPU a host thread of its own, so the two
    // suites side by side each have a core (.config/nextest.toml).
    vm.args(["-smp", "1"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .args(["-serial", "stdio"])
        .arg("-kernel")
        .arg(&kernel)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 root=/dev/nvme0n1 rw panic=-1 {}",
            qemu::NVME_IO_TIMEOUT
        ))
        .args(["-device", "nvme,id=boot,serial=ebscsiroot"])
        .arg("-drive")
        .arg(format!(
            "file={},if=none,id=root,format=raw,snapshot=on",
            root.display()
        ))
        .args(["-device", "nvme-ns,drive=root,bus=boot,nsid=1"])
        .arg("-drive")
        .arg(format!(
            "file={},if=none,id=payload,format=raw,readonly=on",
            payload.display()
        ))
        .args(["-device", "nvme-ns,drive=payload,bus=boot,nsid=2"]);
    let outcome = qemu::run_guest(vm, dir.path(), SUITE_LIMIT);
    let boot = booted_after(&outcome.transcript);
    let mut report: Vec<String> = outcome
        .transcript
        .iter()
        .filter(|l| ["@@INFO", "@@SCENARIO", "@@TIME"].iter().any(|p| l.starts_with(p)))
        .cloned()
        .collect();
    report.push(format!("boot: {boot:.1} s; suite: {:.1} s", outcome.took.as_secs_f64()));
    std::fs::write(vm_dir.join(format!("report-{suite}.txt")), report.join("\n") + "\n").unwrap();
    if outcome.status != 0 {
        eprintln!("console:\n{}", tail(&console));
    }
    outcome.assert_passed(SCENARIOS);
    assert!(boot <= BOOT_LIMIT_SECONDS, "booting took {boot} s");
}

/// The guest's uptime when its test unit started (`@@BOOTED <seconds>`).
fn booted_after(transcript: &[String]) -> f64 {
    transcript
        .iter()
        .find_map(|l| l.strip_prefix("@@BOOTED "))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(f64::INFINITY)
}

/// The last 150 lines of the console log.
fn tail(console: &Path) -> String {
    let text = std::fs::read_to_string(console).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(150)..].join("\n")
}
