# Tessera: a DRA driver for shareable GPUs.
#   make demo   the main job (see README)
#   make test   every test: unit, fuzz (bounded), end to end
SHELL := /bin/bash
GO    ?= go
# go-nvml's cgo wrapper declares every deprecated NVML call; keep builds quiet.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
BIN   := bin
PKGS  := ./...
FUZZTIME ?= 20s

.PHONY: all build test test-inprocess test-cluster bench-smoke-inprocess bench-smoke-cluster unit alerts-test fuzz vet lint fmt generate verify-generated demo print-slices gpu-smoke gpu-smoke-kit bench bench-smoke bench-scale bench-scale-large bench-tuning bench-upstream clean help

all: build

## build: build the kubelet plugin, the controller and the kubectl plugin (kubectl-tessera: `kubectl tessera top`) into bin/
build:
	$(GO) build -o $(BIN)/kubelet-plugin ./cmd/kubelet-plugin
	$(GO) build -o $(BIN)/controller ./cmd/controller
	$(GO) build -o $(BIN)/kubectl-tessera ./cmd/kubectl-tessera

## test: every test, in two lanes side by side once the cached tools are built (upstream binaries, helm, promtool): in process (vet, golangci-lint, generated files, helm lint, unit tests with -race, bounded fuzzing, the short benchmarks) and on the local cluster (end-to-end tests, then the 20-node scale smoke). A test that skips fails the run unless .ci/allowed-skips names it. TEST_LANES=serial runs the lanes one after the other
# The cluster lane mostly waits on the cluster, the in-process lane mostly
# computes: side by side they fill the machine. The in-process lane runs
# under SCHED_IDLE (chrt --idle; nice 19 where chrt is missing): it takes
# only the cores the cluster leaves, and a cluster process that wakes takes
# its core back at once. The e2e still takes longer than alone: 1,280 s
# beside it (1,290-1,366 s at nice 19 and 10), 1,050 s alone.
# Nothing in the first lane touches the cluster's fixed ports or directories
# (docs/local-cluster.md). Each line is prefixed with its lane; both lanes run
# to the end, and the run fails if either did.
TEST_LANES ?= parallel
IDLE := $(shell command -v chrt >/dev/null 2>&1 && echo chrt --idle 0 nice -n 19 || echo nice -n 19)
test: cluster-build helm-bin promtool-bin
ifeq ($(TEST_LANES),serial)
	$(MAKE) --no-print-directory -j1 test-inprocess
	$(MAKE) --no-print-directory -j1 test-cluster
else
	@set -o pipefail; start=$$(date +%s); \
	{ $(MAKE) --no-print-directory -j1 test-cluster 2>&1 | sed -u 's/^/[cluster] /'; } & lane=$$!; \
	{ $(IDLE) $(MAKE) --no-print-directory -j1 test-inprocess 2>&1 | sed -u 's/^/[in-process] /'; }; inproc=$$?; \
	echo "make test: the in-process lane ended (exit $$inproc) after $$(( $$(date +%s) - start )) s"; \
	wait $$lane; cl=$$?; \
	echo "make test: the cluster lane ended (exit $$cl) after $$(( $$(date +%s) - start )) s"; \
	[ $$inproc -eq 0 ] && [ $$cl -eq 0 ]
endif

## test-inprocess: make test's first lane: vet, lint, generated files, helm lint, unit tests, fuzzing, the in-process short benchmarks
test-inprocess: vet lint verify-generated helm-lint unit fuzz bench-smoke-inprocess

## test-cluster: make test's second lane: the end-to-end tests, then the 20-node scale smoke (both on the local cluster, one after the other)
test-cluster: e2e bench-smoke-cluster

## generate: regenerate the deep-copy code and the CRDs from api/ (controller-gen), and the chart's copy of the CRDs
CONTROLLER_GEN ?= $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0
generate:
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONTROLLER_GEN) crd:crdVersions=v1 paths=./api/... output:crd:dir=deployments/crds
	$(MAKE) chart-crds

## verify-generated: fail when api/ changed without `make generate`
verify-generated:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(CONTROLLER_GEN) object paths=./api/... output:object:dir=$$tmp/object && \
	$(CONTROLLER_GEN) crd:crdVersions=v1 paths=./api/... output:crd:dir=$$tmp/crds && \
	diff -u $$tmp/object/zz_generated.deepcopy.go api/v1alpha1/zz_generated.deepcopy.go && \
	diff -ru $$tmp/crds deployments/crds && diff -ru deployments/crds deployments/helm/tessera/crds \
	|| { echo "generated files are stale: run 'make generate' and commit the result" >&2; exit 1; }

## vet: go vet and gofmt check
vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet $(PKGS)

## lint: golangci-lint with the committed .golangci.yml (built once from the module proxy into ~/.cache/tessera)
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT ?= $(HOME)/.cache/tessera/golangci-lint-$(GOLANGCI_LINT_VERSION)/golangci-lint
lint: $(GOLANGCI_LINT)
	$(GOLANGCI_LINT) run ./...
$(GOLANGCI_LINT):
	GOBIN=$(dir $@) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

## unit: unit and integration tests (no cluster), with the race detector (but NORACE_PKGS)
# Packages whose code starts no goroutine (test/layout_test.go parses them
# to check): the race detector can find nothing there, and it makes their
# long property tests eight times slower (test/imagebuild: compressing the
# image's layers, 184 s of CPU with it, 60 s without). Their tests run
# without it.
NORACE_PKGS := ./pkg/control/decide/... ./hack/internal/sim/... ./test/imagebuild/...
# Test binaries run at once: go test's default is GOMAXPROCS (2 here), and
# the longest packages mostly wait on the API servers they start
# (pkg/control/controller: about a quarter of a core for 4 minutes).
UNIT_PARALLEL ?= 4
unit:
	set -o pipefail; { \
	  $(GO) test -json -race -count=1 -p $(UNIT_PARALLEL) -timeout 20m $$($(GO) list $(PKGS) | grep -v -x -F -f <($(GO) list $(NORACE_PKGS))); r=$$?; \
	  $(GO) test -json -count=1 -timeout 20m $(NORACE_PKGS) || r=$$?; exit $$r; \
	} | $(GO) run ./hack/noskip --allow .ci/allowed-skips

## alerts-test: the chart's alert rules under `promtool test rules` (promtool built into ~/.cache/tessera once; also part of unit)
alerts-test:
	$(GO) test -count=1 ./test/alerts/...

## fuzz: run each fuzz target for its budget in FUZZ_BUDGETS (executions), else $(FUZZTIME)
# Budgets are counts, about 20 s of each target on 2 idle cores: a
# duration races Go 1.26's fuzz coordinator at its deadline, which fails a
# target that found nothing ("context deadline exceeded" on a loaded
# machine, go.dev/issue/75804, fixed in Go 1.27); a count has no deadline.
FUZZ_BUDGETS ?= FuzzDecodeConfig=200000x FuzzHostileCycles=300x
fuzz:
	@for target in $$(grep -rl --include='*_test.go' '^func Fuzz' pkg api 2>/dev/null | xargs -r -n1 dirname | sort -u); do \
	  for f in $$(grep -h '^func Fuzz' $$target/*_test.go | sed 's/func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
	    budget=$$(echo "$(FUZZ_BUDGETS)" | tr ' ' '\n' | sed -n "s/^$$f=//p"); budget=$${budget:-$(FUZZTIME)}; \
	    echo "fuzz $$target $$f ($$budget)"; \
	    $(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$$budget ./$$target || exit 1; \
	  done; \
	done

## print-slices: show the ResourceSlices a mock node publishes (PROFILE=t4:2 by default)
PROFILE ?= t4:2
print-slices:
	$(GO) run ./cmd/kubelet-plugin --gpu-backend=mock --mock-profile=$(PROFILE) --node-name=demo-node --print-slices

## gpu-smoke: on a machine with a real NVIDIA GPU (root, no cluster): discovery, prepare, the CUDA probe in a container per claim, unprepare (docs/hardware.md; GPU_SMOKE_ARGS=...)
gpu-smoke:
	hack/gpu-smoke.sh $(GPU_SMOKE_ARGS)

## gpu-smoke-kit: build what gpu-smoke runs (smoke binary, nvidia-cdi-hook, runc, probe) into $(BIN)/gpu-smoke-kit.tgz, for a GPU machine without Go (docs/hardware.md)
gpu-smoke-kit:
	mkdir -p $(BIN) && hack/gpu-smoke.sh --build-kit $(BIN)/gpu-smoke-kit.tgz

## demo: the main job: build what is missing, bring up a real local cluster, run every demo/ scenario with narration, tear down (DEMO_ARGS=--keep keeps it)
demo: demo-cluster

## bench: run every benchmark, regenerate docs/benchmarks.md and its plots (< 15 min)
bench:
	$(GO) run ./hack/bench

## bench-smoke: the same with a small trace and one iteration each, plus the scale run's small variant (20 KWOK nodes), so benchmarks cannot rot
bench-smoke:
	$(GO) run ./hack/bench --short
# make test's two halves of bench-smoke: one per lane
bench-smoke-inprocess:
	$(GO) run ./hack/bench --short --cluster=without
bench-smoke-cluster:
	$(GO) run ./hack/bench --short --cluster=only

## bench-scale: end to end at scale (needs root, < 30 min): 500 KWOK nodes, 4,000 share pods in 10 queues vs the same without, gangs of 64 and 512 vs the same pods ungated; rewrites its section of docs/benchmarks.md (make bench keeps it)
bench-scale:
	$(GO) run ./hack/bench --scale

## bench-scale-large: the scale run beyond 500 nodes (needs root): 2,000 KWOK nodes, 4,000 share pods in (a) and (a') and the same pods without claims (b); no gangs, MIG or peer; rewrites its own section of docs/benchmarks.md
bench-scale-large:
	$(GO) run ./hack/bench --scale --scale-size large

## bench-tuning: settings against the defaults at scale (needs root, < 30 min): 500 KWOK nodes, 1,000 share pods with and without queues per setting (kube-scheduler percentageOfNodesToScore, client QPS, SchedulerPreQueueingHints; Tessera's apply workers, client QPS, cycle interval); rewrites its section of docs/tuning.md
bench-tuning:
	$(GO) run ./hack/bench --tuning

## bench-upstream: kube-scheduler's own benchmark (scheduler_perf of k8s.io/kubernetes v1.37.2, from the module proxy; no cluster, no root) at 500 nodes: upstream's DRA test driver slices vs Tessera's dgxh100 slices with 8Gi shares vs plain pods; rewrites its section of docs/benchmarks.md (BENCH_UPSTREAM_ARGS=--nodes=... --init-pods=... --measure-pods=...)
BENCH_UPSTREAM_ARGS ?=
bench-upstream:
	$(GO) run ./hack/benchupstream $(BENCH_UPSTREAM_ARGS)

## clean: remove build outputs
clean:
	rm -rf $(BIN)

help:
	@grep -h '^## ' $(MAKEFILE_LIST) | sed 's/^## //'

-include hack/localcluster.mk deployments/helm/helm.mk deployments/container/image.mk hack/demo.mk
