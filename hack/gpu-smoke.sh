#!/usr/bin/env bash
# make gpu-smoke: Tessera's prepare path on a machine with a real NVIDIA GPU
# and driver, no cluster. Read-only towards the GPU's configuration: it never
# changes MIG mode or resets a GPU; where MIG is already enabled it creates
# one MIG instance through the plugin's prepare path and destroys it again.
# Needs root (runc) and a C compiler; Go too, unless GPU_SMOKE_KIT names an
# unpacked kit (make gpu-smoke-kit, built on another machine: the smoke
# binary, nvidia-cdi-hook next to it, runc and the probe). The report goes to
# stdout and to ${GPU_SMOKE_REPORT:-gpu-smoke-report.txt}; docs/hardware.md
# says how to commit it. Extra arguments go to hack/gpusmoke (e.g.
# --nvml-library=..., --mps-control=..., --interposer-library=...).
#
#   hack/gpu-smoke.sh [ARGS...]            build what is missing, run
#   hack/gpu-smoke.sh --build-kit OUT.tgz  only build the kit into OUT.tgz
set -euo pipefail
cd "$(dirname "$0")/.."

RUNC_VERSION=${RUNC_VERSION:-v1.5.1}
HOOK_PKG=github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook
CACHE=${TESSERA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
REPORT=${GPU_SMOKE_REPORT:-gpu-smoke-report.txt}

# build_kit DIR: the smoke binary with nvidia-cdi-hook next to it (the
# plugin installs the hook that sits beside its own executable, as in the
# image), runc (without the seccomp build tag, so libseccomp is not
# needed) and the probe, built with cc.
build_kit() {
  local dir=$1
  mkdir -p "$dir"
  echo "gpu-smoke: building the smoke binary, nvidia-cdi-hook and runc $RUNC_VERSION into $dir" >&2
  CGO_ENABLED=1 go build -ldflags="-s -w" -o "$dir/gpusmoke" ./hack/gpusmoke 2> >(grep -v -e 'deprecated' -e 'cgo-gcc-prolog' -e 'nvml.h' -e '^ *[0-9]* |' -e '^ *|' >&2)
  CGO_ENABLED=1 go build -ldflags="-s -w" -o "$dir/nvidia-cdi-hook" "$HOOK_PKG" 2>/dev/null
  if [ ! -x "$CACHE/bin/runc-$RUNC_VERSION/runc" ]; then
    mkdir -p "$CACHE/bin/runc-$RUNC_VERSION"
    GOBIN="$CACHE/bin/runc-$RUNC_VERSION" GOFLAGS=-buildvcs=false go install -ldflags="-s -w" "github.com/opencontainers/runc@$RUNC_VERSION"
  fi
  cp "$CACHE/bin/runc-$RUNC_VERSION/runc" "$dir/runc"
  "$dir/gpusmoke" --build-probe="$dir/probe" --cc="${CC:-cc}"
}

if [ "${1:-}" = --build-kit ]; then
  out=${2:?usage: hack/gpu-smoke.sh --build-kit OUT.tgz}
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  build_kit "$tmp/gpu-smoke-kit"
  git rev-parse --short HEAD >"$tmp/gpu-smoke-kit/COMMIT" 2>/dev/null || echo unknown >"$tmp/gpu-smoke-kit/COMMIT"
  tar -C "$tmp" -czf "$out" gpu-smoke-kit
  echo "gpu-smoke: kit in $out; on the GPU machine: tar xzf $(basename "$out") && GPU_SMOKE_KIT=\$PWD/gpu-smoke-kit hack/gpu-smoke.sh"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "gpu-smoke: run as root (runc starts the probe's container)" >&2
  exit 1
fi
if ! command -v nvidia-smi >/dev/null; then
  echo "gpu-smoke: warning: nvidia-smi not found; is the NVIDIA driver installed?" >&2
fi

KIT=${GPU_SMOKE_KIT:-}
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || cat "$KIT/COMMIT" 2>/dev/null || echo unknown)
if [ -z "$KIT" ]; then
  KIT="$CACHE/gpu-smoke-kit"
  build_kit "$KIT"
fi
RUNC=${RUNC:-$KIT/runc}

{
  echo "# gpu-smoke $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), commit $COMMIT"
  nvidia-smi --query-gpu=index,name,uuid,driver_version,mig.mode.current,memory.total --format=csv 2>&1 || true
  echo "kernel: $(uname -r)"
  echo "runc: $("$RUNC" --version | head -1)"
  "$KIT/gpusmoke" --gpu-backend=nvml --runc="$RUNC" --probe-binary="$KIT/probe" "$@"
} 2>&1 | tee "$REPORT"
exit "${PIPESTATUS[0]}"
