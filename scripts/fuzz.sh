#!/usr/bin/env bash
# Build the libFuzzer targets (tests/fuzz/, clang with ASan + UBSan, CPU-only) in
# build-fuzz/ and run each for SECONDS (default 60) from its seed corpus
# tests/fuzz/corpus/<target>/. The corpus is copied to a temporary directory first, so
# the run never writes into the repository. Exits non-zero on any finding (crash,
# sanitizer report, leak, timeout, out-of-memory); the reproducer is kept in
# $MXMOE_FUZZ_ARTIFACTS (default build-fuzz/artifacts/) and its path printed.
# Reproduce a finding with: build-fuzz/tests/fuzz/<target> <file>
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (targets: fuzz_safetensors fuzz_checkpoint)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET="${1:-60}"
shift || true
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(fuzz_safetensors fuzz_checkpoint)

bash scripts/deps.sh
# clang, and libFuzzer + the sanitizer runtimes, which Debian ships separately
# (bookworm: libclang-rt-14-dev, not even a recommendation of clang).
pkgs=(clang "${MXMOE_CLANG_RT_PKG:-libclang-rt-14-dev}")
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fuzz: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BUILD="${MXMOE_FUZZ_BUILD:-build-fuzz}"
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DMXMOE_FUZZ=ON -DMXMOE_CUDA=OFF \
  -DMXMOE_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}"

ART="${MXMOE_FUZZ_ARTIFACTS:-$BUILD/artifacts}"
mkdir -p "$ART"
ART="$(cd "$ART" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mxmoe-fuzz.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

status=0
for t in "${TARGETS[@]}"; do
  cp -r "tests/fuzz/corpus/$t" "$WORK/$t"
  echo "fuzz: $t for ${SECONDS_PER_TARGET} s ($(ls "$WORK/$t" | wc -l) seed files)"
  # -rss_limit_mb / -timeout turn runaway memory or time into findings; -error_exitcode
  # keeps sanitizer reports and libFuzzer's own findings distinguishable from setup errors.
  if "$BUILD/tests/fuzz/$t" -max_total_time="$SECONDS_PER_TARGET" -dict=tests/fuzz/safetensors.dict \
      -rss_limit_mb=2048 -timeout=25 -print_final_stats=1 -artifact_prefix="$ART/$t-" \
      "$WORK/$t" >"$WORK/$t.log" 2>&1; then
    grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|new_units_added|peak_rss_mb)' "$WORK/$t.log" || true
    echo "fuzz: $t: no finding ($(ls "$WORK/$t" | wc -l) corpus files)"
  else
    status=1
    tail -n 60 "$WORK/$t.log"
    echo "fuzz: $t: FINDING; reproducer(s):" $(ls "$ART" | grep "^$t-" | sed "s|^|$ART/|")
  fi
done
exit $status
