#!/usr/bin/env bash
# make run: pleg-nri on the harness's isolated containerd, with a short demo workload, and its event
# stream shown next to containerd's own. Ctrl-C (or the end of the demo) removes everything.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin/pleg-nri}
IT_ENV="go run ./test/containerd-it/cmd/it-env"
pids=()
up=

cleanup() {
	trap - EXIT INT TERM
	# The printers first, so pleg-nri's shutdown does not end their streams with an error line.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; done
	wait 2>/dev/null || true
	# pleg-nri's front outlives the daemon by design (docs/restarts.md): stop it too.
	if [ -n "${run:-}" ] && [ -S "$run/front.sock" ]; then "$BIN" stop-front --run-dir "$run" >/dev/null || true; fi
	if [ -n "$up" ]; then
		echo
		echo "== tearing down"
		$IT_ENV down
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== bringing up an isolated containerd 2.4 with NRI"
exports=$($IT_ENV up 2>/dev/null) || { $IT_ENV up; exit 1; }
up=1
eval "$exports"
run="$PLEGIT_DIR/pleg-nri"
mkdir -p "$run"

echo "== starting pleg-nri (log: $run/pleg-nri.log)"
"$BIN" --nri-socket "$NRI_SOCKET" --containerd-address "$CONTAINERD_ADDRESS" \
	--runtime-endpoint "unix://$CONTAINERD_ADDRESS" --listen "unix://$run/cri.sock" \
	--metrics-address 127.0.0.1:9810 --state-dir "$run/state" >"$run/pleg-nri.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
	curl -sf 127.0.0.1:9810/readyz >/dev/null 2>&1 && break
	sleep 0.1
done
curl -sf 127.0.0.1:9810/readyz >/dev/null || { echo "pleg-nri did not become ready:"; cat "$run/pleg-nri.log"; exit 1; }

echo "== both event streams (pleg-nri's endpoint and containerd's own), as 'pleg-nri events' prints them"
# Process substitution, so $! is the printer itself: killing it ends its sed too.
"$BIN" events --endpoint "unix://$run/cri.sock" > >(sed -u 's/^/pleg-nri   | /') &
pids+=($!)
"$BIN" events --endpoint "unix://$CONTAINERD_ADDRESS" > >(sed -u 's/^/containerd | /') &
pids+=($!)
sleep 0.5

# The workload goes through pleg-nri's endpoint, as a kubelet's would.
export CONTAINER_RUNTIME_ENDPOINT="unix://$run/cri.sock" IMAGE_SERVICE_ENDPOINT="unix://$run/cri.sock"
cfg="$run/configs"
mkdir -p "$cfg"
cat >"$cfg/pod.json" <<JSON
{"metadata": {"name": "demo", "uid": "demo-$RANDOM", "namespace": "default"},
 "log_directory": "$PLEGIT_DIR/pods/demo",
 "linux": {"cgroup_parent": "$PLEGIT_CGROUP_PARENT/demo"}}
JSON
ctr() { # name script [memory limit]
	local limit=${3:-0}
	cat >"$cfg/$1.json" <<JSON
{"metadata": {"name": "$1"}, "image": {"image": "docker.io/library/busybox:plegit"},
 "command": ["sh", "-c", "$2"], "log_path": "$1.log",
 "linux": {"resources": {"memory_limit_in_bytes": $limit}}}
JSON
	crictl create "$pod" "$cfg/$1.json" "$cfg/pod.json" 2>/dev/null
}

pod=$(crictl runp "$cfg/pod.json" 2>/dev/null)
ok=$(ctr ok "sleep 1; exit 0")
crash=$(ctr crash "sleep 1.5; echo boom; exit 1")
oom=$(ctr oom "sleep 2; tail /dev/zero" 33554432)
web=$(ctr web "sleep 3600")
for c in "$ok" "$crash" "$oom" "$web"; do crictl start "$c" >/dev/null 2>&1; done
sleep 4
echo
crictl ps -a --pod "$pod" 2>/dev/null | sed 's/^/crictl     | /'
echo
crictl rm "$ok" >/dev/null 2>&1
crictl stopp "$pod" >/dev/null 2>&1
crictl rmp "$pod" >/dev/null 2>&1
sleep 1
echo
echo "== pleg-nri's metrics"
curl -s 127.0.0.1:9810/metrics | grep -E '^pleg_nri_(events_emitted_total|events_corrected_total|relist_repairs_total|subscribers) ' | sed 's/^/  /' || true
curl -s 127.0.0.1:9810/metrics | grep -E '^pleg_nri_events_emitted_total\{' | awk '{n+=$2} END {print "  pleg_nri_events_emitted_total (all) " n}'
echo "== demo done"
