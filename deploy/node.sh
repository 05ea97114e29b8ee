#!/bin/sh
# The Helm chart's per-node agent, run from the pleg-nri image (busybox sh) in a privileged pod with
# the host's PID namespace and the host's / at $HOST_ROOT.
#
#   node.sh install     install or upgrade pleg-nri on the host, start it, wait for /readyz, switch the
#                       kubelet when asked (PLEG_NRI_SWITCH_KUBELET=true), then stay (the DaemonSet)
#   node.sh uninstall   put the kubelet back on containerd's socket first (if this chart switched it;
#                       its imageServiceEndpoint as it was before), then stop and remove pleg-nri, in
#                       both modes (the pre-delete hook)
#   node.sh processes   list this install's pleg-nri processes on the host: "PID core|front EXE", a
#                       process still running a replaced binary included
#   node.sh health      the installer pod's readiness check: install done, and pleg-nri serving now
#                       (pleg-nri health: the core's /readyz, and a CRI Version call through the
#                       kubelet's endpoint), the kubelet still switched; install serves it over HTTP
#                       for the kubelet's probe (PLEG_NRI_HEALTH_ADDRESS)
#
# Host commands run in the host's mount namespace (nsenter -t 1 -m): the host's systemctl talks to
# the host's systemd.
set -eu

HOST_ROOT=${HOST_ROOT:-/host}
MODE=${PLEG_NRI_MODE:-systemd}
CONFIG=${PLEG_NRI_CONFIG:-/etc/pleg-nri-config/config.yaml}
READYZ=${PLEG_NRI_READYZ:-http://127.0.0.1:9810/readyz}
READY_TIMEOUT=${PLEG_NRI_READY_TIMEOUT:-120}
SWITCH=${PLEG_NRI_SWITCH_KUBELET:-false}
# Restart a kubelet already on pleg-nri after restarting pleg-nri (see the chart's
# kubelet.restartAfterPlegNRIRestart). Not needed to keep events: pleg-nri's front keeps the kubelet's
# stream across restarts; it starts the count of 5 stream errors again for a kubelet that gave up.
RESTART_KUBELET=${PLEG_NRI_RESTART_KUBELET_AFTER_RESTART:-false}
EVENTED_PLEG=${PLEG_NRI_EVENTED_PLEG:-true}
ENDPOINT=${PLEG_NRI_ENDPOINT:-unix:///run/pleg-nri/cri.sock}
RESTORE_ENDPOINT=${PLEG_NRI_RESTORE_ENDPOINT:-unix:///run/containerd/containerd.sock}
# With the switch, the kubelet's imageServiceEndpoint (the chart's kubelet.imageServiceEndpoint):
# containerd's socket, so that its image calls go to containerd and not through pleg-nri (without it
# the kubelet sends them to containerRuntimeEndpoint). Empty: left as it is. Not defaulted: an empty
# value is the chart's way to turn it off.
IMAGE_ENDPOINT=${PLEG_NRI_IMAGE_ENDPOINT-unix:///run/containerd/containerd.sock}
KUBELET_CONFIG=${KUBELET_CONFIG:-/var/lib/kubelet/config.yaml}
KUBEADM_FLAGS=${KUBEADM_FLAGS:-/var/lib/kubelet/kubeadm-flags.env}
KUBELET_UNIT=${KUBELET_UNIT:-kubelet.service}
# The kubelet's drop-in configuration directory (the chart's kubelet.dropinDir; the kubelet's path,
# e.g. /etc/kubernetes/kubelet.conf.d): the switch writes its settings to a drop-in there and adds
# --config-dir to kubeadm-flags.env, both of which kubeadm upgrade node leaves alone, instead of editing
# config.yaml in place. Empty: the switch in place.
DROPIN_DIR=${PLEG_NRI_KUBELET_DROPIN_DIR:-}
# The mark that this chart switched the kubelet (so that uninstall, or switchKubelet=false, undoes it).
# It holds the kubelet's imageServiceEndpoint from before the switch (pleg-nri kubelet-config
# --record), which the restore puts back; empty (a switch by an older chart): left as it is.
SWITCHED=$HOST_ROOT/etc/pleg-nri/kubelet-switched
# This image's pleg-nri (tests point it at another build).
BIN=${PLEG_NRI_BIN:-/usr/local/bin/pleg-nri}
SRC=/opt/pleg-nri
# The host's pleg-nri binaries of each mode, as /proc/PID/exe shows them (the host's paths: the host
# service's mount namespace and containerd's have the host's /).
SYSTEMD_BIN=/usr/local/bin/pleg-nri
NRI_BIN=/opt/nri/plugins/10-pleg-nri
# The host's processes (tests point it at a tree of their own).
PROC=${PLEG_NRI_PROC:-/proc}
# containerd's NRI timeouts (the chart's containerd.nri): plugin_registration_timeout and
# plugin_request_timeout of [plugins."io.containerd.nri.v1.nri"], as durations ("10s"); both empty: the
# option is off (containerd's defaults, 5s and 2s). They go into a drop-in file beside containerd's
# config (CONTAINERD_DROPIN), which the config imports.
CONTAINERD_CONFIG=${PLEG_NRI_CONTAINERD_CONFIG:-/etc/containerd/config.toml}
CONTAINERD_UNIT=${PLEG_NRI_CONTAINERD_UNIT:-containerd.service}
NRI_REGISTRATION_TIMEOUT=${PLEG_NRI_CONTAINERD_NRI_REGISTRATION_TIMEOUT:-}
NRI_REQUEST_TIMEOUT=${PLEG_NRI_CONTAINERD_NRI_REQUEST_TIMEOUT:-}
CONTAINERD_DROPIN=$(dirname "$CONTAINERD_CONFIG")/conf.d/pleg-nri.toml
# What containerd's config imports: a pattern that matches the drop-in, and nothing once it is removed
# (an import of a missing file would stop containerd).
CONTAINERD_IMPORT=$(dirname "$CONTAINERD_CONFIG")/conf.d/pleg-nri*.toml
# The mark that this pod's install is done (in the pod's own /tmp: a new pod starts without it).
READY_FILE=${PLEG_NRI_READY_FILE:-/tmp/pleg-nri-ready}
# With the switch, re-apply it when the kubelet's settings drift from it (the chart's
# kubelet.reapplySwitch), checked every DRIFT_PERIOD seconds by the staying installer.
REAPPLY=${PLEG_NRI_REAPPLY_SWITCH:-false}
DRIFT_PERIOD=${PLEG_NRI_DRIFT_PERIOD:-30}
# Where the installer serves node.sh health over HTTP for the kubelet's readiness probe (the chart's
# readiness.port on loopback: the pod is hostNetwork): GET /cgi-bin/health answers 200 or 503 with the
# checks' output. An httpGet probe is made by the kubelet itself; an exec probe goes through the
# kubelet's runtime endpoint, which is pleg-nri's front: a front that hangs hangs the probe too, and
# the kubelet keeps the last result of a probe that errs. Empty: no server.
HEALTH_ADDRESS=${PLEG_NRI_HEALTH_ADDRESS:-}
HEALTH_DIR=${PLEG_NRI_HEALTH_DIR:-/tmp/pleg-nri-health}
BUSYBOX=${PLEG_NRI_BUSYBOX:-busybox}
# This script, for the CGI program that runs node.sh health.
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
# How long each check of node.sh health may take, in seconds.
HEALTH_TIMEOUT=${PLEG_NRI_HEALTH_TIMEOUT:-2}

log() { echo "pleg-nri node: $*"; }
die() { log "$*" >&2; exit 1; }
host() { nsenter -t 1 -m -- "$@"; }

# ready: /readyz answers 200. (nc, not busybox's static wget: that one crashes without glibc's NSS
# files, which a FROM scratch image does not have.)
ready() {
	rest=${READYZ#http://}
	hostport=${rest%%/*}
	path=/${rest#*/}
	printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$path" "$hostport" |
		nc -w 2 "${hostport%:*}" "${hostport##*:}" 2>/dev/null | head -1 | grep -q '^HTTP/1\.[01] 200'
}

# wait_ready: /readyz answers 200 within READY_TIMEOUT seconds.
wait_ready() {
	i=0
	until ready; do
		i=$((i + 1))
		[ "$i" -le "$READY_TIMEOUT" ] || die "pleg-nri did not answer $READYZ within ${READY_TIMEOUT}s"
		sleep 1
	done
	log "pleg-nri is ready ($READYZ)"
}

# dropin CMD...: CMD with --dropin-dir DROPIN_DIR when the switch goes through the drop-in directory.
dropin() {
	if [ -n "$DROPIN_DIR" ]; then "$@" --dropin-dir "$DROPIN_DIR"; else "$@"; fi
}

# kubelet_check: the kubelet's settings are the switch's (ENDPOINT, IMAGE_ENDPOINT, EVENTED_PLEG; with
# DROPIN_DIR, its effective settings: config.yaml with its drop-ins); else fails, printing each drift.
kubelet_check() {
	dropin "$BIN" kubelet-config --check --config "$HOST_ROOT$KUBELET_CONFIG" --kubeadm-flags "$HOST_ROOT$KUBEADM_FLAGS" \
		--host-root "$HOST_ROOT" --container-runtime-endpoint "$ENDPOINT" --image-service-endpoint "$IMAGE_ENDPOINT" --evented-pleg "$EVENTED_PLEG" 2>&1
}

# kubelet_edit ENDPOINT IMAGE GATE: edit the kubelet's settings (IMAGE: an endpoint, "restore" from the
# mark, or empty: left), the mark recording its imageServiceEndpoint before the first switch (with
# DROPIN_DIR: the drop-in and kubeadm-flags.env as they were; "restore" undoes whichever switch the
# mark records); sets out to changed or unchanged.
kubelet_edit() {
	out=$(dropin "$BIN" kubelet-config --config "$HOST_ROOT$KUBELET_CONFIG" --kubeadm-flags "$HOST_ROOT$KUBEADM_FLAGS" \
		--host-root "$HOST_ROOT" --record "$SWITCHED" --container-runtime-endpoint "$1" --image-service-endpoint "$2" --evented-pleg "$3")
}

# switched_kind: the kind of switch the mark records: dropin (through the drop-in directory) or
# inplace (config.yaml edited; an empty mark, an older chart's, too).
switched_kind() {
	if grep -q '"dropinFile"' "$SWITCHED" 2>/dev/null; then echo dropin; else echo inplace; fi
}

# kubelet_switch: mark that this chart switches the kubelet (first: a switch cut short is undone
# too), then switch it; out is changed or unchanged. A switch of the other kind (kubelet.dropinDir set
# or emptied since) is undone first.
kubelet_switch() {
	want=inplace
	[ -z "$DROPIN_DIR" ] || want=dropin
	if [ -e "$SWITCHED" ] && [ "$(switched_kind)" != "$want" ]; then
		log "kubelet: undoing the $(switched_kind) switch, for the $want one"
		kubelet_restore
	fi
	mkdir -p "$(dirname "$SWITCHED")"
	touch "$SWITCHED"
	kubelet_edit "$ENDPOINT" "$IMAGE_ENDPOINT" "$EVENTED_PLEG"
}

# kubelet_restore: put the kubelet back on RESTORE_ENDPOINT, its gate removed and its
# imageServiceEndpoint as the mark recorded it, then remove the mark; out is changed or unchanged.
kubelet_restore() {
	kubelet_edit "$RESTORE_ENDPOINT" restore remove
	rm -f "$SWITCHED"
}

# switched, restored: the settings of the switch and of the restore, for the log.
switched() {
	echo "containerRuntimeEndpoint=$ENDPOINT imageServiceEndpoint=${IMAGE_ENDPOINT:-(left)} EventedPLEG=$EVENTED_PLEG${DROPIN_DIR:+ (drop-in $DROPIN_DIR/90-pleg-nri.conf)}"
}
restored() { echo "containerRuntimeEndpoint=$RESTORE_ENDPOINT imageServiceEndpoint=(as before the switch) EventedPLEG=(removed)"; }

# restart_kubelet WHAT: restart the kubelet if its settings changed (out) to WHAT.
restart_kubelet() {
	if [ "$out" = changed ]; then
		log "kubelet: $1; restarting $KUBELET_UNIT"
		host systemctl restart "$KUBELET_UNIT"
	else
		log "kubelet: already $1"
	fi
}

# processes ROLE EXE...: the pids of the host's pleg-nri processes of role ROLE (core, front or all)
# running one of EXE, with their role and binary: "PID ROLE EXE". A process whose binary was replaced
# since it started (an upgrade: install.sh renames the new file over the old) shows "EXE (deleted)" in
# /proc and is one of them. Processes of pods (a kubepods cgroup: this agent's own pleg-nri commands, an
# image's pleg-nri run in a pod) are not.
processes() {
	role=$1
	shift
	for p in "$PROC"/[0-9]*; do
		exe=$(readlink "$p/exe" 2>/dev/null) || continue
		exe=${exe% (deleted)}
		match=false
		for want in "$@"; do
			[ "$exe" = "$want" ] && match=true
		done
		$match || continue
		if grep -q kubepods "$p/cgroup" 2>/dev/null; then continue; fi
		# The front is "pleg-nri front ..."; the core is the daemon (no command).
		args=$(tr '\0' '\n' <"$p/cmdline" 2>/dev/null | sed -n 2p) || args=
		if [ "$args" = front ]; then r=front; else r=core; fi
		if [ "$role" = all ] || [ "$role" = "$r" ]; then echo "${p##*/} $r $exe"; fi
	done
}

# stop_processes ROLE EXE...: SIGTERM to those processes, SIGKILL to any still there 15 s later.
stop_processes() {
	pids=$(processes "$@" | cut -d' ' -f1)
	[ -n "$pids" ] || return 0
	log "stopping pleg-nri processes: $(processes "$@" | tr '\n' ';')"
	# shellcheck disable=SC2086 # one pid a word
	kill $pids 2>/dev/null || true
	i=0
	while [ -n "$(processes "$@")" ]; do
		i=$((i + 1))
		if [ "$i" -gt 15 ]; then
			pids=$(processes "$@" | cut -d' ' -f1)
			log "still running after 15s, killing: $pids"
			# shellcheck disable=SC2086
			kill -9 $pids 2>/dev/null || true
			break
		fi
		sleep 1
	done
}

# remove_systemd: stop and remove the host service (its front stays: KillMode=process; a front of the
# same configuration serves the next core of either mode).
remove_systemd() {
	if host systemctl cat pleg-nri.service >/dev/null 2>&1; then
		log "removing pleg-nri.service"
		host systemctl disable --now pleg-nri.service || true
		sh "$SRC/install.sh" --root "$HOST_ROOT" --mode systemd --uninstall
		host systemctl daemon-reload
	fi
}

# remove_nri: remove the pre-registered files and stop their core (containerd does not stop a plugin
# whose file is gone); its front stays.
remove_nri() {
	if [ -e "$HOST_ROOT$NRI_BIN" ] || [ -n "$(processes core "$NRI_BIN")" ]; then
		log "removing the pre-registered pleg-nri"
		sh "$SRC/install.sh" --root "$HOST_ROOT" --mode nri --uninstall
		stop_processes core "$NRI_BIN"
	fi
}

# running_version: the version the core serving READYZ's /metrics reports (pleg_nri_build_info).
running_version() {
	rest=${READYZ#http://}
	hostport=${rest%%/*}
	printf 'GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n' "$hostport" |
		nc -w 2 "${hostport%:*}" "${hostport##*:}" 2>/dev/null |
		sed -n 's/^pleg_nri_build_info{process="core",version="\([^"]*\)"} 1$/\1/p' | head -1
}

# image_version: this image's pleg-nri version.
image_version() { "$BIN" version | sed -n '1s/^pleg-nri //p'; }

# wait_version: the serving core runs this image's version, within READY_TIMEOUT seconds (a core of
# the previous version may still answer /readyz for a moment).
wait_version() {
	want=$(image_version)
	i=0
	until [ "$(running_version)" = "$want" ]; do
		i=$((i + 1))
		[ "$i" -le "$READY_TIMEOUT" ] || die "the pleg-nri serving $READYZ runs version '$(running_version)', not this image's $want"
		sleep 1
	done
	log "the serving core runs $want"
}

# containerd_config REGISTRATION REQUEST: containerd's NRI timeouts in the drop-in (both empty: no
# drop-in), and containerd's config importing it; prints "changed" when a file changed (containerd
# reads them only when it starts), else "unchanged". containerd's config is edited once, to add the
# import, which stays (it matches nothing once the drop-in is gone).
containerd_config() {
	dropin=$HOST_ROOT$CONTAINERD_DROPIN
	main=$HOST_ROOT$CONTAINERD_CONFIG
	if [ -z "$1$2" ]; then
		if [ -e "$dropin" ]; then
			rm -f "$dropin"
			echo changed
		else
			echo unchanged
		fi
		return 0
	fi
	[ -f "$main" ] || die "containerd.nri: no containerd config at $CONTAINERD_CONFIG (PLEG_NRI_CONTAINERD_CONFIG) to import the timeouts"
	# The drop-in in the config's own version (containerd migrates an older one, with a warning).
	version=$(sed -n 's/^[[:space:]]*version[[:space:]]*=[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$main" | head -1)
	want="# Written by pleg-nri's Helm chart (containerd.nri): containerd's NRI timeouts. Removed when
# the option is off or the chart is uninstalled.
version = ${version:-2}

[plugins.\"io.containerd.nri.v1.nri\"]"
	[ -z "$1" ] || want="$want
  plugin_registration_timeout = \"$1\""
	[ -z "$2" ] || want="$want
  plugin_request_timeout = \"$2\""
	changed=unchanged
	if [ "$(cat "$dropin" 2>/dev/null)" != "$want" ]; then
		mkdir -p "$(dirname "$dropin")"
		printf '%s\n' "$want" >"$dropin.tmp"
		mv "$dropin.tmp" "$dropin"
		changed=changed
	fi
	# The import: already there (ours, or containerd's own conf.d/*.toml), added to an imports array,
	# or a new imports key after version (top-level keys come before the first table).
	all=$(dirname "$CONTAINERD_CONFIG")/conf.d/*.toml
	if ! grep -qF -e "\"$CONTAINERD_IMPORT\"" -e "'$CONTAINERD_IMPORT'" -e "\"$all\"" -e "'$all'" "$main"; then
		awk -v imp="\"$CONTAINERD_IMPORT\"" '
			done == 0 && /^[[:space:]]*imports[[:space:]]*=[[:space:]]*\[/ { sub(/\[/, "[" imp ", "); done = 1 }
			{ lines[NR] = $0 }
			done == 0 && ver == 0 && /^[[:space:]]*version[[:space:]]*=/ { ver = NR }
			END {
				if (done == 0 && ver == 0) print "imports = [" imp "]"
				for (i = 1; i <= NR; i++) {
					print lines[i]
					if (done == 0 && i == ver) print "imports = [" imp "]"
				}
			}' "$main" >"$main.pleg-nri.tmp.new"
		# Replaced atomically, with the config's owner and mode.
		cp -p "$main" "$main.pleg-nri.tmp"
		cat "$main.pleg-nri.tmp.new" >"$main.pleg-nri.tmp"
		rm -f "$main.pleg-nri.tmp.new"
		mv "$main.pleg-nri.tmp" "$main"
		changed=changed
	fi
	echo "$changed"
}

# restart_containerd WHY: restart containerd (its config changed; systemctl waits for its start).
restart_containerd() {
	log "restarting $CONTAINERD_UNIT: $1"
	host systemctl restart "$CONTAINERD_UNIT"
}

# same FILE1 FILE2: both exist with the same content.
same() { [ -f "$1" ] && [ -f "$2" ] && [ "$(sha256sum <"$1")" = "$(sha256sum <"$2")" ]; }

install() {
	restarted=false
	trap 'stop_health_server' EXIT
	trap 'exit 143' TERM INT
	health_server
	ctrd=$(containerd_config "$NRI_REGISTRATION_TIMEOUT" "$NRI_REQUEST_TIMEOUT") || exit 1
	[ "$ctrd" = unchanged ] ||
		log "containerd's NRI timeouts: registration '${NRI_REGISTRATION_TIMEOUT:-default}', request '${NRI_REQUEST_TIMEOUT:-default}' ($CONTAINERD_DROPIN)"
	case $MODE in
	systemd)
		# A switch from mode nri: the pre-registered core goes (else the service's core waits for its
		# state directory's lock, in vain).
		remove_nri
		[ "$ctrd" = unchanged ] || restart_containerd "its NRI configuration changed"
		if same "$BIN" "$HOST_ROOT/usr/local/bin/pleg-nri" && same "$CONFIG" "$HOST_ROOT/etc/pleg-nri/config.yaml" &&
			same "$SRC/systemd/pleg-nri.service" "$HOST_ROOT/etc/systemd/system/pleg-nri.service" &&
			host systemctl is-active -q pleg-nri.service && [ "$(running_version)" = "$(image_version)" ]; then
			log "$("$BIN" version) is installed and running"
		else
			sh "$SRC/install.sh" --root "$HOST_ROOT" --mode systemd --binary "$BIN" --config "$CONFIG"
			host systemctl daemon-reload
			host systemctl enable pleg-nri.service
			log "restarting pleg-nri.service"
			host systemctl restart pleg-nri.service
			restarted=true
		fi
		;;
	nri)
		# A switch from mode systemd: the service goes (the pre-registered core leaves another
		# install's core alone).
		remove_systemd
		# The serving core's version too: the files can be in place while an older core still serves.
		if [ "$ctrd" = unchanged ] && same "$BIN" "$HOST_ROOT/opt/nri/plugins/10-pleg-nri" && same "$CONFIG" "$HOST_ROOT/etc/nri/conf.d/10-pleg-nri.conf" &&
			ready && [ "$(running_version)" = "$(image_version)" ]; then
			log "$("$BIN" version) is installed and running pre-registered"
		else
			sh "$SRC/install.sh" --root "$HOST_ROOT" --mode nri --binary "$BIN" --config "$CONFIG"
			# containerd starts pre-registered plugins only when it starts, and never restarts one; the
			# one it starts takes over from a core of the previous binary or configuration.
			log "restarting containerd.service, which starts pre-registered plugins"
			host systemctl restart containerd.service
			restarted=true
		fi
		;;
	*) die "PLEG_NRI_MODE: want systemd or nri, got $MODE" ;;
	esac
	wait_ready
	wait_version
	if [ "$SWITCH" = true ]; then
		was_switched=false
		[ -e "$SWITCHED" ] && was_switched=true
		kubelet_switch
		restart_kubelet "$(switched)"
		if [ "$out" = unchanged ] && $was_switched && $restarted && [ "$RESTART_KUBELET" = true ]; then
			log "pleg-nri was restarted under a switched kubelet: restarting $KUBELET_UNIT so that it streams events again"
			host systemctl restart "$KUBELET_UNIT"
		fi
	elif [ -e "$SWITCHED" ]; then
		kubelet_restore
		restart_kubelet "$(restored)"
	fi
	touch "$READY_FILE"
	log "done; staying for the DaemonSet"
	trap 'exit 0' TERM INT
	# With the switch: watch the kubelet's settings for a drift (kubeadm upgrade node rewrites them
	# from its ConfigMap), log it, and re-apply the switch when asked (PLEG_NRI_REAPPLY_SWITCH).
	drifted=false
	while :; do
		sleep "$DRIFT_PERIOD" &
		wait $!
		# The readiness check's server, should it have ended.
		if [ -n "$health_pid" ] && ! kill -0 "$health_pid" 2>/dev/null; then
			log "the readiness check's server ended: starting it again"
			health_server
		fi
		[ "$SWITCH" = true ] || continue
		if drift=$(kubelet_check); then
			$drifted && log "kubelet: settings as switched again"
			drifted=false
			continue
		fi
		$drifted || log "kubelet: drift from the switch: $(echo "$drift" | tr '\n' ';')"
		drifted=true
		if [ "$REAPPLY" = true ]; then
			log "kubelet: re-applying the switch (kubelet.reapplySwitch)"
			kubelet_switch
			restart_kubelet "$(switched)"
		fi
	done
}

uninstall() {
	restarted=false
	if [ -e "$SWITCHED" ]; then
		kubelet_restore
		restart_kubelet "$(restored)"
		i=0
		until host systemctl is-active -q "$KUBELET_UNIT"; do
			i=$((i + 1))
			[ "$i" -le 60 ] || die "$KUBELET_UNIT is not active 60s after its restart"
			sleep 1
		done
	fi
	# Both modes, whatever MODE says: a switch of mode, or an upgrade, may have left the other's files
	# and processes (a front keeps running across both).
	if host systemctl cat pleg-nri.service >/dev/null 2>&1; then
		# The core first (while it runs, it starts a new front in place of one that ends), then what
		# KillMode=process leaves on stop: the front; the kubelet is off pleg-nri.
		host systemctl stop pleg-nri.service 2>/dev/null || true
		host systemctl kill --kill-whom=all pleg-nri.service 2>/dev/null || true
	fi
	remove_systemd
	remove_nri
	# containerd's NRI timeouts, if the chart set them: containerd's defaults again.
	if [ "$(containerd_config "" "")" = changed ]; then
		restart_containerd "the chart's NRI timeouts are removed"
	fi
	# What is left of this install on the host, a process of a replaced binary included: fronts, and a
	# core of either mode.
	# The cores first: a core that runs starts a new front in place of one that ends.
	stop_processes core "$SYSTEMD_BIN" "$NRI_BIN"
	stop_processes all "$SYSTEMD_BIN" "$NRI_BIN"
	sh "$SRC/install.sh" --root "$HOST_ROOT" --mode systemd --uninstall
	sh "$SRC/install.sh" --root "$HOST_ROOT" --mode nri --uninstall
	log "pleg-nri removed"
}

# host_endpoint ENDPOINT: a unix socket endpoint of the host as this pod reaches it (under HOST_ROOT);
# a TCP endpoint as it is.
host_endpoint() {
	case $1 in
	unix://*) echo "unix://$HOST_ROOT${1#unix://}" ;;
	/*) echo "$HOST_ROOT$1" ;;
	*) echo "$1" ;;
	esac
}

# health_server: serve node.sh health on HEALTH_ADDRESS (busybox httpd, CGI) in the background, the
# server's pid in health_pid; tried again for 30 s while the address is in use (the previous pod's
# server going away).
health_pid=
health_server() {
	[ -n "$HEALTH_ADDRESS" ] || return 0
	mkdir -p "$HEALTH_DIR/cgi-bin"
	# The kubelet's event of a failed HTTP probe gives only the status code: each change of the
	# result goes to the pod's log too (the CGI program's stderr is the server's), with the checks'
	# output.
	cat >"$HEALTH_DIR/cgi-bin/health" <<-EOF
		#!/bin/sh
		if out=\$(/bin/sh "$SELF" health 2>&1); then st="200 OK"; now=ready; else st="503 Service Unavailable"; now="not ready"; fi
		if [ "\$now" != "\$(cat "$HEALTH_DIR/state" 2>/dev/null)" ]; then
			echo "\$now" >"$HEALTH_DIR/state"
			echo "pleg-nri node: readiness: \$now: \$(echo "\$out" | tr '\n' ';')" >&2
		fi
		printf 'Status: %s\r\nContent-Type: text/plain\r\n\r\n%s\n' "\$st" "\$out"
	EOF
	rm -f "$HEALTH_DIR/state"
	chmod 0755 "$HEALTH_DIR/cgi-bin/health"
	i=0
	while :; do
		"$BUSYBOX" httpd -f -p "$HEALTH_ADDRESS" -h "$HEALTH_DIR" &
		health_pid=$!
		sleep 1
		kill -0 "$health_pid" 2>/dev/null && break
		i=$((i + 1))
		[ "$i" -lt 30 ] || die "cannot serve the readiness check on $HEALTH_ADDRESS"
	done
	log "serving the readiness check on http://$HEALTH_ADDRESS/cgi-bin/health"
}

stop_health_server() {
	[ -z "$health_pid" ] || kill "$health_pid" 2>/dev/null || true
}

# health: the readiness probe. Ready once this pod's install is done (so that a rollout waits for it)
# and for as long as pleg-nri serves the node: its core's /readyz answers 200 and the kubelet's
# endpoint (the front) answers a CRI Version call, each within HEALTH_TIMEOUT seconds; with the switch,
# also while the kubelet's settings are still the switch's (not after kubeadm upgrade node put the
# ConfigMap's back).
health() {
	[ -e "$READY_FILE" ] || { echo "the install has not finished"; exit 1; }
	ok=true
	"$BIN" health --readyz "$READYZ" --runtime-endpoint "$(host_endpoint "$ENDPOINT")" --timeout "${HEALTH_TIMEOUT}s" || ok=false
	if [ "$SWITCH" = true ]; then
		if out=$(kubelet_check); then
			echo "kubelet settings: as switched"
		else
			echo "kubelet settings: FAIL: $out"
			ok=false
		fi
	fi
	$ok
}

case ${1:-} in
install) install ;;
uninstall) uninstall ;;
processes) processes all "$SYSTEMD_BIN" "$NRI_BIN" ;;
health) health ;;
# health-server: serve node.sh health over HTTP until killed, for tests.
health-server)
	trap 'stop_health_server' EXIT
	trap 'exit 0' TERM INT
	health_server
	wait
	;;
# containerd-config: containerd_config with the environment's timeouts (no restart), for tests.
containerd-config) containerd_config "$NRI_REGISTRATION_TIMEOUT" "$NRI_REQUEST_TIMEOUT" ;;
# kubelet-switch, kubelet-restore: the switch's and the restore's edits of the kubelet's settings and
# mark (no restart), printing changed or unchanged, for tests.
kubelet-switch)
	kubelet_switch
	echo "$out"
	;;
kubelet-restore)
	kubelet_restore
	echo "$out"
	;;
*) die "usage: node.sh install|uninstall|processes|health|health-server|containerd-config|kubelet-switch|kubelet-restore" ;;
esac
