#!/usr/bin/env bash
# One whole round of GPU work on a machine with a GPU, over an already-built tree:
# GPU tests, the validation suite, the main job, the benchmark beside the PyTorch
# baseline, compute-sanitizer, and (optionally) the Python package's GPU tests.
#   scripts/gpu_round.sh BUILD_DIR OUT_DIR [sections...]
# sections: tests ep epbench validate run bench fp8 sanitize python (default: all but
# the two EP ones, which need a 2-GPU machine). Prints a short
# summary table last; logs and JSON go to OUT_DIR/round.tgz (one file: the device tool
# brings back at most 8), the summary also to OUT_DIR/summary.txt.
set -uo pipefail
B=${1:?build dir}; OUT_DIR=${2:?output dir}; shift 2
O=$(mktemp -d)
sections=${*:-tests validate run bench fp8 sanitize python}
mkdir -p "$O"
summary=()
note() { summary+=("$(printf '%-28s %s' "$1" "$2")"); }
has() { [[ " $sections " == *" $1 "* ]]; }
last_line() { grep -E "$2" "$1" | tail -1; }

# NCCL (EP runs dlopen libnccl.so.2): next to CUDA, or from the pip package
# nvidia-nccl-cu13 that the GPU machine's Python carries.
if ! ldconfig -p | grep -q libnccl.so.2; then
  nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export NCCL_NVLS_ENABLE=0  # never NVLink multicast on these shared hosts

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$O/gpu.txt"

if has tests; then
  for t in "$B"/tests/test_engine "$B"/tests/test_suite_cuda "$B"/tests/test_error_flags; do
    n=$(basename "$t")
    timeout 400 "$t" --gtest_brief=1 > "$O/$n.log" 2>&1
    note "$n" "rc=$? $(last_line "$O/$n.log" 'PASSED|FAILED' )"
  done
fi
if has ep; then
  # Expert parallelism over NCCL: the tests fork one process per GPU (skip below 2 GPUs).
  timeout 500 "$B"/tests/test_ep --gtest_brief=1 > "$O/test_ep.log" 2>&1
  note "test_ep" "rc=$? $(last_line "$O/test_ep.log" 'PASSED|FAILED|SKIPPED')"
fi
if has epbench; then
  timeout 500 "$B"/mxmoe ep-bench --ranks 2 --json "$O/ep_bench.json" > "$O/ep_bench.log" 2>&1
  note "mxmoe ep-bench --ranks 2" "rc=$?"
  tail -30 "$O/ep_bench.log"
fi
if has validate; then
  timeout 400 "$B"/mxmoe validate --suite all --backend cuda --json "$O/validate_cuda.json" > "$O/validate_cuda.log" 2>&1
  note "validate --suite all cuda" "rc=$? $(last_line "$O/validate_cuda.log" 'passed')"
fi
if has run; then
  timeout 120 "$B"/mxmoe run > "$O/run.log" 2>&1
  note "mxmoe run (main job)" "rc=$? $(last_line "$O/run.log" 'passed')"
fi
if has bench; then
  # Decode (M < 16), small-tile prefill (16..96) and prefill (M >= 128, issue 5) cases,
  # the baseline in the same run.
  tokens=1,2,4,8,16,24,32,64,96,128,512,1024,4096,16384
  timeout 300 python3 bench/torch_baseline.py --tokens $tokens --json "$O/torch_baseline.json" > "$O/torch_baseline.log" 2>&1
  note "torch baseline" "rc=$?"
  timeout 300 "$B"/mxmoe bench --tokens $tokens --iterations 20 --baseline "$O/torch_baseline.json" --json "$O/bench.json" > "$O/bench.log" 2>&1
  note "mxmoe bench" "rc=$?"
fi
if has fp8; then
  # The FP8 precision mode (docs/FP8_MODE.md): the coverage matrix judged by its bound,
  # and its speed (beside the baseline when the bench section ran first).
  timeout 400 "$B"/mxmoe validate --suite all --backend cuda --precision fp8 --json "$O/validate_fp8.json" \
    > "$O/validate_fp8.log" 2>&1
  note "validate fp8" "rc=$? $(last_line "$O/validate_fp8.log" 'passed')"
  base=()
  [ -f "$O/torch_baseline.json" ] && base=(--baseline "$O/torch_baseline.json")
  timeout 300 "$B"/mxmoe bench --tokens 24,32,64,128,512,1024,4096,16384 --iterations 20 --precision fp8 "${base[@]}" \
    --json "$O/bench_fp8.json" > "$O/bench_fp8.log" 2>&1
  note "mxmoe bench --precision fp8" "rc=$?"
fi
if has sanitize; then
  # The stage and engine tests under all three tools; memcheck also over the coverage
  # matrix without the real-shape cases (those take minutes under the sanitizers; the
  # same kernels run in the small cases).
  for tool in memcheck racecheck synccheck; do
    bins="test_engine test_error_flags"
    [ $tool = memcheck ] && bins="$bins test_suite_cuda"
    for t in $bins; do
      filter=""
      [ "$t" = test_suite_cuda ] && filter="--gtest_filter=-*kimi_real*"
      # (the E4M3 check launches 2^32 threads: minutes under a sanitizer, no memory access
      # worth checking)
      [ "$t" = test_engine ] && filter="--gtest_filter=-Formats.DeviceE4m3*"
      timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 "$B/tests/$t" --gtest_brief=1 $filter \
        > "$O/sanitizer_${tool}_$t.log" 2>&1
      note "sanitizer $tool $t" "rc=$? $(last_line "$O/sanitizer_${tool}_$t.log" 'SUMMARY|FAILED')"
    done
  done
fi
if has python; then
  # The extension is built here (the device has nanobind, scikit-build-core and torch);
  # CLI11/nlohmann headers travel in .devdeps when the machine lacks them.
  [ -d .devdeps ] && export CMAKE_PREFIX_PATH="$PWD/.devdeps${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  MXMOE_CUDA_ARCHS=90a timeout 400 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/mxmoe_py . \
    > "$O/python_build.log" 2>&1
  note "python build" "rc=$?"
  PYTHONPATH=/tmp/mxmoe_py timeout 300 python3 -m pytest -q python/tests -p no:cacheprovider > "$O/pytest.log" 2>&1
  note "pytest (GPU machine)" "rc=$? $(tail -1 "$O/pytest.log")"
  PYTHONPATH=/tmp/mxmoe_py timeout 120 python3 examples/kimi_k3_layer.py > "$O/example.log" 2>&1
  note "examples/kimi_k3_layer.py" "rc=$? $(tail -1 "$O/example.log")"
fi
[ -f "$O/bench.log" ] && tail -28 "$O/bench.log"
[ -f "$O/bench_fp8.log" ] && tail -12 "$O/bench_fp8.log"
printf '%s\n' "${summary[@]}" | tee "$O/summary.txt"
mkdir -p "$OUT_DIR"
cp "$O/summary.txt" "$OUT_DIR/"
tar czf "$OUT_DIR/round.tgz" -C "$O" .
