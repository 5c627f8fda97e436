#!/usr/bin/env bash
# Configure and build into build/ (CUDA where nvcc exists, sm_80/sm_90a/sm_120a).
# Extra arguments go to cmake (e.g. -DMXMOE_CUDA=OFF, -DMXMOE_CUDA_ARCHS=90a).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$(nproc)"
