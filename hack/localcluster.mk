# Local-cluster targets; the top-level Makefile includes this file.
# The harness lives in test/localcluster (library) and hack/localcluster (CLI);
# see docs/local-cluster.md. All targets need root.

LOCALCLUSTER     ?= go run ./hack/localcluster
TESSERA_PROFILE  ?= t4:2
E2E_TIMEOUT      ?= 40m
# E2E_PARALLEL: how many tests of the parallel group (inParallel in
# test/e2e/helpers_test.go) run at once; go test's default is GOMAXPROCS (2 here)
E2E_PARALLEL     ?= 4

.PHONY: cluster-build cluster-up cluster-down cluster-status e2e

## cluster-build: build (or reuse from the cache) the pinned upstream binaries
cluster-build:
	$(LOCALCLUSTER) build

## cluster-up: tear down leftovers, bring the local cluster up and leave it running
cluster-up:
	$(LOCALCLUSTER) up --profile $(TESSERA_PROFILE)

## cluster-down: stop the local cluster and remove all its state
cluster-down:
	$(LOCALCLUSTER) down

## cluster-status: show the local cluster's components and paths
cluster-status:
	$(LOCALCLUSTER) status

## e2e: end-to-end tests; they bring their own cluster up and down
e2e:
	set -o pipefail; TESSERA_PROFILE=$(TESSERA_PROFILE) go test -json -tags e2e -count=1 -parallel $(E2E_PARALLEL) ./test/e2e/... -timeout $(E2E_TIMEOUT) | go run ./hack/noskip --stream --allow .ci/allowed-skips
