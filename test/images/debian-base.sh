#!/usr/bin/env bash
# Builds pleg-nri-test/debian-base:bookworm without a registry: a Debian bookworm root filesystem made
# with debootstrap from Debian's packages, trimmed to boot systemd as PID 1 in a container (what a kind
# node and the systemd unit tests need), then `docker import`ed.
#
# Cached twice, keyed by the sha256 of this script's lines that are not comments:
#   - the image carries the label org.pleg-nri.script-sha256=<hash>: if an image of that name has the
#     label of this script, nothing is done;
#   - the root filesystem tarball stays in $PLEG_NRI_CACHE/debian-base-<hash>.tar, so a pruned image is
#     re-imported in seconds without debootstrap; debootstrap's .debs stay in
#     $PLEG_NRI_CACHE/debootstrap-debs.
# Changing this script's code (packages, trimming, metadata) rebuilds the image.
#
# Usage: debian-base.sh             (prints the image name on stdout on success)
# Env:   PLEG_NRI_CACHE             cache root (default /var/cache/pleg-nri)
#        DEBIAN_MIRROR              Debian mirror (default http://deb.debian.org/debian)
#        PLEG_NRI_BASE_IMAGE        image name (default pleg-nri-test/debian-base:bookworm)
#
# Run a systemd container from it (the image's CMD is /sbin/init, its STOPSIGNAL SIGRTMIN+3, ENV
# container=docker). Where the Docker engine may grant every capability, as kind runs its nodes:
#   docker run -d --privileged --cgroupns=private --tmpfs /run --tmpfs /tmp -v /var \
#     pleg-nri-test/debian-base:bookworm
# On this project's machines `--privileged` fails with "runc create failed: unable to start container
# process: unable to apply caps: operation not permitted": the host's bounding set lacks
# CAP_SYS_RESOURCE and Docker 20.10 asks runc for every capability. What works there (systemd boots to
# "running", services get their cgroup v2 in the hybrid hierarchy):
#   docker run -d --cap-add ALL --cap-drop SYS_RESOURCE --security-opt seccomp=unconfined \
#     --security-opt apparmor=unconfined --security-opt systempaths=unconfined \
#     --cgroupns=private --tmpfs /run --tmpfs /tmp -v /var pleg-nri-test/debian-base:bookworm
set -euo pipefail

IMAGE=${PLEG_NRI_BASE_IMAGE:-pleg-nri-test/debian-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}
SUITE=bookworm
LABEL=org.pleg-nri.script-sha256

# Packages on top of debootstrap's minbase. The first line is what systemd as PID 1 needs, the rest what
# a kubelet, kubeadm and kind's entrypoint call (kind's base image installs the same set).
PACKAGES=(
	systemd systemd-sysv dbus libsystemd0
	iproute2 iptables nftables ebtables conntrack ethtool socat kmod
	procps util-linux mount ca-certificates libseccomp2 fuse-overlayfs
	bash coreutils findutils grep sed gawk tar gzip less jq curl
)

log() { echo "debian-base: $*" >&2; }
die() { echo "debian-base: ERROR: $*" >&2; exit 1; }
# shellcheck source=../../hack/retry.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../hack/retry.sh"

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap chroots)"
command -v docker >/dev/null || die "docker is not on PATH"

# Comment lines are left out of the hash: editing a comment rebuilds nothing.
hash=$(grep -v '^[[:space:]]*#' "${BASH_SOURCE[0]}" | sha256sum | cut -c1-64)

have_image() {
	[ "$(docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$IMAGE" 2>/dev/null || true)" = "$hash" ]
}

if have_image; then
	log "$IMAGE is current (script sha256 ${hash:0:12})"
	echo "$IMAGE"
	exit 0
fi

mkdir -p "$CACHE"
# Serialize concurrent builds (two helpers or two make targets at once); not the cache's global .lock,
# which install-deps.sh holds for minutes.
exec 9>"$CACHE/.debian-base.lock"
flock 9
if have_image; then
	echo "$IMAGE"
	exit 0
fi

start=$SECONDS
tarball=$CACHE/debian-base-$hash.tar
if [ ! -f "$tarball" ]; then
	if ! command -v debootstrap >/dev/null; then
		log "apt-get install debootstrap"
		DEBIAN_FRONTEND=noninteractive retry apt_get update -qq >&2 || die "apt-get update failed"
		DEBIAN_FRONTEND=noninteractive retry apt_get install -y -qq --no-install-recommends debootstrap >&2 ||
			die "apt-get install debootstrap failed"
	fi
	work=$(mktemp -d "$CACHE/debian-base.XXXXXX")
	# The chroot's /proc and /sys may still be mounted if debootstrap failed halfway.
	trap 'umount -R "$work/rootfs/proc" "$work/rootfs/sys" 2>/dev/null || true; rm -rf "$work"' EXIT
	rootfs=$work/rootfs
	mkdir -p "$CACHE/debootstrap-debs" "$rootfs"
	log "debootstrap $SUITE from $MIRROR into $rootfs"
	include=$(
		IFS=,
		echo "${PACKAGES[*]}"
	)
	# A try that failed (a download that timed out, say) leaves a half-made root: the next starts anew,
	# with the .debs already fetched kept in the cache directory.
	bootstrap() {
		umount -R "$rootfs/proc" "$rootfs/sys" 2>/dev/null || true
		rm -rf "$rootfs" && mkdir -p "$rootfs" || return 1
		debootstrap --variant=minbase --merged-usr --include="$include" \
			--cache-dir="$CACHE/debootstrap-debs" "$SUITE" "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
			tail -n 30 "$work/debootstrap.log" >&2
			return 1
		}
	}
	retry bootstrap || die "debootstrap failed (log above)"
	log "debootstrap done in $((SECONDS - start))s"

	# Trim systemd for a container, as kind's base image does: no udev, no gettys, no units the host
	# owns (kernel config/debug mounts, module loading), no tmpfiles setup at boot that would wipe what
	# the runtime mounted; journald does not read /dev/kmsg.
	rm -f "$rootfs"/lib/systemd/system/multi-user.target.wants/* \
		"$rootfs"/etc/systemd/system/*.wants/* \
		"$rootfs"/lib/systemd/system/local-fs.target.wants/* \
		"$rootfs"/lib/systemd/system/sockets.target.wants/*udev* \
		"$rootfs"/lib/systemd/system/sockets.target.wants/*initctl* \
		"$rootfs"/lib/systemd/system/basic.target.wants/*
	find "$rootfs"/lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
	for unit in systemd-udevd.service systemd-udevd-kernel.socket systemd-udevd-control.socket \
		systemd-modules-load.service sys-kernel-config.mount sys-kernel-debug.mount \
		sys-kernel-tracing.mount getty.target console-getty.service systemd-firstboot.service; do
		ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
	done
	echo "ReadKMsg=no" >>"$rootfs/etc/systemd/journald.conf"
	# dbus starts on demand through its socket; multi-user.target is the default target.
	mkdir -p "$rootfs/etc/systemd/system/sockets.target.wants"
	ln -sf /lib/systemd/system/dbus.socket "$rootfs/etc/systemd/system/sockets.target.wants/dbus.socket"
	ln -sf /lib/systemd/system/multi-user.target "$rootfs/etc/systemd/system/default.target"
	# An empty machine-id: systemd makes a transient one per container (systemd's container interface).
	: >"$rootfs/etc/machine-id"
	rm -f "$rootfs/var/lib/dbus/machine-id" "$rootfs/etc/hostname"
	# apt works inside the container, with the same mirror and the security updates.
	cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
EOF
	rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log \
		"$rootfs"/tmp/* "$rootfs"/var/tmp/*

	log "packing $tarball"
	tar --numeric-owner --xattrs --acls -C "$rootfs" -cf "$tarball.tmp" . || die "tar of the root filesystem failed"
	mv "$tarball.tmp" "$tarball"
	# Older tarballs of this script's earlier versions.
	find "$CACHE" -maxdepth 1 -name 'debian-base-*.tar' ! -name "debian-base-$hash.tar" -delete
fi

old_id=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
log "docker import $tarball as $IMAGE"
# docker import cannot set STOPSIGNAL (engines before 25 refuse it as a change): import to a temporary
# tag, then one Dockerfile step on it with the classic builder, which never contacts a registry.
docker import "$tarball" "$IMAGE-import" >/dev/null || die "docker import failed"
DOCKER_BUILDKIT=0 docker build -q -t "$IMAGE" - >/dev/null <<EOF || die "docker build of the image metadata failed"
FROM $IMAGE-import
ENV container=docker PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
STOPSIGNAL SIGRTMIN+3
CMD ["/sbin/init"]
LABEL $LABEL=$hash
EOF
docker rmi "$IMAGE-import" >/dev/null 2>&1 || true
have_image || die "imported $IMAGE does not carry the label $LABEL=$hash"
# The previous build, now untagged (kept if a container still uses it).
[ -z "$old_id" ] || docker rmi "$old_id" >/dev/null 2>&1 || true
log "built $IMAGE in $((SECONDS - start))s"
echo "$IMAGE"
