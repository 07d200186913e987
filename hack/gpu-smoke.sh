#!/usr/bin/env bash
# make gpu-smoke: Tessera's prepare path on a machine with a real NVIDIA GPU
# and driver, no cluster. Read-only towards the GPU's configuration: it never
# changes MIG mode or resets a GPU; where MIG is already enabled it creates
# one MIG instance through the plugin's prepare path and destroys it again.
# Needs root (runc), a C compiler and Go. The report goes to stdout and to
# ${GPU_SMOKE_REPORT:-gpu-smoke-report.txt}; docs/hardware.md says how to
# commit it. Extra arguments go to hack/gpusmoke (e.g. --nvml-library=...,
# --interposer-library=/usr/local/vgpu/libvgpu.so to check a share's limit).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNC_VERSION=${RUNC_VERSION:-v1.5.1}
CACHE=${TESSERA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
REPORT=${GPU_SMOKE_REPORT:-gpu-smoke-report.txt}

if [ "$(id -u)" != 0 ]; then
  echo "gpu-smoke: run as root (runc starts the probe's container)" >&2
  exit 1
fi
if ! command -v nvidia-smi >/dev/null; then
  echo "gpu-smoke: warning: nvidia-smi not found; is the NVIDIA driver installed?" >&2
fi

# runc: $RUNC, the one on PATH, or built once from the Go module proxy
# (without the seccomp build tag, so libseccomp is not needed).
RUNC=${RUNC:-$(command -v runc || true)}
if [ -z "$RUNC" ]; then
  RUNC="$CACHE/bin/runc-$RUNC_VERSION/runc"
  if [ ! -x "$RUNC" ]; then
    echo "gpu-smoke: building runc $RUNC_VERSION into $(dirname "$RUNC")"
    mkdir -p "$(dirname "$RUNC")"
    GOBIN="$(dirname "$RUNC")" GOFLAGS=-buildvcs=false go install "github.com/opencontainers/runc@$RUNC_VERSION"
  fi
fi

{
  echo "# gpu-smoke $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=index,name,uuid,driver_version,mig.mode.current,memory.total --format=csv 2>&1 || true
  echo "runc: $("$RUNC" --version | head -1)"
  go run ./hack/gpusmoke --gpu-backend=nvml --runc="$RUNC" --cc="${CC:-cc}" "$@"
} 2>&1 | tee "$REPORT"
exit "${PIPESTATUS[0]}"
