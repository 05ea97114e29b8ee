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
INTEGRATION_PKGS := ./test/containerd-it/
# A real kubelet on the harness's containerd, directly and through pleg-nri (part of make integration).
KUBELET_E2E_PKG  := ./test/kubelet-e2e/
UNIT_PKGS        = $(shell $(GO) list ./... | grep -v -x -F -e github.com/pleg-nri/pleg-nri/test/containerd-it -e github.com/pleg-nri/pleg-nri/test/kubelet-e2e)
IT_TIMEOUT      ?= 30m
FUZZTIME        ?= 10s

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
test: verify unit fuzz integration ## Everything CI runs: gofmt, vet, staticcheck, unit tests with -race, fuzzing, integration tests.

##@ Build

.PHONY: build
build: ## Build bin/pleg-nri.
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/pleg-nri ./cmd/pleg-nri

##@ Checks

.PHONY: verify
verify: fmt-check vet lint ## gofmt, go vet and staticcheck.

.PHONY: fmt-check
fmt-check: ## Fail if gofmt would change a file.
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

.PHONY: vet
vet: ## go vet every package.
	$(GO) vet ./...

$(STATICCHECK):
	@mkdir -p $(dir $@)
	GOBIN=$(dir $@) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VER)

.PHONY: lint
lint: $(STATICCHECK) ## staticcheck every package.
	$(STATICCHECK) ./...

##@ Tests

.PHONY: unit
unit: ## Unit tests with -race and goroutine-leak checks.
	$(GO) test -race -count=1 $(UNIT_PKGS)

.PHONY: fuzz
fuzz: ## Run every fuzz target of the unit packages for FUZZTIME each (default 10s).
	@for pkg in $(UNIT_PKGS); do \
	  dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
	  for fn in $$(cat $$dir/*_test.go 2>/dev/null | sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p'); do \
	    echo "fuzz: $$fn in $$pkg for $(FUZZTIME)"; \
	    $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 2s $$pkg 2>&1 | { grep -v '^time=' || true; }; \
	  done; \
	done

.PHONY: deps
deps: deps-runtime deps-kubelet ## Install and build what the integration tests need (cached: a second run builds nothing).

.PHONY: deps-runtime
deps-runtime: ## Install and build containerd, runc, crictl, CNI and the test images' inputs (cached).
	@test "$$(id -u)" = 0 || { echo "the integration tests need root (they run containerd and runc)"; exit 1; }
	bash test/containerd-it/hack/install-deps.sh >/dev/null

.PHONY: deps-kubelet
deps-kubelet: ## Build the kubelet the kubelet suite runs (cached; several minutes the first time).
	bash test/kubelet-e2e/hack/build-kubelet.sh >/dev/null

.PHONY: integration
integration: deps ## Integration tests against a real, isolated containerd with NRI, and a real kubelet on it (root, Linux).
	@set -o pipefail; start=$$(date +%s); \
	$(GO) test -count=1 -v -timeout $(IT_TIMEOUT) $(INTEGRATION_PKGS) $(KUBELET_E2E_PKG) 2>&1 | tee /tmp/pleg-nri-it.log; \
	passed=$$(grep -c -E '^\s*--- PASS' /tmp/pleg-nri-it.log || true); \
	failed=$$(grep -c -E '^\s*--- FAIL' /tmp/pleg-nri-it.log || true); \
	echo "integration: $$passed passed, $$failed failed in $$(( $$(date +%s) - start ))s"; \
	test "$$passed" -gt 0 || { echo "integration: no integration test ran"; exit 1; }

.PHONY: soak
soak: deps-runtime ## Long load and fault tests against a real containerd (TestSoak*, PLEG_NRI_SOAK=1; up to an hour).
	PLEG_NRI_SOAK=1 $(GO) test -count=1 -v -run 'Soak' -timeout 60m $(INTEGRATION_PKGS)

.PHONY: bench
bench: deps-runtime ## Side-by-side benchmarks against a real containerd (~5 min); writes docs/benchmarks.md and docs/exit-latency.svg.
	@out=/tmp/pleg-nri-bench; rm -rf $$out; mkdir -p $$out; hook=; \
	if ! list=$$($(GO) test -list '^BenchmarkHook' ./plugin/ 2>&1); then echo "$$list"; echo "bench: ./plugin/ does not build: its BenchmarkHook is left out"; \
	elif ! grep -q '^BenchmarkHook' <<<"$$list"; then echo "bench: ./plugin/ has no BenchmarkHook, skipped"; \
	elif $(GO) test -run '^$$' -bench '^BenchmarkHook' -benchtime 20000x -benchmem ./plugin/ 2>&1 | grep -v '^time=' | tee $$out/plugin.txt; then \
	  hook="-hook-bench $$out/plugin.txt"; \
	else echo "bench: the plugin's BenchmarkHook failed: left out of the report"; fi; \
	PLEG_NRI_BENCH_RESULTS=$$out/results.json $(GO) test -count=1 -run '^$$' -bench . -benchtime=1x -timeout 20m $(INTEGRATION_PKGS); \
	$(GO) run ./test/containerd-it/cmd/bench-report -results $$out/results.json $$hook -md docs/benchmarks.md -svg docs/exit-latency.svg

.PHONY: bench-kubelet
bench-kubelet: deps ## A real kubelet's crash-to-restart time: GenericPLEG, EventedPLEG on containerd, on pleg-nri (~6 min); writes docs/kubelet-bench.md.
	PLEG_NRI_KUBELET_BENCH_MD=$(CURDIR)/docs/kubelet-bench.md $(GO) test -count=1 -run '^$$' -bench BenchmarkCrashRestart -benchtime 1x -timeout 20m $(KUBELET_E2E_PKG)

.PHONY: it-up
it-up: deps-runtime ## Start the harness's containerd by hand and print its sockets as shell exports.
	@$(GO) run ./test/containerd-it/cmd/it-env up

.PHONY: it-down
it-down: ## Tear down what it-up started; fails if anything is left behind.
	@$(GO) run ./test/containerd-it/cmd/it-env down

.PHONY: clean
clean: ## Remove build outputs (the dependency cache stays).
	rm -rf $(BIN)
