#!/usr/bin/env bash
# Installs and builds everything the integration tests need, with nothing preinstalled but Go:
# Debian packages (libseccomp-dev, the busybox-static .deb) and pinned binaries built from the Go
# module proxy into a cache outside the source tree, one directory per version, so a second run
# rebuilds nothing.
#
# Usage: install-deps.sh            (prints the cache directory on success)
# Env:   PLEG_NRI_CACHE             cache root (default /var/cache/pleg-nri)
set -euo pipefail

CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
RUNC_VERSION=${RUNC_VERSION:-v1.5.2}
CRICTL_VERSION=${CRICTL_VERSION:-v1.36.0}
CNI_VERSION=${CNI_VERSION:-v1.9.1}

CACHE=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}
mkdir -p "$CACHE"

log() { echo "install-deps: $*" >&2; }
die() { echo "install-deps: ERROR: $*" >&2; exit 1; }
# shellcheck source=../../../hack/retry.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../../hack/retry.sh"

[ "$(id -u)" = 0 ] || die "must run as root (the integration tests run containerd and runc)"
[ "$(uname -s)" = Linux ] || die "Linux only"
command -v go >/dev/null || die "go is not on PATH"

# Serialize concurrent installs (make test and make it-up at once).
exec 9>"$CACHE/.lock"
flock 9

apt_updated=
apt_install() {
	local missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	if [ -z "$apt_updated" ]; then
		log "apt-get update"
		DEBIAN_FRONTEND=noninteractive retry apt_get update -qq >&2 || die "apt-get update failed"
		apt_updated=1
	fi
	log "apt-get install ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive retry apt_get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
		die "apt-get install ${missing[*]} failed"
}

# Tools the harness itself calls: iproute2 (ip netns/link), util-linux (mount tools), procps (pkill-free ps).
need_cmds=()
command -v ip >/dev/null || need_cmds+=(iproute2)
command -v flock >/dev/null || need_cmds+=(util-linux)
command -v ps >/dev/null || need_cmds+=(procps)
apt_install libseccomp-dev pkg-config "${need_cmds[@]}"

# build NAME OUTDIR CMD...: runs CMD with GOBIN=OUTDIR.tmp (tried again on failure: go install downloads
# and builds in one, and a retry resumes from the build cache), then renames it into place, so an
# interrupted build never leaves a half-filled cache entry.
build() {
	local name=$1 out=$2
	shift 2
	if [ -f "$out/.done" ]; then
		return 0
	fi
	log "building $name into $out"
	rm -rf "$out.tmp"
	mkdir -p "$out.tmp"
	local start=$SECONDS
	GOBIN="$out.tmp" GOFLAGS=-buildvcs=false GOTOOLCHAIN=local retry "$@" >&2 || die "building $name failed"
	touch "$out.tmp/.done"
	rm -rf "$out"
	mv "$out.tmp" "$out"
	log "built $name in $((SECONDS - start))s"
}

build "containerd $CONTAINERD_VERSION" "$CACHE/containerd-$CONTAINERD_VERSION" bash -c "
	go install github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION &&
	go install github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION &&
	CGO_ENABLED=0 go install github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"

build "runc $RUNC_VERSION" "$CACHE/runc-$RUNC_VERSION" \
	go install -tags "seccomp urfave_cli_no_docs" "github.com/opencontainers/runc@$RUNC_VERSION"

# go install sigs.k8s.io/cri-tools/cmd/crictl@VERSION is refused by the proxy (it asks for a version
# list the proxy does not serve); download the module and build inside it instead.
build "crictl $CRICTL_VERSION" "$CACHE/crictl-$CRICTL_VERSION" bash -c '
	dir=$(go mod download -json sigs.k8s.io/cri-tools@'"$CRICTL_VERSION"' | sed -n "s/^[[:space:]]*\"Dir\": \"\(.*\)\",$/\1/p")
	[ -n "$dir" ] || { echo "no module dir for cri-tools"; exit 1; }
	cd "$dir" && CGO_ENABLED=0 go build -o "$GOBIN/crictl" ./cmd/crictl'

build "CNI plugins $CNI_VERSION" "$CACHE/cni-$CNI_VERSION" bash -c "
	for p in main/bridge main/loopback ipam/host-local; do
		CGO_ENABLED=0 go install github.com/containernetworking/plugins/plugins/\$p@$CNI_VERSION || exit 1
	done"

# busybox: Debian's static build, taken from its .deb (never installed on the host).
bb_ver=$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || true)
if [ -z "$bb_ver" ]; then
	bb_ver=$(apt-cache policy busybox-static 2>/dev/null | sed -n 's/^ *Candidate: //p')
	if [ -z "$bb_ver" ] || [ "$bb_ver" = "(none)" ]; then
		DEBIAN_FRONTEND=noninteractive retry apt_get update -qq >&2 || die "apt-get update failed"
		bb_ver=$(apt-cache policy busybox-static | sed -n 's/^ *Candidate: //p')
	fi
fi
[ -n "$bb_ver" ] && [ "$bb_ver" != "(none)" ] || die "no busybox-static package available"
bb_dir="$CACHE/busybox-static-${bb_ver//[:~]/_}"
if [ ! -f "$bb_dir/.done" ]; then
	log "fetching busybox-static $bb_ver"
	rm -rf "$bb_dir.tmp"
	mkdir -p "$bb_dir.tmp/x"
	chmod 0777 "$bb_dir.tmp"  # apt downloads as _apt
	(cd "$bb_dir.tmp" && retry apt_get download "busybox-static=$bb_ver" >&2) || die "apt-get download busybox-static failed"
	dpkg-deb -x "$bb_dir.tmp"/busybox-static_*.deb "$bb_dir.tmp/x"
	install -m 0755 "$bb_dir.tmp/x/bin/busybox" "$bb_dir.tmp/busybox"
	rm -rf "$bb_dir.tmp/x" "$bb_dir.tmp"/*.deb
	touch "$bb_dir.tmp/.done"
	rm -rf "$bb_dir"
	mv "$bb_dir.tmp" "$bb_dir"
fi

# One directory of links for the harness to put first on PATH. It is rebuilt only when a link is missing
# or wrong: a running containerd execs runc and the CNI plugins through it, so a second run (another
# `make integration` or `make bench` on the machine) must not pull it from under them.
bin="$CACHE/bin"
links() {
	for f in containerd ctr containerd-shim-runc-v2; do echo "$f $CACHE/containerd-$CONTAINERD_VERSION/$f"; done
	echo "runc $CACHE/runc-$RUNC_VERSION/runc"
	echo "crictl $CACHE/crictl-$CRICTL_VERSION/crictl"
	echo "busybox $bb_dir/busybox"
	for f in bridge loopback host-local; do echo "cni/$f $CACHE/cni-$CNI_VERSION/$f"; done
}
links_ok() {
	local name target
	while read -r name target; do
		[ "$(readlink "$bin/$name" 2>/dev/null)" = "$target" ] || return 1
	done < <(links)
}
if ! links_ok; then
	rm -rf "$bin.tmp"
	mkdir -p "$bin.tmp/cni"
	while read -r name target; do ln -s "$target" "$bin.tmp/$name"; done < <(links)
	rm -rf "$bin"
	mv "$bin.tmp" "$bin"
fi
echo "$CACHE"
