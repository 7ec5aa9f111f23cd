"""What a test run left behind: every process that carries the run's mark
(EBS_CSI_TEST_RUN=TOKEN in its environment, which make test exports and
every process it starts inherits, in whatever PID namespace) or names one
of the run's test sandboxes (`<temp dir>/ebs-csi-test-TOKEN*`,
tests/src/lib.rs `sandbox_prefix`), and every mount and loop device of
one. Each is reported, then ended (processes killed, mounts and loop
devices detached), and the exit status is 1 if there was any, so that
`make test` fails when anything of its own outlives it. What another run
beside this one has is left alone.

Usage: python3 tests/leftovers.py TOKEN   (make test, after its steps; TOKEN
is six hex digits)
"""

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "deploy"))
from report import exit_on  # noqa: E402



def ancestors():
    """This process and the ones above it (make and its shell carry the mark)."""
    pids, pid = set(), os.getpid()
    while pid > 0:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids


def run_processes(mark, sandbox):
    """(pid, command line) of each process, other than ours, with `mark`
    in its environment or a sandbox path in its command line (the helper
    starts its tools with an empty environment)."""
    found, ours = [], ancestors()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in ours:
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile
            continue
        if mark in environment or sandbox in command:
            found.append((int(entry.name), command))
    return found


def sandbox_mounts(sandbox):
    """Mount points of the run's sandboxes (each one's own too), deepest first."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split(" ")[4].replace("\\040", " ")
        if point.startswith(sandbox):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def sandbox_loop_devices(sandbox):
    """(/dev/loopN, backing file) of each loop device backed by a file of
    the run's sandboxes."""
    devices = []
    for block in Path("/sys/block").glob("loop*"):
        try:
            backing = (block / "loop/backing_file").read_text().strip()
        except OSError:
            continue
        if backing.startswith(sandbox):
            devices.append((f"/dev/{block.name}", backing))
    return devices


def main():
    mark = f"EBS_CSI_TEST_RUN={sys.argv[1]}".encode()
    sandbox = str(Path(tempfile.gettempdir()) / f"ebs-csi-test-{sys.argv[1]}")
    problems = []
    for pid, command in run_processes(mark, sandbox):
        problems.append(f"left running: pid {pid}: {command}")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for point in sandbox_mounts(sandbox):
        problems.append(f"left mounted: {point}")
        subprocess.run(["umount", "--lazy", point], check=False)
    for device, backing in sandbox_loop_devices(sandbox):
        problems.append(f"left attached: {device} ({backing})")
        subprocess.run(["losetup", "--detach", device], check=False)
    exit_on(problems, "thing(s) the test run started outlived it (ended now)")
    print("leftovers: nothing the test run started outlived it")


if __name__ == "__main__":
    main()
