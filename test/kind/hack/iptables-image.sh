#!/usr/bin/env bash
# Builds an image for a program that runs in a kind node's network namespace and calls iptables
# (kube-proxy, nodenet): the Debian base image of the node (pleg-nri-test/debian-base, which has
# iptables, ip and conntrack from Debian), the program as /usr/local/bin/NAME, and
# test/kind/images/iptables-wrapper in front of every iptables tool so that the program writes its rules
# into the backend the node uses. Saved with docker save to TARBALL (for ctr import or kind load
# image-archive); the image stays in Docker too.
#
# Usage: iptables-image.sh BASE_IMAGE BINARY IMAGE TARBALL
set -euo pipefail

[ $# -eq 4 ] || { echo "usage: iptables-image.sh BASE_IMAGE BINARY IMAGE TARBALL" >&2; exit 2; }
base=$1 binary=$2 image=$3 tarball=$4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "iptables-image: ERROR: $*" >&2; exit 1; }

[ -x "$binary" ] || die "$binary is not an executable"
name=$(basename "$binary")
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$binary" "$ctx/$name"
cp "$here/images/iptables-wrapper" "$ctx/iptables-wrapper"
cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $base
COPY $name /usr/local/bin/$name
COPY iptables-wrapper /usr/local/sbin/iptables-wrapper
RUN chmod 0755 /usr/local/bin/$name /usr/local/sbin/iptables-wrapper \\
 && for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do \\
      ln -sf /usr/local/sbin/iptables-wrapper /usr/sbin/\$t; done
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/$name"]
CMD []
DOCKERFILE
DOCKER_BUILDKIT=0 docker build -q -t "$image" "$ctx" >/dev/null 2>"$ctx/build.err" || {
	cat "$ctx/build.err" >&2
	die "docker build of $image failed"
}
docker save -o "$tarball" "$image" || die "docker save $image failed"
