#!/usr/bin/env bash
# retry: runs a command that reaches a package registry (the Go module proxy, Debian's archive) again
# when it fails, as such a registry times out now and then: RETRY_ATTEMPTS tries in all (default 4),
# RETRY_DELAY seconds before the second (default 2), doubling after each. Each failure is reported with
# the command and its exit status; after the last, retry returns that status, so the caller's own
# error follows (`retry go get ... || die "go get ... failed"`).
#
# Sourced (`. hack/retry.sh`), it defines the functions retry, apt_get and go_mod_dir; run (`bash
# hack/retry.sh CMD...`, as the Makefile does), it retries its arguments (which may call apt_get).

retry() {
	local attempts=${RETRY_ATTEMPTS:-4} delay=${RETRY_DELAY:-2} n=1 rc
	while :; do
		"$@" && return 0
		rc=$?
		if [ "$n" -ge "$attempts" ]; then
			echo "retry: '$*' failed $n times (last exit status $rc)" >&2
			return "$rc"
		fi
		echo "retry: '$*' failed (exit status $rc): try $((n + 1)) of $attempts in ${delay}s" >&2
		sleep "$delay"
		n=$((n + 1))
		delay=$((delay * 2))
	done
}

# apt_get ARG...: apt-get, one at a time. make test builds in the background while it tests
# (hack/with-background.sh), and a second apt-get fails on apt's locks instead of waiting for the first.
apt_get() {
	flock "${APT_GET_LOCK:-/run/lock/pleg-nri-apt-get.lock}" apt-get "$@"
}

# go_mod_dir MODULE@VERSION: downloads the module from the Go module proxy (retried) and prints its
# directory in the module cache; on failure it prints go's own error and returns 1. Call it from outside
# any module (a scratch directory), so that no go.mod is touched.
go_mod_dir() {
	local json dir
	json=$(retry go mod download -json "$1")
	dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$json" | tail -n 1)
	if [ -z "$dir" ] || [ ! -f "$dir/go.mod" ]; then
		echo "go mod download $1: $(sed -n 's/^[[:space:]]*"Error": "\(.*\)"$/\1/p' <<<"$json" | tail -n 1)" >&2
		return 1
	fi
	echo "$dir"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	[ $# -gt 0 ] || { echo "usage: retry.sh COMMAND [ARG...]" >&2; exit 2; }
	retry "$@"
fi
