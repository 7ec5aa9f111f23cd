//! Real NVMe controllers: the scenarios of `ebs-csi-vm-guest` in a QEMU
//! VM (TCG) whose emulated NVMe disks carry EBS-style serials, with disks
//! hot-plugged and unplugged through QMP while the agent works.
//!
//! `make vm` builds the kernel and initramfs into `target/vm`;
//! `make test` sets `EBS_CSI_VM_DIR` to it. Without the variable the test
//! is skipped with a message; with it, missing files fail the test. The
//! scenarios' lines (with the measured hot-plug delays) are written to
//! `report.txt` there.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ebs_csi_tests::loopdev::run;

/// The disks the VM boots with (the guest expects the same serials).
const BOOT_SERIALS: [&str; 3] = ["vol0aaaaaaaaaaaaaaa1", "vol0bbbbbbbbbbbbbbb2", "vol0ccccccccccccccc3"];
/// Size of every disk, in MiB (xfs needs 300 MiB at least).
const DISK_MIB: u64 = 512;
/// PCIe root ports left free for hot-plugged disks.
const HOTPLUG_PORTS: usize = 9;
/// The whole suite's time limit.
const SUITE_LIMIT: Duration = Duration::from_secs(150);

/// A QMP connection (QEMU Machine Protocol: one JSON object a line).
struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    fn connect(socket: &Path) -> Self {
        let deadline = Instant::now() + Duration::from_secs(10);
        let stream = loop {
            match UnixStream::connect(socket) {
                Ok(stream) => break stream,
                Err(e) => assert!(Instant::now() < deadline, "QMP socket: {e}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut qmp = Self {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
        };
        let mut greeting = String::new();
        qmp.reader.read_line(&mut greeting).unwrap();
        qmp.execute(r#"{"execute":"qmp_capabilities"}"#);
        qmp
    }

    /// Sends one command; panics unless QEMU answers with a return.
    fn execute(&mut self, command: &str) {
        writeln!(self.writer, "{command}").unwrap();
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            if line.contains(r#""return""#) {
                return;
            }
            assert!(!line.contains(r#""error""#), "QMP {command}: {line}");
        }
    }
}

fn disk(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.img"));
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(DISK_MIB << 20))
        .unwrap();
    path
}

#[test]
fn nvme_scenarios_in_a_vm() {
    let Some(vm_dir) = std::env::var_os("EBS_CSI_VM_DIR").map(PathBuf::from) else {
        return eprintln!("skipped: EBS_CSI_VM_DIR is not set (`make test` sets it after `make vm`)");
    };
    let (kernel, initramfs) = (vm_dir.join("vmlinuz"), vm_dir.join("initramfs.gz"));
    assert!(kernel.is_file() && initramfs.is_file(), "run `make vm` first");
    let dir = tempfile::tempdir().unwrap();
    let qmp_socket = dir.path().join("qmp.sock");
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args([
        "-accel",
        "tcg",
        "-machine",
        "q35",
        "-m",
        "512",
        "-nic",
        "none",
        "-no-reboot",
    ])
    .args(["-display", "none", "-monitor", "none", "-serial", "stdio"])
    .arg("-kernel")
    .arg(&kernel)
    .arg("-initrd")
    .arg(&initramfs)
    .args(["-append", "console=ttyS0 quiet panic=-1"])
    .arg("-qmp")
    .arg(format!("unix:{},server=on,wait=off", qmp_socket.display()));
    for (n, serial) in BOOT_SERIALS.iter().enumerate() {
        let image = disk(dir.path(), serial);
        qemu.arg("-drive")
            .arg(format!("file={},if=none,id=boot{n},format=raw", image.display()))
            .args(["-device", &format!("nvme,drive=boot{n},serial={serial}")]);
    }
    for port in 0..HOTPLUG_PORTS {
        qemu.args([
            "-device",
            &format!("pcie-root-port,id=port{port},chassis={},slot={}", port + 1, port + 1),
        ]);
    }
    let mut vm = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("qemu-system-x86_64 (make vm-deps installs it)");
    let (lines, console) = mpsc::channel();
    let stdout = vm.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut qmp = Qmp::connect(&qmp_socket);
    let (start, mut ports, mut scenarios, mut transcript) = (Instant::now(), 0..HOTPLUG_PORTS, Vec::new(), Vec::new());
    let mut unreadable = Vec::new();
    let status = loop {
        let line = match console.recv_timeout(SUITE_LIMIT.saturating_sub(start.elapsed())) {
            Ok(line) => line,
            Err(e) => {
                let _ = vm.kill();
                panic!("the VM stopped answering ({e}); console:\n{}", transcript.join("\n"));
            }
        };
        transcript.push(line.clone());
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["@@PLUG", id, serial, contents @ ..] => {
                let image = disk(dir.path(), id);
                let file = format!(r#"{{"driver":"file","filename":"{}"}}"#, image.display());
                let file = match contents {
                    ["data"] => {
                        // A volume that holds data: a pattern over its first MiB.
                        let pattern = ebs_csi_tests::data_pattern(1 << 20);
                        std::fs::OpenOptions::new()
                            .write(true)
                            .open(&image)
                            .unwrap()
                            .write_all(&pattern)
                            .unwrap();
                        file
                    }
                    ["ext4-eio"] => {
                        // An ext4 volume whose reads covering sector 0 fail
                        // with EIO (QEMU's blkdebug, on the reads the raw
                        // format driver makes: its read_aio event).
                        run("mkfs.ext4", &["-q", "-F", &image.to_string_lossy()]);
                        unreadable.push((image.clone(), uuid(&image)));
                        format!(
                            r#"{{"driver":"blkdebug","image":{file},"inject-error":[{{"event":"read_aio","errno":5,"sector":0}}]}}"#
                        )
                    }
                    _ => file,
                };
                let port = ports.next().expect("a free root port");
                qmp.execute(&format!(
                    r#"{{"execute":"blockdev-add","arguments":{{"driver":"raw","node-name":"{id}","file":{file}}}}}"#
                ));
                qmp.execute(&format!(
                    r#"{{"execute":"device_add","arguments":{{"driver":"nvme","id":"{id}","drive":"{id}","serial":"{serial}","bus":"port{port}"}}}}"#
                ));
            }
            ["@@UNPLUG", id] => qmp.execute(&format!(r#"{{"execute":"device_del","arguments":{{"id":"{id}"}}}}"#)),
            ["@@SCENARIO", ..] => {
                eprintln!("{line}");
                scenarios.push(line.clone());
            }
            ["@@EXIT", code] => break code.parse::<i32>().unwrap(),
            _ => {}
        }
    };
    let _ = vm.wait();
    scenarios.push(format!("VM suite: {:.1} s", start.elapsed().as_secs_f64()));
    std::fs::write(vm_dir.join("report.txt"), scenarios.join("\n") + "\n").unwrap();
    assert_eq!(status, 0, "a scenario failed; console:\n{}", transcript.join("\n"));
    for n in 1..=8 {
        assert!(
            scenarios.iter().any(|s| s.starts_with(&format!("@@SCENARIO {n} ok"))),
            "scenario {n} did not report; console:\n{}",
            transcript.join("\n")
        );
    }
    for (image, before) in unreadable {
        assert_eq!(
            uuid(&image),
            before,
            "the unreadable volume {} was formatted",
            image.display()
        );
    }
}

/// The UUID of the filesystem in an image file (`blkid -p`).
fn uuid(image: &Path) -> String {
    run("blkid", &["-p", "-s", "UUID", "-o", "value", &image.to_string_lossy()])
        .trim()
        .to_owned()
}
