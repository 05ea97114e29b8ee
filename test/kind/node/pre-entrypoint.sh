#!/bin/sh
# Runs before kind's entrypoint in pleg-nri-test/kind-node. With `docker run --privileged` (every
# normal engine) it changes nothing. Where the engine cannot grant every capability and the node runs
# with the equivalent flags instead (test/kind/hack/docker-shim/docker), Docker mounts the cgroup
# hierarchies read-only and gives no /dev/kmsg (the kubelet's OOM watcher reads it): make the cgroups
# writable (a bind remount: cgroup v1 hierarchies share their superblock with the host), create it,
# and keep containerd from asking for oom_score_adj values the node may not set.
set -eu
if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
	mount -o remount,rw /sys/fs/cgroup 2>/dev/null || true
	awk '$3 == "cgroup" { print $2 }' /proc/self/mounts | while read -r m; do
		mount -o remount,bind,rw "$m" 2>/dev/null || true
	done
else
	mount -o remount,rw /sys/fs/cgroup 2>/dev/null || true
fi
[ -e /dev/kmsg ] || mknod -m 0600 /dev/kmsg c 1 11 2>/dev/null || true
# Lowering an oom_score_adj needs CAP_SYS_RESOURCE (bit 24). Without it runc fails every pod with
# "nsexec: failed to update /proc/self/oom_score_adj: Permission denied"; containerd's
# restrict_oom_score_adj keeps the values it asks for at or above its own, as kind's entrypoint does
# for rootless nodes.
bnd=$(awk '/^CapBnd:/ { print $2 }' /proc/self/status)
if [ $((0x$bnd >> 24 & 1)) -eq 0 ]; then
	sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' /etc/containerd/config.toml
fi
exec "$@"
