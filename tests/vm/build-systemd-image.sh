#!/bin/sh
# Builds the root disk of a systemd test VM (tests/tests/systemd_vm.rs): a
# Debian SUITE made by mmdebstrap with systemd as PID 1 and systemd-udevd,
# the modules of the VM's kernel (the same Debian cloud kernel package the
# NVMe VM boots), and one unit that runs the test payload at boot. The
# image is raw ext4 without partitions: the kernel mounts it from the
# first NVMe disk (built into the cloud kernel), so no initramfs is needed.
#
# Usage: build-systemd-image.sh SUITE KERNEL_DEB OUT
# OUT is written only when the whole build succeeded.
set -eu
suite=$1 kernel_deb=$2 out=$3
here=$(dirname "$0")
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

# minbase plus init, udev and the tools the helper runs. dbus: the bus
# systemctl and systemd-analyze use. No documentation, manuals or locales.
mmdebstrap --quiet --variant=minbase \
    --include=systemd-sysv,udev,dbus,kmod,e2fsprogs,xfsprogs,util-linux,mount \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$suite" "$root" http://deb.debian.org/debian

# The kernel's modules (xfs, dm-mod, virtio) where modprobe looks for them.
# (/lib is a symlink to usr/lib in the image: merged /usr.)
dpkg-deb --fsys-tarfile "$kernel_deb" | tar -x -C "$root" --keep-directory-symlink --wildcards '*/lib/modules/*'
version=$(ls "$root/usr/lib/modules")
chroot "$root" depmod "$version"

echo "ebs-csi-vm" > "$root/etc/hostname"
printf '/dev/nvme0n1 / ext4 rw,errors=remount-ro 0 1\n' > "$root/etc/fstab"
# The payload disk (a second NVMe disk, ext4 labelled ebs-csi-payload) holds
# the freshly built binaries, units and the scenario driver.
install -m 0644 "$here/ebs-csi-vm-test.service" "$root/etc/systemd/system/"
ln -s /etc/systemd/system/ebs-csi-vm-test.service \
    "$root/etc/systemd/system/multi-user.target.wants/ebs-csi-vm-test.service"
# The console is for the kernel and systemd; nothing logs in on it.
ln -s /dev/null "$root/etc/systemd/system/serial-getty@ttyS0.service"
ln -s /dev/null "$root/etc/systemd/system/getty@tty1.service"
rm -f "$root/etc/machine-id" && touch "$root/etc/machine-id"

mke2fs -q -t ext4 -L ebs-csi-root -d "$root" "$out.part" 2G
mv "$out.part" "$out"
echo "built $out"
