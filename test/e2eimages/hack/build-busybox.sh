#!/usr/bin/env bash
# Builds the busybox of upstream's e2e test images (registry.k8s.io/e2e-test-images/busybox, which is
# Docker Hub's busybox): Debian bookworm's busybox source, its static configuration and its patches,
# but for the two that change how ash imports its environment:
#   revert-9c143ce52da11ec3d21a3491c3749841d3dc10f0.patch  undoes upstream's commit 9c143ce5, so ash
#                                                          drops variables whose names are not shell
#                                                          identifiers (data-1=value-1) from environ
#   temp-deb-installer-hack.patch                          debian-installer's option on top of it
# Upstream busybox keeps such variables and passes them to its children; upstream's specs read them
# back with `sh -c env` (ConfigMap and Secrets "should be consumable via the environment", ...), and
# fail with Debian's binary. Built once per source version and script:
# $PLEG_NRI_CACHE/busybox-e2e/<version>-<hash>/busybox.
#
# The source comes from the Debian mirror the way apt would take it: InRelease checked with gpgv
# against Debian's archive keyring, Sources.xz against InRelease's SHA256, each source file against
# Sources'.
#
# Usage: build-busybox.sh        (prints the binary's path on success)
# Env:   PLEG_NRI_CACHE          cache root (default /var/cache/pleg-nri)
#        DEBIAN_MIRROR           Debian mirror (default http://deb.debian.org/debian)
set -euo pipefail

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}
SUITE=bookworm
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
# The patches of Debian's series left out (see above).
SKIP_PATCHES="revert-9c143ce52da11ec3d21a3491c3749841d3dc10f0.patch temp-deb-installer-hack.patch"

log() { echo "build-busybox: $*" >&2; }
die() { echo "build-busybox: ERROR: $*" >&2; exit 1; }
# shellcheck source=../../../hack/retry.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../../hack/retry.sh"

# The tools of the build, installed from Debian's packages where missing.
missing=()
for pair in curl:curl gpgv:gpgv xz:xz-utils bzip2:bzip2 make:make gcc:gcc patch:patch; do
	command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
[ -r "$KEYRING" ] || missing+=(debian-archive-keyring)
if [ ${#missing[@]} -gt 0 ]; then
	log "apt-get install ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive retry apt_get update -qq >&2 || die "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive retry apt_get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
		die "apt-get install ${missing[*]} failed"
fi

mkdir -p "$CACHE/busybox-e2e"
exec 9>"$CACHE/busybox-e2e/.lock"
flock 9

work=$(mktemp -d "$CACHE/busybox-e2e/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT

fetch() { # fetch URL FILE
	retry curl -fsSL --connect-timeout 20 --max-time 300 -o "$2" "$1" || die "could not download $1"
}
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# InRelease, signed by Debian's archive keys; then Sources.xz by its hash in InRelease.
fetch "$MIRROR/dists/$SUITE/InRelease" "$work/InRelease"
gpgv --keyring "$KEYRING" --output "$work/Release" "$work/InRelease" 2>"$work/gpgv.log" ||
	die "InRelease of $SUITE does not verify against $KEYRING: $(cat "$work/gpgv.log")"
want=$(awk '/^SHA256:/{s=1; next} /^[^ ]/{s=0} s && $3 == "main/source/Sources.xz" {print $1}' "$work/Release")
[ -n "$want" ] || die "InRelease of $SUITE lists no main/source/Sources.xz"
fetch "$MIRROR/dists/$SUITE/main/source/Sources.xz" "$work/Sources.xz"
[ "$(sha256_of "$work/Sources.xz")" = "$want" ] || die "Sources.xz does not match InRelease's SHA256"

# The busybox stanza: its version, directory and files with their SHA256.
xz -dc "$work/Sources.xz" >"$work/Sources"
awk '/^Package: busybox$/{p=1} p && /^$/{exit} p' "$work/Sources" >"$work/stanza"
version=$(sed -n 's/^Version: //p' "$work/stanza")
dir=$(sed -n 's/^Directory: //p' "$work/stanza")
[ -n "$version" ] && [ -n "$dir" ] || die "Sources of $SUITE has no busybox source package"
awk '/^Checksums-Sha256:/{s=1; next} /^[^ ]/{s=0} s {print $1, $3}' "$work/stanza" >"$work/files"
[ -s "$work/files" ] || die "busybox $version: Sources lists no files"

hash=$( (grep -v '^[[:space:]]*#' "${BASH_SOURCE[0]}"; cat "$work/files") | sha256sum | cut -c1-16)
out=$CACHE/busybox-e2e/${version//[:~]/_}-$hash/busybox
if [ -x "$out" ]; then
	echo "$out"
	exit 0
fi

log "busybox $version from $MIRROR/$dir, without: $SKIP_PATCHES"
while read -r sum name; do
	fetch "$MIRROR/$dir/$name" "$work/$name"
	[ "$(sha256_of "$work/$name")" = "$sum" ] || die "$name does not match Sources' SHA256"
done <"$work/files"

src=$work/src
mkdir "$src"
orig=$(awk '$2 ~ /\.orig\.tar\./ {print $2}' "$work/files")
debian=$(awk '$2 ~ /\.debian\.tar\./ {print $2}' "$work/files")
[ -n "$orig" ] && [ -n "$debian" ] || die "busybox $version is not a 3.0 (quilt) source: $(cat "$work/files")"
tar -xf "$work/$orig" -C "$src" --strip-components=1
tar -xf "$work/$debian" -C "$src"

skipped=0
while read -r p _; do
	case $p in '' | '#'*) continue ;; esac
	if [[ " $SKIP_PATCHES " == *" $p "* ]]; then
		skipped=$((skipped + 1))
		continue
	fi
	patch -d "$src" -p1 -s --no-backup-if-mismatch <"$src/debian/patches/$p" >&2 || die "Debian's patch $p does not apply"
done <"$src/debian/patches/series"
[ "$skipped" = 2 ] || die "Debian's series of busybox $version no longer lists both of: $SKIP_PATCHES (this script needs a look)"

# Debian's static flavour, configured and built as its debian/rules does.
b=$src/b/static
mkdir -p "$b"
cat "$src/debian/config/os/linux" "$src/debian/config/pkg/static" >"$b/.config"
(yes "" || true) | make -C "$b" -f "$src/Makefile" KBUILD_SRC="$src" silentoldconfig >"$work/config.log" 2>&1 ||
	die "busybox configuration failed: $(tail -20 "$work/config.log")"
grep -q '^CONFIG_STATIC=y' "$b/.config" || die "busybox configuration is not static"
make -C "$b" -j"$(nproc)" all SKIP_STRIP=y BB_EXTRA_VERSION="Debian $version, e2e" >"$work/build.log" 2>&1 ||
	die "busybox build failed: $(tail -30 "$work/build.log")"

# The one behaviour this build exists for, checked on the binary.
got=$(env -i 'data-1=value-1' PATH=/nonexistent "$b/busybox" sh -c 'env' | grep -c '^data-1=value-1$' || true)
[ "$got" = 1 ] || die "the built busybox's sh does not pass data-1=value-1 to env"

mkdir -p "$(dirname "$out")"
install -m 0755 "$b/busybox" "$out.tmp"
mv "$out.tmp" "$out"
log "built $out"
echo "$out"
