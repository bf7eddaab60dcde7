# gcagent: every target says what it does with a `## ` line; `make help` lists them.
SHELL := /bin/bash
GO ?= go
CONTAINERD2_VERSION := v2.3.7
CONTAINERD2_DIR ?= $(HOME)/.cache/gcagent/containerd-$(CONTAINERD2_VERSION)
APT_PACKAGES := containerd runc busybox-static prometheus systemd nats-server
# VERSION is the release, read from the VERSION file: stamped into the binary
# (`gcagent version`), the image's tag, the chart's appVersion and the
# manifest's image (deploy/version_test.go fails when they differ). COMMIT is
# the commit, with -dirty for a changed tree.
VERSION ?= $(shell cat VERSION)
COMMIT ?= $(shell git describe --always --dirty --abbrev=40 --exclude='*' 2>/dev/null || echo unknown)
COMMIT_TIME ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
LDFLAGS := -X github.com/gcagent/gcagent/internal/version.Version=$(VERSION) -X github.com/gcagent/gcagent/internal/version.Commit=$(COMMIT)
# TAGS are Go build tags for `build` and `image`: TAGS=noembeddednats leaves
# the embedded NATS server out (nodes that publish to a fleet NATS with
# --nats-url): a 16 MiB binary instead of 25, 2 MiB less resident.
TAGS ?=
# Every build also has grpcnotrace: it leaves out grpc's golang.org/x/net/trace,
# which parses HTML templates when the process starts, and a reflect method
# lookup reachable from a binary keeps every exported method of every type
# in it: 6 MiB of code and tables, 5 of them resident on every node. grpc traces only
# with grpc.EnableTracing, which gcagent never sets.
comma := ,
BUILD_TAGS := grpcnotrace$(if $(TAGS),$(comma)$(TAGS))
export GCAGENT_TEST_CONTAINERD2_DIR := $(CONTAINERD2_DIR)
CRICTL_VERSION := v1.37.0
CRICTL_DIR ?= $(HOME)/.cache/gcagent/crictl-$(CRICTL_VERSION)
export GCAGENT_TEST_CRICTL_DIR := $(CRICTL_DIR)
# The real kubelet the end-to-end tests run standalone (internal/testenv/kubelet.go),
# built from a module of its own that requires k8s.io/kubernetes at this version
# (its go.mod replaces each staging module by its tag). The version is stamped as
# the release's own build would.
KUBELET_VERSION := v1.37.2
KUBELET_DIR ?= $(HOME)/.cache/gcagent/kubelet-$(KUBELET_VERSION)
KUBELET_MODULE := internal/testenv/k8sbuild
KUBELET_LDFLAGS := $(foreach kv,gitVersion=$(KUBELET_VERSION) gitMajor=1 gitMinor=37 gitTreeState=clean,-X k8s.io/component-base/version.$(kv))
export GCAGENT_TEST_KUBELET_DIR := $(KUBELET_DIR)
# The real API server the cluster component's tests run against
# (internal/testenv/apiserver.go): kube-apiserver and kubectl of the
# kubelet's release, built from the same module, and etcd's server, built
# from a module of its own (internal/testenv/etcdbuild).
K8S_DIR ?= $(HOME)/.cache/gcagent/k8s-$(KUBELET_VERSION)
export GCAGENT_TEST_K8S_DIR := $(K8S_DIR)
ETCD_VERSION := v3.7.3
ETCD_DIR ?= $(HOME)/.cache/gcagent/etcd-$(ETCD_VERSION)
ETCD_MODULE := internal/testenv/etcdbuild
export GCAGENT_TEST_ETCD_DIR := $(ETCD_DIR)
# The Helm chart's tests are a module of their own: Helm's Go SDK would move
# bbolt, prometheus/client_golang and others up in the agent's go.mod.
HELM_MODULE := deploy/helm

.PHONY: help deps deps-apt build static image test unit e2e bench demo soak lint tidy-check fuzz chart manifest

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-11s %s\n", $$1, $$2}'

deps-apt: ## install Debian's packages that are missing (containerd 1.6 and its ctr, runc, busybox-static, prometheus, systemd, nats-server 2.9.10: the oldest NATS server supported) and the Go modules: all `make demo` needs
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		case " $$missing " in *" nats-server "*) \
			echo "nats-server: its service is disabled (tests start their own, on random ports)"; \
			systemctl disable --now nats-server >/dev/null 2>&1 || true;; \
		esac; \
	fi
	@$(GO) mod download

deps: deps-apt ## install what is missing: deps-apt, then containerd 2.3 and its ctr, crictl (go install), the kubelet (go build, ~7 min cold), kube-apiserver, kubectl and etcd
	@if [ ! -x $(CONTAINERD2_DIR)/containerd ] || [ ! -x $(CONTAINERD2_DIR)/containerd-shim-runc-v2 ] || [ ! -x $(CONTAINERD2_DIR)/ctr ]; then \
		echo "building containerd $(CONTAINERD2_VERSION) (daemon, shim, ctr) into $(CONTAINERD2_DIR)"; \
		GOBIN=$(CONTAINERD2_DIR) GOFLAGS=-tags=no_btrfs $(GO) install \
			github.com/containerd/containerd/v2/cmd/containerd@$(CONTAINERD2_VERSION) \
			github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$(CONTAINERD2_VERSION) \
			github.com/containerd/containerd/v2/cmd/ctr@$(CONTAINERD2_VERSION); \
	fi
	@if [ ! -x $(CRICTL_DIR)/crictl ]; then \
		echo "building crictl $(CRICTL_VERSION) into $(CRICTL_DIR)"; \
		GOBIN=$(CRICTL_DIR) $(GO) install sigs.k8s.io/cri-tools/cmd/crictl@$(CRICTL_VERSION); \
	fi
	@if [ ! -x $(KUBELET_DIR)/kubelet ]; then \
		echo "building kubelet $(KUBELET_VERSION) into $(KUBELET_DIR) (about 7 minutes cold on 2 idle cores, far longer on a loaded machine)"; \
		mkdir -p $(KUBELET_DIR) && cd $(KUBELET_MODULE) && \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(KUBELET_LDFLAGS)" -o $(KUBELET_DIR)/kubelet.tmp k8s.io/kubernetes/cmd/kubelet && \
		mv $(KUBELET_DIR)/kubelet.tmp $(KUBELET_DIR)/kubelet; \
	fi
	@for b in kube-apiserver kubectl; do if [ ! -x $(K8S_DIR)/$$b ]; then \
		echo "building $$b $(KUBELET_VERSION) into $(K8S_DIR) (a few minutes once the kubelet's packages are built)"; \
		mkdir -p $(K8S_DIR) && (cd $(KUBELET_MODULE) && \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(KUBELET_LDFLAGS)" -o $(K8S_DIR)/$$b.tmp k8s.io/kubernetes/cmd/$$b) && \
		mv $(K8S_DIR)/$$b.tmp $(K8S_DIR)/$$b || exit 1; \
	fi; done
	@if [ ! -x $(ETCD_DIR)/etcd ]; then \
		echo "building etcd $(ETCD_VERSION) into $(ETCD_DIR)"; \
		mkdir -p $(ETCD_DIR) && cd $(ETCD_MODULE) && \
		CGO_ENABLED=0 $(GO) build -trimpath -o $(ETCD_DIR)/etcd.tmp go.etcd.io/etcd/server/v3 && \
		mv $(ETCD_DIR)/etcd.tmp $(ETCD_DIR)/etcd; \
	fi

build: ## build bin/gcagent for development (dynamic, with symbols; version and commit stamped; TAGS=noembeddednats: without the embedded NATS server); a node takes `make static`
	$(GO) build -tags "$(BUILD_TAGS)" -ldflags "$(LDFLAGS)" -o bin/gcagent ./cmd/gcagent

static: ## build bin/gcagent-static: the static, stripped binary the image ships and every figure is measured on; the one to install on a node (TAGS as for build)
	CGO_ENABLED=0 $(GO) build -tags "$(BUILD_TAGS)" -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/gcagent-static ./cmd/gcagent

image: static ## build the OCI image archive bin/gcagent-image.tar (gcagent:$(VERSION), static binaries at /gcagent and /gcagent-cluster, TAGS as for build), no registry needed
	CGO_ENABLED=0 $(GO) build -tags "$(BUILD_TAGS)" -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/gcagent-cluster-static ./cmd/gcagent-cluster
	$(GO) run ./internal/ociimage/mkimage -binary bin/gcagent-static -version $(VERSION) -commit $(COMMIT) -created $(COMMIT_TIME) -cluster-binary bin/gcagent-cluster-static -o bin/gcagent-image.tar

# TEST_PARALLEL is how many tests of one package run at once (go test
# -parallel): the end-to-end tests mostly wait on daemons and agents, so
# four times as many as cores share the machine (docs/testing.md).
TEST_PARALLEL ?= 8
# TEST_REPORT reads `go test -json`: it prints what go test prints, the
# kubelet differential's figures, and at the end the ten slowest tests.
# The events themselves are kept in bin/test-events.json.
TEST_REPORT := bin/testreport

test: deps lint image ## install what is missing, build the image, then gofmt, vet and all tests (unit and end-to-end on containerd 1.6 and 2.3, and the differential against the kubelet's container GC); prints the ten slowest tests
	$(GO) build -o $(TEST_REPORT) ./internal/testreport
	@set -o pipefail; { status=0; \
		$(GO) test -json -count=1 -timeout 60m -parallel $(TEST_PARALLEL) ./... || status=1; \
		(cd kubeletdiff && $(GO) test -json -count=1 ./...) || status=1; \
		exit $$status; } | tee bin/test-events.json | $(TEST_REPORT) -v '/kubeletdiff$$'

unit: ## run the tests that need no daemon
	$(GO) test -count=1 ./events/ ./node/ ./projection/ ./gc/ ./trace/ ./replay/ ./internal/tracegen/ ./logs/ ./deletion/ ./natsbus/ ./fleet/ ./internal/agent/ ./internal/streak/ ./internal/kubeletconfig/ ./cmd/... ./deploy/ ./docs/ ./internal/ociimage/ ./internal/testreport/

e2e: deps image ## run only the end-to-end tests; prints the ten slowest
	$(GO) build -o $(TEST_REPORT) ./internal/testreport
	@set -o pipefail; $(GO) test -json -count=1 -timeout 60m -parallel $(TEST_PARALLEL) ./e2e/... | tee bin/test-events.json | $(TEST_REPORT)

bench: deps ## run the benchmarks (reducer, reconcile over the real API, the usage trace's cost and size, a replay of a busy node's month, the agent's footprint with 1,000 and 10,000 images and containers, 10,000 agents on a 3-server NATS cluster, a keep list change reaching them, the cluster component's first sync and its events bridge) and print figures
	$(GO) test -run '^$$' -bench . -skip 'BenchmarkFootprint|BenchmarkFleetCluster|BenchmarkFleetKeepReach|BenchmarkClusterFirstSync|BenchmarkClusterEventsBridge' -benchmem -timeout 30m ./events/ ./node/ ./projection/ ./gc/ ./trace/ ./replay/ ./e2e/ ./natsbus/ ./cmd/gcagent/
	$(GO) test -run '^$$' -bench BenchmarkFootprint -benchtime 1x -timeout 20m ./e2e/
	$(GO) test -run '^$$' -bench 'BenchmarkClusterFirstSync|BenchmarkClusterEventsBridge' -benchtime 1x -timeout 30m ./e2e/
	$(GO) test -run '^$$' -bench BenchmarkFleetCluster -benchtime 1x -timeout 40m ./natsbus/
	$(GO) test -run '^$$' -bench BenchmarkFleetKeepReach -benchtime 1x -timeout 60m ./natsbus/

demo: deps-apt ## Debian's containerd 1.6 on a small tmpfs + the agent as installed by default (embedded NATS) + gcagent watch: a dead container pruned, a dangling log link removed, image GC under pressure, then a summary
	$(GO) test -count=1 -tags demo -run TestDemo -v -timeout 10m ./e2e/

SOAK ?= 2h
SOAK_DIR ?= $(CURDIR)/bin/soak
soak: deps ## the agent under mixed load on containerd 1.6 and 2.3 at once for SOAK (default 2h): memory, Go heap, fds and goroutines by minute, every removal stored once in JetStream; tables in SOAK_DIR (bin/soak)
	@mkdir -p $(SOAK_DIR)
	@# -timeout 0: the soak bounds itself (the load stops at SOAK, the catch-up after it within 5 minutes).
	GCAGENT_TEST_SOAK=$(SOAK) GCAGENT_TEST_SOAK_DIR=$(SOAK_DIR) $(GO) test -count=1 -tags soak -run '^TestSoak$$' -v -timeout 0 ./e2e/

FUZZTIME ?= 30s
fuzz: ## run every Fuzz target (found in *_fuzz_test.go) for FUZZTIME each (default 30s); make test runs only their seeds
	@set -e; for f in $$(git ls-files '*_fuzz_test.go'); do \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "== $$t ($$(dirname $$f), $(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) ./$$(dirname $$f)/; \
		done; \
	done

lint: ## gofmt and go vet (also of the agent built without the embedded NATS server)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags noembeddednats ./cmd/gcagent/
	$(GO) vet -tags testhooks ./internal/agent/ ./node/
	$(GO) vet -tags soak ./e2e/
	cd kubeletdiff && $(GO) vet ./...

chart: ## lint the Helm chart and render it with Helm's Go SDK (defaults = deploy/kubernetes/gcagent.yaml, every value set, strict typed decode), gofmt, vet and tidy-check of its module
	@cd $(HELM_MODULE) && out=$$(gofmt -l .) && if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	@cd $(HELM_MODULE) && cp go.mod /tmp/gcagent-helm.go.mod.bak && cp go.sum /tmp/gcagent-helm.go.sum.bak && $(GO) mod tidy && \
	if ! diff -q go.mod /tmp/gcagent-helm.go.mod.bak >/dev/null || ! diff -q go.sum /tmp/gcagent-helm.go.sum.bak >/dev/null; then \
		cp /tmp/gcagent-helm.go.mod.bak go.mod; cp /tmp/gcagent-helm.go.sum.bak go.sum; echo "go mod tidy would change $(HELM_MODULE)/go.mod/go.sum"; exit 1; fi
	cd $(HELM_MODULE) && $(GO) vet ./... && $(GO) test -count=1 ./...

manifest: ## regenerate deploy/kubernetes/gcagent.yaml (the chart rendered with its default values), deploy/kubernetes/gcagent-cluster.yaml (the cluster component's objects, cluster.enabled=true) and deploy/helm/testdata/k3s.yaml (with a k3s node's, for the e2e test)
	cd $(HELM_MODULE) && $(GO) test -count=1 -run '^(TestManifestIsChartDefault|TestClusterManifestIsChartRender|TestK3sRender)$$' . -update-manifest

# The chart's module is outside ./..., so test runs it too.
test: chart

tidy-check: ## fail if go mod tidy would change go.mod or go.sum (of the module, of kubeletdiff and of the kubelet's build module)
	@for d in . kubeletdiff $(KUBELET_MODULE) $(ETCD_MODULE); do \
		cp $$d/go.mod /tmp/gcagent.go.mod.bak; cp $$d/go.sum /tmp/gcagent.go.sum.bak; \
		(cd $$d && $(GO) mod tidy); \
		if ! diff -q $$d/go.mod /tmp/gcagent.go.mod.bak >/dev/null || ! diff -q $$d/go.sum /tmp/gcagent.go.sum.bak >/dev/null; then \
			cp /tmp/gcagent.go.mod.bak $$d/go.mod; cp /tmp/gcagent.go.sum.bak $$d/go.sum; echo "go mod tidy would change $$d/go.mod or go.sum"; exit 1; fi; \
	done
