#!/usr/bin/env bash
# Builds etcd and CoreDNS at the versions kubeadm of K8S_VERSION lists (`kubeadm config images list`)
# from the Go module proxy into $PLEG_NRI_CACHE/etcd-<version> and coredns-<version>, once each.
#
# etcd's server module replaces its sibling modules with ../ paths, so it cannot be `go install`ed:
# a scratch module requires it (a dependency's replace directives do not apply) and builds it.
#
# Usage: build-addons.sh ETCD_VERSION COREDNS_VERSION   (e.g. v3.7.0 v1.14.6; prints both paths)
# Env:   PLEG_NRI_CACHE             cache root (default /var/cache/pleg-nri)
set -euo pipefail

[ $# -eq 2 ] || { echo "usage: build-addons.sh ETCD_VERSION COREDNS_VERSION" >&2; exit 2; }
ETCD_VERSION=$1
COREDNS_VERSION=$2
CACHE=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}

log() { echo "build-addons: $*" >&2; }
die() { echo "build-addons: ERROR: $*" >&2; exit 1; }
# shellcheck source=../../../hack/retry.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../../hack/retry.sh"
command -v go >/dev/null || die "go is not on PATH"
mkdir -p "$CACHE"
exec 8>"$CACHE/.addons.lock"
flock 8
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0

out="$CACHE/etcd-$ETCD_VERSION"
if [ ! -f "$out/.done" ]; then
	log "building etcd $ETCD_VERSION into $out"
	start=$SECONDS
	rm -rf "$out.tmp"
	mkdir -p "$out.tmp/src"
	printf 'module pleg-nri.test/etcd-build\n\ngo %s\n' "$(go env GOVERSION | sed 's/^go//')" >"$out.tmp/src/go.mod"
	retry go -C "$out.tmp/src" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2 ||
		die "go get go.etcd.io/etcd/server/v3@$ETCD_VERSION failed"
	go -C "$out.tmp/src" build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3 >&2 ||
		die "building etcd $ETCD_VERSION failed"
	"$out.tmp/etcd" --version >&2 || die "the built etcd does not run"
	rm -rf "$out.tmp/src"
	touch "$out.tmp/.done"
	rm -rf "$out"
	mv "$out.tmp" "$out"
	log "built etcd $ETCD_VERSION in $((SECONDS - start))s"
fi
echo "$out/etcd"

out="$CACHE/coredns-$COREDNS_VERSION"
if [ ! -f "$out/.done" ]; then
	log "building coredns $COREDNS_VERSION into $out"
	start=$SECONDS
	rm -rf "$out.tmp"
	mkdir -p "$out.tmp"
	# go install downloads and builds in one: a failed build is tried again too (from the build cache).
	GOBIN="$out.tmp" retry go -C "$out.tmp" install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION" >&2 ||
		die "building coredns $COREDNS_VERSION failed"
	"$out.tmp/coredns" -version >&2 || die "the built coredns does not run"
	touch "$out.tmp/.done"
	rm -rf "$out"
	mv "$out.tmp" "$out"
	log "built coredns $COREDNS_VERSION in $((SECONDS - start))s"
fi
echo "$out/coredns"
