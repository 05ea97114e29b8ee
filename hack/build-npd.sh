#!/usr/bin/env bash
# build-npd.sh VERSION OUT: builds node-problem-detector VERSION (k8s.io/node-problem-detector, from the
# Go module proxy) to OUT, for make npd. Not `go install MODULE@VERSION`: that also lists the module's
# versions (for deprecations), which a proxy that serves only what it holds refuses (403 on @v/list);
# the module's own directory is built instead, as its main module (its go.mod has no replace
# directives). No cgo: the journald log watcher (build tag journald) is left out; deploy/npd needs only
# the custom plugin monitor. Nothing of it goes into pleg-nri's go.mod.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/retry.sh"
version=$1 out=$2
die() { echo "build-npd: $*" >&2; exit 1; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
src=$(cd "$scratch" && go_mod_dir "k8s.io/node-problem-detector@$version") || die "cannot download k8s.io/node-problem-detector@$version"
mkdir -p "$(dirname "$out")"
(cd "$src" && CGO_ENABLED=0 retry go build -trimpath -o "$out.tmp" \
	-ldflags "-X k8s.io/node-problem-detector/pkg/version.version=$version" ./cmd/nodeproblemdetector) || die "go build failed"
mv "$out.tmp" "$out"
