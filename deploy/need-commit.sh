#!/bin/sh
# Makes sure COMMIT is in this clone: a shallow clone (CI's) fetches it from
# origin; fails when it cannot.
# Usage: need-commit.sh COMMIT   (from the repository's root)
set -eu
git cat-file -e "$1^{commit}" 2>/dev/null && exit 0
git fetch --quiet origin "$1" 2>/dev/null || true
git cat-file -e "$1^{commit}" 2>/dev/null ||
    { echo "error: commit $1 is not in this clone and cannot be fetched" >&2; exit 1; }
