#!/usr/bin/env bash
# with-background: runs a build in the background, at the lowest CPU and I/O priority, while a
# foreground command runs, so that the build uses the CPU the foreground leaves idle. make test runs
# its checks and tests in the foreground and builds what its integration tests need later (containerd,
# the kubelets, the Debian base image) behind them: on a cold cache that is 20 minutes of builds, and
# the tests wait on sockets and processes much of the time.
#
# Usage: with-background.sh LOG BACKGROUND -- FOREGROUND...
#
# BACKGROUND is one shell command (run by bash -c); its output goes to LOG. The foreground never
# depends on it: every step the foreground needs takes the same cache lock as the background's and
# finds the result done, waits for the background to finish it, or (if the background failed) does it
# itself and fails with its own error. The background runs in its own session, whose autogroup is
# given nice 19 where the kernel has autogroups (a plain nice does not reach across them), with nice 19
# and idle I/O priority as well. When the foreground ends, a background still running is stopped (its
# whole process group: every build script cleans up its temporary files on SIGTERM), and the exit
# status is the foreground's.
set -uo pipefail

[ $# -ge 4 ] && [ "$3" = -- ] || { echo "usage: with-background.sh LOG BACKGROUND -- FOREGROUND..." >&2; exit 2; }
log=$1 bg=$2
shift 3

start=$SECONDS
# setsid in a non-interactive shell's background job execs in place: $! is the session's leader, and
# its process group is the session's.
setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 ionice -c 3 bash -c "$0"' "$bg" >"$log" 2>&1 &
bg_pid=$!
echo "with-background: building in the background (pid $bg_pid, lowest priority): $bg; log: $log"

stop_background() {
	kill -0 "$bg_pid" 2>/dev/null || return 0
	echo "with-background: the foreground ended first: stopping the background build (log: $log)"
	kill -TERM -- "-$bg_pid" 2>/dev/null
	for _ in $(seq 50); do
		kill -0 "$bg_pid" 2>/dev/null || break
		sleep 0.2
	done
	kill -KILL -- "-$bg_pid" 2>/dev/null
	wait "$bg_pid" 2>/dev/null
}
trap stop_background EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$@"
rc=$?

if ! kill -0 "$bg_pid" 2>/dev/null; then
	wait "$bg_pid"
	bg_rc=$?
	if [ "$bg_rc" -ne 0 ]; then
		# Not the foreground's failure: what the foreground needed it built itself.
		echo "with-background: the background build failed (exit status $bg_rc); its last lines ($log):"
		tail -n 20 "$log"
	fi
fi
echo "with-background: foreground done in $((SECONDS - start))s (exit status $rc)"
exit "$rc"
