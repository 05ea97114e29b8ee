#!/bin/sh
# check-pleg-nri.sh: node-problem-detector's custom plugin for pleg-nri (pleg-nri-monitor.json): does
# pleg-nri serve this node? It runs `pleg-nri health` (the core's /readyz answers 200, and the kubelet's
# endpoint answers a CRI Version call, each within PLEG_NRI_HEALTH_TIMEOUT). NPD's plugin protocol: exit
# 0 is OK (the condition PlegNRIUnhealthy False), 1 a problem (True, reason PlegNRINotServing), anything
# else unknown; the first line printed becomes the condition's message.
#
# In NPD's pod (npd-daemonset.yaml) the host's pleg-nri binary, run directory and loopback are the
# host's: hostNetwork, and hostPath mounts under /host. Each setting can be overridden by the
# environment (the test points them at fakes).
BIN=${PLEG_NRI_BIN:-}
READYZ=${PLEG_NRI_READYZ:-http://127.0.0.1:9810/readyz}
ENDPOINT=${PLEG_NRI_ENDPOINT:-unix:///host/run/pleg-nri/cri.sock}
TIMEOUT=${PLEG_NRI_HEALTH_TIMEOUT:-2s}

if [ -z "$BIN" ]; then
	# The binary of either install mode: the host service's, or the one pre-registered with containerd.
	for b in /host/usr/local/bin/pleg-nri /host/opt/nri/plugins/10-pleg-nri; do
		if [ -x "$b" ]; then
			BIN=$b
			break
		fi
	done
fi
if [ -z "$BIN" ]; then
	echo "pleg-nri is not installed on this node (no /usr/local/bin/pleg-nri or /opt/nri/plugins/10-pleg-nri)"
	exit 1
fi
if out=$("$BIN" health --readyz "$READYZ" --runtime-endpoint "$ENDPOINT" --timeout "$TIMEOUT" 2>&1); then
	echo "pleg-nri serves this node"
	exit 0
fi
# The first failed check, else the first line.
msg=$(echo "$out" | grep -m 1 FAIL) || msg=$(echo "$out" | head -n 1)
echo "${msg:-pleg-nri health failed}"
exit 1
