#!/bin/sh
# The failure deploy/build-copy.sh exists to prevent, played with the real
# cargo on a workspace of two crates: a copy built from one commit, then
# brought to a later commit whose changed file carries an older time (git
# archive gives a file its commit's time; a checkout, the time it was
# written) than the first build's outputs. Cargo takes a workspace crate
# as fresh when none of its files is newer than its last build, so a copy
# that kept those times would link the first commit's crate. Passes when
# the second build runs the second commit's code, and when a third call on
# the same commit rebuilds nothing (what the copy keeps is worth keeping).
# Usage: build-copy-test.sh   (from the repository's root; needs cargo, git, rsync)
set -eu
here=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
repo=$work/repo
mkdir -p "$repo/deploy" "$repo/a/src" "$repo/b/src"
cp deploy/build-copy.sh deploy/copy-tree.sh deploy/need-commit.sh "$repo/deploy/"
cd "$repo"
printf '[workspace]\nmembers = ["a", "b"]\nresolver = "2"\n' > Cargo.toml
printf '[package]\nname = "a"\nversion = "0.1.0"\nedition = "2021"\n' > a/Cargo.toml
printf '[package]\nname = "b"\nversion = "0.1.0"\nedition = "2021"\n[dependencies]\na = { path = "../a" }\n' > b/Cargo.toml
echo 'fn main() { println!("{}", a::which()); }' > b/src/main.rs
printf 'run:\n\tcargo run --quiet --offline -p b > said\n' > Makefile
echo 'pub fn which() -> &'"'"'static str { "first" }' > a/src/lib.rs
git init --quiet && git add . 
# Both commits are dated well before the first build (as a checkout or an
# archive of an older commit is).
GIT_COMMITTER_DATE=2020-01-01T00:00:00Z git -c user.name=t -c user.email=t@t commit --quiet -m first --date 2020-01-01T00:00:00Z
first=$(git rev-parse HEAD)
echo 'pub fn which() -> &'"'"'static str { "second" }' > a/src/lib.rs
GIT_COMMITTER_DATE=2020-01-02T00:00:00Z git -c user.name=t -c user.email=t@t commit --quiet -am second --date 2020-01-02T00:00:00Z
second=$(git rev-parse HEAD)
said() { cat "$work/target-tree/said"; }
deploy/build-copy.sh "$work/target" "$first" run
[ "$(said)" = first ] || { echo "build-copy-test: the first commit's build said '$(said)'" >&2; exit 1; }
deploy/build-copy.sh "$work/target" "$second" run
[ "$(said)" = second ] || {
    echo "build-copy-test: the second commit's build ran the first commit's crate ('$(said)')" >&2; exit 1; }
built=$(stat -c %Y "$work/target/debug/b")
sleep 1
deploy/build-copy.sh "$work/target" "$second" run
[ "$(stat -c %Y "$work/target/debug/b")" = "$built" ] || {
    echo "build-copy-test: the same commit again was built again" >&2; exit 1; }
cd "$here"
echo "build-copy-test: a copy brought to another commit builds that commit's crates; the same commit again builds nothing"
