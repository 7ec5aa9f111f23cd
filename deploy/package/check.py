"""Checks the packages `make deb` and `make rpm` built (`make packages`, in
`make test`): the .deb and the .rpm of each package hold the same files —
its file list beside this script and its documentation directory — owned
by root, programs 0755 and the rest 0644; the scriptlets of both name every
unit the package ships; and lintian (Debian's) finds no error or warning
that is not overridden with its reason (debian/<package>.lintian-overrides).

What this cannot prove here: that the .rpm installs and runs on Amazon
Linux 2023 (no such system boots on this machine); the .deb is installed,
upgraded and purged in the systemd VMs (tests/tests/systemd_vm.rs).

Usage: python3 deploy/package/check.py PACKAGE_DIR   (from the repository's root)
"""

import subprocess
import sys
from pathlib import Path

from build import PACKAGES, ROOT

# deploy/'s shared modules (report.py).
sys.path.insert(0, str(ROOT / "deploy"))

import report  # noqa: E402

# What only the .deb carries: its changelog and lintian's overrides.
DEB_ONLY = {"usr/share/doc/{name}/changelog.gz", "usr/share/lintian/overrides/{name}"}


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def one(directory, pattern):
    found = sorted(directory.glob(pattern))
    if len(found) != 1:
        sys.exit(f"expected one {pattern} in {directory}, found {[f.name for f in found]}")
    return found[0]


def expected_files(package):
    doc = f"usr/share/doc/{package.name}"
    sboms = [f"{doc}/{b}.cdx.json" for b in package.binaries()]
    return set(package.files) | {f"{doc}/copyright"} | {f"{doc}/{d}" for d in package.docs} | set(sboms)


def deb_entries(deb):
    """(path, mode, owner) of each file of a .deb (`dpkg-deb -c`)."""
    entries = []
    for line in run("dpkg-deb", "-c", str(deb)).splitlines():
        mode, owner, _size, _date, _time, path = line.split(None, 5)
        if not mode.startswith("d"):
            entries.append((path.removeprefix("./"), mode, owner))
    return entries


def rpm_entries(rpm):
    """(path, mode, owner) of each file of an .rpm."""
    out = run("rpm", "-qp", "--qf", "[%{FILEMODES:perms} %{FILEUSERNAME}/%{FILEGROUPNAME} %{FILENAMES}\n]", str(rpm))
    return [(path.removeprefix("/"), mode, owner) for mode, owner, path in (l.split(" ", 2) for l in out.splitlines())]


def problems_of(package, kind, entries, scripts):
    problems = []
    want = expected_files(package)
    if kind == "deb":
        want |= {p.format(name=package.name) for p in DEB_ONLY}
    have = {path for path, _, _ in entries}
    if have != want:
        problems.append(f"{kind} {package.name}: missing {sorted(want - have)}, extra {sorted(have - want)}")
    for path, mode, owner in entries:
        expected = "-rwxr-xr-x" if path.startswith("usr/bin/") else "-rw-r--r--"
        if (mode, owner) != (expected, "root/root"):
            problems.append(f"{kind} {package.name}: {path} is {mode} {owner}, not {expected} root/root")
    for unit in (Path(f).name for f in package.files if f.startswith("usr/lib/systemd/system/")):
        if unit not in scripts:
            problems.append(f"{kind} {package.name}: the scriptlets do not name {unit}")
    return problems


def main():
    directory = Path(sys.argv[1])
    problems = []
    for package in PACKAGES:
        deb = one(directory, f"{package.name}_*_amd64.deb")
        rpm = one(directory, f"{package.name}-*.x86_64.rpm")
        deb_scripts = "".join(run("dpkg-deb", "-I", str(deb), script) for script in ["postinst", "prerm", "postrm"])
        problems += problems_of(package, "deb", deb_entries(deb), deb_scripts)
        problems += problems_of(package, "rpm", rpm_entries(rpm), run("rpm", "-qp", "--scripts", str(rpm)))
        print(f"{package.name}: {len(expected_files(package))} files in the .deb and the .rpm")
    lintian = subprocess.run(["lintian", "--fail-on", "error,warning", "--allow-root", *sorted(map(str, directory.glob("*.deb")))],
                             capture_output=True, text=True)
    print(lintian.stdout, end="")
    if lintian.returncode != 0:
        problems.append(f"lintian failed ({lintian.returncode}): {lintian.stderr.strip()}")
    report.exit_on(problems, "problem(s) in the packages")


if __name__ == "__main__":
    main()
