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
# Cargo takes a workspace crate as fresh when none of its files is newer
# than what it built last (cargo's fingerprint of path sources is the
# mtime of its dep-info file), so the copy must never carry a file time
# older than a build from another tree: an archive's or a checkout's times
# are (git archive gives the commit's time, tar keeps the working tree's),
# and cargo then links the other tree's crates. The copy is therefore
# brought to the tree by content (rsync --checksum, without keeping times):
# a file that changed, or is new, is written now and so newer than any
# build; a file with the same bytes keeps its time, and what depends only
# on such files stays built.
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
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
if [ -n "$commit" ]; then
    git archive "$commit" | tar -x -C "$tree"
else
    git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -x -C "$tree"
fi
# The copy's own outputs (target/: packages, images) are not the tree's.
mkdir -p "$copy"
rsync --recursive --links --perms --checksum --delete --exclude=/target "$tree/" "$copy/"
make --no-print-directory -C "$copy" "$@" CARGO_TARGET_DIR="$target" STATIC_IN_PLACE=1
