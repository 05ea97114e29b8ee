#!/usr/bin/env bash
# Builds upstream's node e2e suite, the test binary of k8s.io/kubernetes/test/e2e_node, unmodified, from
# the Go module proxy into $PLEG_NRI_CACHE/e2e-node-<version>/e2e_node.test, once per version (a second
# run builds nothing); with E2E_SUITE=e2e, the cluster suite of k8s.io/kubernetes/test/e2e instead, into
# $PLEG_NRI_CACHE/e2e-<version>/e2e.test (make e2e-cluster-conformance). Either comes with what runs it: the ginkgo CLI at the version k8s.io/kubernetes requires (it
# runs the suite's specs in parallel processes, as upstream's jobs do) and agnhost, the test image's
# program, from k8s.io/kubernetes/test/images/agnhost at the same version. The binary starts its own etcd
# and API server (test/e2e_node/services); the kubelet it runs is the one
# test/kubelet-e2e/hack/build-kubelet.sh builds for the same version.
#
# Same way as build-kubelet.sh (k8s.io/kubernetes cannot be `go install`ed): a scratch module that
# requires k8s.io/kubernetes and replaces every staging module with its published release; `go get -t`
# adds the suite's test dependencies, then `go test -c` builds it.
#
# It is the heaviest build of the project (about an hour on two busy cores with a cold Go build cache,
# measured at v1.37.2; 5 min at v1.35.4 right after that version's kubelet was built): run it
# alone, never beside another Kubernetes build.
#
# Usage: build-e2e-node.sh          (prints the directory on success: e2e_node.test or e2e.test, ginkgo, agnhost)
# Env:   PLEG_NRI_CACHE             cache root (default /var/cache/pleg-nri)
#        KUBELET_VERSION            default v1.37.2 (v1.35.x, v1.36.3, v1.37.2)
#        E2E_SUITE                  e2e_node (default) or e2e
set -euo pipefail

KUBELET_VERSION=${KUBELET_VERSION:-v1.37.2}
CACHE=${PLEG_NRI_CACHE:-/var/cache/pleg-nri}
case ${E2E_SUITE:-e2e_node} in
e2e_node) out="$CACHE/e2e-node-$KUBELET_VERSION" ;;
e2e) out="$CACHE/e2e-$KUBELET_VERSION" ;;
*) echo "build-e2e-node: ERROR: E2E_SUITE must be e2e_node or e2e, not $E2E_SUITE" >&2; exit 1 ;;
esac
suite=${E2E_SUITE:-e2e_node}
pkg=k8s.io/kubernetes/test/$suite

log() { echo "build-e2e-node: $*" >&2; }
die() { echo "build-e2e-node: ERROR: $*" >&2; exit 1; }
# shellcheck source=../../../hack/retry.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../../hack/retry.sh"

[[ $KUBELET_VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "KUBELET_VERSION must look like v1.36.3, not $KUBELET_VERSION"
minor=${BASH_REMATCH[1]}
staging_version="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
command -v go >/dev/null || die "go is not on PATH"
mkdir -p "$CACHE"

# The same lock as the other Kubernetes builds of this version would be too narrow: any two of them
# starve each other on this machine, so every heavy build of the suite waits for the one before.
exec 8>"$CACHE/.e2e-node.lock"
flock 8

bins=("$suite.test" ginkgo agnhost)
done=true
for b in "${bins[@]}"; do [ -x "$out/$b" ] || done=false; done
if [ -f "$out/.done" ] && $done; then
	echo "$out"
	exit 0
fi

export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local GOWORK=off
log "building $pkg $KUBELET_VERSION into $out (minutes after the same kubelet build, about an hour from a cold Go build cache)"
start=$SECONDS
rm -rf "$out.tmp"
mkdir -p "$out.tmp/src"
src=$(cd "$out.tmp/src" && go_mod_dir "k8s.io/kubernetes@$KUBELET_VERSION") || die "cannot download k8s.io/kubernetes@$KUBELET_VERSION"
[ -d "$src/test/$suite" ] || die "k8s.io/kubernetes@$KUBELET_VERSION has no test/$suite"
staging=$(sed -n 's|^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/k8s\.io/[a-z0-9-]*$|\1|p' "$src/go.mod")
[ -n "$staging" ] || die "found no staging replacements in $src/go.mod"
{
	echo "module pleg-nri.test/e2e-node-build"
	echo
	echo "go $(go env GOVERSION | sed 's/^go//')"
	echo
	echo "require k8s.io/kubernetes $KUBELET_VERSION"
	echo
	echo "replace ("
	for m in $staging; do echo "	$m => $m $staging_version"; done
	echo ")"
} >"$out.tmp/src/go.mod"

# -t: the suite's test-only dependencies too. Each step with its own error.
retry go -C "$out.tmp/src" get -t "$pkg@$KUBELET_VERSION" >&2 || die "go get -t $pkg@$KUBELET_VERSION failed"
agnhost=k8s.io/kubernetes/test/images/agnhost
retry go -C "$out.tmp/src" get "$agnhost@$KUBELET_VERSION" >&2 || die "go get $agnhost@$KUBELET_VERSION failed"
# The ginkgo CLI at the version the suite is built with (a different CLI refuses to run it).
ginkgo_version=$(sed -n 's|^[[:space:]]*github.com/onsi/ginkgo/v2 \(v[^[:space:]]*\).*|\1|p' "$src/go.mod" | head -n 1)
[ -n "$ginkgo_version" ] || die "found no github.com/onsi/ginkgo/v2 in $src/go.mod"
retry go -C "$out.tmp/src" get "github.com/onsi/ginkgo/v2/ginkgo@$ginkgo_version" >&2 ||
	die "go get github.com/onsi/ginkgo/v2/ginkgo@$ginkgo_version failed"
vpkg=k8s.io/component-base/version
CGO_ENABLED=0 go -C "$out.tmp/src" test -c -trimpath -o "$out.tmp/$suite.test" -ldflags "-s -w \
	-X $vpkg.gitVersion=$KUBELET_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor \
	-X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z" \
	"$pkg" >&2 || die "building $pkg $KUBELET_VERSION failed"
CGO_ENABLED=0 go -C "$out.tmp/src" build -trimpath -o "$out.tmp/agnhost" -ldflags "-s -w" "$agnhost" >&2 ||
	die "building $agnhost $KUBELET_VERSION failed"
CGO_ENABLED=0 go -C "$out.tmp/src" build -trimpath -o "$out.tmp/ginkgo" -ldflags "-s -w" github.com/onsi/ginkgo/v2/ginkgo >&2 ||
	die "building ginkgo $ginkgo_version failed"
"$out.tmp/$suite.test" --list-images >/dev/null 2>"$out.tmp/list-images.err" ||
	die "the built $suite.test does not run: $(tail -n 5 "$out.tmp/list-images.err")"
"$out.tmp/ginkgo" version >&2 || die "the built ginkgo does not run"
rm -f "$out.tmp/list-images.err"
rm -rf "$out.tmp/src"
touch "$out.tmp/.done"
rm -rf "$out"
mv "$out.tmp" "$out"
log "built $pkg, agnhost and ginkgo $ginkgo_version ($KUBELET_VERSION) in $((SECONDS - start))s"
echo "$out"
