"""A CycloneDX SBOM of each OCI image (`make image`), made from what the
image holds, file by file: an ebs-csi program is its binary's SBOM (`make
sbom`: the crates it is built from); every other file is the Debian package
of this build host it was copied from (`dpkg -S`; deploy/image/build.sh
copies the tools, their libraries and the CA bundle from the host), with
its version and purl. A file that is neither fails the build.

Usage: python3 deploy/image/sbom.py IMAGE_DIR VERSION   (from the repository's root)
       python3 deploy/image/sbom.py --digest ARCHIVE   (prints its image's manifest digest)
Reads IMAGE_DIR/<image>.oci.tar and IMAGE_DIR/<binary>.cdx.json; writes
IMAGE_DIR/<image>.oci.cdx.json, reproducible (SOURCE_DATE_EPOCH or the last
commit's time).
"""

import functools
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
# deploy/'s shared modules (source.py, report.py).
sys.path.insert(0, str(ROOT / "deploy"))

import report  # noqa: E402
import source  # noqa: E402

IMAGES = ["ebs-csi", "ebs-csi-helper"]
# The CA bundle is made by update-ca-certificates, which no package lists.
MADE_BY = {"etc/ssl/certs/ca-certificates.crt": "ca-certificates"}


def manifest_digest(oci):
    """The digest ("sha256:…") of the one image an open OCI archive holds."""
    return json.load(oci.extractfile("index.json"))["manifests"][0]["digest"]


def image_files(archive):
    """The paths of the regular files and symlinks in an OCI archive's layers."""
    paths = set()
    with tarfile.open(archive) as oci:
        manifest = json.load(oci.extractfile("blobs/sha256/" + manifest_digest(oci).split(":")[1]))
        for layer in manifest["layers"]:
            blob = oci.extractfile("blobs/sha256/" + layer["digest"].split(":")[1])
            with tarfile.open(fileobj=blob, mode="r:*") as files:
                paths |= {m.name.removeprefix("./") for m in files if m.isfile() or m.issym()}
    return sorted(paths)


def debian_package(path):
    """(name, version, architecture) of the host package that holds /path,
    asked under its merged-/usr aliases too (/usr/sbin/x may be /sbin/x)."""
    name = MADE_BY.get(path)
    if name is None:
        bare = path.removeprefix("usr/")
        for candidate in [f"/{path}", f"/{bare}", f"/usr/{bare}"]:
            found = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
            if found.returncode == 0:
                name = found.stdout.split(":")[0].split(",")[0].strip()
                break
    return None if name is None else installed(name)


@functools.cache
def installed(name):
    """(name, version, architecture) of the installed package `name`, asked
    of dpkg once per package (a tool's libraries share a few)."""
    fields = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version} ${Architecture}", name],
                            check=True, capture_output=True, text=True).stdout.split()
    return tuple(fields)


def components_of(image_dir, files):
    """The image's components, each once (by purl), and the files no
    component accounts for."""
    components, unknown = {}, []
    for path in files:
        binary = Path(path).name
        sbom = image_dir / f"{binary}.cdx.json"
        if path.startswith("usr/bin/ebs-csi-") and sbom.is_file():
            document = json.loads(sbom.read_text())
            for component in [document["metadata"]["component"], *document.get("components", [])]:
                components[component["purl"]] = component
            continue
        package = debian_package(path)
        if package is None:
            unknown.append(path)
            continue
        name, version, arch = package
        purl = f"pkg:deb/debian/{name}@{version}?arch={arch}"
        components[purl] = {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}
    return [components[p] for p in sorted(components)], unknown


def main():
    if sys.argv[1] == "--digest":
        with tarfile.open(sys.argv[2]) as oci:
            print(manifest_digest(oci))
        return
    image_dir, version = Path(sys.argv[1]), sys.argv[2]
    epoch = source.epoch()
    problems = []
    for image in IMAGES:
        files = image_files(image_dir / f"{image}.oci.tar")
        components, unknown = components_of(image_dir, files)
        problems += [f"{image}: {path} is in no SBOM component" for path in unknown]
        document = {
            "bomFormat": "CycloneDX",
            "specVersion": "1.5",
            "version": 1,
            "metadata": {
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)),
                "component": {"type": "container", "bom-ref": f"{image}@{version}", "name": image,
                              "version": version},
            },
            "components": components,
        }
        out = image_dir / f"{image}.oci.cdx.json"
        out.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        print(f"{out}: {len(files)} files, {len(components)} components")
    report.exit_on(problems, "file(s) of the images in no SBOM")


if __name__ == "__main__":
    main()
