#!/bin/sh
# Checks each image built by build.sh names this commit (SOURCE_COMMIT,
# else the last commit), and runs every
# binary of the images with --help (and each tool of the helper image with
# its version flag) under podman and runc; fails if any does not start.
# Usage: check.sh IMAGE_DIR VERSION
set -eu
dir=$1 version=$2
# podman IMAGE ARGS...: run in a fresh container. crun does not work on
# this machine; the ulimits are needed here too.
in_container() {
    image=$1
    shift
    podman --storage-driver vfs --runtime runc run --rm --network none \
        --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
        "localhost/$image:$version" "$@" 2>&1
}
# run IMAGE ARGS...: must exit 0.
run() {
    in_container "$@" >/dev/null
    echo "ok: $*"
}
# tool_version PATH EXPECTED: `PATH -V` prints EXPECTED (some tools exit
# non-zero after printing their version, so the exit status is not used).
tool_version() {
    out=$(in_container ebs-csi-helper "$1" -V || true)
    case "$out" in
    *"$2"*) echo "ok: $1: $(echo "$out" | head -n1)" ;;
    *) echo "$1 does not run in ebs-csi-helper: $out" >&2; exit 1 ;;
    esac
}
for image in ebs-csi ebs-csi-helper; do
    podman --storage-driver vfs load --quiet --input "$dir/$image.oci.tar" >/dev/null
done
# Each image names the commit it was built from, its version and licence.
# label IMAGE NAME: the image's org.opencontainers.image.NAME label.
label() {
    podman --storage-driver vfs image inspect \
        --format "{{index .Labels \"org.opencontainers.image.$2\"}}" "localhost/$1:$version"
}
for image in ebs-csi ebs-csi-helper; do
    labels="$(label $image revision) $(label $image version) $(label $image licenses)"
    [ "$labels" = "${SOURCE_COMMIT:-$(git rev-parse HEAD)} $version Apache-2.0" ] || { echo "$image: labels $labels" >&2; exit 1; }
    echo "ok: $image labelled $labels"
done
for b in ebs-csi-agent ebs-csi-controller ebs-csi-helper; do
    run ebs-csi "/usr/bin/$b" --help
done
run ebs-csi-helper /usr/bin/ebs-csi-helper --help
for tool in mkfs.ext2 mkfs.ext3 mkfs.ext4; do
    tool_version "/usr/sbin/$tool" "mke2fs 1."
done
tool_version /usr/sbin/mkfs.xfs "mkfs.xfs version"
tool_version /usr/sbin/xfs_growfs "xfs_growfs version"
tool_version /usr/sbin/blkid "util-linux"
