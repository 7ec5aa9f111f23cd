#!/bin/sh
# `make test` as CI runs it on a new machine: `.ci/run` in a fresh clone of
# this repository's last commit under DIR, with every cache the project
# keeps pointed at a new, empty place under DIR: the cargo home (crates.io's
# registry and the tools `cargo install` builds), the target directory (the
# builds, the VM images, the previous commits' builds, the reproducibility
# copy), Go's build and module caches and pip's cache (none: every wheel
# downloaded). The rust toolchain and Debian's packages stay: a new machine
# has the first, and `make test` installs the second (docs/testing.md adds
# their time). Prints the run's time at the end; DIR is emptied first and
# kept after, for its logs.
# Usage: test-cold.sh DIR   (make test-cold; from the repository's root)
set -eu
dir=$(realpath -m "$1")
rm -rf "$dir" && mkdir -p "$dir/cargo/bin"
git clone --quiet --no-hardlinks "$(pwd)" "$dir/ebs-csi"
# The reference beside the repository, as CI lays it.
[ ! -d ../shared ] || ln -s "$(realpath ../shared)" "$dir/shared"
# The toolchain's programs (rustup's proxies), but not the tools installed
# beside them: PATH loses their directory and gets the new cargo home's.
toolchain_bin=$(dirname "$(command -v cargo)")
for program in cargo rustc rustdoc rustup rustfmt cargo-fmt cargo-clippy clippy-driver; do
    ln -s "$toolchain_bin/$program" "$dir/cargo/bin/$program"
done
path=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$toolchain_bin" | paste -sd:)
start=$(date +%s)
status=0
(
    cd "$dir/ebs-csi"
    env CI=true CARGO_HOME="$dir/cargo" PATH="$dir/cargo/bin:$path" CARGO_TARGET_DIR="$dir/target" \
        GOCACHE="$dir/go/cache" GOMODCACHE="$dir/go/mod" GOPATH="$dir/go" PIP_NO_CACHE_DIR=1 \
        bash .ci/run
) > "$dir/run.log" 2>&1 || status=$?
tail -n 40 "$dir/run.log"
echo "test-cold: .ci/run exited $status after $(($(date +%s) - start)) s on a new machine's caches (log: $dir/run.log)"
exit "$status"
