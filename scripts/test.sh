#!/usr/bin/env bash
# Build and run the whole test suite. GPU tests skip themselves (named, with the reason)
# where no GPU is visible; CTest lists them as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
