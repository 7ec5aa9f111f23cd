//! Real NVMe controllers: the scenarios of `ebs-csi-vm-guest` in a QEMU
//! VM (TCG) whose emulated NVMe disks carry EBS-style serials, with disks
//! hot-plugged and unplugged through QMP while the agent works.
//!
//! `make vm` builds the kernel and initramfs into `target/vm`;
//! `make test` sets `EBS_CSI_VM_DIR` to it. Built without the variable the
//! test is reported ignored with that reason; with it, missing files fail
//! the test. The scenarios' lines (with the measured hot-plug delays) are
//! written to `report.txt` there.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::path::PathBuf;
use std::time::Duration;

use ebs_csi_tests::qemu;

/// The disks the VM boots with (the guest expects the same serials).
const BOOT_SERIALS: [&str; 3] = ["vol0aaaaaaaaaaaaaaa1", "vol0bbbbbbbbbbbbbbb2", "vol0ccccccccccccccc3"];
/// The whole suite's time limit.
const SUITE_LIMIT: Duration = Duration::from_secs(150);

#[test]
#[cfg_attr(no_vm, ignore = "needs EBS_CSI_VM_DIR: make test sets it after make vm")]
fn nvme_scenarios_in_a_vm() {
    let vm_dir = PathBuf::from(std::env::var_os("EBS_CSI_VM_DIR").expect("EBS_CSI_VM_DIR: built with it, run without"));
    let (kernel, initramfs) = (vm_dir.join("vmlinuz"), vm_dir.join("initramfs.gz"));
    assert!(kernel.is_file() && initramfs.is_file(), "run `make vm` first");
    let dir = qemu::scratch();
    let mut vm = qemu::command(dir.path(), 512);
    vm.args(["-serial", "stdio"])
        .arg("-kernel")
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initramfs)
        .arg("-append")
        .arg(format!("console=ttyS0 quiet panic=-1 {}", qemu::NVME_IO_TIMEOUT));
    for (n, serial) in BOOT_SERIALS.iter().enumerate() {
        let image = qemu::disk(dir.path(), serial);
        vm.arg("-drive")
            .arg(format!("file={},if=none,id=boot{n},format=raw", image.display()))
            .args(["-device", &format!("nvme,drive=boot{n},serial={serial}")]);
    }
    let outcome = qemu::run_guest(vm, dir.path(), SUITE_LIMIT);
    let mut report = outcome.scenarios.clone();
    report.push(format!("VM suite: {:.1} s", outcome.took.as_secs_f64()));
    std::fs::write(vm_dir.join("report.txt"), report.join("\n") + "\n").unwrap();
    outcome.assert_passed(12);
    for (image, before) in &outcome.unreadable {
        assert_eq!(
            &qemu::uuid(image),
            before,
            "the unreadable volume {} was formatted",
            image.display()
        );
    }
}
