# Helm chart targets; the top-level Makefile includes this file and runs
# helm-test in `make test`.
#   make helm-bin    build the pinned helm from the Go module proxy (cached)
#   make helm-lint   helm lint --strict the chart with every shipped values file
#   make helm-test   lint + golden renders + property checks (go test ./test/helm)
#   make chart-crds  copy the generated CRDs (deployments/crds) into the chart
# Keep HELM_VERSION equal to Version in test/helm/helm.go (a test checks).

GO                ?= go
HELM_VERSION      := v4.3.1
TESSERA_CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tessera
HELM              ?= $(TESSERA_CACHE_DIR)/bin/helm-$(HELM_VERSION)/helm
CHART             := deployments/helm/tessera
CHART_VALUES      := $(wildcard deployments/helm/values/*.yaml)

.PHONY: helm-bin promtool-bin helm-lint helm-test helm-update chart-crds

## helm-bin: build the pinned helm (go install from the module proxy, cached)
helm-bin: $(HELM)

$(HELM):
	@echo "building helm $(HELM_VERSION) into $(dir $(HELM)) (once; a few minutes on a cold cache)"
	@mkdir -p $(dir $(HELM))
	cd $(dir $(HELM)) && GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOBIN=$(abspath $(dir $(HELM))) \
	  $(GO) install -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$(HELM_VERSION)" \
	  helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)

## promtool-bin: build the pinned promtool (the chart's alert rules' tests, test/alerts) from the module proxy, without Prometheus' service discovery plugins (-tags remove_all_sd: promtool test rules needs none), cached
PROMTOOL_VERSION := v0.316.0
PROMTOOL         ?= $(TESSERA_CACHE_DIR)/bin/promtool-$(PROMTOOL_VERSION)/promtool
promtool-bin: $(PROMTOOL)

$(PROMTOOL):
	@echo "building promtool $(PROMTOOL_VERSION) into $(dir $(PROMTOOL)) (once; a few minutes on a cold cache)"
	@mkdir -p $(dir $(PROMTOOL))
	cd $(dir $(PROMTOOL)) && GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOBIN=$(abspath $(dir $(PROMTOOL))) \
	  $(GO) install -trimpath -tags remove_all_sd -ldflags "-s -w" github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION)

## helm-lint: lint the chart with its defaults and each values file
helm-lint: helm-bin
	$(HELM) lint --strict $(CHART)
	@for f in $(CHART_VALUES); do \
	  echo "$(HELM) lint --strict $(CHART) -f $$f"; \
	  $(HELM) lint --strict $(CHART) -f $$f --set-string kubeletPlugin.mock.deviceRoot=/tmp/mock-devices || exit 1; \
	done

## helm-test: chart tests: lint, golden renders, RBAC/schema/flag checks
helm-test: helm-lint
	HELM=$(HELM) $(GO) test -count=1 ./test/helm/...

## helm-update: rewrite the golden renders after an intended chart change
helm-update: helm-bin
	HELM=$(HELM) $(GO) test -count=1 ./test/helm/... -update

## chart-crds: sync the CRDs generated into deployments/crds into the chart
chart-crds:
	rm -f $(CHART)/crds/*.yaml
	cp deployments/crds/*.yaml $(CHART)/crds/
