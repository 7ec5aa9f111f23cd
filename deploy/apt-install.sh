#!/bin/sh
# Installs those of the Debian packages named that are not installed yet
# (make's apt_install). make test's steps install side by side (the bulk of
# the tests' packages beside the first builds), and apt and dpkg take one
# writer at a time: a call that finds a package missing waits for the
# others (flock), then looks again.
# Usage: apt-install.sh PACKAGE...
set -eu
missing() {
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || printf ' %s' "$p"
    done
}
[ -n "$(missing "$@")" ] || exit 0
exec 9>/run/lock/ebs-csi-apt
flock 9
packages=$(missing "$@")
[ -n "$packages" ] || exit 0
echo "installing:$packages"
apt-get update -qq
# shellcheck disable=SC2086 # one word a package
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages >/dev/null
