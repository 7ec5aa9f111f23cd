"""A CycloneDX SBOM of each shipped binary (`make sbom`, in `make test`),
made by cargo-cyclonedx from Cargo's own dependency graph for the release
target — the crates the binary is built from, build scripts' dependencies
left out — and checked: every component has a version, a purl and a
licence, and each binary holds what it must and not what it must not (the
privileged helper no async runtime, gRPC, HTTP or AWS code, and not the
agent's client of its socket).

The files are reproducible: the timestamp is the last commit's
(SOURCE_DATE_EPOCH, which cargo-cyclonedx honours) and the clone's
absolute path in the workspace crates' references is replaced by `.`.

Each binary also carries its dependency list (built with cargo-auditable,
`make static`); read back with rust-audit-info, it must agree with the
SBOM: every crate linked in (cargo-auditable's `runtime` packages) is a
component, and every component is in the list (proc macros are
cargo-auditable's `build` packages: they run in the compiler, not in the
binary).

Usage: python3 deploy/sbom.py OUT_DIR BIN_DIR   (from the repository's root)
Writes OUT_DIR/<binary>.cdx.json; the images are built beside them from
the binaries in BIN_DIR.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import report
import source

ROOT = Path(__file__).resolve().parent.parent
TARGET = "x86_64-unknown-linux-gnu"
# Each shipped binary and the package that builds it.
SHIPPED = {"ebs-csi-agent": "agent", "ebs-csi-controller": "controller", "ebs-csi-helper": "helper"}
MUST = {
    "ebs-csi-helper": {"ebs-csi-helper-proto", "ebs-csi-linux", "rustix", "seccompiler", "landlock"},
    # Their TLS is AWS-LC's FIPS module's (proto/csi/src/fips.rs).
    "ebs-csi-agent": {"ebs-csi-helper-client", "ebs-csi-proto", "tonic", "tokio", "aws-lc-fips-sys"},
    "ebs-csi-controller": {"ebs-csi-proto", "tonic", "aws-sdk-ec2", "aws-sdk-ebs", "aws-config", "aws-lc-fips-sys"},
}
MUST_NOT = {
    "ebs-csi-helper": {"tokio", "tonic", "prost", "hyper", "h2", "aws-sdk-ec2", "aws-sdk-ebs", "aws-config",
                       "ebs-csi-helper-client", "ebs-csi-proto", "aws-lc-fips-sys"},
    # The agent reads IMDS through aws-config, but calls no EC2 or EBS API.
    "ebs-csi-agent": {"aws-sdk-ec2", "aws-sdk-ebs"},
    "ebs-csi-controller": {"ebs-csi-helper-client"},
}


def generate(out):
    subprocess.run(["cargo", "cyclonedx", "-q", "--format", "json", "--spec-version", "1.5",
                    "--describe", "binaries", "--no-build-deps", "--target", TARGET],
                   cwd=ROOT, check=True, env=dict(os.environ, SOURCE_DATE_EPOCH=str(source.epoch())))
    out.mkdir(parents=True, exist_ok=True)
    for made in ROOT.glob("*/*_bin.cdx.json"):
        binary = made.name.removesuffix("_bin.cdx.json")
        if binary in SHIPPED:
            text = made.read_text().replace(f"file://{ROOT}/", "file://./")
            (out / f"{binary}.cdx.json").write_text(text)
        made.unlink()


def check(out):
    problems = []
    for binary in SHIPPED:
        sbom = json.loads((out / f"{binary}.cdx.json").read_text())
        components = sbom["components"]
        names = {c["name"] for c in components}
        for c in components:
            if not (c.get("version") and c.get("purl") and c.get("licenses")):
                problems.append(f"{binary}: {c['name']} lacks a version, purl or licence")
        for name in sorted(MUST[binary] - names):
            problems.append(f"{binary}: {name} is missing")
        for name in sorted(MUST_NOT[binary] & names):
            problems.append(f"{binary}: built from {name}, which it must not be")
        print(f"{len(components):4} components  {out / (binary + '.cdx.json')}")
    return problems


def check_audit_data(out, binaries):
    """The dependency list each binary carries against its SBOM."""
    problems = []
    for binary in SHIPPED:
        read = subprocess.run(["rust-audit-info", str(binaries / binary)], capture_output=True, text=True)
        if read.returncode != 0:
            problems.append(f"{binary}: no dependency list ({read.stderr.strip()})")
            continue
        packages = json.loads(read.stdout)["packages"]
        roots = [p["name"] for p in packages if p.get("root")]
        linked = {(p["name"], p["version"]) for p in packages if p.get("kind", "runtime") == "runtime" and not p.get("root")}
        listed = {(p["name"], p["version"]) for p in packages}
        sbom = json.loads((out / f"{binary}.cdx.json").read_text())
        components = {(c["name"], c["version"]) for c in sbom["components"]}
        if roots != [binary]:
            problems.append(f"{binary}: its dependency list is of {roots}")
        for name, version in sorted(linked - components):
            problems.append(f"{binary}: links {name} {version}, which its SBOM leaves out")
        for name, version in sorted(components - listed):
            problems.append(f"{binary}: its SBOM names {name} {version}, which it is not built from")
        print(f"{len(linked):4} crates linked, as the SBOM says  {binaries / binary}")
    return problems


def main():
    out = Path(sys.argv[1]).resolve()
    generate(out)
    problems = check(out) + check_audit_data(out, Path(sys.argv[2]).resolve())
    report.exit_on(problems, "problem(s) in the SBOMs")


if __name__ == "__main__":
    main()
