#!/usr/bin/env bash
# make e2e-kind: builds what is missing (cached: the node image, kind, kubectl, pleg-nri), then runs
# test/kind/cmd/e2e-kind with kind's docker provider, once per Kubernetes version given.
#
# Usage: e2e.sh [K8S_VERSION...]     (default: v1.37.2 v1.36.3)
# Env:   PLEG_NRI_CACHE              cache root (default /var/cache/pleg-nri)
#        KIND_VERSION                default v0.33.0
#        PLEG_NRI_BINARY             a pleg-nri binary to put in the node instead of building this tree's
#        PLEG_NRI_E2E_KEEP           keep the clusters (to look into a failure)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
CACHE=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}
# shellcheck source=../../hack/retry.sh
. "$root/hack/retry.sh"
KIND_VERSION=${KIND_VERSION:-v0.33.0}
export PLEG_NRI_CACHE=$CACHE GOFLAGS=-buildvcs=false
[ $# -gt 0 ] || set -- v1.37.2 v1.36.3

log() { echo "e2e-kind: $*" >&2; }
die() { echo "e2e-kind: ERROR: $*" >&2; exit 1; }

kind=$CACHE/kind-$KIND_VERSION/kind
if [ ! -x "$kind" ]; then
	log "building kind $KIND_VERSION"
	rm -rf "$kind.tmp"
	GOBIN=$(dirname "$kind").tmp GOTOOLCHAIN=local retry go -C "$CACHE" install "sigs.k8s.io/kind@$KIND_VERSION" ||
		die "building kind failed"
	mv "$(dirname "$kind").tmp" "$(dirname "$kind")"
fi
cd "$root"
# The kind config mounts bin/pleg-nri into the node: this tree's, or PLEG_NRI_BINARY (a release, say).
if [ -n "${PLEG_NRI_BINARY:-}" ]; then
	install -m 0755 "$PLEG_NRI_BINARY" bin/pleg-nri
else
	CGO_ENABLED=0 go build -o bin/pleg-nri ./cmd/pleg-nri
fi
go build -o bin/e2e-kind ./test/kind/cmd/e2e-kind
# kind's docker provider runs its nodes --privileged; the shim stands in for the flags where the
# engine cannot grant every capability (it passes everything through where it can).
export PATH=$here/hack/docker-shim:$PATH
# kind's entrypoint picks fuse-overlayfs when the node's root is on FUSE (Docker's fuse-overlayfs
# storage driver here) and the image has no fuse-overlayfs snapshotter; containerd's root is on the
# node's /var volume, where overlayfs works.
export KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER=${KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER:-overlayfs}

# Every version runs, whatever the ones before gave; the run fails if one failed.
failed=()
for v in "$@"; do
	start=$SECONDS
	image=$(bash "$here/node-image.sh" "$v")
	log "node image $image ready in $((SECONDS - start))s"
	kubectl=$(K8S_VERSION=$v bash "$here/hack/build-k8s.sh")/kubectl
	start=$SECONDS
	if bin/e2e-kind -kind "$kind" -kubectl "$kubectl" -image "$image"; then
		log "Kubernetes $v passed in $((SECONDS - start))s"
	else
		log "Kubernetes $v FAILED after $((SECONDS - start))s"
		failed+=("$v")
	fi
done
[ ${#failed[@]} -eq 0 ] || die "failed on ${failed[*]}"
