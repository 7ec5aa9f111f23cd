#!/bin/sh
# Builds the shipped binaries a second time, from a copy of this tree in
# another directory and with a target directory of its own, by the same
# `make static`, and fails unless each is bit for bit the binary BIN_DIR
# holds. Both builds take SOURCE_DATE_EPOCH from the last commit; `make
# static` remaps the tree's and the target directory's paths, so neither
# directory's name reaches a binary.
# Usage: repro-check.sh BIN_DIR REPRO_TARGET_DIR   (from the repository's root)
set -eu
bin=$1 target=$2
binaries="ebs-csi-agent ebs-csi-controller ebs-csi-helper"
# The copy is no git repository: the last commit's time goes with it.
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
export SOURCE_DATE_EPOCH
copy=$(mktemp -d /tmp/ebs-csi-repro.XXXXXX)
trap 'rm -rf "$copy"' EXIT
# The tree as it is (tracked and new files, changes included), without
# what git ignores (target/ among them).
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -x -C "$copy"
make --no-print-directory -C "$copy" static CARGO_TARGET_DIR="$target"
status=0
for b in $binaries; do
    first=$(sha256sum < "$bin/$b" | cut -d' ' -f1)
    second=$(sha256sum < "$target/x86_64-unknown-linux-gnu/release/$b" | cut -d' ' -f1)
    if [ "$first" = "$second" ]; then
        echo "reproducible: $b $first"
    else
        echo "NOT reproducible: $b $first (here) != $second (from $copy)" >&2
        status=1
    fi
done
exit $status
