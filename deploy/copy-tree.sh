#!/bin/sh
# Brings COPY to a tree by content: COMMIT's, or for `worktree` this working
# tree as it is (tracked and new files, changes included, without what git
# ignores). COPY's own target/, .git and .venv stay as they are.
#
# Cargo takes a workspace crate as fresh when none of its files is newer
# than what it built last (cargo's fingerprint of path sources is the
# mtime of its dep-info file), so a copy must never carry a file time
# older than a build from another tree: an archive's or a checkout's times
# are (git archive gives the commit's time, tar keeps the working tree's),
# and cargo then links the other tree's crates. The copy is therefore
# brought to the tree by content (rsync --checksum, without keeping times):
# a file that changed, or is new, is written now and so newer than any
# build; a file with the same bytes keeps its time, and what depends only
# on such files stays built (deploy/build-copy-test.sh plays both).
# Usage: copy-tree.sh COMMIT|worktree COPY   (from the repository's root)
set -eu
commit=$1 copy=$2
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
if [ "$commit" != worktree ]; then
    git archive "$commit" | tar -x -C "$tree"
else
    git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -x -C "$tree"
fi
# The copy's root as a clone's is (mktemp makes it 0700): the tests' unprivileged
# processes read the tree.
chmod 0755 "$tree"
mkdir -p "$copy"
rsync --recursive --links --perms --checksum --delete \
    --exclude=/target --exclude=/.git --exclude=/.venv "$tree/" "$copy/"
