// bench_options.h — `mxmoe bench`'s options, and the command that reproduces one of its
// cases (SPEC §11: the benchmark prints, per case, the command that reproduces it).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace mxmoe::cli {

struct BenchOptions {
  std::vector<int64_t> tokens{1, 2, 4, 8, 16, 32, 128};
  int iterations = 50;
  std::string json_path;
  std::string baseline_json;  // PyTorch baseline times measured in the same run (bench/)
  double hbm_tbps = 4.25, bf16_tflops = 792.0, fp8_tflops = 1448.0;
  // > 1: model the receiving side of EP over this many ranks (exact mode): M is tokens
  // per rank, every rank's tokens route uniformly over all 896 experts, and the layer
  // runs on the tokens that hit this rank's 28 experts, with their other slots skipped.
  int ep_ranks = 1;
  std::string precision = "exact";  // fp8: the FP8 mode (docs/FP8_MODE.md), its peak the ceiling
};

/// The `mxmoe bench` command line that runs the case of `tokens` (per rank) alone with
/// these options: its iterations, precision, EP ranks, and any ceiling that is not the
/// default. The case's routing depends on its M alone (cmd_bench), so it times the same
/// problem. The baseline file is named where one was given (its figure for this M).
inline std::string bench_case_command(const BenchOptions& o, int64_t tokens) {
  const BenchOptions d;
  std::ostringstream os;
  os << "mxmoe bench --tokens " << tokens << " --iterations " << o.iterations << " --precision " << o.precision;
  if (o.ep_ranks != d.ep_ranks) os << " --ep-ranks " << o.ep_ranks;
  if (o.hbm_tbps != d.hbm_tbps) os << " --hbm-tbps " << o.hbm_tbps;
  if (o.bf16_tflops != d.bf16_tflops) os << " --bf16-tflops " << o.bf16_tflops;
  if (o.fp8_tflops != d.fp8_tflops) os << " --fp8-tflops " << o.fp8_tflops;
  if (!o.baseline_json.empty()) os << " --baseline " << o.baseline_json;
  return os.str();
}

}  // namespace mxmoe::cli
