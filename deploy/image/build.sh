#!/usr/bin/env bash
# make image: build the pleg-nri image offline and save it as a tarball that `docker load` and
# `ctr images import` both read.
#
#   deploy/image/build.sh IMAGE TARBALL
#
# The root of the image is staged in a temporary directory: /usr/local/bin/pleg-nri (static, CGO off),
# /bin/busybox (Debian's busybox-static, taken from its .deb, never installed on the host) with /bin/sh,
# and /opt/pleg-nri/ (what deploy/install.sh installs on a host, and the scripts themselves).
set -euo pipefail
image=${1:?usage: build.sh IMAGE TARBALL}
tarball=${2:?usage: build.sh IMAGE TARBALL}
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}
version=${VERSION:-dev}

# busybox-static: the harness's copy if it has one, else its .deb.
busybox=$(ls "$cache"/busybox-static-*/busybox 2>/dev/null | head -1 || true)
if [ -z "$busybox" ]; then
	dl=$(mktemp -d)
	chmod 0777 "$dl" # apt downloads as _apt
	# shellcheck source=../../hack/retry.sh
	. "$root/hack/retry.sh"
	(cd "$dl" && { apt_get download busybox-static >&2 || { retry apt_get update -qq >&2 && retry apt_get download busybox-static >&2; }; }) ||
		{ echo "build.sh: ERROR: apt-get download busybox-static failed" >&2; exit 1; }
	dpkg-deb -x "$dl"/busybox-static_*.deb "$dl/x"
	mkdir -p "$cache/busybox-static-image"
	install -m 0755 "$dl/x/bin/busybox" "$cache/busybox-static-image/busybox"
	rm -rf "$dl"
	busybox=$cache/busybox-static-image/busybox
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
rootfs=$ctx/rootfs
mkdir -p "$rootfs/usr/local/bin" "$rootfs/bin" "$rootfs/opt/pleg-nri" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=$version" -o "$rootfs/usr/local/bin/pleg-nri" ./cmd/pleg-nri)
install -m 0755 "$busybox" "$rootfs/bin/busybox"
ln -s busybox "$rootfs/bin/sh"
cp -r "$root/deploy/systemd" "$root/deploy/nri" "$rootfs/opt/pleg-nri/"
install -m 0755 "$root/deploy/install.sh" "$root/deploy/node.sh" "$rootfs/opt/pleg-nri/"
install -m 0644 "$root/nri.conf.example" "$rootfs/opt/pleg-nri/config.yaml"
cp "$root/deploy/image/Dockerfile" "$ctx/"
docker build -q --label "org.opencontainers.image.version=$version" -t "$image" "$ctx" >/dev/null
mkdir -p "$(dirname "$tarball")"
docker save -o "$tarball" "$image"
echo "make image: $image ($(docker image inspect -f '{{.Size}}' "$image") bytes), saved to $tarball"
