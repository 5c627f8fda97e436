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

/// The default ceilings are the H200's, measured (shared/H200.md): its copy bandwidth and
/// its BF16 and FP8 matrix-product rates. On another GPU they are not that GPU's, and a
/// case's "x floor" and "% of peak" read against an H200 (an H100's copy bandwidth is ~30%
/// lower, session 45). A note saying so, naming the GPU and the options that set its own
/// ceilings; "" on an H200 (not a GH200, whose memory differs), or where the caller set
/// both ceilings the run uses (an option given at its default value reads as unset).
inline std::string ceiling_note(const BenchOptions& o, const std::string& gpu_name) {
  const BenchOptions d;
  if (gpu_name.find("H200") != std::string::npos && gpu_name.find("GH200") == std::string::npos) return "";
  const bool fp8 = o.precision == "fp8";
  std::vector<std::string> values, options;  // the defaults still in use, and their options
  const auto keep = [&](double value, const char* unit, const char* option) {
    std::ostringstream v;
    v << value << unit;
    values.push_back(v.str());
    options.push_back(option);
  };
  if (o.hbm_tbps == d.hbm_tbps) keep(d.hbm_tbps, " TB/s", "--hbm-tbps");
  if (fp8 && o.fp8_tflops == d.fp8_tflops) keep(d.fp8_tflops, " TFLOP/s", "--fp8-tflops");
  if (!fp8 && o.bf16_tflops == d.bf16_tflops) keep(d.bf16_tflops, " TFLOP/s", "--bf16-tflops");
  if (values.empty()) return "";
  const auto join = [](const std::vector<std::string>& v, const char* sep) {
    std::string out = v[0];
    for (size_t i = 1; i < v.size(); ++i) out += sep + v[i];
    return out;
  };
  return "note: this GPU is '" + gpu_name + "', but the floors use the H200's measured ceilings (" +
         join(values, ", ") + "): pass " + join(options, " and ") +
         " measured on it, or read 'x floor' and the peak fractions as against an H200";
}

}  // namespace mxmoe::cli
