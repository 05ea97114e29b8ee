#!/usr/bin/env bash
# make bench-compare BASE=<commit> [ROUNDS=2]: make bench's benchmarks (the go test command of the
# Makefile's bench target) in this tree (HEAD, as it is, uncommitted changes included) and in a temporary
# worktree of BASE (its own harness and pleg-nri binary), ROUNDS rounds of one run each, the side that goes
# first alternating from round to round (HEAD BASE, BASE HEAD, ...); then test/containerd-it/cmd/bench-compare
# writes docs/bench-compare-<base>.md. Each run writes its own results JSON and log under BENCH_COMPARE_OUT
# (default /tmp/pleg-nri-bench-compare); runs.tsv lists the runs with their times, load averages and exit
# statuses. Both sides use the dependency cache ($PLEG_NRI_CACHE) that make deps-runtime fills (the
# Makefile's target runs it first; run it yourself before calling this script directly). Needs root, as
# make bench. BASE=HEAD compares HEAD with itself: what the noise alone looks like.
#
# BENCH_COMPARE_DRY=1 prints the commands it would run and runs nothing (no worktree either).
set -euo pipefail

usage() {
	echo "usage: $0 BASE [ROUNDS]" >&2
	exit 2
}
[ $# -ge 1 ] && [ $# -le 2 ] || usage
base=$1
rounds=${2:-2}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench-compare: ROUNDS=$rounds: want a number from 1" >&2; exit 2; }
GO=${GO:-go}
pkgs=${INTEGRATION_PKGS:-./test/containerd-it/}
dry=${BENCH_COMPARE_DRY:-}
out=${BENCH_COMPARE_OUT:-/tmp/pleg-nri-bench-compare}
case $out in /*/*) ;; *) echo "bench-compare: BENCH_COMPARE_OUT=$out: want an absolute path below a directory (it is emptied)" >&2; exit 2 ;; esac
export GOFLAGS=${GOFLAGS:--buildvcs=false}

top=$(git rev-parse --show-toplevel)
cd "$top"
base_sha=$(git rev-parse --verify --quiet "$base^{commit}") || { echo "bench-compare: BASE=$base is not a commit" >&2; exit 2; }
short=$(git rev-parse --short=7 "$base_sha")
md=docs/bench-compare-$short.md

# describe REV: its short hash, commit date and subject (cut short: this project's subjects are long).
describe() {
	local s
	s=$(git log -1 --format='`%h` (%cs) %s' "$1")
	if [ "${#s}" -gt 140 ]; then s="${s:0:140}…"; fi
	printf '%s' "$s"
}
head_desc=$(describe HEAD)
if [ -n "$(git status --porcelain)" ]; then
	head_desc+=", with the tree's uncommitted changes and untracked files"
fi
base_desc=$(describe "$base_sha")

# The go test command of make bench (Makefile, target bench): keep the two the same.
bench=(test -count=1 -run '^$' -bench . -skip '^BenchmarkRestartStall$' -benchtime=1x -timeout 20m "$pkgs")

# quote ARGS...: the arguments as a shell would take them back.
quote() {
	local a sep=
	for a in "$@"; do
		if [[ $a =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then
			printf '%s%s' "$sep" "$a"
		else
			printf "%s'%s'" "$sep" "${a//\'/\'\\\'\'}"
		fi
		sep=' '
	done
}
bench_str="go $(quote "${bench[@]}")"

# run ARGS...: runs the command, or prints it when dry.
run() {
	if [ -n "$dry" ]; then
		echo "+ $(quote "$@")"
		return 0
	fi
	"$@"
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

if [ -n "$dry" ]; then
	echo "bench-compare: dry run (BENCH_COMPARE_DRY): HEAD $(git rev-parse --short=7 HEAD) against BASE $short, ROUNDS=$rounds; nothing runs"
	tmp=/tmp/pleg-nri-bench-compare-base.XXXXXX
else
	tmp=$(mktemp -d /tmp/pleg-nri-bench-compare-base.XXXXXX)
fi
tree=$tmp/tree
cleanup() {
	if [ -n "$dry" ]; then
		echo "+ git worktree remove --force $tree"
		return
	fi
	git -C "$top" worktree remove --force "$tree" 2>/dev/null || true
	rm -rf "$tmp"
	git -C "$top" worktree prune
}
trap cleanup EXIT
trap 'exit 130' INT TERM

run rm -rf "$out"
run mkdir -p "$out"
run git worktree add --quiet --detach "$tree" "$base_sha"

# Build both sides' test binaries first (niced: the machine is shared), so that a broken BASE fails here
# and no run pays for a compile (go test finds them in the build cache).
for dir in "$top" "$tree"; do
	run env -C "$dir" nice -n 10 "$GO" test -c -o /dev/null "$pkgs"
done

runs=$out/runs.tsv
if [ -z "$dry" ]; then
	printf 'round\tside\tfirst\tstart\tend\tload_before\tload_after\texit\tresults\n' >"$runs"
fi
failed=0

# bench_run ROUND SIDE FIRST DIR: one run of the benchmarks in DIR, appended to runs.tsv.
bench_run() {
	local round=$1 side=$2 first=$3 dir=$4
	local name res log start load_before rc
	name=r$round-$(tr '[:upper:]' '[:lower:]' <<<"$side")
	res=$out/$name.json log=$out/$name.log
	load_before=$(loadavg)
	echo "bench-compare: round $round of $rounds, $side ($dir), load $load_before"
	if [ -n "$dry" ]; then
		run env -C "$dir" PLEG_NRI_BENCH_RESULTS="$res" "$GO" "${bench[@]}"
		return
	fi
	start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
	set +e
	env -C "$dir" PLEG_NRI_BENCH_RESULTS="$res" "$GO" "${bench[@]}" 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
	set -e
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$side" "$first" "$start" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
		"$load_before" "$(loadavg)" "$rc" "$res" >>"$runs"
	if [ "$rc" != 0 ]; then
		echo "bench-compare: round $round, $side: go test exited $rc (log: $log)"
		failed=$((failed + 1))
	fi
}

for ((r = 1; r <= rounds; r++)); do
	if ((r % 2 == 1)); then
		bench_run "$r" HEAD 1 "$top"
		bench_run "$r" BASE 0 "$tree"
	else
		bench_run "$r" BASE 1 "$tree"
		bench_run "$r" HEAD 0 "$top"
	fi
done

run nice -n 10 "$GO" run ./test/containerd-it/cmd/bench-compare -runs "$runs" -md "$md" \
	-command "make bench-compare BASE=$base ROUNDS=$rounds" -head "$head_desc" -base "$base_desc" \
	-machine "$(nproc) CPUs, Linux $(uname -r)" -bench-command "$bench_str"
if [ "$failed" -gt 0 ]; then
	echo "bench-compare: $failed of $((2 * rounds)) runs failed (their logs are in $out); $md says which"
	exit 1
fi
