#!/bin/sh
# Builds the two OCI images of ebs-csi with buildah, FROM scratch, and
# exports them as OCI archives:
#   OUT/ebs-csi.oci.tar         the three static binaries and CA certificates
#                               (controller, agent; and the helper binary)
#   OUT/ebs-csi-helper.oci.tar  the static helper plus the tools it runs
#                               (mkfs.ext2/3/4, mkfs.xfs, blkid, xfs_growfs)
#                               and their shared libraries, taken
#                               from this build host's Debian packages
# Usage: build.sh BIN_DIR OUT_DIR VERSION
# Runs as root; uses the vfs storage driver and chroot isolation (no
# container engine or daemon needed). Reproducible: every time in the
# images (their creation, their history, their files) is SOURCE_DATE_EPOCH
# or the last commit's, and the revision label SOURCE_COMMIT or the last
# commit (deploy/build-copy.sh builds in a copy that is no git repository).
set -eu
bin=$1 out=$2 version=$3
revision=${SOURCE_COMMIT:-$(git rev-parse HEAD)}
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
tools="blkid mkfs.ext2 mkfs.ext3 mkfs.ext4 mkfs.xfs xfs_growfs"
mkdir -p "$out"

# new_image NAME: a scratch working container, labelled.
new_image() {
    c=$(buildah from --name "$1-build-$$" scratch)
    buildah config --label org.opencontainers.image.title="$1" \
        --label org.opencontainers.image.version="$version" \
        --label org.opencontainers.image.revision="$revision" \
        --label org.opencontainers.image.source=https://github.com/ebs-csi/ebs-csi \
        --label org.opencontainers.image.licenses=Apache-2.0 "$c"
    echo "$c"
}

# commit CONTAINER NAME: export as OUT/NAME.oci.tar, tagged VERSION.
commit() {
    rm -f "$out/$2.oci.tar"
    buildah commit --quiet --format oci --timestamp "$epoch" --rm "$1" "oci-archive:$out/$2.oci.tar:localhost/$2:$version" >/dev/null
    echo "built $out/$2.oci.tar"
}

# add_file CONTAINER SOURCE DEST: SOURCE with its symlinks resolved, as DEST.
add_file() {
    buildah copy --quiet --chmod "$(stat -L -c %a "$2")" "$1" "$(readlink -f "$2")" "$3" >/dev/null
}

c=$(new_image ebs-csi)
for b in ebs-csi-agent ebs-csi-controller ebs-csi-helper; do
    add_file "$c" "$bin/$b" "/usr/bin/$b"
done
add_file "$c" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
buildah config --user 65532:65532 "$c"
commit "$c" ebs-csi

c=$(new_image ebs-csi-helper)
add_file "$c" "$bin/ebs-csi-helper" /usr/bin/ebs-csi-helper
libs=""
for t in $tools; do
    path=$(command -v "$t" || PATH=/usr/sbin:/sbin command -v "$t")
    add_file "$c" "$path" "/usr/sbin/$t"
    libs="$libs $(ldd "$path" | awk '/=> \// { print $3 } /^\t\// { print $1 }')"
done
for lib in $(echo "$libs" | tr ' ' '\n' | sort -u); do
    add_file "$c" "$lib" "$lib"
done
add_file "$c" /etc/mke2fs.conf /etc/mke2fs.conf
commit "$c" ebs-csi-helper
