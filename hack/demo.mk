# The demo on a real local cluster; the top-level Makefile includes this file
# (`demo: demo-cluster`). It needs root: it runs a kubelet and containerd.
# See demo/README.md and docs/local-cluster.md.
#
#   make demo-cluster                              every scenario in demo/, then teardown
#   make demo-cluster DEMO_ARGS=--keep             leave the cluster running, print kubectl usage
#   make demo-cluster DEMO_ARGS="--only mig"       one scenario (see: go run ./hack/demo --list)

DEMO      ?= go run ./hack/demo
DEMO_ARGS ?=

.PHONY: demo-cluster

## demo-cluster: build what is missing, bring up the local cluster, run the demo/ scenarios with narration, tear down (DEMO_ARGS=--keep keeps it)
demo-cluster:
	$(DEMO) $(DEMO_ARGS)
