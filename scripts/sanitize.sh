#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of the CPU tests (issue 7): a
# separate CPU-only build in build-asan/ (g++, whose sanitizer runtimes come with it),
# then the CPU tests under CTest. Any sanitizer report fails the test that produced it.
# The slow validate_real_cpu test (Kimi-K3 real shapes through the float64 reference) is
# left out; validate_smoke_cpu (the whole coverage matrix at small shapes) runs.
# Extra arguments go to ctest (e.g. -R Safetensors).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh

BUILD="${MXMOE_ASAN_BUILD:-build-asan}"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# RelWithDebInfo: -O2 keeps the tests fast under the sanitizers, -g gives line numbers.
cmake -S . -B "$BUILD" -G Ninja -DMXMOE_CUDA=OFF -DMXMOE_TESTS=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$SAN" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$BUILD" -j "$(nproc)"

# halt/abort on the first report so CTest sees a failure; leaks are reported too.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:halt_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir "$BUILD" -L cpu -E '^validate_real_cpu$' --output-on-failure -j "$(nproc)" "$@"
