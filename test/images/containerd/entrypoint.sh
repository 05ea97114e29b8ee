#!/bin/sh
# PID 1 of the pleg-nri-test/containerd image: makes /sys and the cgroup hierarchies writable for
# containerd and runc, enables cgroup v2 nesting, then runs the command (default: containerd with the
# image's config; the integration test harness runs `sleep infinity` and starts containerd itself with
# `docker exec`, so it can stop and restart containerd while the shims and containers keep running).
set -eu

# With --privileged both are already writable. Without it (an engine whose host lacks a capability,
# so that --privileged fails) Docker mounts them read-only; the container holds CAP_SYS_ADMIN, so a
# remount works. cgroup v1 hierarchies share their superblock with the host: only a bind remount
# (per mount point) may change them.
mount -o remount,rw /sys 2>/dev/null || true
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
	mount -o remount,rw /sys/fs/cgroup 2>/dev/null || true
	# cgroup v2 nesting, as kind's and containerd's CI entrypoints do: a cgroup with processes cannot
	# enable controllers for its children, so every process of the root moves to /init first.
	mkdir -p /sys/fs/cgroup/init
	while read -r pid; do
		echo "$pid" >/sys/fs/cgroup/init/cgroup.procs 2>/dev/null || true
	done </sys/fs/cgroup/cgroup.procs
	sed -e 's/ / +/g' -e 's/^/+/' </sys/fs/cgroup/cgroup.controllers >/sys/fs/cgroup/cgroup.subtree_control
else
	mount -o remount,rw /sys/fs/cgroup 2>/dev/null || true
	awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts | while read -r m; do
		mount -o remount,bind,rw "$m" 2>/dev/null || true
	done
fi

if [ $# -eq 0 ]; then
	set -- containerd
fi
exec "$@"
