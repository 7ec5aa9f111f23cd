#!/bin/sh
# Builds the shipped binaries, the Debian packages and the OCI images with
# their SBOMs a second time, from a copy of this tree at another path than
# the first build's copy (make static) and with a target directory of its
# own, by the same `make static deb image` (deploy/build-copy.sh, which
# keeps the copy between runs and rebuilds what changed), and fails unless
# each binary is bit for bit the one BIN_DIR holds, each .deb the one
# PACKAGE_DIR holds, and each image the one IMAGE_DIR holds: the same
# manifest digest (which names the configuration and every layer by their
# digests; the OCI archive around them records its own write times) and
# the same SBOM. Both builds take SOURCE_DATE_EPOCH (and the packages'
# changelog and the images' revision label its commit) from the last
# commit; `make static` remaps the tree's and the target directory's
# paths, so neither directory's name reaches a binary.
# Usage: repro-check.sh BIN_DIR PACKAGE_DIR IMAGE_DIR REPRO_TARGET_DIR   (from the repository's root)
set -eu
bin=$1 packages=$2 images=$3 target=$4
binaries="ebs-csi-agent ebs-csi-controller ebs-csi-helper"
copy=$target-tree
deploy/build-copy.sh "$target" worktree static deb image
status=0
# equal WHAT FIRST SECOND: whether the two builds' digests of WHAT agree.
equal() {
    if [ "$2" = "$3" ]; then
        echo "reproducible: $1 $2"
    else
        echo "NOT reproducible: $1 $2 (here) != $3 (from $copy)" >&2
        status=1
    fi
}
# same WHAT FIRST SECOND: whether two files are bit for bit the same.
same() {
    equal "$1" "$(sha256sum < "$2" | cut -d' ' -f1)" "$(sha256sum < "$3" | cut -d' ' -f1)"
}
# manifest ARCHIVE: the digest of the one image an OCI archive holds.
manifest() {
    python3 deploy/image/sbom.py --digest "$1"
}
for b in $binaries; do
    same "$b" "$bin/$b" "$target/x86_64-unknown-linux-gnu/release/$b"
done
for deb in "$packages"/*.deb; do
    same "$(basename "$deb")" "$deb" "$copy/target/packages/$(basename "$deb")"
done
for image in ebs-csi ebs-csi-helper; do
    equal "$image image" "$(manifest "$images/$image.oci.tar")" "$(manifest "$copy/target/image/$image.oci.tar")"
    same "$image.oci.cdx.json" "$images/$image.oci.cdx.json" "$copy/target/image/$image.oci.cdx.json"
done
exit $status
