#!/usr/bin/env bash
# Builds a Debian bookworm root filesystem with debootstrap (minbase) and the given packages, from
# Debian's packages only, as a tar for an image layer of upstream's e2e suites' test images
# (test/e2eimages: make e2e-node, make e2e-cluster-conformance), once per package list:
# $PLEG_NRI_CACHE/e2e-rootfs/<name>-<hash>.tar, the hash over the packages and this script's code.
# debootstrap's .debs are shared with test/images/debian-base.sh ($PLEG_NRI_CACHE/debootstrap-debs).
#
# Usage: build-rootfs.sh NAME PACKAGE...    (prints the tar's path on success)
# Env:   PLEG_NRI_CACHE                      cache root (default /var/cache/pleg-nri)
#        DEBIAN_MIRROR                       Debian mirror (default http://deb.debian.org/debian)
set -euo pipefail

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}
SUITE=bookworm

log() { echo "build-rootfs: $*" >&2; }
die() { echo "build-rootfs: ERROR: $*" >&2; exit 1; }
# shellcheck source=../../../hack/retry.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../../hack/retry.sh"

[ $# -ge 2 ] || die "usage: build-rootfs.sh NAME PACKAGE..."
name=$1
shift
[[ $name =~ ^[a-z0-9-]+$ ]] || die "NAME must be lower-case letters, digits and dashes, not $name"
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap chroots)"

hash=$( (grep -v '^[[:space:]]*#' "${BASH_SOURCE[0]}"; echo "$SUITE $*") | sha256sum | cut -c1-16)
out=$CACHE/e2e-rootfs/$name-$hash.tar
mkdir -p "$CACHE/e2e-rootfs"
exec 9>"$CACHE/e2e-rootfs/.$name.lock"
flock 9
if [ -f "$out" ]; then
	echo "$out"
	exit 0
fi

if ! command -v debootstrap >/dev/null; then
	log "apt-get install debootstrap"
	DEBIAN_FRONTEND=noninteractive retry apt_get update -qq >&2 || die "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive retry apt_get install -y -qq --no-install-recommends debootstrap >&2 ||
		die "apt-get install debootstrap failed"
fi
start=$SECONDS
work=$(mktemp -d "$CACHE/e2e-rootfs/$name.XXXXXX")
trap 'umount -R "$work/rootfs/proc" "$work/rootfs/sys" 2>/dev/null || true; rm -rf "$work"' EXIT
rootfs=$work/rootfs
mkdir -p "$CACHE/debootstrap-debs"
include=$(
	IFS=,
	echo "$*"
)
# A try that failed halfway (a download that timed out) starts anew, with the .debs fetched kept.
bootstrap() {
	umount -R "$rootfs/proc" "$rootfs/sys" 2>/dev/null || true
	rm -rf "$rootfs" && mkdir -p "$rootfs" || return 1
	debootstrap --variant=minbase --merged-usr --include="$include" \
		--cache-dir="$CACHE/debootstrap-debs" "$SUITE" "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
		tail -n 30 "$work/debootstrap.log" >&2
		return 1
	}
}
log "debootstrap $SUITE with $* (minutes the first time)"
retry bootstrap || die "debootstrap failed (log above)"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log \
	"$rootfs"/tmp/* "$rootfs"/var/tmp/*
: >"$rootfs/etc/machine-id"
rm -f "$rootfs/etc/hostname"
tar --numeric-owner -C "$rootfs" -cf "$out.tmp" . || die "tar of the root filesystem failed"
mv "$out.tmp" "$out"
find "$CACHE/e2e-rootfs" -maxdepth 1 -name "$name-*.tar" ! -name "$name-$hash.tar" -delete
log "built $out in $((SECONDS - start))s"
echo "$out"
