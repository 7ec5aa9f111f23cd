"""The Debian and RPM packages of ebs-csi (`make deb`, `make rpm`).

Two packages, each from its file list beside this script, which holds what
`make install-files` places (PREFIX=/usr), so a package and `make install`
can never differ: ebs-csi-node (helper, agent, their units, the preset, the
udev rule, sysusers.d and tmpfiles.d entries) and ebs-csi-controller. Every
file `make install-files` places is in exactly one list, or the build fails.
Each package also carries, under /usr/share/doc/<package>/, its copyright
file (and the .deb its changelog), the CycloneDX SBOM of each of its binaries (`make sbom`) and, for the
node, the helper's and the systemd install guide.

The .deb is made by dpkg-deb with the maintainer scripts of debian/ (the
shapes debhelper gives them), a Debian changelog and lintian overrides (its
dependencies leave out util-linux, for blkid: it is essential in Debian);
the .rpm by rpmbuild from a spec written here, with the scriptlets of rpm/
(the shapes of systemd's RPM macros). Both are reproducible: every time is
the last commit's (SOURCE_DATE_EPOCH), owners are root, and the version is
the workspace's followed by the commit's time (`0.1.0+git20261125074536`),
so a later commit's package upgrades an earlier one's.

A package is what dpkg-deb or rpmbuild makes of its tree (the commit's time
on every file), so with CACHE_DIR the one made before from the same tree,
recipe and tool is taken from there instead of compressed again (`made`:
each .deb's xz took about 10 s, three times in a run of `make test`). The
cache is the build's own: repro-check's second build has its own, so the
packages it compares are still made twice, each from its own tree.

Usage: python3 deploy/package/build.py deb|rpm BIN_DIR SBOM_DIR OUT_DIR [CACHE_DIR]
(from the repository's root). Writes OUT_DIR/<package>_<version>_amd64.deb
or OUT_DIR/<package>-<version>-1.x86_64.rpm and prints their paths.
"""

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
# deploy/'s shared modules (source.py, report.py).
sys.path.insert(0, str(ROOT / "deploy"))

import source  # noqa: E402
HERE = ROOT / "deploy" / "package"
MAINTAINER = "ebs-csi developers <ebs-csi@example.org>"
# The documents `make install-files` places, moved to each package's own
# documentation directory as Debian and Fedora name it.
INSTALLED_DOCS = "usr/share/doc/ebs-csi"


class Package:
    """One package: its name, what it is, what it needs, and its files."""

    def __init__(self, name, summary, description, depends, rpm_requires, docs):
        self.name = name
        self.summary = summary
        self.description = description
        self.depends = depends
        self.rpm_requires = rpm_requires
        self.docs = docs
        lines = (HERE / f"{name}.files").read_text().splitlines()
        self.files = [line.lstrip("/") for line in lines if line and not line.startswith("#")]

    def binaries(self):
        return [Path(f).name for f in self.files if f.startswith("usr/bin/")]


PACKAGES = [
    Package(
        "ebs-csi-node",
        "Amazon EBS CSI driver: node agent and privileged helper",
        "The node side of ebs-csi, a CSI driver for Amazon EBS (driver name\n"
        "ebs.csi.aws.com). The agent serves the CSI Node service without\n"
        "capabilities or AWS credentials; the helper, socket-activated, is the\n"
        "only privileged part: it formats, mounts, unmounts and grows the EBS\n"
        "volumes it proves are the ones named, and nothing else. The package\n"
        "enables the helper's socket and starts nothing.",
        ["e2fsprogs", "xfsprogs", "systemd", "udev", "init-system-helpers (>= 1.54~)"],
        ["e2fsprogs", "xfsprogs", "util-linux", "systemd", "systemd-udev"],
        ["helper.md", "install-systemd.md"],
    ),
    Package(
        "ebs-csi-controller",
        "Amazon EBS CSI driver: controller",
        "The controller side of ebs-csi, a CSI driver for Amazon EBS (driver\n"
        "name ebs.csi.aws.com): the CSI Controller service, the only part that\n"
        "holds AWS credentials and calls EC2. The unit is installed, neither\n"
        "enabled nor started.",
        ["systemd", "init-system-helpers (>= 1.54~)"],
        ["systemd"],
        [],
    ),
]


def run(*args, **kwargs):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kwargs).stdout.strip()


def version(epoch):
    cargo = (ROOT / "Cargo.toml").read_text()
    workspace = re.search(r'^version = "([^"]+)"', cargo, re.MULTILINE).group(1)
    return f"{workspace}+git{time.strftime('%Y%m%d%H%M%S', time.gmtime(epoch))}"


def stage(bin_dir, into):
    """`make install-files` into `into`; fails unless every file it places
    is in exactly one package's list."""
    subprocess.run(["make", "--no-print-directory", "-s", "-C", str(ROOT), "install-files",
                    f"DESTDIR={into}", f"BIN_SOURCE={bin_dir}"], check=True, stdout=subprocess.DEVNULL)
    placed = {str(p.relative_to(into)) for p in into.rglob("*") if p.is_file()}
    placed = {p for p in placed if not p.startswith(INSTALLED_DOCS + "/")}
    listed = [f for package in PACKAGES for f in package.files]
    twice = {f for f in listed if listed.count(f) > 1}
    if placed != set(listed) or twice:
        sys.exit(f"the package lists and `make install-files` differ: placed but not listed "
                 f"{sorted(placed - set(listed))}, listed but not placed {sorted(set(listed) - placed)}, "
                 f"listed twice {sorted(twice)}")


def tree(package, staged, sbom_dir, into):
    """The package's files under `into`, its documentation directory added."""
    for f in package.files:
        (into / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(staged / f, into / f)
    doc = into / "usr/share/doc" / package.name
    doc.mkdir(parents=True)
    for name in package.docs:
        shutil.copy2(staged / INSTALLED_DOCS / name, doc / name)
    for binary in package.binaries():
        shutil.copy2(sbom_dir / f"{binary}.cdx.json", doc / f"{binary}.cdx.json")
    shutil.copy2(HERE / "copyright", doc / "copyright")


def clamp_times(into, epoch):
    """Every file's and directory's time set to the commit's; modes as the
    packages want them (directories 0755, nothing group- or other-writable)."""
    for path in [into, *into.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
        else:
            path.chmod(path.stat().st_mode & 0o755)
        os.utime(path, (epoch, epoch))


def changelog(package, ver, epoch):
    date = time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime(epoch))
    return (f"{package.name} ({ver}) unstable; urgency=medium\n\n"
            f"  * Built from commit {source.commit()}.\n\n -- {MAINTAINER}  {date}\n")


def digest(tree, *recipe):
    """sha256 of what a package is made of: every file's and directory's
    path, mode and bytes under `tree`, the recipe's strings and this
    script."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for part in recipe:
        h.update(b"\0" + part.encode())
    for path in sorted(tree.rglob("*")):
        h.update(f"\0{path.relative_to(tree)}\0{path.lstat().st_mode:o}\0".encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def made(target, package, key, cache, make):
    """`target` made by `make()`, or copied from `cache` where an earlier
    call with the same `key` made it; the cache keeps each package's two
    latest of each kind."""
    if cache is None:
        make()
        return target
    kept = cache / package.name
    entry = kept / f"{key}{target.suffix}"
    if entry.exists():
        shutil.copyfile(entry, target)
        os.utime(entry)
        return target
    make()
    kept.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(target, entry.with_suffix(".part"))
    entry.with_suffix(".part").rename(entry)
    for old in sorted(kept.glob(f"*{target.suffix}"), key=lambda p: p.stat().st_mtime)[:-2]:
        old.unlink()
    return target


def build_deb(package, root, ver, epoch, out, cache):
    doc = root / "usr/share/doc" / package.name
    # A native package's (its version has no Debian revision) changelog;
    # gzip's header without a name and with the commit's time (mtime=).
    with open(doc / "changelog.gz", "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=epoch) as z:
            z.write(changelog(package, ver, epoch).encode())
    overrides = root / "usr/share/lintian/overrides"
    overrides.mkdir(parents=True)
    shutil.copy2(HERE / "debian" / f"{package.name}.lintian-overrides", overrides / package.name)
    control = root / "DEBIAN"
    control.mkdir()
    for script in ["postinst", "prerm", "postrm"]:
        shutil.copy2(HERE / "debian" / f"{package.name}.{script}", control / script)
        (control / script).chmod(0o755)
    files = sorted(p for p in root.rglob("*") if p.is_file() and control not in p.parents)
    # What `dpkg --verify` checks the installed files against.
    (control / "md5sums").write_text("".join(
        f"{hashlib.md5(p.read_bytes()).hexdigest()}  {p.relative_to(root)}\n" for p in files))
    size = sum(-(-p.stat().st_size // 1024) for p in files)
    description = "\n".join(f" {line}" for line in package.description.splitlines())
    (control / "control").write_text(
        f"Package: {package.name}\nVersion: {ver}\nArchitecture: amd64\nMaintainer: {MAINTAINER}\n"
        f"Installed-Size: {size}\nDepends: {', '.join(package.depends)}\nSection: admin\n"
        f"Priority: optional\nDescription: {package.summary}\n{description}\n")
    clamp_times(root, epoch)
    deb = out / f"{package.name}_{ver}_amd64.deb"
    command = ["dpkg-deb", "--root-owner-group", "-Zxz", "--build"]
    key = digest(root, *command, run("dpkg-deb", "--version").splitlines()[0], str(epoch))
    return made(deb, package, key, cache, lambda: subprocess.run(
        [*command, str(root), str(deb)], check=True, stdout=subprocess.DEVNULL,
        env=dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))))


def spec(package, root, ver):
    """The RPM spec: the tree as it is, the scriptlets of rpm/, and
    rpmbuild's own additions (build-id links, debug packages, stripping,
    dependency scanning) off, so the file list is the .deb's."""
    scriptlets = "".join(f"%{name}\n{(HERE / 'rpm' / f'{package.name}.{name}').read_text()}\n"
                         for name in ["post", "preun", "postun"])
    files = "\n".join(f"/{p.relative_to(root)}" for p in sorted(root.rglob("*")) if p.is_file())
    requires = "".join(f"Requires: {r}\n" for r in package.rpm_requires)
    return (f"%define _build_id_links none\n%define debug_package %{{nil}}\n%define __strip /bin/true\n"
            f"%define __os_install_post %{{nil}}\n%define use_source_date_epoch_as_buildtime 1\n"
            f"%define clamp_mtime_to_source_date_epoch 1\n%define _buildhost reproducible\n"
            f"AutoReqProv: no\n\nName: {package.name}\nVersion: {ver}\nRelease: 1\n"
            f"Summary: {package.summary}\nLicense: Apache-2.0\nBuildArch: x86_64\n{requires}\n"
            f"%description\n{package.description}\n\n%install\ncp -a {root}/. %{{buildroot}}/\n\n"
            f"{scriptlets}\n%files\n%defattr(-,root,root,-)\n{files}\n")


def build_rpm(package, root, ver, epoch, out, work, cache):
    clamp_times(root, epoch)
    spec_file = work / f"{package.name}.spec"
    text = spec(package, root, ver)
    spec_file.write_text(text)
    key = digest(root, text.replace(str(root), "<tree>"), run("rpmbuild", "--version"), str(epoch))
    return made(out / f"{package.name}-{ver}-1.x86_64.rpm", package, key, cache, lambda: subprocess.run(
        ["rpmbuild", "--quiet", "-bb", "--define", f"_topdir {work / 'rpmbuild'}",
         "--define", f"_rpmdir {out}", "--define", "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm",
         str(spec_file)], check=True, env=dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))))


def main():
    kind, bin_dir, sbom_dir, out = sys.argv[1], *(Path(a).resolve() for a in sys.argv[2:5])
    cache = Path(sys.argv[5]).resolve() if len(sys.argv) > 5 else None
    epoch = source.epoch()
    ver = version(epoch)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        staged = work / "staged"
        stage(bin_dir, staged)
        for package in PACKAGES:
            root = work / package.name
            tree(package, staged, sbom_dir, root)
            if kind == "deb":
                package_file = build_deb(package, root, ver, epoch, out, cache)
            else:
                package_file = build_rpm(package, root, ver, epoch, out, work, cache)
            print(package_file)


if __name__ == "__main__":
    main()
