#!/bin/sh
# The images the test cluster runs besides the project's own (#43), as OCI
# archives in OUT, built with buildah FROM scratch (nothing can be pulled
# here):
#   pause.oci.tar    registry.k8s.io/pause:3.10.1, the sandbox image, from
#                    Kubernetes v1.35.4's own build/pause/linux/pause.c,
#                    compiled as its build/pause/Makefile does
#   busybox.oci.tar  localhost/busybox:1.35.0, Debian's busybox-static, for
#                    the scenarios' pods
# Usage: images.sh KUBERNETES_SOURCE OUT   (the k8s.io/kubernetes module's
# directory in the Go module cache; make kube-images)
set -eu
source=$1 out=$2
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# image NAME FILE DEST ENTRYPOINT: FILE as DEST in an image of its own.
image() {
    c=$(buildah from --name "ebs-csi-test-$1-$$" scratch)
    buildah copy --quiet --chmod 0755 "$c" "$2" "$3" >/dev/null
    buildah config --entrypoint "$4" "$c"
    rm -f "$out/$1.oci.tar"
    buildah commit --quiet --format oci --rm "$c" "oci-archive:$out/$1.oci.tar:$5" >/dev/null
}

gcc -Os -Wall -Werror -static -DVERSION=v3.10.1-v1.35.4 -o "$work/pause" "$source/build/pause/linux/pause.c"
image pause "$work/pause" /pause '["/pause"]' registry.k8s.io/pause:3.10.1
image busybox /bin/busybox /bin/busybox '["/bin/busybox"]' localhost/busybox:1.35.0
