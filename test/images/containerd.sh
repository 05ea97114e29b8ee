#!/usr/bin/env bash
# Builds pleg-nri-test/containerd:<containerd version> without a registry: pleg-nri-test/debian-base
# (debian-base.sh) plus containerd, ctr, the runc shim, runc, crictl and the CNI plugins from the
# dependency cache (test/containerd-it/hack/install-deps.sh) and the test images' OCI archives (the
# harness builds them: harness.BuildImages), with an entrypoint that makes cgroups writable and nests
# them (containerd/entrypoint.sh).
#
# Cached: the image carries org.pleg-nri.inputs-sha256, the hash of this script's code, the files under
# containerd/, every binary and archive it copies, and the base image's id; nothing is built when the
# image of that name has the label of the current inputs.
#
# Usage: containerd.sh ARCHIVE...   (the test images' OCI archives; prints the image name on success)
# Env:   PLEG_NRI_CACHE             cache root (default /var/cache/pleg-nri)
#
# Run it on its own (a developer without a native containerd; the sockets appear in ./run):
#   docker run -d --name containerd --privileged --cgroupns=private --tmpfs /run --tmpfs /tmp \
#     -v /var/lib/containerd -v "$PWD/run:/run/containerd" pleg-nri-test/containerd:v2.4.2
set -euo pipefail

CACHE=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LABEL=org.pleg-nri.inputs-sha256

log() { echo "containerd-image: $*" >&2; }
die() { echo "containerd-image: ERROR: $*" >&2; exit 1; }

[ $# -gt 0 ] || die "usage: containerd.sh ARCHIVE... (the test images' OCI archives)"
bins=(containerd ctr containerd-shim-runc-v2 runc crictl)
for b in "${bins[@]}"; do
	[ -x "$CACHE/bin/$b" ] || die "$CACHE/bin/$b is missing: run test/containerd-it/hack/install-deps.sh"
done
cnis=("$CACHE"/bin/cni/*)
[ -e "${cnis[0]}" ] || die "no CNI plugins in $CACHE/bin/cni"
version=$("$CACHE/bin/containerd" --version | awk '{print $3}' | sed 's/+.*//')
[ -n "$version" ] || die "cannot tell the version of $CACHE/bin/containerd"
IMAGE=${PLEG_NRI_CONTAINERD_IMAGE:-pleg-nri-test/containerd:v$version}

base=$(bash "$here/debian-base.sh") || die "building the base image failed"
base_id=$(docker image inspect -f '{{.Id}}' "$base")

hash=$(
	{
		grep -v '^[[:space:]]*#' "${BASH_SOURCE[0]}"
		cat "$here"/containerd/*
		echo "$base_id"
		for f in "${bins[@]/#/$CACHE/bin/}" "${cnis[@]}" "$@"; do
			sha256sum "$(readlink -f "$f")" | cut -c1-64
		done | sort
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

mkdir -p "$CACHE"
exec 9>"$CACHE/.containerd-image.lock"
flock 9
if current; then
	echo "$IMAGE"
	exit 0
fi

start=$SECONDS
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin" "$ctx/cni" "$ctx/images"
for b in "${bins[@]}"; do cp "$(readlink -f "$CACHE/bin/$b")" "$ctx/bin/$b"; done
for c in "${cnis[@]}"; do cp "$(readlink -f "$c")" "$ctx/cni/$(basename "$c")"; done
for a in "$@"; do cp "$a" "$ctx/images/"; done
cp "$here"/containerd/* "$ctx/"
cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $base
COPY bin/ /usr/local/bin/
COPY cni/ /opt/cni/bin/
COPY images/ /opt/pleg-nri/images/
COPY config.toml /etc/containerd/config.toml
COPY 10-pods.conflist /etc/cni/net.d/10-pods.conflist
COPY crictl.yaml /etc/crictl.yaml
COPY entrypoint.sh /usr/local/bin/entrypoint
COPY run-containerd.sh /usr/local/bin/run-containerd
RUN mkdir -p /var/lib/containerd
VOLUME /var/lib/containerd
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/entrypoint"]
CMD ["/usr/local/bin/run-containerd"]
LABEL $LABEL=$hash org.pleg-nri.containerd=v$version
DOCKERFILE
old_id=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
log "building $IMAGE"
# The classic builder: it never contacts a registry for a base image that is here.
DOCKER_BUILDKIT=0 docker build -q -t "$IMAGE" "$ctx" >/dev/null 2>"$ctx/build.err" || {
	cat "$ctx/build.err" >&2
	die "docker build failed"
}
current || die "built $IMAGE does not carry the label $LABEL=$hash"
# The previous build, now untagged (kept if a container still uses it).
[ -z "$old_id" ] || docker rmi "$old_id" >/dev/null 2>&1 || true
log "built $IMAGE in $((SECONDS - start))s"
echo "$IMAGE"
