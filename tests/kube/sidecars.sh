#!/bin/sh
# The CSI sidecars of sidecars.tsv (#43): each built from its own module at
# its pinned version, static (CGO_ENABLED=0) with its version stamped as its
# release's Makefile stamps it (main.version), into OUT/bin; each packed as
# OUT/NAME.oci.tar under the image name the manifests use, FROM scratch with
# the program as /NAME and its entrypoint, and packed again only when the
# program changed (nothing can be pulled here: cluster.sh imports these).
# A module whose go.mod replaces a module with a directory of its own
# release tree (external-snapshotter's ./client), which its module zip does
# not hold, is built in a copy of its tree with that directory filled from
# the replaced module at the same version: the release's tree again.
# Usage: sidecars.sh OUT   (make kube-tools; GOMODCACHE and GOCACHE set)
set -eu
out=$1 here=$(cd "$(dirname "$0")" && pwd)
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
mkdir -p "$out/bin"

# module_dir MODULE@VERSION: its directory in the module cache.
module_dir() {
    go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
}

grep -v '^#' "$here/sidecars.tsv" | while IFS='	' read -r image module version package; do
    name=${package##*/}
    if [ "$module" = . ]; then
        source=$here
    else
        source=$(module_dir "$module@$version")
        locals=$(go mod edit -json "$source/go.mod" | python3 -c 'import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"]["Path"].startswith("."): print(r["New"]["Path"], r["Old"]["Path"])')
        if [ -n "$locals" ]; then
            tree=$out/src/$name
            rm -rf "$tree" && mkdir -p "$out/src" && cp -r "$source" "$tree"
            echo "$locals" | while read -r dir path; do
                rm -rf "${tree:?}/$dir" && cp -r "$(module_dir "$path@$version")" "$tree/$dir"
            done
            chmod -R u+w "$tree"
            source=$tree
        fi
    fi
    go build -C "$source" -trimpath -ldflags "-s -w -X main.version=$version" -o "$out/bin/$name" "$package"
    key=$(cat "$out/bin/$name" | sha256sum | cut -c1-16)
    [ "$(cat "$out/$name.key" 2>/dev/null)" != "$key $image" ] || continue
    c=$(buildah from --name "ebs-csi-test-$name-$$" scratch)
    buildah copy --quiet --chmod 0755 "$c" "$out/bin/$name" "/$name" >/dev/null
    buildah config --entrypoint "[\"/$name\"]" "$c"
    buildah commit --quiet --format oci --rm "$c" "oci-archive:$out/$name.oci.tar:$image" >/dev/null
    echo "$key $image" >"$out/$name.key"
done
