"""The privileged-code budget: measures what an auditor of the helper reads
in everything the helper binary is built from — helper/src,
proto/helper/src and linux/src, and the policy data in helper/policy — and
fails when a measure exceeds its budget in docs/helper.md.

Three numbers:
- decision code: the code lines inside function bodies (signature
  included), where the helper decides;
- declarations: the other code lines — imports, types, their fields and
  variants, constants, `impl` and `mod` lines;
- policy rows: the entries of helper/policy/*.json (a system call of the
  seccomp policy, a mount option or value word of the mount-option policy),
  each with its reason or source there.

A code line is a line that is neither blank nor a comment (`//`, `///`,
`//!`), outside a `#[cfg(test)]` module, `*_tests.rs` files and `tests/`
directories (a test module's files, such as the requests' fake kernel).

Decision code is budgeted and ratcheted ("Decision-code budget: **N**"): a
count above the budget fails, and so does one below it, so that the budget
follows every line taken out. The raw count (decision code and
declarations) keeps its ceiling ("Privileged-code budget: **N** code
lines"). A raise names its reason in docs/helper.md.

Usage: python3 helper/budget.py   (from the repository's root)
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["helper/src", "proto/helper/src", "linux/src"]
POLICY = ROOT / "helper" / "policy"
RAW_BUDGET = re.compile(r"Privileged-code budget: \*\*([\d,]+)\*\* code lines")
DECISION_BUDGET = re.compile(r"Decision-code budget: \*\*([\d,]+)\*\*")
# A function's first line: `fn`, after its visibility and qualifiers.
FUNCTION = re.compile(r"^(pub(\([\w: ]+\))?\s+)?((const|async|unsafe|extern \"C\")\s+)*fn\s")


def braces(line):
    """How much deeper `line` leaves the braces it opens and closes."""
    return line.count("{") - line.count("}")


def measure(path):
    """(decision code, declarations) of one Rust file, its test module
    left out."""
    lines = path.read_text().split("\n")
    decision, declarations, i = 0, 0, 0
    while i < len(lines):
        line = lines[i].strip()
        if line == "#[cfg(test)]":
            # `#[cfg(test)] [#[path = …]] mod x;` or `mod x { … }`: skip it.
            i += 1
            while lines[i].strip().startswith("#["):
                i += 1
            depth = braces(lines[i])
            i += 1
            while depth > 0:
                depth += braces(lines[i])
                i += 1
            continue
        if FUNCTION.match(line):
            # The signature and the body, to the brace that closes it; a
            # trait's declaration without a body ends at its `;`.
            depth, opened = 0, False
            while True:
                text = lines[i].strip()
                if text and not text.startswith("//"):
                    decision += 1
                depth += braces(text)
                opened = opened or "{" in text
                i += 1
                if (opened and depth <= 0) or (not opened and text.endswith(";")):
                    break
            continue
        if line and not line.startswith("//"):
            declarations += 1
        i += 1
    return decision, declarations


def is_test(path):
    """Whether a file below a source directory is test code."""
    return path.name.endswith("_tests.rs") or "tests" in path.parts[:-1]


def rows(value, key=None):
    """The policy's entries in `value`: each element of a list (a system
    call's object counts once) and each member of an object that holds a
    word; `about` texts are for the reader."""
    if key == "about":
        return 0
    if isinstance(value, dict):
        return sum(rows(v, k) for k, v in value.items())
    if isinstance(value, list):
        return sum(1 if isinstance(v, (str, dict)) else rows(v) for v in value)
    return 1 if isinstance(value, str) else 0


def budget(guide, pattern, name):
    """The budget `pattern` finds in docs/helper.md."""
    match = pattern.search(guide)
    if not match:
        sys.exit(f"docs/helper.md states no {name}")
    return int(match.group(1).replace(",", ""))


def main():
    guide = (ROOT / "docs" / "helper.md").read_text()
    raw_budget = budget(guide, RAW_BUDGET, "privileged-code budget")
    decision_budget = budget(guide, DECISION_BUDGET, "decision-code budget")
    decision, declarations = 0, 0
    for source in SOURCES:
        files = [f for f in sorted((ROOT / source).rglob("*.rs")) if not is_test(f.relative_to(ROOT / source))]
        counts = [measure(f) for f in files]
        d, n = sum(c[0] for c in counts), sum(c[1] for c in counts)
        print(f"{d + n:6,} {source} ({d:,} decision code, {n:,} declarations)")
        decision, declarations = decision + d, declarations + n
    policy = sum(rows(json.loads(f.read_text())) for f in sorted(POLICY.glob("*.json")))
    total = decision + declarations
    print(f"{decision:6,} lines of decision code, budget {decision_budget:,} (docs/helper.md)")
    print(f"{declarations:6,} lines of declarations")
    print(f"{policy:6,} policy rows (helper/policy)")
    print(f"{total:6,} code lines of the helper, budget {raw_budget:,} (docs/helper.md)")
    if decision > decision_budget:
        sys.exit(f"over the decision-code budget by {decision - decision_budget:,} lines: shrink the helper, "
                 "or raise the budget in docs/helper.md with the reason")
    if decision < decision_budget:
        sys.exit(f"the decision code is {decision_budget - decision:,} lines under its budget: lower the "
                 f"budget in docs/helper.md to {decision:,}")
    if total > raw_budget:
        sys.exit(f"over the privileged-code budget by {total - raw_budget:,} lines: shrink the helper, "
                 "or raise the budget in docs/helper.md with the reason")


if __name__ == "__main__":
    main()
