#!/bin/sh
# Runs `make TARGET...` (make test's steps) in a copy of this tree at one
# path, CACHE/test-tree/ebs-csi, brought to it by content
# (deploy/copy-tree.sh), with CACHE as the target directory.
#
# Cargo takes a workspace crate for built by its files' times, and every
# file of a fresh clone is newer than any build: run in the clone itself,
# every run built every workspace crate again (the debug build, the
# instrumented and the fuzzing builds), and the tests' package again for
# the paths that name the clone (CARGO_MANIFEST_DIR, EBS_CSI_VM_DIR). In
# the copy a file keeps its time while its bytes stay the same, and the
# paths are the same on every run: a run with nothing changed builds
# nothing, and one with a change builds what the change touches.
#
# The copy is this tree to every tool: its .git names this tree's
# repository (git log, archive and ls-files), its target/ is this tree's
# (the test log, the VMs' files and reports, the packages, the book), and
# ../shared beside it is this tree's where there is one. Every cargo build
# in it is marked (RUSTFLAGS --cfg=ebs_csi_test_tree): where CACHE also
# serves builds cargo makes straight in another tree, whose crates have
# the same names, cargo then builds this tree's again instead of taking the
# other tree's for them by their times.
# Usage: test-tree.sh CACHE TARGET...   (from the repository's root)
set -eu
cache=$(realpath -m "$1")
shift
copy=$cache/test-tree/ebs-csi
deploy/copy-tree.sh worktree "$copy"
printf 'gitdir: %s\n' "$(git rev-parse --absolute-git-dir)" > "$copy/.git"
mkdir -p target
[ "$(readlink "$copy/target" 2>/dev/null)" = "$(pwd)/target" ] || { rm -rf "$copy/target" && ln -s "$(pwd)/target" "$copy/target"; }
if [ -d ../shared ]; then
    ln -sfn "$(realpath ../shared)" "$cache/test-tree/shared"
else
    rm -f "$cache/test-tree/shared"
fi
export CARGO_TARGET_DIR="$cache" RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }--cfg=ebs_csi_test_tree"
exec "${MAKE:-make}" --no-print-directory -C "$copy" "$@"
