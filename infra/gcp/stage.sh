#!/bin/sh
# infra/gcp/stage.sh [DIR] — lays out the Cloud Functions source in DIR
# (default infra/gcp/build/source), as Google's Go buildpack wants it:
#
#   DIR/go.mod, go.sum, function.go   infra/gcp/function: the function
#                                     package at the root, module path
#                                     with a dot, replace labkeep => ./labkeep
#   DIR/labkeep/                      labkeep's committed tree (git archive HEAD,
#                                     about 3 MB; only what the function
#                                     imports is built)
#
# main.tf zips DIR and uploads it. Commit first: uncommitted changes are
# not in the archive.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$here/build/source}
rm -rf "$out"
mkdir -p "$out/labkeep"
git -C "$root" archive HEAD | tar -x -C "$out/labkeep"
cp "$here/function/go.mod" "$here/function/go.sum" "$here/function/function.go" "$out/"
(cd "$out" && go mod edit -replace labkeep=./labkeep)
echo "$out"
