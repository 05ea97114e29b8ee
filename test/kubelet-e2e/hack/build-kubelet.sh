#!/usr/bin/env bash
# Builds an unmodified kubelet from the Go module proxy into $PLEG_NRI_CACHE/kubelet-<version>, once per
# version (a second run builds nothing).
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod requires every staging module (k8s.io/api,
# k8s.io/client-go, ...) at v0.0.0 and replaces them with ./staging paths, which only work inside its own
# tree. So this makes a scratch module that requires k8s.io/kubernetes and replaces each of those staging
# modules with its published release (v0.X.Y for kubernetes v1.X.Y), then builds cmd/kubelet in it.
#
# Usage: build-kubelet.sh           (prints the kubelet's path on success)
# Env:   PLEG_NRI_CACHE             cache root (default /var/cache/pleg-nri)
#        KUBELET_VERSION            default v1.37.2. Supported: v1.35.x, v1.36.3, v1.37.2 (on the Go module
#                                   proxy). Each of them still defines the EventedPLEG gate in
#                                   pkg/features/kube_features.go (alpha, off by default; 1.37 makes it
#                                   depend on PLEGOnDemandRelist, GA there; checked below): 1.35 and 1.36 write each event's
#                                   status into the pod cache, 1.37 turns a STOPPED into a targeted relist
#                                   (k/k PR #139262).
set -euo pipefail

KUBELET_VERSION=${KUBELET_VERSION:-v1.37.2}
CACHE=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}
out="$CACHE/kubelet-$KUBELET_VERSION"

log() { echo "build-kubelet: $*" >&2; }
die() { echo "build-kubelet: ERROR: $*" >&2; exit 1; }
# shellcheck source=../../../hack/retry.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../../hack/retry.sh"

[[ $KUBELET_VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "KUBELET_VERSION must look like v1.36.3, not $KUBELET_VERSION"
staging_version="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
command -v go >/dev/null || die "go is not on PATH"
mkdir -p "$CACHE"

# A kubelet already built is there to take without the lock (a build moves its directory into place
# whole): the lock is held for the whole of a build of any version, so a run that only needs a cached
# kubelet would otherwise wait for another version's build.
if [ -f "$out/.done" ] && [ -x "$out/kubelet" ]; then
	echo "$out/kubelet"
	exit 0
fi
# A lock of its own: the build takes minutes and must not hold up install-deps.sh's lock.
exec 8>"$CACHE/.kubelet.lock"
flock 8

if [ -f "$out/.done" ] && [ -x "$out/kubelet" ]; then
	echo "$out/kubelet"
	exit 0
fi

export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local GOWORK=off
log "building kubelet $KUBELET_VERSION into $out (takes several minutes)"
start=$SECONDS
rm -rf "$out.tmp"
mkdir -p "$out.tmp/src"
# From the scratch directory: outside any module, so no go.mod or go.sum of the caller is touched.
src=$(cd "$out.tmp/src" && go_mod_dir "k8s.io/kubernetes@$KUBELET_VERSION") || die "cannot download k8s.io/kubernetes@$KUBELET_VERSION"
grep -q '^[[:space:]]*EventedPLEG[[:space:]]*featuregate.Feature' "$src/pkg/features/kube_features.go" ||
	die "k8s.io/kubernetes $KUBELET_VERSION has no EventedPLEG feature gate"

# Every module k8s.io/kubernetes replaces with a ./staging path, at its published release.
staging=$(sed -n 's|^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/k8s\.io/[a-z0-9-]*$|\1|p' "$src/go.mod")
[ -n "$staging" ] || die "found no staging replacements in $src/go.mod"
{
	echo "module pleg-nri.test/kubelet-build"
	echo
	echo "go $(go env GOVERSION | sed 's/^go//')"
	echo
	echo "require k8s.io/kubernetes $KUBELET_VERSION"
	echo
	echo "replace ("
	for m in $staging; do echo "	$m => $m $staging_version"; done
	echo ")"
} >"$out.tmp/src/go.mod"

# Each step with its own error (set -e does not apply inside a `( ... ) || die`). go get downloads
# every module the build needs: a failure of the build is the build's own.
retry go -C "$out.tmp/src" get "k8s.io/kubernetes/cmd/kubelet@$KUBELET_VERSION" >&2 ||
	die "go get k8s.io/kubernetes/cmd/kubelet@$KUBELET_VERSION failed"
pkg=k8s.io/component-base/version
CGO_ENABLED=0 go -C "$out.tmp/src" build -trimpath -o "$out.tmp/kubelet" -ldflags "-s -w \
	-X $pkg.gitVersion=$KUBELET_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=${BASH_REMATCH[1]} \
	-X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z" \
	k8s.io/kubernetes/cmd/kubelet >&2 || die "building kubelet $KUBELET_VERSION failed"
"$out.tmp/kubelet" --version >&2 || die "the built kubelet does not run"
rm -rf "$out.tmp/src"
touch "$out.tmp/.done"
rm -rf "$out"
mv "$out.tmp" "$out"
log "built kubelet $KUBELET_VERSION in $((SECONDS - start))s"
echo "$out/kubelet"
