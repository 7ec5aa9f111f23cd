"""The reference pages name exactly the flags the programs take (`make docs`,
in `make test`): for each program, the long flags its `--help` lists (clap's
definitions; `--help` and `--version` aside) and those the first column of
the tables in docs/reference/<program>.md names must be the same set, so a
flag added, renamed or removed in the code fails until its page follows.

Usage: python3 docs/check-flags.py BIN_DIR   (from the repository's root)
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# deploy/'s shared modules (report.py).
sys.path.insert(0, str(ROOT / "deploy"))

import report  # noqa: E402

PAGES = {"ebs-csi-agent": "agent.md", "ebs-csi-helper": "helper.md", "ebs-csi-controller": "controller.md"}
# clap's own flags, on every program.
CLAP = {"--help", "--version"}


def flags_of_program(program):
    """The long flags `program --help` lists: an option line starts with
    them, after an optional short flag (`  -v, --v <V>`)."""
    text = subprocess.run([str(program), "--help"], check=True, capture_output=True, text=True).stdout
    return set(re.findall(r"^\s+(?:-\w, )?(--[a-z0-9-]+)", text, re.MULTILINE)) - CLAP


def flags_of_page(page):
    """The long flags the first cell of each table row names."""
    flags = set()
    for line in page.read_text().splitlines():
        if line.startswith("| `-"):
            first = line.split("|")[1]
            flags |= set(re.findall(r"`(--[a-z0-9-]+)`", first))
    return flags


def main():
    bin_dir = Path(sys.argv[1])
    problems = []
    for program, page in PAGES.items():
        code, docs = flags_of_program(bin_dir / program), flags_of_page(ROOT / "docs" / "reference" / page)
        if code != docs:
            problems.append(f"docs/reference/{page}: missing {sorted(code - docs)}, not flags of {program} "
                            f"{sorted(docs - code)}")
        else:
            print(f"docs/reference/{page}: the {len(code)} flags of {program}")
    report.exit_on(problems, "reference page(s) differ from the programs' flags")


if __name__ == "__main__":
    main()
