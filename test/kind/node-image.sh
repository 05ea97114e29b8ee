#!/usr/bin/env bash
# Builds pleg-nri-test/kind-node:<k8s version>, an offline stand-in for kindest/node: `kind build
# node-image` fetches from registries and cannot run here, so this does its steps by hand.
#   - the base: pleg-nri-test/debian-base (systemd and the userland from Debian) with kind's own base
#     files (entrypoint, units, containerd config: images/base/files of the sigs.k8s.io/kind module)
#     and containerd, runc, crictl and the CNI plugins from the dependency cache;
#   - kubelet, kubeadm, kubectl in /usr/bin, built from the Go module proxy;
#   - the images `kubeadm config images list` names (kube-apiserver, kube-controller-manager,
#     kube-scheduler, kube-proxy, etcd, CoreDNS, pause), each a single layer around its binary built from
#     the proxy (kube-proxy: on the Debian base, for iptables; hack/iptables-image.sh), and the busybox
#     test image, imported into the node's containerd pinned, as kind does;
#   - /kind/version, a static bridge CNI config (kindnetd is not on the proxy: the kind config of the
#     tests sets disableDefaultCNI), and a pre-entrypoint that makes the cgroups writable where Docker
#     cannot run the node --privileged (see hack/docker-shim/docker).
# make e2e-kind's clusters run no kube-proxy (kubeProxyMode none); make e2e-cluster's run the one here.
#
# Cached: the image carries org.pleg-nri.inputs-sha256 (this script, the files it adds, the binaries,
# the base image); nothing is rebuilt when that matches.
#
# Usage: node-image.sh [K8S_VERSION]   (default v1.37.2; prints the image name)
# Env:   PLEG_NRI_CACHE                cache root (default /var/cache/pleg-nri)
#        KIND_VERSION                  the sigs.k8s.io/kind module whose base files are used (v0.33.0)
set -euo pipefail

K8S_VERSION=${1:-v1.37.2}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
CACHE=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}
export PLEG_NRI_CACHE=$CACHE
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
IMAGE=pleg-nri-test/kind-node:$K8S_VERSION
LABEL=org.pleg-nri.inputs-sha256

log() { echo "node-image: $*" >&2; }
die() { echo "node-image: ERROR: $*" >&2; exit 1; }
# shellcheck source=../../hack/retry.sh
. "$root/hack/retry.sh"

[ "$(id -u)" = 0 ] || die "must run as root"
command -v docker >/dev/null || die "docker is not on PATH"
export GOFLAGS=-buildvcs=false

# Everything the image is made of, built or found in the cache.
# Each step stops the script with its own error (a failure inside a process substitution would not).
base=$(bash "$root/test/images/debian-base.sh") || die "building the Debian base image failed"
bash "$root/test/containerd-it/hack/install-deps.sh" >/dev/null || die "building containerd, runc, crictl and CNI failed"
kubelet=$(KUBELET_VERSION=$K8S_VERSION bash "$root/test/kubelet-e2e/hack/build-kubelet.sh") || die "building the kubelet $K8S_VERSION failed"
k8s=$(K8S_VERSION=$K8S_VERSION bash "$here/hack/build-k8s.sh") || die "building Kubernetes $K8S_VERSION failed"
mapfile -t images < <("$k8s/kubeadm" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null)
[ ${#images[@]} -ge 5 ] || die "kubeadm config images list gave: ${images[*]}"
etcd_version= coredns_version= pause_image=
for i in "${images[@]}"; do
	case $i in
	*/etcd:*) etcd_version=v${i##*:} ;;
	*/coredns:*) coredns_version=${i##*:} ;;
	*/pause:*) pause_image=$i ;;
	esac
done
etcd_version=${etcd_version%-*} # 3.7.0-0 is etcd v3.7.0, image revision 0
out=$(bash "$here/hack/build-addons.sh" "$etcd_version" "$coredns_version") || die "building etcd and CoreDNS failed"
mapfile -t addons <<<"$out"
out=$(cd "$root" && go run ./test/containerd-it/cmd/build-images) || die "building the test images failed"
mapfile -t archives <<<"$out"
pause_archive=$(printf '%s\n' "${archives[@]}" | grep '_pause_')
busybox_archive=$(printf '%s\n' "${archives[@]}" | grep '_busybox_')
[ "$pause_image" = "registry.k8s.io/pause:3.10.2" ] ||
	die "kubeadm $K8S_VERSION wants $pause_image; the test pause image is registry.k8s.io/pause:3.10.2"
kind_src=$(cd "$CACHE" && GOFLAGS=-mod=mod go_mod_dir "sigs.k8s.io/kind@$KIND_VERSION") || die "cannot download sigs.k8s.io/kind@$KIND_VERSION"
[ -d "$kind_src/images/base/files" ] || die "no images/base/files in sigs.k8s.io/kind@$KIND_VERSION"

bins=("$CACHE"/bin/{containerd,ctr,containerd-shim-runc-v2,runc,crictl} "$CACHE"/bin/cni/*
	"$kubelet" "$k8s"/{kubeadm,kubectl,kube-apiserver,kube-controller-manager,kube-scheduler,kube-proxy} "${addons[@]}")
hash=$(
	{
		grep -v '^[[:space:]]*#' "${BASH_SOURCE[0]}"
		find "$here/node" "$here/images" "$here/hack/iptables-image.sh" "$kind_src/images/base/files" -type f | sort | xargs cat
		docker image inspect -f '{{.Id}}' "$base"
		for f in "${bins[@]}" "${archives[@]}"; do sha256sum "$(readlink -f "$f")" | cut -c1-64; done | sort
		printf '%s\n' "${images[@]}"
	} | sha256sum | cut -c1-64
)
current() {
	[ "$(docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$IMAGE" 2>/dev/null || true)" = "$hash" ]
}
if current; then
	log "$IMAGE is current (inputs sha256 ${hash:0:12})"
	echo "$IMAGE"
	exit 0
fi
exec 9>"$CACHE/.kind-node.lock"
flock 9
if current; then
	echo "$IMAGE"
	exit 0
fi

start=$SECONDS
ctx=$(mktemp -d)
build_ctr=pleg-nri-kind-node-build-$$
cleanup() {
	docker rm -f -v "$build_ctr" >/dev/null 2>&1 || true
	for i in "${images[@]}"; do docker rmi "$i" >/dev/null 2>&1 || true; done
	docker rmi "$IMAGE-base" >/dev/null 2>&1 || true
	rm -rf "$ctx"
}
trap cleanup EXIT

# 1. The control plane images: one layer each, the binary and what it needs to run as a static pod.
log "building the control plane images ${images[*]}"
mkdir -p "$ctx/archives"
for i in "${images[@]}"; do
	name=${i%:*}
	name=${name##*/}
	layer=$ctx/layer-$name
	mkdir -p "$layer/usr/local/bin" "$layer/etc" "$layer/tmp" "$layer/var/run"
	chmod 1777 "$layer/tmp"
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n' >"$layer/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$layer/etc/group"
	entry=
	case $name in
	kube-apiserver | kube-controller-manager | kube-scheduler)
		cp "$k8s/$name" "$layer/usr/local/bin/$name"
		entry=/usr/local/bin/$name
		;;
	etcd)
		cp "${addons[0]}" "$layer/usr/local/bin/etcd"
		entry=/usr/local/bin/etcd
		;;
	coredns)
		cp "${addons[1]}" "$layer/coredns"
		entry=/coredns
		;;
	pause) continue ;; # the test pause image (an OCI archive) is imported as it is
	kube-proxy)
		# kube-proxy runs iptables: the Debian base with the backend wrapper.
		bash "$here/hack/iptables-image.sh" "$base" "$k8s/kube-proxy" "$i" "$ctx/archives/$name.tar" ||
			die "building the image $i failed"
		rm -rf "$layer"
		continue
		;;
	*) die "no recipe for image $i" ;;
	esac
	tar --numeric-owner -C "$layer" -cf "$layer.tar" .
	docker import --change "ENTRYPOINT [\"$entry\"]" \
		--change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' "$layer.tar" "$i" >/dev/null
	docker save -o "$ctx/archives/$name.tar" "$i"
	rm -rf "$layer" "$layer.tar"
done
cp "$pause_archive" "$ctx/archives/pause.tar"
cp "$busybox_archive" "$ctx/archives/busybox.tar"

# 2. The base: Debian with systemd, kind's base files, the runtime and the Kubernetes binaries.
log "assembling the node's file system"
mkdir -p "$ctx/files" "$ctx/bin" "$ctx/sbin" "$ctx/usrbin" "$ctx/cni"
cp -r "$kind_src/images/base/files/." "$ctx/files/"
chmod -R u+w "$ctx/files"
for b in containerd ctr containerd-shim-runc-v2 crictl; do cp "$(readlink -f "$CACHE/bin/$b")" "$ctx/bin/"; done
cp "$(readlink -f "$CACHE/bin/runc")" "$ctx/sbin/runc"
for c in "$CACHE"/bin/cni/*; do cp "$(readlink -f "$c")" "$ctx/cni/$(basename "$c")"; done
cp "$kubelet" "$k8s/kubeadm" "$k8s/kubectl" "$ctx/usrbin/"
cp "$here"/node/* "$ctx/"
# containerd's base OCI spec for pods, as kind's Dockerfile makes it: the product files hook added,
# rlimits removed.
"$CACHE/bin/ctr" oci spec | python3 -c '
import json, sys
spec = json.load(sys.stdin)
spec.setdefault("hooks", {}).setdefault("createContainer", []).append({"path": "/kind/bin/mount-product-files.sh"})
spec["process"].pop("rlimits", None)
json.dump(spec, sys.stdout, indent=2)' >"$ctx/cri-base.json"
cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $base
COPY files/usr/local/bin/ /usr/local/bin/
COPY files/kind/ /kind/
COPY files/etc/ /etc/
COPY files/LICENSES/ /LICENSES/
COPY bin/ /usr/local/bin/
COPY sbin/ /usr/local/sbin/
COPY cni/ /opt/cni/bin/
COPY usrbin/ /usr/bin/
COPY cri-base.json /etc/containerd/cri-base.json
COPY 10-pods.conflist /etc/cni/net.d/10-pods.conflist
COPY pre-entrypoint.sh /usr/local/bin/pleg-nri-pre-entrypoint
RUN chmod 0755 /kind /kind/bin /kind/bin/* /usr/local/bin/* /usr/local/sbin/runc /usr/bin/kubelet \\
      /usr/bin/kubeadm /usr/bin/kubectl /opt/cni/bin/* \\
 && sed -i 's|sandbox_image = .*|sandbox_image = "$pause_image"|' /etc/containerd/config.toml \\
 && mkdir -p /etc/systemd/system/multi-user.target.wants /etc/kubernetes/manifests /var/lib/containerd \\
 && ln -sf /etc/systemd/system/kubelet.service /etc/systemd/system/multi-user.target.wants/kubelet.service \\
 && ln -sf /etc/systemd/system/containerd.service /etc/systemd/system/multi-user.target.wants/containerd.service \\
 && ln -sf /etc/systemd/system/undo-mount-hacks.service /etc/systemd/system/multi-user.target.wants/undo-mount-hacks.service \\
 && ln -sf /dev/null /etc/systemd/system/systemd-binfmt.service \\
 && echo "$K8S_VERSION" > /kind/version
DOCKERFILE
old_id=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
DOCKER_BUILDKIT=0 docker build -q -t "$IMAGE-base" "$ctx" >/dev/null 2>"$ctx/build.err" || {
	cat "$ctx/build.err" >&2
	die "docker build of the node base failed"
}

# 3. The images into the node's containerd, pinned, without unpacking (kind's node image build does
# the same: the node unpacks on first use, on its /var volume), then commit.
log "importing the images into the node's containerd"
docker run -d --name "$build_ctr" --entrypoint sleep "$IMAGE-base" infinity >/dev/null
docker cp "$ctx/archives/." "$build_ctr:/kind/images/"
docker exec "$build_ctr" sh -c '
	set -e
	containerd >/tmp/containerd.log 2>&1 &
	pid=$!
	i=0
	until ctr version >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 300 ] || { cat /tmp/containerd.log; exit 1; }; sleep 0.1; done
	for a in /kind/images/*.tar; do
		ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests "$a"
	done
	ctr --namespace=k8s.io images list -q
	kill $pid; wait $pid || true
	rm -rf /kind/images /tmp/containerd.log' >"$ctx/import.log" 2>&1 || {
	cat "$ctx/import.log" >&2
	die "importing the images failed"
}
for i in "${images[@]}" docker.io/library/busybox:plegit; do
	grep -qxF "$i" "$ctx/import.log" || { cat "$ctx/import.log" >&2; die "$i is not in the node's containerd"; }
done
docker commit \
	--change 'ENTRYPOINT ["/usr/local/bin/pleg-nri-pre-entrypoint", "/usr/local/bin/entrypoint", "/sbin/init"]' \
	--change 'CMD []' \
	--change "LABEL $LABEL=$hash org.pleg-nri.kubernetes=$K8S_VERSION" \
	"$build_ctr" "$IMAGE" >/dev/null
[ -z "$old_id" ] || docker rmi "$old_id" >/dev/null 2>&1 || true
current || die "built $IMAGE does not carry the label $LABEL=$hash"
log "built $IMAGE in $((SECONDS - start))s"
echo "$IMAGE"
