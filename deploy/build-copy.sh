#!/bin/sh
# Runs `make TARGET...` (e.g. static deb) in a copy of a tree at
# TARGET_DIR-tree, with TARGET_DIR as its target directory, and leaves the
# copy there for the caller to read (e.g. its packages under
# TARGET_DIR-tree/target/packages); the next call brings it to another
# tree. The tree is COMMIT's, or for `worktree` this working tree as it is
# (tracked and new files, changes included, without what git ignores). The
# copy is no git repository: COMMIT's (or the last commit's) time and id go
# with it as SOURCE_DATE_EPOCH and SOURCE_COMMIT, and the time of its last
# change to Cargo.lock as LOCK_DATE_EPOCH.
#
# The copy's path is the same on every call: `make static` puts it in the
# build's RUSTFLAGS (its remapping), and other flags would rebuild every
# dependency. A tree of another commit at the same path rebuilds only the
# workspace's crates (deploy/repro-check.sh and make previous-package
# share the dependencies this way).
#
# The copy is brought to the tree by content (deploy/copy-tree.sh): cargo
# takes a workspace crate for built by its files' times, so a copy must
# never carry a time older than a build from another tree.
# Usage: build-copy.sh TARGET_DIR COMMIT|worktree TARGET...   (from the repository's root)
set -eu
target=$1 commit=$2
shift 2
[ "$commit" != worktree ] || commit=""
copy=$target-tree
[ -z "$commit" ] || deploy/need-commit.sh "$commit"
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct ${commit:+"$commit"})
SOURCE_COMMIT=$(git log -1 --format=%H ${commit:+"$commit"})
# The C compilers' time in `make static`: the last change to Cargo.lock.
LOCK_DATE_EPOCH=$(git log -1 --format=%ct ${commit:+"$commit"} -- Cargo.lock)
export SOURCE_DATE_EPOCH SOURCE_COMMIT LOCK_DATE_EPOCH
deploy/copy-tree.sh "${commit:-worktree}" "$copy"
make --no-print-directory -C "$copy" "$@" CARGO_TARGET_DIR="$target" STATIC_IN_PLACE=1
