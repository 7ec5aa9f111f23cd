//! The host side of the QEMU test VMs (`tests/tests/nvme_vm.rs`,
//! `tests/tests/systemd_vm.rs`): QEMU started with a QMP socket, and the
//! console protocol the guest drivers speak. A guest prints
//! `@@PLUG <id> <serial> [data|ext4-half|ext4-eio|mbr-overlap]` and `@@UNPLUG <id>` for the host
//! to hot-plug or unplug an emulated NVMe disk through QMP, one
//! `@@SCENARIO <n> ok: …` line per scenario, `@@INFO` and `@@TIME` lines
//! for the report, and `@@EXIT <status>` last.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test support: a failed step fails the test"
)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::guest::{INSTANCE_ID, INSTANCE_TYPE};
use crate::run;

/// Size of every EBS-style disk, in MiB (xfs needs 300 MiB at least).
pub const DISK_MIB: u64 = 512;
/// PCIe root ports left free for hot-plugged disks.
pub const HOTPLUG_PORTS: usize = 9;

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

    /// Sends one command and gives QEMU's answer (a return or an error, one
    /// JSON line), or `None` when none comes within 10 s: asked of a guest
    /// that stopped answering, whose QEMU may be stuck too, so that the
    /// test reports instead of waiting for ever.
    fn ask(&mut self, command: &str) -> Option<String> {
        let stream = self.reader.get_ref();
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        writeln!(self.writer, "{command}").ok()?;
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).ok()?;
            if line.contains(r#""return""#) || line.contains(r#""error""#) {
                return Some(line);
            }
        }
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

/// Where tmpfs is mounted on every Linux host the tests run on (systemd and
/// Debian mount it there).
const TMPFS: &str = "/dev/shm";

/// A new directory for a VM's disk images, its QMP socket and QEMU's
/// temporary overlay of a `snapshot=on` drive ([`command`] sets `TMPDIR`
/// to it), on tmpfs: every write and flush the guest makes then completes
/// in memory. On the host's disk a guest's NVMe flush is an `fdatasync`
/// that waits for whatever else the host's journal commits, and a write can
/// be held by the host's dirty-page throttling; a guest whose I/O waits
/// past its NVMe driver's 30 s `io_timeout` aborts it, resets the
/// controller and loses the disk (drivers/nvme/host/pci.c `nvme_timeout`),
/// as a CI run of `make test` beside the real cluster's test saw: a
/// hot-plugged disk's ext4 journal aborted in the middle of NodeStage's
/// online resize. Sparse images take only the memory the guest writes.
///
/// # Panics
/// When the directory cannot be made.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(TMPFS).expect("a directory on tmpfs (/dev/shm)")
}

/// The guests' NVMe I/O timeout, on their kernel command line: 300 s, for
/// the 30 s default (`nvme_core.io_timeout`, drivers/nvme/host/core.c). The
/// controllers are QEMU's emulation under TCG, on a host whose two cores
/// the real cluster's test, the other VMs and the builds under the tests
/// share; with the images on tmpfs a guest still saw an I/O outlast 30 s
/// there (a CI run of ea95454: the bookworm guest's root disk reset, then
/// disabled, in the middle of dpkg), so the wait is QEMU's, not a disk's.
/// No test asserts an I/O's latency; a guest that loses its disk to a
/// timeout fails its suite instead of testing the product. An emulated I/O
/// stalled past 300 s still does.
pub const NVME_IO_TIMEOUT: &str = "nvme_core.io_timeout=300";

/// A sparse disk image of [`DISK_MIB`] named `<name>.img` in `dir`.
pub fn disk(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.img"));
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(DISK_MIB << 20))
        .unwrap();
    path
}

/// The common part of a test VM's command line: TCG on q35 with `memory_mib`,
/// SMBIOS tables like an EC2 Nitro instance's (system manufacturer `Amazon
/// EC2`, product [`INSTANCE_TYPE`], board asset tag [`INSTANCE_ID`]),
/// no network or display, a QMP socket and QEMU's temporary files in `dir`
/// (a [`scratch`] directory), and [`HOTPLUG_PORTS`] free root ports.
pub fn command(dir: &Path, memory_mib: u32) -> Command {
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.env("TMPDIR", dir)
        .args(["-accel", "tcg", "-machine", "q35", "-m", &memory_mib.to_string()])
        .args(["-nic", "none", "-no-reboot", "-display", "none", "-monitor", "none"])
        .arg("-smbios")
        .arg(format!("type=1,manufacturer=Amazon EC2,product={INSTANCE_TYPE}"))
        .arg("-smbios")
        .arg(format!("type=2,manufacturer=Amazon EC2,asset={INSTANCE_ID}"))
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", dir.join("qmp.sock").display()));
    for port in 0..HOTPLUG_PORTS {
        qemu.args([
            "-device",
            &format!("pcie-root-port,id=port{port},chassis={},slot={}", port + 1, port + 1),
        ]);
    }
    qemu
}

/// [`Outcome::status`] of a guest that printed nothing for the rest of its
/// time limit (stopped, then); the transcript's last line says so.
pub const STOPPED_ANSWERING: i32 = -1;

/// [`Outcome::status`] of a QEMU that exited before its guest printed
/// `@@EXIT` (a guest that powered off or crashed, or QEMU itself failing,
/// whose message is on stderr); the transcript's last line says so.
pub const QEMU_EXITED: i32 = -2;

/// The QMP commands whose answers a guest that stopped answering leaves in
/// its transcript: whether it runs, and its vCPUs' registers.
const WHERE_IT_STANDS: [&str; 2] = [
    r#"{"execute":"query-status"}"#,
    r#"{"execute":"human-monitor-command","arguments":{"command-line":"info registers -a"}}"#,
];

/// What a guest reported.
pub struct Outcome {
    /// The `@@EXIT` status, [`STOPPED_ANSWERING`] or [`QEMU_EXITED`].
    pub status: i32,
    /// The `@@SCENARIO` lines, in order.
    pub scenarios: Vec<String>,
    /// Every line the guest printed on the protocol port.
    pub transcript: Vec<String>,
    /// Disks plugged as `ext4-eio`: their image and the UUID of the ext4
    /// filesystem they held before the guest saw them.
    pub unreadable: Vec<(PathBuf, String)>,
    /// From start to `@@EXIT`.
    pub took: Duration,
}

impl Outcome {
    /// Panics unless the guest exited 0 and reported scenarios 1 to `count`;
    /// the guest's own panic message, where it printed one, comes first
    /// (a long transcript's middle is what a CI summary leaves out).
    pub fn assert_passed(&self, count: usize) {
        let console = self.transcript.join("\n");
        let panic: Vec<&str> = self
            .transcript
            .iter()
            .skip_while(|line| !line.contains("panicked at"))
            .take(4)
            .map(String::as_str)
            .collect();
        assert_eq!(
            self.status,
            0,
            "the guest failed: {}\nits transcript:\n{console}",
            panic.join("\n")
        );
        for n in 1..=count {
            assert!(
                self.scenarios
                    .iter()
                    .any(|s| s.starts_with(&format!("@@SCENARIO {n} ok"))),
                "scenario {n} did not report; console:\n{console}"
            );
        }
    }
}

/// Runs `qemu` (from [`command`], with its guest's disks, kernel and the
/// protocol port on stdio) and serves the guest's requests until it exits
/// or `limit` passes (then stopped, with status [`STOPPED_ANSWERING`], so
/// that the caller can show what the guest's console says; a QEMU that
/// exits first gives [`QEMU_EXITED`]); disk images
/// for hot-plugged disks go to `dir`.
pub fn run_guest(mut qemu: Command, dir: &Path, limit: Duration) -> Outcome {
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
    let mut qmp = Qmp::connect(&dir.join("qmp.sock"));
    let (start, mut ports) = (Instant::now(), 0..HOTPLUG_PORTS);
    let (mut scenarios, mut transcript, mut unreadable) = (Vec::new(), Vec::new(), Vec::new());
    let status = loop {
        let line = match console.recv_timeout(limit.saturating_sub(start.elapsed())) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                transcript.push(format!("(the VM printed nothing more for {limit:?} from its start)"));
                // Where it stands: running or not, and each vCPU's registers
                // (RIP tells a hung kernel from a guest idling or waiting).
                for command in WHERE_IT_STANDS {
                    let answer = qmp
                        .ask(command)
                        .unwrap_or_else(|| format!("(QMP gave no answer to {command})"));
                    transcript.push(answer.replace("\\r\\n", "\n"));
                }
                break STOPPED_ANSWERING;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                transcript.push("(QEMU exited before the guest printed @@EXIT)".into());
                break QEMU_EXITED;
            }
        };
        transcript.push(line.clone());
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["@@PLUG", id, serial, contents @ ..] => {
                let (file, eio) = backing_file(dir, id, contents);
                unreadable.extend(eio);
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
    let took = start.elapsed();
    let deadline = Instant::now() + Duration::from_secs(30);
    while status != STOPPED_ANSWERING && vm.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop(&mut vm);
    Outcome {
        status,
        scenarios,
        transcript,
        unreadable,
        took,
    }
}

fn stop(vm: &mut Child) {
    let _ = vm.kill();
    let _ = vm.wait();
}

/// The QMP `file` node for a hot-plugged disk `id`: an empty image, one
/// holding a data pattern over its first MiB (`data`), one with an ext4
/// filesystem over its first half (`ext4-half`), one whose partitions
/// share sectors (`mbr-overlap`, [`overlapping_mbr`]), or an ext4 image
/// whose reads of sector 0 fail with EIO (`ext4-eio`, QEMU's blkdebug on
/// the raw driver's `read_aio` event; returned with its UUID).
fn backing_file(dir: &Path, id: &str, contents: &[&str]) -> (String, Option<(PathBuf, String)>) {
    let image = disk(dir, id);
    let file = format!(r#"{{"driver":"file","filename":"{}"}}"#, image.display());
    match contents {
        ["data"] => {
            let pattern = crate::data_pattern(1 << 20);
            std::fs::OpenOptions::new()
                .write(true)
                .open(&image)
                .unwrap()
                .write_all(&pattern)
                .unwrap();
            (file, None)
        }
        ["ext4-half"] => {
            // A restored snapshot in a larger volume: ext4 over half the disk.
            let half = format!("{}M", DISK_MIB / 2);
            run("mkfs.ext4", &["-q", "-F", &image.to_string_lossy(), &half]);
            (file, None)
        }
        ["mbr-overlap"] => {
            overlapping_mbr(&image);
            (file, None)
        }
        ["ext4-eio"] => {
            run("mkfs.ext4", &["-q", "-F", &image.to_string_lossy()]);
            let uuid = uuid(&image);
            (
                format!(
                    r#"{{"driver":"blkdebug","image":{file},"inject-error":[{{"event":"read_aio","errno":5,"sector":0}}]}}"#
                ),
                Some((image, uuid)),
            )
        }
        _ => (file, None),
    }
}

/// Writes into `image` an MBR (DOS) table of two Linux partitions that
/// share sectors — 16 MiB from 1 MiB, and 16 MiB from 8 MiB — as its bytes:
/// libfdisk's tools and the kernel's `BLKPG` refuse partitions that
/// overlap, the kernel's partition parser (block/partitions/msdos.c) takes
/// them when it scans a disk.
pub fn overlapping_mbr(image: &Path) {
    use std::os::unix::fs::FileExt;
    let mut sector = [0u8; 512];
    for (n, (start, sectors)) in [(2048u32, 32768u32), (16384, 32768)].into_iter().enumerate() {
        let entry = &mut sector[446 + 16 * n..446 + 16 * (n + 1)];
        entry[4] = 0x83;
        entry[8..12].copy_from_slice(&start.to_le_bytes());
        entry[12..16].copy_from_slice(&sectors.to_le_bytes());
    }
    sector[510..].copy_from_slice(&[0x55, 0xAA]);
    let file = std::fs::OpenOptions::new().write(true).open(image).unwrap();
    file.write_all_at(&sector, 0).unwrap();
}

/// The UUID of the filesystem in an image file (`blkid -p`).
pub fn uuid(image: &Path) -> String {
    run("blkid", &["-p", "-s", "UUID", "-o", "value", &image.to_string_lossy()])
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    /// `TMPFS_MAGIC`, include/uapi/linux/magic.h.
    const TMPFS_MAGIC: i64 = 0x0102_1994;

    #[test]
    fn a_vms_scratch_directory_is_in_memory() {
        let dir = super::scratch();
        let fs = rustix::fs::statfs(dir.path()).unwrap();
        assert_eq!(fs.f_type, TMPFS_MAGIC, "{} is not on tmpfs", dir.path().display());
    }
}
