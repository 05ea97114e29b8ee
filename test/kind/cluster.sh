#!/usr/bin/env bash
# make e2e-cluster: builds what is missing (cached: the node image with kube-proxy, kind, kubectl;
# nodenet's image is built every run, in seconds), then runs test/kind/cmd/e2e-cluster with kind's docker
# provider: a cluster of one control plane and two workers, pod networking by nodenet, kubeadm's
# kube-proxy, pleg-nri on every node by the Helm chart, workloads on every node, a rolling upgrade and a
# rollback, helm uninstall; crash to restart per setup and per node, written to
# docs/e2e-cluster-$K8S_VERSION.md. Offline: everything comes from the Go module proxy and Debian's archive.
#
# Usage: cluster.sh                  (run by make e2e-cluster, which builds the pleg-nri image and helm)
# Env:   K8S_VERSION                 default v1.37.2
#        PLEG_NRI_IMAGE_TAR          pleg-nri's image (make image; default bin/pleg-nri-image.tar)
#        PLEG_NRI_HELM               helm (make helm)
#        PLEG_NRI_PROMETHEUS         prometheus (make prometheus): run it against the cluster (none: no Prometheus)
#        PLEG_NRI_CACHE              cache root (default /var/cache/pleg-nri)
#        KIND_VERSION                default v0.33.0
#        PLEG_NRI_E2E_KEEP           keep the cluster (to look into a failure)
#        PLEG_NRI_CONFORMANCE        1: instead of the rest, upstream's [sig-node] [Conformance] specs of
#                                    e2e.test (built at K8S_VERSION into the cache) on the cluster per setup
#                                    (GenericPLEG, containerd's stream, pleg-nri), written to
#                                    docs/e2e-cluster-conformance-$K8S_VERSION.{md,json} (make e2e-cluster-conformance)
#        CONFORMANCE_PROCS           ginkgo's parallel processes (default 4)
#        PLEG_NRI_REGISTRY           with PLEG_NRI_CONFORMANCE: the registry binary (make builds it) serving the
#                                    built images to the specs that pull, on the kind network's gateway
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
CACHE=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}
# shellcheck source=../../hack/retry.sh
. "$root/hack/retry.sh"
K8S_VERSION=${K8S_VERSION:-v1.37.2}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
export PLEG_NRI_CACHE=$CACHE GOFLAGS=-buildvcs=false

log() { echo "e2e-cluster: $*" >&2; }
die() { echo "e2e-cluster: ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (the node image is built with debootstrap)"
cd "$root"
image_tar=${PLEG_NRI_IMAGE_TAR:-bin/pleg-nri-image.tar}
helm=${PLEG_NRI_HELM:-}
[ -f "$image_tar" ] || die "no pleg-nri image at $image_tar (make image)"
[ -x "$helm" ] || die "no helm at '$helm' (make helm; PLEG_NRI_HELM)"
plegnri_image=$(tar -xOf "$image_tar" manifest.json | sed -n 's/.*"RepoTags":\["\([^"]*\)"\].*/\1/p')
[ -n "$plegnri_image" ] || die "no image name in $image_tar"

kind=$CACHE/kind-$KIND_VERSION/kind
if [ ! -x "$kind" ]; then
	log "building kind $KIND_VERSION"
	rm -rf "$(dirname "$kind").tmp"
	GOBIN=$(dirname "$kind").tmp GOTOOLCHAIN=local retry go -C "$CACHE" install "sigs.k8s.io/kind@$KIND_VERSION" ||
		die "building kind failed"
	mv "$(dirname "$kind").tmp" "$(dirname "$kind")"
fi
start=$SECONDS
node_image=$(bash "$here/node-image.sh" "$K8S_VERSION") || die "building the node image failed"
log "node image $node_image ready in $((SECONDS - start))s"
kubectl=$(K8S_VERSION=$K8S_VERSION bash "$here/hack/build-k8s.sh")/kubectl || die "building kubectl failed"
base=$(bash "$root/test/images/debian-base.sh") || die "building the Debian base image failed"

# nodenet: this tree's, in an image of its own, removed again at the end.
tmp=$(mktemp -d)
nodenet_image=pleg-nri-test/nodenet:e2e-cluster
trap 'docker rmi "$nodenet_image" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
CGO_ENABLED=0 go build -trimpath -o "$tmp/nodenet" ./test/kind/cmd/nodenet || die "building nodenet failed"
bash "$here/hack/iptables-image.sh" "$base" "$tmp/nodenet" "$nodenet_image" "$tmp/nodenet.tar" ||
	die "building nodenet's image failed"
go build -o "$tmp/e2e-cluster" ./test/kind/cmd/e2e-cluster || die "building the driver failed"
# The rolling upgrade's image: the same tree, another version of the binary, under the same name.
upgrade_image=${plegnri_image%%:*}:cluster-upgrade
trap 'docker rmi "$nodenet_image" "$upgrade_image" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
VERSION=cluster-upgrade bash deploy/image/build.sh "$upgrade_image" "$tmp/upgrade.tar" >/dev/null ||
	die "building the upgrade image failed"
# pleg-nri's kubelet-config command, copied to the nodes to put their kubelets on containerd's stream.
CGO_ENABLED=0 go build -trimpath -o "$tmp/pleg-nri" ./cmd/pleg-nri || die "building pleg-nri failed"

conformance=()
if [ "${PLEG_NRI_CONFORMANCE:-}" = 1 ]; then
	suite=$(E2E_SUITE=e2e KUBELET_VERSION=$K8S_VERSION bash test/e2e-node/hack/build-e2e-node.sh) ||
		die "building e2e.test $K8S_VERSION failed"
	commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
	[ -z "$(git status --porcelain 2>/dev/null)" ] || commit="$commit+changes"
	conformance=(-conformance "$suite" -conformance-report "docs/e2e-cluster-conformance-$K8S_VERSION.md"
		-conformance-procs "${CONFORMANCE_PROCS:-4}" -cache "$CACHE" -commit "$commit" ${PLEG_NRI_REGISTRY:+-registry "$PLEG_NRI_REGISTRY"})
fi

# kind's docker provider runs its nodes --privileged: the shim stands in where the engine cannot grant
# every capability (make e2e-kind does the same). kind's entrypoint would pick fuse-overlayfs here.
export PATH=$here/hack/docker-shim:$PATH
export KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER=${KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER:-overlayfs}
start=$SECONDS
if "$tmp/e2e-cluster" -kind "$kind" -kubectl "$kubectl" -helm "$helm" -image "$node_image" \
	-nodenet-image-tar "$tmp/nodenet.tar" -nodenet-image "$nodenet_image" \
	-pleg-nri-image-tar "$image_tar" -pleg-nri-image "$plegnri_image" -chart deploy/helm/pleg-nri \
	-upgrade-image-tar "$tmp/upgrade.tar" -upgrade-image "$upgrade_image" -pleg-nri-bin "$tmp/pleg-nri" \
	-k8s-version "$K8S_VERSION" -report "docs/e2e-cluster-$K8S_VERSION.md" ${PLEG_NRI_PROMETHEUS:+-prometheus "$PLEG_NRI_PROMETHEUS"} \
	"${conformance[@]}"; then
	log "Kubernetes $K8S_VERSION passed in $((SECONDS - start))s"
else
	die "Kubernetes $K8S_VERSION FAILED after $((SECONDS - start))s"
fi
