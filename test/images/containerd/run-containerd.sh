#!/bin/sh
# The image's default command: containerd with /etc/containerd/config.toml, and the test images
# (/opt/pleg-nri/images) imported into its k8s.io namespace once it answers.
set -eu
containerd "$@" &
pid=$!
trap 'kill -TERM $pid' TERM INT
i=0
until ctr version >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 300 ] || { echo "run-containerd: containerd did not answer" >&2; exit 1; }
	kill -0 $pid || exit 1
	sleep 0.1
done
for a in /opt/pleg-nri/images/*.tar; do
	ctr --namespace k8s.io images import --local "$a" >&2
done
wait $pid
