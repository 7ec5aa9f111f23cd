"""Fails make test for a test it did not run that it should have.

Reads `cargo nextest list --run-ignored only --message-format json` (the
tests ignored in this build) on stdin. A test may be ignored only as a
benchmark (a name with `bench_`: make bench runs them) or as the comparison
with the upstream csi.proto when ../shared/reference is not beside the
repository (proto/csi/build.rs). Any other was ignored for what make test
provides (root, the VM images, the previous helper: tests/build.rs), which
means it was not given: each is printed and the exit status is 1.
"""

import json
import sys

MAY_BE_IGNORED = ("bench_", "matches_the_upstream_definition_field_by_field")


def main():
    listing = json.load(sys.stdin)
    missed = [
        f"{suite} {name}"
        for suite, binary in listing["rust-suites"].items()
        for name, case in binary["testcases"].items()
        if case["ignored"] and not any(part in name for part in MAY_BE_IGNORED)
    ]
    for test in missed:
        print(f"error: not run: {test} (make test runs it as root with what it needs)")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
