# pleg-nri: `make help` lists the targets.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

export PATH := /usr/local/go/bin:$(PATH)
export GOFLAGS ?= -buildvcs=false
# Binaries the tests need (containerd, runc, crictl, CNI, linters) are built here, one directory per
# version, outside the source tree.
export PLEG_NRI_CACHE ?= /var/cache/pleg-nri

GO              ?= go
BIN             := bin
VERSION         ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS         := -X main.version=$(VERSION)
STATICCHECK_VER := v0.8.2
STATICCHECK     := $(PLEG_NRI_CACHE)/staticcheck-$(STATICCHECK_VER)/staticcheck
HELM_VER        := v3.22.0
HELM            := $(PLEG_NRI_CACHE)/helm-$(HELM_VER)/helm
# promtool: without the service discovery plugins (one of their modules is not on the proxy).
PROMTOOL_VER    := v0.316.0
PROMTOOL        := $(PLEG_NRI_CACHE)/promtool-$(PROMTOOL_VER)/promtool
# Prometheus for make e2e-cluster: the same version, with node discovery in the cluster (kubernetes) and
# no other service discovery.
PROMETHEUS      := $(PLEG_NRI_CACHE)/prometheus-$(PROMTOOL_VER)/prometheus
# The distribution project's registry, for the node e2e specs that pull an image.
REGISTRY_VER    := v3.1.2
# node-problem-detector, for test-deploy's check of deploy/npd (make npd; not in go.mod).
NPD_VER         := v1.34.0
NPD             := $(PLEG_NRI_CACHE)/npd-$(NPD_VER)/node-problem-detector
REGISTRY        := $(PLEG_NRI_CACHE)/registry-$(REGISTRY_VER)/registry
# protoc-gen-go at the version of the google.golang.org/protobuf runtime in go.mod, which the generated
# code is checked against; protoc from Debian's protobuf-compiler.
PROTOC_GEN_GO_VER := $(shell awk '$$1 == "google.golang.org/protobuf" { print $$2 }' go.mod)
PROTOC_GEN_GO     := $(PLEG_NRI_CACHE)/protoc-gen-go-$(PROTOC_GEN_GO_VER)/protoc-gen-go
# The .proto files whose .pb.go are committed beside them.
PROTOS            := pleg/internal/checkpointpb/checkpoint.proto
INTEGRATION_PKGS := ./test/containerd-it/
# A real kubelet on the harness's containerd, directly and through pleg-nri (part of make integration).
KUBELET_E2E_PKG  := ./test/kubelet-e2e/
# The kubelets make integration runs the kubelet suite on: one of each meaning of the event stream
# (1.37: a STOPPED triggers a relist; 1.36: events write the pod cache). make kubelet-all adds 1.35.
KUBELET_TEST_VERSIONS ?= v1.37.2 v1.36.3
KUBELET_ALL_VERSIONS  ?= v1.37.2 v1.36.3 v1.35.4
# The kubelet of make bench-kubelet and make bench-node.
KUBELET_VERSION ?= v1.37.2
# WORKLOADS_LOAD keeps the node of make bench-workloads busy (cpu:N, N busy loops); empty: a quiet node.
WORKLOADS_LOAD ?=
# The idle pods of make bench-node and make bench-storm (the kubelet's maxPods is raised above 110; the
# reports of another count than 100 get it in their name, docs/kubelet-node-cost-<version>-<n>pods.md).
NODE_PODS ?= 100
# The deployment artifacts under systemd and helm (make test-deploy).
DEPLOY_PKG       := ./test/deploy/
# Upstream's node e2e suite (test/e2e_node of k8s.io/kubernetes) on the harness (make e2e-node).
E2E_NODE_PKG     := ./test/e2e-node/
UNIT_PKGS        = $(shell $(GO) list ./... | grep -v -x -F -e github.com/pleg-nri/pleg-nri/test/containerd-it -e github.com/pleg-nri/pleg-nri/test/kubelet-e2e -e github.com/pleg-nri/pleg-nri/test/deploy)
IT_TIMEOUT      ?= 30m
K8S_VERSIONS    ?= v1.37.2 v1.36.3
FUZZTIME        ?= 10s
# The fuzz targets run on Go 1.27.1 (fetched through the module proxy): Go 1.26's fuzz coordinator can
# report its own -fuzztime deadline as a failure ("context deadline exceeded", no failing input) when
# a worker is slow to stop on a loaded machine, go.dev/issue/75804, fixed in 1.27.
FUZZ_TOOLCHAIN  ?= go1.27.1
# Every download from a registry (the Go module proxy, Debian's archive) is tried again with backoff
# (hack/retry.sh): the registries time out now and then.
RETRY           := bash $(CURDIR)/hack/retry.sh

##@ Main

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
	  /^[a-zA-Z0-9_-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

.PHONY: run
run: build deps-runtime ## Demo: pleg-nri on an isolated containerd, a workload, its stream next to containerd's; leaves nothing behind.
	@bash hack/demo.sh

.PHONY: test
test: ## Everything CI runs: gofmt, vet, staticcheck, unit tests with -race, fuzzing, integration tests (also on containerd in Docker); what the integration tests need is built behind the checks.
	@bash hack/with-background.sh /tmp/pleg-nri-test-background.log '$(MAKE) --no-print-directory deps-background' -- \
	  $(MAKE) --no-print-directory verify unit fuzz integration-docker integration

##@ Build

.PHONY: build
build: ## Build bin/pleg-nri.
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/pleg-nri ./cmd/pleg-nri

##@ Deploy

IMAGE          ?= pleg-nri:$(VERSION)
IMAGE_TAR      ?= $(BIN)/pleg-nri-image.tar
# The tests make test-deploy-kind runs (a -run alternation of whole names).
KIND_TESTS     ?= TestHelmKind|TestHelmKindHealth|TestHelmKindDayTwo|TestHelmKindNPD
PREFIX         ?= /
INSTALL_MODE   ?= systemd
INSTALL_CONFIG ?=

.PHONY: image
image: ## OCI image (static pleg-nri FROM scratch, the host files, busybox for the installer) as IMAGE, saved to IMAGE_TAR.
	VERSION=$(VERSION) bash deploy/image/build.sh $(IMAGE) $(IMAGE_TAR)

$(HELM):
	@mkdir -p $(dir $@)
	GOBIN=$(dir $@) $(RETRY) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VER)

.PHONY: helm
helm: $(HELM) ## Build helm from the Go module proxy into the dependency cache.

$(NPD):
	bash hack/build-npd.sh $(NPD_VER) $@

.PHONY: npd
npd: $(NPD) ## Build node-problem-detector from the Go module proxy into the dependency cache (deploy/npd's test in make test-deploy).

$(REGISTRY):
	@mkdir -p $(dir $@)
	GOBIN=$(dir $@) $(RETRY) $(GO) install github.com/distribution/distribution/v3/cmd/registry@$(REGISTRY_VER)

$(PROMTOOL):
	@mkdir -p $(dir $@)
	GOBIN=$(dir $@) $(RETRY) $(GO) install -tags remove_all_sd github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VER)

$(PROMETHEUS):
	@mkdir -p $(dir $@)
	GOBIN=$(dir $@) $(RETRY) $(GO) install -tags remove_all_sd,enable_kubernetes_sd github.com/prometheus/prometheus/cmd/prometheus@$(PROMTOOL_VER)

.PHONY: prometheus
prometheus: $(PROMETHEUS) ## Build Prometheus (kubernetes service discovery only) from the Go module proxy into the dependency cache.

.PHONY: promtool
promtool: $(PROMTOOL) ## Build promtool from the Go module proxy into the dependency cache (~5 min cold).

.PHONY: install
install: build ## Install the host files under PREFIX (a root, default /): INSTALL_MODE=systemd (service) or nri (pre-registered).
	sh deploy/install.sh --root $(PREFIX) --mode $(INSTALL_MODE) --binary $(BIN)/pleg-nri $(if $(INSTALL_CONFIG),--config $(INSTALL_CONFIG))

.PHONY: uninstall
uninstall: ## Remove what make install put under PREFIX (the configuration and the state stay).
	sh deploy/install.sh --root $(PREFIX) --mode $(INSTALL_MODE) --uninstall

##@ Checks

.PHONY: verify
verify: deps-go fmt-check vet lint tidy-check generate-check ## gofmt, go vet, staticcheck, go mod tidy and the generated code.

.PHONY: deps-go
deps-go: ## Download the module's dependencies and the fuzzing toolchain (FUZZ_TOOLCHAIN), retried; every go command after it finds them.
	$(RETRY) $(GO) mod download
	$(RETRY) env GOTOOLCHAIN=$(FUZZ_TOOLCHAIN) $(GO) version

.PHONY: fmt-check
fmt-check: ## Fail if gofmt would change a file.
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

.PHONY: tidy-check
tidy-check: ## Fail if go mod tidy would change go.mod or go.sum (it prints the difference).
	$(GO) mod tidy -diff

.PHONY: vet
vet: ## go vet every package.
	$(GO) vet ./...

$(STATICCHECK):
	@mkdir -p $(dir $@)
	GOBIN=$(dir $@) $(RETRY) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VER)

.PHONY: lint
lint: $(STATICCHECK) ## staticcheck every package.
	$(STATICCHECK) ./...

##@ Generated code

$(PROTOC_GEN_GO):
	@mkdir -p $(dir $@)
	GOBIN=$(dir $@) $(RETRY) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VER)

.PHONY: protoc
protoc: ## Install protoc (Debian's protobuf-compiler) if it is missing.
	@command -v protoc >/dev/null || { \
	  test "$$(id -u)" = 0 || { echo "protoc is missing: apt-get install protobuf-compiler (as root)"; exit 1; }; \
	  $(RETRY) apt_get update -qq && $(RETRY) apt_get install -y -qq protobuf-compiler >/dev/null; }

# gen-into DIR: the .pb.go of PROTOS, generated under DIR (same relative paths).
define gen-into
protoc --plugin=protoc-gen-go=$(PROTOC_GEN_GO) --go_out=$(1) --go_opt=paths=source_relative $(PROTOS)
endef

.PHONY: generate
generate: protoc $(PROTOC_GEN_GO) ## Regenerate the committed .pb.go from the .proto files (installs protoc and protoc-gen-go if missing) and the front's revision (eventbridge/front/revision.go).
	$(call gen-into,.)
	$(GO) run ./hack/front-revision

.PHONY: generate-check
generate-check: protoc $(PROTOC_GEN_GO) ## Fail if the committed .pb.go differ from what make generate makes (the protoc version line aside).
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(call gen-into,$$tmp); \
	rc=0; for f in $(PROTOS:.proto=.pb.go); do \
	  diff -u -I '^//[[:space:]]*protoc[[:space:]]' $$f $$tmp/$$f || { echo "generate-check: $$f is not what make generate makes"; rc=1; }; \
	done; exit $$rc

##@ Tests

.PHONY: unit
unit: deps-go ## Unit tests with -race and goroutine-leak checks.
	$(GO) test -race -count=1 $(UNIT_PKGS)

.PHONY: fuzz
fuzz: deps-go ## Run every fuzz target of the unit packages for FUZZTIME each (default 10s), on Go FUZZ_TOOLCHAIN.
	@for pkg in $(UNIT_PKGS); do \
	  dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
	  for fn in $$(cat $$dir/*_test.go 2>/dev/null | sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p'); do \
	    echo "fuzz: $$fn in $$pkg for $(FUZZTIME)"; \
	    GOTOOLCHAIN=$(FUZZ_TOOLCHAIN) $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 2s $$pkg 2>&1 | { grep -v '^time=' || true; }; \
	  done; \
	done

.PHONY: deps
deps: deps-runtime deps-kubelet ## Install and build what the integration tests need (cached: a second run builds nothing).

# deps-background is what make test builds behind its checks and tests (hack/with-background.sh), in
# the order they need it, but for the Debian base image, which only waits on Debian's archive: it goes
# first so that its apt-get is over before the checks want theirs. make test runs the tests that need
# no kubelet (integration-docker, then the containerd tests) before the kubelet suites, so the
# kubelets, the longest builds, have the most idle CPU behind them.
.PHONY: deps-background
deps-background:
	bash test/images/debian-base.sh >/dev/null
	@$(MAKE) --no-print-directory deps-runtime deps-kubelet

.PHONY: deps-runtime
deps-runtime: ## Install and build containerd, runc, crictl, CNI and the test images' inputs (cached).
	@test "$$(id -u)" = 0 || { echo "the integration tests need root (they run containerd and runc)"; exit 1; }
	bash test/containerd-it/hack/install-deps.sh >/dev/null

.PHONY: deps-kubelet
deps-kubelet: ## Build the kubelets the kubelet suite and its benches run (cached; several minutes each the first time).
	@for v in $(KUBELET_TEST_VERSIONS) $(filter-out $(KUBELET_TEST_VERSIONS),$(KUBELET_VERSION)); do KUBELET_VERSION=$$v bash test/kubelet-e2e/hack/build-kubelet.sh >/dev/null || exit 1; done

.PHONY: integration
integration: deps-runtime image ## Integration tests against a real, isolated containerd with NRI, and a real kubelet on it (1.37.2 and 1.36.3; root, Linux).
	@$(MAKE) --no-print-directory run-integration KUBELETS="$(KUBELET_TEST_VERSIONS)"

.PHONY: kubelet-all
kubelet-all: deps ## The kubelet suite on every supported kubelet (KUBELET_ALL_VERSIONS: 1.37.2, 1.36.3, 1.35.4).
	@for v in $(KUBELET_ALL_VERSIONS); do KUBELET_VERSION=$$v bash test/kubelet-e2e/hack/build-kubelet.sh >/dev/null; done
	@$(MAKE) --no-print-directory run-integration PKGS= KUBELETS="$(KUBELET_ALL_VERSIONS)"

.PHONY: kubelet-races
kubelet-races: deps ## The kubelet's own races with EventedPLEG on 1.35/1.36 (static pods given a second container), counted on containerd's stream and on pleg-nri (KUBELET_VERSION; minutes per setup).
	PLEG_NRI_KUBELET_RACES=1 KUBELET_VERSION=$(KUBELET_VERSION) $(GO) test -count=1 -v -run '^TestStaticPodRestarts$$' -timeout 40m $(KUBELET_E2E_PKG)

# run-integration runs PKGS (default: the containerd tests) once, then the kubelet suite once per
# version in KUBELETS, and fails unless something ran and nothing failed.
PKGS ?= $(INTEGRATION_PKGS)
.PHONY: run-integration
run-integration:
	@set -o pipefail; start=$$(date +%s); log=/tmp/pleg-nri-it.log; : >$$log; rc=0; \
	if [ -n "$(PKGS)" ]; then PLEG_NRI_IMAGE_TAR=$(CURDIR)/$(IMAGE_TAR) $(GO) test -count=1 -v -timeout $(IT_TIMEOUT) $(PKGS) 2>&1 | tee -a $$log || rc=1; fi; \
	for v in $(KUBELETS); do \
	  echo "integration: the kubelet suite on kubelet $$v"; \
	  KUBELET_VERSION=$$v bash test/kubelet-e2e/hack/build-kubelet.sh >/dev/null || { rc=1; continue; }; \
	  KUBELET_VERSION=$$v $(GO) test -count=1 -v -timeout $(IT_TIMEOUT) $(KUBELET_E2E_PKG) 2>&1 | tee -a $$log || rc=1; \
	done; \
	passed=$$(grep -c -E '^\s*--- PASS' $$log || true); \
	failed=$$(grep -c -E '^\s*--- FAIL' $$log || true); \
	echo "integration: $$passed passed, $$failed failed in $$(( $$(date +%s) - start ))s (kubelets: $(KUBELETS))"; \
	test "$$passed" -gt 0 || { echo "integration: no integration test ran"; exit 1; }; \
	if grep -q 'SKIP (loud)' $$log; then echo "integration: a test make test must run was skipped:"; grep 'SKIP (loud)' $$log; rc=1; fi; \
	exit $$rc

.PHONY: integration-docker
integration-docker: deps-runtime ## The side-by-side scenario tests (TestCompare*) against containerd in Docker (image built offline, cached).
	@set -o pipefail; start=$$(date +%s); \
	PLEG_NRI_IT_CONTAINERD=docker $(GO) test -count=1 -v -run '^TestCompare' -timeout $(IT_TIMEOUT) $(INTEGRATION_PKGS) 2>&1 | tee /tmp/pleg-nri-it-docker.log; \
	passed=$$(grep -c -E '^\s*--- PASS' /tmp/pleg-nri-it-docker.log || true); \
	failed=$$(grep -c -E '^\s*--- FAIL' /tmp/pleg-nri-it-docker.log || true); \
	echo "integration-docker: $$passed passed, $$failed failed in $$(( $$(date +%s) - start ))s"; \
	test "$$passed" -gt 0 || { echo "integration-docker: no scenario test ran"; exit 1; }

.PHONY: e2e-kind
e2e-kind: ## kind clusters with and without pleg-nri (deploy/kind/kind-config.yaml), node images built offline; K8S_VERSIONS="v1.37.2 v1.36.3".
	@test "$$(id -u)" = 0 || { echo "e2e-kind needs root (it builds images with debootstrap)"; exit 1; }
	bash test/kind/e2e.sh $(K8S_VERSIONS)

# make e2e-cluster: the cluster's Kubernetes version (node image, kube-proxy, kubectl).
K8S_VERSION ?= v1.37.2
# KEEP=1 keeps make e2e-cluster's cluster (PLEG_NRI_E2E_KEEP), to look into a failure.
KEEP ?=

.PHONY: e2e-cluster
e2e-cluster: image helm prometheus ## A kind cluster of 3 nodes (K8S_VERSION, default v1.37.2): pod network, kube-proxy, the chart on every node, workloads, crash to restart per setup, a rolling upgrade and a rollback, Prometheus with the shipped rules and dashboard, uninstall; built offline (KEEP=1 keeps it).
	@test "$$(id -u)" = 0 || { echo "e2e-cluster needs root (it builds images with debootstrap)"; exit 1; }
	K8S_VERSION=$(K8S_VERSION) PLEG_NRI_IMAGE_TAR=$(CURDIR)/$(IMAGE_TAR) PLEG_NRI_HELM=$(HELM) PLEG_NRI_PROMETHEUS=$(PROMETHEUS) $(if $(KEEP),PLEG_NRI_E2E_KEEP=1) \
	  bash test/kind/cluster.sh

# make e2e-cluster-conformance: ginkgo's parallel processes per setup.
CONFORMANCE_PROCS ?= 4

.PHONY: e2e-cluster-conformance
e2e-cluster-conformance: deps-runtime image helm $(REGISTRY) ## Upstream's [sig-node] [Conformance] specs (e2e.test at K8S_VERSION, built once into the cache; its images built offline) on make e2e-cluster's 3-node cluster with GenericPLEG, containerd's stream and pleg-nri; writes docs/e2e-cluster-conformance-<version>.{md,json}.
	@test "$$(id -u)" = 0 || { echo "e2e-cluster-conformance needs root (it builds images with debootstrap)"; exit 1; }
	K8S_VERSION=$(K8S_VERSION) PLEG_NRI_IMAGE_TAR=$(CURDIR)/$(IMAGE_TAR) PLEG_NRI_HELM=$(HELM) PLEG_NRI_CONFORMANCE=1 CONFORMANCE_PROCS=$(CONFORMANCE_PROCS) PLEG_NRI_REGISTRY=$(REGISTRY) \
	  $(if $(KEEP),PLEG_NRI_E2E_KEEP=1) bash test/kind/cluster.sh

.PHONY: test-deploy
test-deploy: deps-runtime image helm promtool npd ## The image (docker load, ctr import), make install, systemd units and the chart's node agent under systemd, the chart, alerts (~3 min warm).
	@test -f test/images/debian-base.sh || { echo "test-deploy: test/images/debian-base.sh (the systemd base image) is missing"; exit 1; }
	bash test/images/debian-base.sh >/dev/null
	PLEG_NRI_IMAGE_TAR=$(CURDIR)/$(IMAGE_TAR) $(GO) test -count=1 -v -run '^(TestImage|TestMakeInstallPreregistered|TestPreRegistered)$$' -timeout 10m $(INTEGRATION_PKGS)
	PLEG_NRI_DEPLOY_TESTS=1 PLEG_NRI_IMAGE=$(IMAGE) PLEG_NRI_HELM=$(HELM) PLEG_NRI_PROMTOOL=$(PROMTOOL) PLEG_NRI_NPD=$(NPD) $(GO) test -count=1 -v -timeout 20m $(DEPLOY_PKG)

.PHONY: test-deploy-kind
test-deploy-kind: image helm prometheus npd ## The Helm chart in a kind cluster through every upgrade path of both modes (upgrades, a config change, mode switches), then uninstalled; the installer pod's readiness through faults of the core and the front, Prometheus finding it by its annotations; a real kubeadm upgrade node under each kubelet switch; deploy/npd's node condition raised and cleared (make e2e-kind's node image; ~25 min). KIND_TESTS=TestHelmKindDayTwo runs one.
	PLEG_NRI_KIND_TESTS=1 PLEG_NRI_IMAGE_TAR=$(CURDIR)/$(IMAGE_TAR) PLEG_NRI_HELM=$(HELM) PLEG_NRI_PROMETHEUS=$(PROMETHEUS) PLEG_NRI_NPD=$(NPD) $(GO) test -count=1 -v -run '^($(KIND_TESTS))$$' -timeout 60m $(DEPLOY_PKG)

.PHONY: conformance-kind
conformance-kind: image helm ## pleg-nri conformance inside a kind node (the chart installed, the kubelet switched): containerd's socket and pleg-nri's endpoint side by side (make e2e-kind's node image; ~10 min). CONFORMANCE_KIND_OUT=FILE keeps the table.
	PLEG_NRI_KIND_TESTS=1 PLEG_NRI_IMAGE_TAR=$(CURDIR)/$(IMAGE_TAR) PLEG_NRI_HELM=$(HELM) PLEG_NRI_CONFORMANCE_KIND_OUT=$(CONFORMANCE_KIND_OUT) $(GO) test -count=1 -v -run '^TestConformanceKind$$' -timeout 40m $(DEPLOY_PKG)

.PHONY: soak
soak: deps ## Long load and fault tests against a real containerd (TestSoak*, PLEG_NRI_SOAK=1; up to an hour), then the kubelet suite's on KUBELET_VERSION (10 SIGKILLs each of the core, containerd and the front under a kubelet).
	PLEG_NRI_SOAK=1 $(GO) test -count=1 -v -run 'Soak' -timeout 60m $(INTEGRATION_PKGS)
	PLEG_NRI_SOAK=1 KUBELET_VERSION=$(KUBELET_VERSION) $(GO) test -count=1 -v -run 'Soak' -timeout 60m $(KUBELET_E2E_PKG)

# hack/bench-compare.sh (make bench-compare) runs bench's go test command too: keep the two the same.
.PHONY: bench
bench: deps-runtime ## Side-by-side benchmarks against a real containerd (~5 min); writes docs/benchmarks.md and docs/exit-latency.svg.
	@out=/tmp/pleg-nri-bench; rm -rf $$out; mkdir -p $$out; hook=; \
	if ! list=$$($(GO) test -list '^BenchmarkHook' ./plugin/ 2>&1); then echo "$$list"; echo "bench: ./plugin/ does not build: its BenchmarkHook is left out"; \
	elif ! grep -q '^BenchmarkHook' <<<"$$list"; then echo "bench: ./plugin/ has no BenchmarkHook, skipped"; \
	elif $(GO) test -run '^$$' -bench '^BenchmarkHook' -benchtime 20000x -benchmem ./plugin/ 2>&1 | grep -v '^time=' | tee $$out/plugin.txt; then \
	  hook="-hook-bench $$out/plugin.txt"; \
	else echo "bench: the plugin's BenchmarkHook failed: left out of the report"; fi; \
	PLEG_NRI_BENCH_RESULTS=$$out/results.json $(GO) test -count=1 -run '^$$' -bench . -skip '^BenchmarkRestartStall$$' -benchtime=1x -timeout 20m $(INTEGRATION_PKGS); \
	$(GO) run ./test/containerd-it/cmd/bench-report -results $$out/results.json $$hook -md docs/benchmarks.md -svg docs/exit-latency.svg

# make bench-compare: the commit to compare this tree with, and the rounds (each runs both sides once, the
# side that goes first alternating). hack/bench-compare.sh runs make bench's go test command: keep the two
# the same. BENCH_COMPARE_DRY=1 prints the commands and runs nothing (nor make deps-runtime).
BASE ?=
ROUNDS ?= 2
ifneq ($(filter bench-compare,$(MAKECMDGOALS)),)
ifeq ($(BASE),)
$(error bench-compare: BASE=<commit> is required (make bench-compare BASE=a1ca225))
endif
endif

.PHONY: bench-compare
bench-compare: $(if $(BENCH_COMPARE_DRY),,deps-runtime) ## make bench's benchmarks in this tree and in a temporary worktree of BASE (a commit), ROUNDS (2) rounds in alternating order (~10 min a round); writes docs/bench-compare-<base>.md: pooled figures side by side, a 95 % interval of each difference, every round's figures.
	GO=$(GO) INTEGRATION_PKGS=$(INTEGRATION_PKGS) bash hack/bench-compare.sh '$(BASE)' '$(ROUNDS)'

# make bench-stall: the node's pods and the core restarts of BenchmarkRestartStall.
STALL_PODS ?= 110
STALL_RESTARTS ?= 20

.PHONY: bench-stall
bench-stall: deps-runtime ## What a restart of pleg-nri's core stalls pod starts (NRI's Synchronize holds every create and start), with STALL_PODS (110) pods, STALL_RESTARTS (20) restarts against as many quiet windows (~3 min); prints the figures.
	PLEG_NRI_BENCH_STALL_PODS=$(STALL_PODS) PLEG_NRI_BENCH_STALL_RESTARTS=$(STALL_RESTARTS) \
	  $(GO) test -count=1 -run '^$$' -bench '^BenchmarkRestartStall$$' -benchtime=1x -timeout 30m $(INTEGRATION_PKGS)

.PHONY: bench-kubelet
bench-kubelet: deps ## A real kubelet (KUBELET_VERSION, default v1.37.2)'s crash-to-restart time, per PLEG setup and with pleg-nri attached while the kubelet uses containerd's stream (controls; ~13 min); writes docs/kubelet-bench-<version>.{md,json}.
	KUBELET_VERSION=$(KUBELET_VERSION) PLEG_NRI_KUBELET_BENCH_MD=$(CURDIR)/docs/kubelet-bench-$(KUBELET_VERSION).md \
	  $(GO) test -count=1 -run '^$$' -bench BenchmarkCrashRestart -benchtime 1x -timeout 30m $(KUBELET_E2E_PKG)

.PHONY: bench-deletion
bench-deletion: deps ## A real kubelet (KUBELET_VERSION)'s static pod deletions, right after a sync and idle, 24 each per PLEG setup and pleg-nri with cache-tick (~12 min on 1.36); writes docs/kubelet-deletion-<version>.{md,json}.
	KUBELET_VERSION=$(KUBELET_VERSION) PLEG_NRI_KUBELET_DELETION_MD=$(CURDIR)/docs/kubelet-deletion-$(KUBELET_VERSION).md \
	  $(GO) test -count=1 -run '^$$' -bench BenchmarkPodDeletion -benchtime 1x -timeout 30m $(KUBELET_E2E_PKG)

.PHONY: bench-workloads
bench-workloads: deps ## A real kubelet (KUBELET_VERSION)'s init chain (3 init containers, then the app), Job-like pods (exit 0 after 100 ms -> Succeeded), a crash and a sidecar's OOM kill, 24 each per PLEG setup (pleg-nri as configured for that kubelet; ~15 min); WORKLOADS_LOAD=cpu:N keeps the node busy with N busy loops; writes docs/workloads-standalone-<version>[-cpu<N>].{md,json,svg}.
	KUBELET_VERSION=$(KUBELET_VERSION) PLEG_NRI_WORKLOADS_LOAD=$(WORKLOADS_LOAD) \
	  PLEG_NRI_WORKLOADS_MD=$(CURDIR)/docs/workloads-standalone-$(KUBELET_VERSION)$(if $(WORKLOADS_LOAD),-$(subst :,,$(WORKLOADS_LOAD))).md \
	  $(GO) test -count=1 -run '^$$' -bench BenchmarkWorkloads -benchtime 1x -timeout 90m $(KUBELET_E2E_PKG)

.PHONY: bench-node
bench-node: deps ## What NODE_PODS (100) pods cost the node per PLEG setup, idle, with churn and without the kubelet, and what containerd serves and spends its CPU on (KUBELET_VERSION; ~30 min); writes docs/kubelet-node-cost-<version>[-<n>pods].{md,json}.
	KUBELET_VERSION=$(KUBELET_VERSION) PLEG_NRI_NODE_BENCH_PODS=$(NODE_PODS) PLEG_NRI_NODE_BENCH_MD=$(CURDIR)/docs/kubelet-node-cost-$(KUBELET_VERSION).md PLEG_NRI_CONTAINERD_PROFILE=1 \
	  $(GO) test -count=1 -run '^$$' -bench BenchmarkNodeCost -benchtime 1x -timeout 90m $(KUBELET_E2E_PKG)

.PHONY: bench-storm
bench-storm: deps ## With NODE_PODS (100) idle pods, per PLEG setup: 100 pods deleted at once, 100 created at once, 50 containers crash-looping; times, node CPU, events/s, a probe of containerd (KUBELET_VERSION; ~30 min); writes docs/kubelet-storm-<version>[-<n>pods].{md,json}.
	KUBELET_VERSION=$(KUBELET_VERSION) PLEG_NRI_NODE_BENCH_PODS=$(NODE_PODS) PLEG_NRI_STORM_MD=$(CURDIR)/docs/kubelet-storm-$(KUBELET_VERSION).md PLEG_NRI_CONTAINERD_PROFILE=1 \
	  $(GO) test -count=1 -run '^$$' -bench BenchmarkNodeStorm -benchtime 1x -timeout 90m $(KUBELET_E2E_PKG)

# make e2e-node: the selection of upstream's pull-kubernetes-node-containerd-evented-pleg-e2e job
# (test-infra), plus [Alpha]: the job enables no alpha gate but EventedPLEG.
E2E_NODE_FOCUS ?= \[NodeConformance\]|\[Feature:.+\]|\[Feature\]
E2E_NODE_SKIP  ?= \[Flaky\]|\[Slow\]|\[Serial\]|\[Alpha\]
# make e2e-node-quick: pod lifecycle, container restarts, probes, lifecycle hooks, termination, mirror
# pods, the container log path, and the specs reported failing upstream with the gate on
# (../shared/docs/background.md), from the job's selection.
E2E_NODE_QUICK_FOCUS ?= \[sig-node\] (Pods |Pod Extended|Container Lifecycle Hook|Probing container|Container Runtime blackbox test on terminated|ContainerLogPath|MirrorPod|Kubelet when scheduling)|should not hang in termination if terminated during initialization|restart them while in preStop
E2E_NODE_PROCS ?= 4
# make e2e-node-quick runs, unless PLEG says otherwise, pleg-nri alone, configured as docs/operations.md
# configures it for the kubelet (1.35, 1.36: refresh-after-stop and cache-tick, setup pleg-nri-tick), with
# 6 ginkgo processes: one setup in under 15 minutes warm (PLEG=generic,containerd,pleg-nri-tick: side by side).
E2E_NODE_QUICK_PLEG  ?= $(if $(filter v1.35.% v1.36.%,$(KUBELET_VERSION)),pleg-nri-tick,pleg-nri)
# (an E2E_NODE_PROCS given on the command line or in the environment still wins).
E2E_NODE_QUICK_PROCS ?= $(if $(filter command line environment,$(origin E2E_NODE_PROCS)),$(E2E_NODE_PROCS),6)
# PLEG: the setups to run, comma-separated (default generic,containerd,pleg-nri; pleg-nri-refresh adds refresh-after-stop, pleg-nri-tick refresh-after-stop and a 1 s cache-tick).
PLEG ?=
# SHARD=i/N: make e2e-node runs only shard i of N of the selection (the specs listed with ginkgo
# --dry-run; the specs of each Ordered container kept in one shard, the rest dealt so the shards are
# even), kept as selection <name>-ordered-shard-<i>of<N>; the report merges the shards per setup.
SHARD ?=
# E2E_NODE_SELECTION: the name make e2e-node keeps its runs under (another name for another focus).
E2E_NODE_SELECTION ?= job
# RUN=n: the selection's n-th run (default 1, the one its tables show), kept beside the others; the
# report names every spec whose outcome was not the same in every run of a setup (make e2e-node-quick RUN=2).
RUN ?= 1

.PHONY: e2e-node
e2e-node: deps-runtime $(REGISTRY) ## Upstream's node e2e suite at KUBELET_VERSION, the job's selection (SHARD=i/N: one shard of it), per PLEG setup (builds the suite once per version: ~1 h from a cold Go build cache, ~5 min after that version's kubelet; runs take hours); writes docs/e2e-node-<version>.{md,json}.
	PLEG_NRI_E2E_NODE=1 KUBELET_VERSION=$(KUBELET_VERSION) PLEG='$(PLEG)' E2E_NODE_SELECTION='$(E2E_NODE_SELECTION)' E2E_NODE_SHARD='$(SHARD)' E2E_NODE_RUN='$(RUN)' \
	  E2E_NODE_REGISTRY=$(REGISTRY) E2E_NODE_PROCS=$(E2E_NODE_PROCS) \
	  FOCUS='$(E2E_NODE_FOCUS)' SKIP='$(E2E_NODE_SKIP)' $(GO) test -count=1 -v -timeout 14h $(E2E_NODE_PKG)

.PHONY: e2e-node-quick
e2e-node-quick: deps-runtime $(REGISTRY) ## The focused part of make e2e-node (pod lifecycle, restarts, probes, hooks, termination, mirror pods, log path) on pleg-nri as configured for KUBELET_VERSION (PLEG=...: other setups; ~12 min a setup warm).
	PLEG_NRI_E2E_NODE=1 KUBELET_VERSION=$(KUBELET_VERSION) PLEG='$(or $(PLEG),$(E2E_NODE_QUICK_PLEG))' E2E_NODE_SELECTION=quick E2E_NODE_RUN='$(RUN)' E2E_NODE_REGISTRY=$(REGISTRY) E2E_NODE_PROCS=$(E2E_NODE_QUICK_PROCS) \
	  FOCUS='$(E2E_NODE_QUICK_FOCUS)' SKIP='$(E2E_NODE_SKIP)' $(GO) test -count=1 -v -timeout 3h $(E2E_NODE_PKG)

.PHONY: it-up
it-up: deps-runtime ## Start the harness's containerd by hand and print its sockets as shell exports.
	@$(GO) run ./test/containerd-it/cmd/it-env up

.PHONY: it-down
it-down: ## Tear down what it-up started; fails if anything is left behind.
	@$(GO) run ./test/containerd-it/cmd/it-env down

.PHONY: clean
clean: ## Remove build outputs (the dependency cache stays).
	rm -rf $(BIN)
