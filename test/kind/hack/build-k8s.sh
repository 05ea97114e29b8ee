#!/usr/bin/env bash
# Builds the Kubernetes binaries a kind node needs besides the kubelet (kubeadm, kubectl and the control
# plane: kube-apiserver, kube-controller-manager, kube-scheduler; kube-proxy, which make e2e-cluster runs)
# from the Go module proxy into $PLEG_NRI_CACHE/k8s-<version>, once per version (a second run builds
# nothing; a cache from before a command was added here is built again). The kubelet comes from
# test/kubelet-e2e/hack/build-kubelet.sh.
#
# Same way as build-kubelet.sh (k8s.io/kubernetes cannot be `go install`ed): a scratch module that
# requires k8s.io/kubernetes and replaces every staging module with its published release; one `go
# build` of every command, so the packages they share compile once.
#
# Usage: build-k8s.sh               (prints the directory on success)
# Env:   PLEG_NRI_CACHE             cache root (default /var/cache/pleg-nri)
#        K8S_VERSION                default v1.37.2
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
CACHE=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}
out="$CACHE/k8s-$K8S_VERSION"
CMDS=(kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy)

log() { echo "build-k8s: $*" >&2; }
die() { echo "build-k8s: ERROR: $*" >&2; exit 1; }
# shellcheck source=../../../hack/retry.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../../hack/retry.sh"

[[ $K8S_VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "K8S_VERSION must look like v1.37.2, not $K8S_VERSION"
minor=${BASH_REMATCH[1]}
staging_version="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
command -v go >/dev/null || die "go is not on PATH"
mkdir -p "$CACHE"

exec 8>"$CACHE/.k8s-$K8S_VERSION.lock"
flock 8

complete() {
	[ -f "$out/.done" ] || return 1
	local c
	for c in "${CMDS[@]}"; do [ -x "$out/$c" ] || return 1; done
}
if complete; then
	echo "$out"
	exit 0
fi

export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local GOWORK=off
log "building ${CMDS[*]} $K8S_VERSION into $out (takes many minutes)"
start=$SECONDS
rm -rf "$out.tmp"
mkdir -p "$out.tmp/src"
src=$(cd "$out.tmp/src" && go_mod_dir "k8s.io/kubernetes@$K8S_VERSION") || die "cannot download k8s.io/kubernetes@$K8S_VERSION"
staging=$(sed -n 's|^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/k8s\.io/[a-z0-9-]*$|\1|p' "$src/go.mod")
[ -n "$staging" ] || die "found no staging replacements in $src/go.mod"
{
	echo "module pleg-nri.test/k8s-build"
	echo
	echo "go $(go env GOVERSION | sed 's/^go//')"
	echo
	echo "require k8s.io/kubernetes $K8S_VERSION"
	echo
	echo "replace ("
	for m in $staging; do echo "	$m => $m $staging_version"; done
	echo ")"
} >"$out.tmp/src/go.mod"

pkgs=()
for c in "${CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
# Each step on its own, each with its own error (set -e does not apply inside a `( ... ) || die`).
for p in "${pkgs[@]}"; do
	retry go -C "$out.tmp/src" get "$p@$K8S_VERSION" >&2 || die "go get $p@$K8S_VERSION failed"
done
pkg=k8s.io/component-base/version
# go get downloaded every module the build needs: a failure here is the build's own.
CGO_ENABLED=0 go -C "$out.tmp/src" build -trimpath -o "$out.tmp/" -ldflags "-s -w \
	-X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor \
	-X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z" \
	"${pkgs[@]}" >&2 || die "building ${CMDS[*]} $K8S_VERSION failed"
for c in "${CMDS[@]}"; do
	[ -x "$out.tmp/$c" ] || die "$c was not built"
done
"$out.tmp/kubeadm" version -o short >&2 || die "the built kubeadm does not run"
rm -rf "$out.tmp/src"
touch "$out.tmp/.done"
rm -rf "$out"
mv "$out.tmp" "$out"
log "built ${CMDS[*]} $K8S_VERSION in $((SECONDS - start))s"
echo "$out"
