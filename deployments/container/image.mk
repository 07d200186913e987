# Container image targets; the top-level Makefile includes this file. Both
# build the image deployments/container/image.yaml defines, with the same tool
# (go run ./hack/image); docs/install.md, "Images".
#   make image-archive   build the image without Docker into bin/tessera-image.tar
#                        (OCI archive, tessera.dev/tessera:dev) for ctr import
#   make image-docker    docker build with deployments/container/Dockerfile

GO            ?= go
IMAGE_ARCHIVE ?= bin/tessera-image.tar
IMAGE_TAG     ?= tessera.dev/tessera:dev

.PHONY: image-archive image-docker

## image-archive: build the image without Docker (OCI archive for `ctr -n k8s.io images import`)
image-archive:
	$(GO) run ./hack/image -o $(IMAGE_ARCHIVE) -tag $(IMAGE_TAG)

## image-docker: build the same image with Docker/BuildKit (its build stage runs hack/image)
image-docker:
	docker build -f deployments/container/Dockerfile -t $(IMAGE_TAG) .
