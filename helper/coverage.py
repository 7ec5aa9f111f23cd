"""The request handlers' branch coverage by their unit tests over the fake
kernel (helper/src/handler/tests), run as a normal user (nobody), and the
floor docs/helper.md states ("Branch coverage of the requests: at least
N %"): below it, this fails.

The tests are built instrumented (cargo-llvm-cov, LLVM's branch coverage,
which needs RUSTC_BOOTSTRAP on a stable toolchain) in a target directory of
their own, run as nobody (so none can lean on root), and reported by
cargo-llvm-cov.

Usage: python3 helper/coverage.py [--build-only] TARGET_DIR LLVM_BIN_DIR   (make coverage)
--build-only builds the instrumented tests and their dependencies, runs
nothing (make test does it under its tests; make coverage then rebuilds
only the workspace's crates, which it cleans for a fresh report).
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANDLERS = "helper/src/handler/"
FLOOR = re.compile(r"Branch coverage of the requests: at least \*\*([\d.]+) %\*\*")
NOBODY = 65534


def coverage_env(target, llvm_bin):
    """The environment cargo-llvm-cov gives an instrumented build."""
    env = dict(os.environ, CARGO_TARGET_DIR=str(target), RUSTC_BOOTSTRAP="1",
               LLVM_COV=str(llvm_bin / "llvm-cov"), LLVM_PROFDATA=str(llvm_bin / "llvm-profdata"))
    shown = subprocess.run(["cargo", "llvm-cov", "show-env", "--sh", "--branch"], env=env, cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout
    for line in shown.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0] if value else ""
    return env


def test_binary(env):
    """Builds the helper's unit tests; the test executable's path."""
    built = subprocess.run(["cargo", "test", "-p", "ebs-csi-helper", "--lib", "--no-run", "--message-format=json"],
                           env=env, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    for line in built.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message.get("executable") \
                and message["target"]["name"] == "ebs_csi_helper":
            return message["executable"]
    sys.exit("cargo built no unit-test executable of ebs-csi-helper")


def run_as_nobody(executable, target):
    """Runs the requests' tests as nobody; their profiles go to `target`."""
    with tempfile.TemporaryDirectory() as profiles:
        os.chown(profiles, NOBODY, NOBODY)
        env = {"PATH": "/usr/bin:/bin", "LLVM_PROFILE_FILE": f"{profiles}/%p-%2m.profraw"}
        run = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                              "--inh-caps=-all", executable, "handler::tests"],
                             env=env, cwd=profiles, capture_output=True, text=True)
        print(run.stdout[-400:], run.stderr[-2000:], sep="\n")
        # libtest's summary: "test result: ok. N passed; F failed; I ignored; …".
        summary = re.search(r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored", run.stdout)
        if run.returncode != 0 or not summary or summary[1] != "ok" \
                or int(summary[2]) == 0 or int(summary[3]) or int(summary[4]):
            sys.exit("the requests' tests did not all run and pass as nobody")
        for profile in Path(profiles).glob("*.profraw"):
            shutil.move(str(profile), target / profile.name)


def handler_branches(env):
    """(covered, count) of the branches of each handler file."""
    report = subprocess.run(["cargo", "llvm-cov", "report", "--branch", "--json", "--summary-only"],
                            env=env, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    files = {}
    for entry in json.loads(report)["data"][0]["files"]:
        name = os.path.relpath(entry["filename"], ROOT)
        if name.startswith(HANDLERS) and "/tests/" not in name:
            branches = entry["summary"]["branches"]
            files[name] = (branches["covered"], branches["count"])
    return files


def main():
    build_only = sys.argv[1:2] == ["--build-only"]
    target, llvm_bin = Path(sys.argv[1 + build_only]).resolve(), Path(sys.argv[2 + build_only])
    floor = FLOOR.search((ROOT / "docs" / "helper.md").read_text())
    if not floor:
        sys.exit("docs/helper.md states no branch coverage of the requests")
    env = coverage_env(target, llvm_bin)
    if build_only:
        test_binary(env)
        return
    subprocess.run(["cargo", "llvm-cov", "clean", "--workspace"], env=env, cwd=ROOT, check=True)
    run_as_nobody(test_binary(env), target)
    files = handler_branches(env)
    for name, (covered, count) in sorted(files.items()):
        print(f"{covered:4} of {count:4} branches  {name}")
    covered, count = (sum(c for c, _ in files.values()), sum(n for _, n in files.values()))
    percent = 100 * covered / count
    print(f"{covered} of {count} branches of the requests ({percent:.1f} %) reached as nobody, "
          f"floor {floor.group(1)} % (docs/helper.md)")
    if percent < float(floor.group(1)):
        sys.exit("below the floor: cover the new branches with tests over the fake kernel")


if __name__ == "__main__":
    main()
