#!/usr/bin/env bash
# The main job: build, then run a Kimi-K3 expert layer from the embedded checkpoint on
# the GPU when there is one (else the CPU), validated against the float64 reference.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/mxmoe info
./build/mxmoe run "$@"
