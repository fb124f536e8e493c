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
# The image: a statically linked binary (glibc, crt-static; the explicit --target keeps the
# flag off build scripts and proc macros), written as an OCI archive named after the chart.
IMAGE_TARGET := x86_64-unknown-linux-gnu
APP_VERSION := $(shell awk '$$1 == "appVersion:" {gsub(/"/, "", $$2); print $$2}' charts/leasehold/Chart.yaml)
IMAGE := target/image/leasehold-$(APP_VERSION).oci.tar
# The oldest supported Kubernetes release: a directory under e2e/controlplane with its own
# go.mod (docs/upgrading.md, "Kubernetes versions").
OLDEST_RELEASE := releases/v1.30
# The suites that run against it as well: the controller, the sidecar, admission and the chart.
OLDEST_SUITES := controller:: sidecar:: sidecar_api:: sidecar_hold:: sidecar_owner:: sidecar_run:: admission:: chart::
CLUSTER_DIR := .cluster
RELEASE_DIR := target/release-artifacts
PLUGIN_DIR ?= $(HOME)/.local/bin
NODE := target/debug/leasehold-node

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the leasehold binary and the dev tools.
	$(CARGO) build --workspace --bins

.PHONY: controlplane
controlplane: ## Build etcd, kube-apiserver, kube-controller-manager, kubectl from Go modules (cached).
	e2e/controlplane/build.sh

.PHONY: controlplane-oldest
controlplane-oldest: ## Build the control plane of the oldest supported release (cached).
	e2e/controlplane/build.sh $(OLDEST_RELEASE)

.PHONY: image
image: ## Build Leasehold's image without a container engine: target/image/leasehold-<appVersion>.oci.tar (OCI archive, deterministic; leasehold and leasehold-sidecar).
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release --locked -p leasehold --bin leasehold --bin leasehold-sidecar --target $(IMAGE_TARGET)
	$(CARGO) run -q --locked -p leasehold-image -- --binary target/$(IMAGE_TARGET)/release/leasehold \
		--sidecar-binary target/$(IMAGE_TARGET)/release/leasehold-sidecar --out $(IMAGE)

.PHONY: chart
chart: ## Package the chart: $(RELEASE_DIR)/leasehold-<version>.tgz (helm lint --strict first).
	e2e/tools/package-chart.sh $(RELEASE_DIR)

.PHONY: release
release: image ## Release artifacts in target/release-artifacts/: image archive, packaged chart, static binary (also as the kubectl plugin kubectl-leasehold), CRDs, SHA256SUMS.
	rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)
	cp $(IMAGE) $(RELEASE_DIR)/
	cp target/$(IMAGE_TARGET)/release/leasehold $(RELEASE_DIR)/leasehold-$(APP_VERSION)-linux-amd64
	cp target/$(IMAGE_TARGET)/release/leasehold $(RELEASE_DIR)/kubectl-leasehold-$(APP_VERSION)-linux-amd64
	target/$(IMAGE_TARGET)/release/leasehold crd > $(RELEASE_DIR)/leasehold-$(APP_VERSION)-crds.yaml
	e2e/tools/package-chart.sh $(RELEASE_DIR) >/dev/null
	cd $(RELEASE_DIR) && sha256sum leasehold-* kubectl-leasehold-* > SHA256SUMS && sha256sum --check --quiet SHA256SUMS
	@ls -l $(RELEASE_DIR)

.PHONY: kubectl-plugin
kubectl-plugin: ## Build leasehold and link it as kubectl-leasehold in $(PLUGIN_DIR) (default ~/.local/bin, which must be on PATH): then `kubectl leasehold status ...`.
	$(CARGO) build --release --locked -p leasehold --bin leasehold
	@mkdir -p $(PLUGIN_DIR)
	ln -sf $(abspath target/release/leasehold) $(PLUGIN_DIR)/kubectl-leasehold
	@echo "kubectl leasehold --help  # works when $(PLUGIN_DIR) is on PATH"

.PHONY: node
node: ## Build or install what the test node needs (kubelet & co. from Go modules, containerd v2, Debian packages).
	e2e/node/build.sh >/dev/null
	$(CARGO) build -q -p leasehold-harness --bin leasehold-node

.PHONY: cluster
cluster: image node ## Start a real single-node cluster (kubelet, containerd) in the background, with the image loaded.
	@mkdir -p $(CLUSTER_DIR)
	@if [ -f $(CLUSTER_DIR)/node.json ] && kill -0 $$(sed -n 's/.*"supervisorPid": *\([0-9]*\).*/\1/p' $(CLUSTER_DIR)/node.json) 2>/dev/null; then \
		echo "already running (make cluster-down stops it)"; exit 1; fi
	@rm -f $(CLUSTER_DIR)/node.json
	@setsid $(NODE) up --dir $(CLUSTER_DIR) --image $(IMAGE) > $(CLUSTER_DIR)/supervisor.log 2>&1 < /dev/null & \
	for i in $$(seq 1 1200); do [ -f $(CLUSTER_DIR)/node.json ] && break; \
		kill -0 $$! 2>/dev/null || { cat $(CLUSTER_DIR)/supervisor.log; exit 1; }; sleep 0.5; done
	@[ -f $(CLUSTER_DIR)/node.json ] || { cat $(CLUSTER_DIR)/supervisor.log; exit 1; }
	@echo "A single-node cluster is running (logs in $(CLUSTER_DIR)/logs/); the image $(IMAGE) is loaded."
	@echo "  export KUBECONFIG=$(CURDIR)/$(CLUSTER_DIR)/kubeconfig"
	@echo "  alias kubectl=$(KUBECTL)"
	@echo "Try: helm install leasehold charts/leasehold --namespace leasehold-system --create-namespace --wait"
	@echo "Stop it with: make cluster-down"

.PHONY: cluster-down
cluster-down: ## Stop what `make cluster` started and remove everything it left.
	@if [ -x $(NODE) ]; then $(NODE) down --dir $(CLUSTER_DIR); else echo "nothing to stop"; fi

.PHONY: generate
generate: ## Regenerate committed generated files (the CRDs and their reference, the chart's copies of them and of the Lease guard).
	$(CARGO) run -q --bin leasehold -- crd --kind distributedlock > crds/leasehold.dev_distributedlocks.yaml
	$(CARGO) run -q --bin leasehold -- crd --kind lockclaim > crds/leasehold.dev_lockclaims.yaml
	$(CARGO) run -q --bin leasehold -- crd --kind forcereleaserequest > crds/leasehold.dev_forcereleaserequests.yaml
	$(CARGO) run -q --bin leasehold -- crd --format markdown > docs/crd-reference.md
	cp crds/leasehold.dev_distributedlocks.yaml charts/leasehold/files/crd.yaml
	cp crds/leasehold.dev_lockclaims.yaml charts/leasehold/files/crd-lockclaims.yaml
	cp crds/leasehold.dev_forcereleaserequests.yaml charts/leasehold/files/crd-forcereleaserequests.yaml
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
lint: ## helm lint, and kubeconform --strict of the chart rendered with every documented value set, for the pinned and the oldest supported release.
	OLDEST_RELEASE=$(OLDEST_RELEASE) e2e/tools/lint-chart.sh

.PHONY: unit
unit: ## Unit tests (pure logic, no control plane).
	$(CARGO) test --workspace --lib --bins

.PHONY: packages
packages: ## Install the Debian packages the tests need (PostgreSQL, libfaketime, runc, CNI plugins, ...) when missing.
	e2e/packages.sh

.PHONY: e2e
e2e: packages controlplane node image ## End-to-end tests against the real control plane, and on a real node (the image in real pods).
	$(CARGO) test --workspace --tests -- --test-threads=$(E2E_THREADS)

.PHONY: e2e-oldest
e2e-oldest: packages controlplane-oldest ## The controller, sidecar, admission and chart suites against the oldest supported Kubernetes release.
	LEASEHOLD_KUBE_RELEASE=$(OLDEST_RELEASE) $(CARGO) test --test e2e -- --test-threads=$(E2E_THREADS) $(OLDEST_SUITES)

.PHONY: test
test: fmt-check clippy verify lint unit e2e e2e-oldest ## Everything CI runs: format, lints, generated files, chart lint, unit and e2e tests (e2e also on the oldest supported release).

.PHONY: bench
bench: controlplane node image ## Benchmarks vs. the floors and peer libraries, one run (~30 min warm, builds first if cold); report in target/bench/.
	bench/prepare.sh >/dev/null
	$(CARGO) bench --bench leasehold

.PHONY: bench-scale
# The quiet baseline runs too: the idle locks' writes per minute are net of its background.
bench-scale: controlplane ## Only the bench's scale phase, at 10,000 and 100,000 locks: controller memory, time to reconcile, idle writes; report in target/bench/.
	bench/prepare.sh >/dev/null
	LEASEHOLD_BENCH_PHASES="baseline,many locks" LEASEHOLD_BENCH_SCALE_COUNTS=10000,100000 $(CARGO) bench --bench leasehold

.PHONY: test-faults
# Test-only builds broken on purpose, each in its own target directory; the fault suite
# must catch every one (see docs/fault-suite.md).
BROKEN_BUILDS := ignore-renew-deadline regrant-at-once 401-transient fence-new-label writer-shares unconfirmed-at-once guard-handoff
test-faults: packages controlplane ## The long fault-injection suite (>= 1,000 faults) and the broken-build demonstrations.
	for b in $(BROKEN_BUILDS); do \
		$(CARGO) build --features broken-$$b --bin leasehold --bin leasehold-sidecar --target-dir target/broken-$$b || exit 1; done
	LEASEHOLD_BROKEN_SIDECAR=$(CURDIR)/target/broken-ignore-renew-deadline/debug/leasehold-sidecar \
	LEASEHOLD_BROKEN_CONTROLLER=$(CURDIR)/target/broken-regrant-at-once/debug/leasehold \
	LEASEHOLD_BROKEN_HOLDER=$(CURDIR)/target/broken-401-transient/debug/leasehold-sidecar \
	LEASEHOLD_BROKEN_WEBHOOK=$(CURDIR)/target/broken-fence-new-label/debug/leasehold \
	LEASEHOLD_BROKEN_SERVE=$(CURDIR)/target/broken-writer-shares/debug/leasehold \
	LEASEHOLD_BROKEN_UNCONFIRMED=$(CURDIR)/target/broken-unconfirmed-at-once/debug/leasehold \
	LEASEHOLD_BROKEN_GUARD=$(CURDIR)/target/broken-guard-handoff/debug/leasehold \
		$(CARGO) test --test faults -- --ignored --nocapture --test-threads=1 --skip repeat_one_fault

.PHONY: demo
demo: build controlplane tools ## Run Leasehold end to end on a local control plane: three workers, a frozen holder, a rejected stale write (Ctrl-C ends it).
	@eval "$$(e2e/tools/build.sh)"; target/debug/leasehold-demo --leasehold target/debug/leasehold --helm "$$helm"

.PHONY: demo-cluster
demo-cluster: build image node tools ## The demo on a real node: the chart installed, worker pods with injected sidecars contending (Ctrl-C ends it).
	@eval "$$(e2e/tools/build.sh)"; target/debug/leasehold-demo --cluster --image $(IMAGE) --helm "$$helm"

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
