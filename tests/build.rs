//! What the tests' world lacks, as `cfg`s: `not_root` when they are built
//! by a user other than root, `no_vm` without `EBS_CSI_VM_DIR` (the VM
//! images of `make vm`), `no_previous_helper` without
//! `EBS_CSI_PREVIOUS_HELPER` (`make previous-helper`). A test that needs
//! what is missing is marked `#[cfg_attr(<cfg>, ignore = "needs …")]`, so it
//! is reported as ignored with its reason instead of passing without having
//! run; `make test` fails if any is. Built again when the user or the
//! variables change.

use std::os::unix::fs::MetadataExt;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(not_root, no_vm, no_previous_helper)");
    println!("cargo::rerun-if-env-changed=USER");
    println!("cargo::rerun-if-changed=build.rs");
    // The owner of /proc/self is the process's effective uid (proc(5)).
    let euid = std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid());
    if euid != 0 {
        println!("cargo::rustc-cfg=not_root");
    }
    for (variable, cfg) in [
        ("EBS_CSI_VM_DIR", "no_vm"),
        ("EBS_CSI_PREVIOUS_HELPER", "no_previous_helper"),
    ] {
        println!("cargo::rerun-if-env-changed={variable}");
        if std::env::var_os(variable).is_none() {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}
