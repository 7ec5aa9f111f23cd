#!/bin/sh
# Builds the initramfs of the NVMe test VM (tests/tests/nvme_vm.rs):
# busybox (static), the static agent, helper and scenario driver, the
# tools the helper runs with their libraries from this host, and the xfs
# modules of the guest kernel.
# Usage: build-initramfs.sh STATIC_BIN_DIR MODULES_DIR OUT
set -eu
bin=$1 modules=$2 out=$3
here=$(dirname "$0")
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root"
mkdir -p "$root/bin" "$root/usr/bin" "$root/usr/sbin" "$root/proc" "$root/sys" "$root/dev" \
    "$root/run" "$root/tmp" "$root/var/lib" "$root/lib/modules" "$root/etc"
cp /bin/busybox "$root/bin/busybox"
install -m 0755 "$here/init" "$root/init"
for b in ebs-csi-agent ebs-csi-helper ebs-csi-vm-guest; do
    install -m 0755 "$bin/$b" "$root/usr/bin/$b"
done
for t in blkid mkfs.ext4 mkfs.xfs resize2fs xfs_growfs sfdisk dmsetup; do
    path=$(PATH=/usr/sbin:/sbin:/usr/bin command -v "$t")
    cp -L "$path" "$root/usr/sbin/$t"
    for lib in $(ldd "$path" | awk '/=> \// { print $3 } /^\t\// { print $1 }'); do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
done
cp /etc/mke2fs.conf "$root/etc/mke2fs.conf"
echo "nobody:x:65534:65534:nobody:/nonexistent:/bin/false" > "$root/etc/passwd"
echo "nogroup:x:65534:" > "$root/etc/group"
cp "$modules/libcrc32c.ko" "$modules/xfs.ko" "$modules/dm-mod.ko" "$root/lib/modules/"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$out"
echo "built $out"
