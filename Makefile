# Leasehold — developer entry points. `make help` lists them.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

export GOTOOLCHAIN := local
CARGO ?= cargo
# Parallel end-to-end tests: each has its own namespace and processes.
E2E_THREADS ?= 6
DEV_DIR := .dev
LEASEHOLD := target/debug/leasehold
KUBECTL = $$(e2e/controlplane/build.sh)/kubectl

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the leasehold binary and the dev tools.
	$(CARGO) build --workspace --bins

.PHONY: controlplane
controlplane: ## Build etcd, kube-apiserver, kube-controller-manager, kubectl from Go modules (cached).
	e2e/controlplane/build.sh

.PHONY: generate
generate: ## Regenerate committed generated files (the CRD and its reference, the chart's copies of it and of the Lease guard).
	$(CARGO) run -q --bin leasehold -- crd > crds/leasehold.dev_distributedlocks.yaml
	$(CARGO) run -q --bin leasehold -- crd --format markdown > docs/crd-reference.md
	cp crds/leasehold.dev_distributedlocks.yaml charts/leasehold/files/crd.yaml
	$(CARGO) run -q --bin leasehold -- lease-guard --controller-user __LEASEHOLD_CONTROLLER_USER__ \
		> charts/leasehold/files/lease-guard.yaml

.PHONY: verify
verify: generate ## Fail if generated files differ from what is committed.
	git diff --exit-code -- crds/ charts/leasehold/files/ docs/crd-reference.md

.PHONY: fmt-check
fmt-check: ## cargo fmt --check.
	$(CARGO) fmt --all -- --check

.PHONY: clippy
clippy: ## clippy with warnings as errors.
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: tools
tools: ## Build helm and kubeconform from the Go module proxy (cached).
	e2e/tools/build.sh

.PHONY: lint
lint: ## helm lint, and kubeconform --strict of the chart rendered with every documented value set.
	e2e/tools/lint-chart.sh

.PHONY: unit
unit: ## Unit tests (pure logic, no control plane).
	$(CARGO) test --workspace --lib --bins

.PHONY: e2e
e2e: controlplane ## End-to-end tests against the real control plane.
	$(CARGO) test --workspace --tests -- --test-threads=$(E2E_THREADS)

.PHONY: test
test: fmt-check clippy verify lint unit e2e ## Everything CI runs: format, lints, generated files, chart lint, unit and e2e tests.

.PHONY: bench
bench: controlplane ## Benchmarks vs. the floors and peer libraries, one run (~11 min warm, builds first if cold); report in target/bench/.
	bench/prepare.sh >/dev/null
	$(CARGO) bench --bench leasehold

.PHONY: test-faults
test-faults: controlplane ## The long fault-injection suite (>= 1,000 faults) and the broken-sidecar demonstration.
	$(CARGO) build --features broken-ignore-renew-deadline --bin leasehold --target-dir target/broken
	LEASEHOLD_BROKEN_SIDECAR=$(CURDIR)/target/broken/debug/leasehold \
		$(CARGO) test --test faults -- --ignored --nocapture --test-threads=1 --skip repeat_one_fault

.PHONY: demo
demo: build controlplane tools ## Run Leasehold end to end on a local control plane: three workers, a frozen holder, a rejected stale write (Ctrl-C ends it).
	@eval "$$(e2e/tools/build.sh)"; target/debug/leasehold-demo --leasehold target/debug/leasehold --helm "$$helm"

.PHONY: dev
dev: build controlplane ## Start a local control plane with the CRD and a controller, in the background.
	@mkdir -p $(DEV_DIR)
	@if [ -f $(DEV_DIR)/cluster.pid ] && kill -0 $$(cat $(DEV_DIR)/cluster.pid) 2>/dev/null; then \
		echo "already running (make dev-down stops it)"; exit 1; fi
	@target/debug/leasehold-dev --kubeconfig $(DEV_DIR)/kubeconfig > $(DEV_DIR)/cluster.log 2>&1 & echo $$! > $(DEV_DIR)/cluster.pid
	@for i in $$(seq 1 120); do grep -q '^export KUBECONFIG' $(DEV_DIR)/cluster.log && break; \
		kill -0 $$(cat $(DEV_DIR)/cluster.pid) 2>/dev/null || { cat $(DEV_DIR)/cluster.log; exit 1; }; sleep 0.5; done
	@KUBECONFIG=$(DEV_DIR)/kubeconfig $(KUBECTL) apply -f crds/ >/dev/null
	@KUBECONFIG=$(DEV_DIR)/kubeconfig $(LEASEHOLD) controller --admin-addr 127.0.0.1:8080 --leader-elect=false \
		> $(DEV_DIR)/controller.log 2>&1 & echo $$! > $(DEV_DIR)/controller.pid
	@echo "Leasehold is running against a local control plane (logs in $(DEV_DIR)/)."
	@echo "  export KUBECONFIG=$(CURDIR)/$(DEV_DIR)/kubeconfig"
	@echo "  alias kubectl=$(KUBECTL)"
	@echo "Try: kubectl apply -f examples/basic/lock.yaml && kubectl get dlock"
	@echo "Stop it with: make dev-down"

.PHONY: dev-down
dev-down: ## Stop what `make dev` started.
	@for p in controller cluster; do \
		if [ -f $(DEV_DIR)/$$p.pid ]; then kill $$(cat $(DEV_DIR)/$$p.pid) 2>/dev/null || true; rm -f $(DEV_DIR)/$$p.pid; fi; done
	@echo "stopped"
