"""The privileged-code budget: counts the code lines of everything the
helper binary is built from — helper/src, proto/helper/src and linux/src —
and fails when they exceed the budget docs/helper.md states
("Privileged-code budget: N code lines").

A code line is a line that is neither blank nor a comment (`//`, `///`,
`//!`), outside a `#[cfg(test)]` module, `*_tests.rs` files and `tests/`
directories (a test module's files, such as the requests' fake kernel).

Usage: python3 helper/budget.py   (from the repository's root)
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["helper/src", "proto/helper/src", "linux/src"]
BUDGET = re.compile(r"Privileged-code budget: \*\*([\d,]+)\*\* code lines")


def code_lines(path):
    """The code lines of one Rust file, its test module left out."""
    lines = path.read_text().split("\n")
    count, i = 0, 0
    while i < len(lines):
        line = lines[i].strip()
        if line == "#[cfg(test)]":
            # `#[cfg(test)] [#[path = …]] mod x;` or `mod x { … }`: skip it.
            i += 1
            while lines[i].strip().startswith("#["):
                i += 1
            depth = lines[i].count("{") - lines[i].count("}")
            i += 1
            while depth > 0:
                depth += lines[i].count("{") - lines[i].count("}")
                i += 1
            continue
        if line and not line.startswith("//"):
            count += 1
        i += 1
    return count


def is_test(path):
    """Whether a file below a source directory is test code."""
    return path.name.endswith("_tests.rs") or "tests" in path.parts[:-1]


def main():
    guide = (ROOT / "docs" / "helper.md").read_text()
    match = BUDGET.search(guide)
    if not match:
        sys.exit("docs/helper.md states no privileged-code budget")
    budget = int(match.group(1).replace(",", ""))
    total = 0
    for source in SOURCES:
        files = [f for f in sorted((ROOT / source).rglob("*.rs")) if not is_test(f.relative_to(ROOT / source))]
        lines = sum(code_lines(f) for f in files)
        print(f"{lines:6,} {source}")
        total += lines
    print(f"{total:6,} code lines of the helper, budget {budget:,} (docs/helper.md)")
    if total > budget:
        sys.exit(f"over the privileged-code budget by {total - budget:,} lines: shrink the helper, "
                 "or raise the budget in docs/helper.md with the reason")


if __name__ == "__main__":
    main()
