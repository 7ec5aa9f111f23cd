#!/bin/sh
# Builds the shipped binaries and the Debian packages a second time, from a
# copy of this tree in another directory and with a target directory of its
# own, by the same `make static deb`, and fails unless each binary is bit
# for bit the one BIN_DIR holds and each .deb the one PACKAGE_DIR holds.
# Both builds take SOURCE_DATE_EPOCH (and the packages' changelog its
# commit) from the last commit; `make static` remaps the tree's and the
# target directory's paths, so neither directory's name reaches a binary.
# Usage: repro-check.sh BIN_DIR PACKAGE_DIR REPRO_TARGET_DIR   (from the repository's root)
set -eu
bin=$1 packages=$2 target=$3
binaries="ebs-csi-agent ebs-csi-controller ebs-csi-helper"
# The copy is no git repository: the last commit's time and id go with it.
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
SOURCE_COMMIT=$(git log -1 --format=%H)
export SOURCE_DATE_EPOCH SOURCE_COMMIT
# The copy's path is the same each run (beside its target directory): it is
# in the build's RUSTFLAGS (its remapping), and other flags would rebuild
# every dependency.
copy=$target-tree
rm -rf "$copy" && mkdir -p "$copy"
trap 'rm -rf "$copy"' EXIT
# The tree as it is (tracked and new files, changes included), without
# what git ignores (target/ among them).
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -x -C "$copy"
make --no-print-directory -C "$copy" static deb CARGO_TARGET_DIR="$target"
status=0
# same WHAT FIRST SECOND: whether two files are bit for bit the same.
same() {
    first=$(sha256sum < "$2" | cut -d' ' -f1)
    second=$(sha256sum < "$3" | cut -d' ' -f1)
    if [ "$first" = "$second" ]; then
        echo "reproducible: $1 $first"
    else
        echo "NOT reproducible: $1 $first (here) != $second (from $copy)" >&2
        status=1
    fi
}
for b in $binaries; do
    same "$b" "$bin/$b" "$target/x86_64-unknown-linux-gnu/release/$b"
done
for deb in "$packages"/*.deb; do
    same "$(basename "$deb")" "$deb" "$copy/target/packages/$(basename "$deb")"
done
exit $status
