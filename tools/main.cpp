// The `mxmoe` command: info, run, validate, bench, ep-bench, convert, generate.
// Every command exits non-zero on any failure; --json writes machine-readable results.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "mxmoe/checkpoint.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/random.h"
#include "mxmoe/routing.h"
#include "mxmoe/safetensors.h"
#include "mxmoe/suite.h"
#include "bench_options.h"
#include "ep_bench.h"
#include "table.h"

using json = nlohmann::json;
using namespace mxmoe;

namespace {

uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

/// Where a command's tables and summary lines go: stdout, or stderr when its JSON goes to
/// stdout (`--json -`), so that stdout is the JSON alone and parses.
std::ostream& report_stream(const std::string& json_path) { return json_path == "-" ? std::cerr : std::cout; }

void write_json(const std::string& path, const json& j) {
  if (path.empty()) return;
  if (path == "-") {
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::ofstream f(path);
  if (!f) throw InvalidArgument("--json", "cannot write '" + path + "'");
  f << j.dump(2) << "\n";
}

json result_json(const CaseResult& r) {
  json j = {{"name", r.name}, {"what", r.what}, {"backend", to_string(r.backend)},
            {"status", r.status_string()}, {"seed", r.seed},
            {"max_row_rel_l2", r.vs_reference.max_row_rel_l2},
            {"min_cosine", r.vs_reference.min_cosine},
            {"max_abs_err", r.vs_reference.max_abs_err},
            {"bound_violations", r.vs_reference.bound_violations},
            {"atol", r.vs_reference.atol}, {"rtol", r.vs_reference.rtol},
            {"near_ties", r.near_ties}, {"near_ties_taken", r.near_ties_taken},
            {"output_ties_taken", r.output_ties_taken},
            {"deterministic_3_runs", r.deterministic},
            {"backend_seconds", r.backend_seconds}, {"reference_seconds", r.reference_seconds},
            {"note", r.note}};
  if (r.graph_checked) j["graph_replays_identical"] = r.graph_identical;
  if (r.has_ideal) j["ideal"] = {{"max_row_rel_l2", r.ideal_rel_l2}, {"min_cosine", r.ideal_cosine}};
  return j;
}

std::string sci(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}
std::string fix(double v, int digits) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

void print_results(const std::vector<CaseResult>& results, std::ostream& os) {
  Table t({"case", "backend", "status", "rel L2", "cosine", "viol", "ties", "3 runs", "graph",
           "ideal rel L2", "ideal cos", "time s"});
  for (const CaseResult& r : results) {
    t.row({r.name, to_string(r.backend), r.status_string(), sci(r.vs_reference.max_row_rel_l2),
           fix(r.vs_reference.min_cosine, 6), std::to_string(r.vs_reference.bound_violations),
           std::to_string(r.near_ties_taken) + "/" + std::to_string(r.near_ties),
           r.deterministic ? "same" : "DIFF", r.graph_checked ? (r.graph_identical ? "same" : "DIFF") : "-",
           r.has_ideal ? sci(r.ideal_rel_l2) : "-", r.has_ideal ? fix(r.ideal_cosine, 4) : "-",
           fix(r.backend_seconds, 3)});
  }
  t.print(os);
  for (const CaseResult& r : results)
    if (r.status != CaseResult::Status::Pass) os << r.name << ": " << r.status_string() << ": " << r.note << "\n";
}

// ------------------------------------------------------------------ info
int cmd_info(bool as_json) {
  json j;
  j["version"] = MXMOE_VERSION;
  j["cuda_built"] = cuda_built();
  j["gpus"] = json::array();
  const std::vector<GpuInfo> gpus = cuda_devices();
  for (const GpuInfo& g : gpus) {
    const GpuCapabilities& c = g.capabilities;
    j["gpus"].push_back({{"index", g.index}, {"name", g.name},
                         {"sm", std::to_string(g.sm_major) + std::to_string(g.sm_minor)},
                         {"sms", g.sm_count}, {"memory_gib", g.memory_bytes / double(1ull << 30)},
                         {"supported", g.supported}, {"note", g.note},
                         {"activations", c.activations}, {"input_formats", c.input_formats},
                         {"intermediate_formats", c.intermediate_formats}, {"output_formats", c.output_formats},
                         {"precisions", c.precisions}, {"paths", c.paths}});
  }
  const LibraryCapabilities& all = library_capabilities();
  j["capabilities"] = {
      {"backends", default_backend(gpus) == Backend::Cuda ? json{"cpu", "cuda"} : json{"cpu"}},
      {"activations", all.activations},
      {"input_formats", all.input_formats},
      {"intermediate_formats", all.intermediate_formats},
      {"output_formats", all.output_formats},
      {"weight_formats", all.weight_formats},
      {"w13_layouts", all.w13_layouts},
      {"checkpoint_formats", all.checkpoint_formats},
      {"routers", all.routers}};
  if (as_json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "mxmoe " << MXMOE_VERSION << "\n"
            << "CUDA engine built: " << (cuda_built() ? "yes" : "no (CPU-only build)") << "\n"
            << "GPUs seen: " << cuda_device_count() << "\n";
  const auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  for (const GpuInfo& g : gpus)
    std::cout << "  [" << g.index << "] " << g.name << " sm_" << g.sm_major << g.sm_minor << ", " << g.sm_count
              << " SMs, " << fix(g.memory_bytes / double(1ull << 30), 1) << " GiB, "
              << (g.supported ? "supported: precisions " + join(g.capabilities.precisions) + "; paths " +
                                    join(g.capabilities.paths)
                              : "not supported: " + g.note)
              << "\n";
  std::cout << "backends: " << j["capabilities"]["backends"].dump() << "\n"
            << "activations: " << join(all.activations)
            << " (swiglu: SwiGLU-OAI, silu: SiLU-gated); per-expert parameters\n"
            << "inputs: " << join(all.input_formats) << "; intermediate: " << join(all.intermediate_formats)
            << "; output: " << join(all.output_formats) << "; weights: " << join(all.weight_formats) << "\n"
            << "checkpoints: " << join(all.checkpoint_formats) << "; w13 layouts: " << join(all.w13_layouts)
            << "; routers: " << join(all.routers) << "\n";
  return 0;
}

// ------------------------------------------------------------------ validate
int cmd_validate(const std::string& suite, const std::string& backend_name, const std::string& json_path,
                 uint64_t seed, const std::string& filter, const std::string& precision_name) {
  const Precision precision = parse_precision(precision_name, "--precision");
  const Backend backend = parse_backend(backend_name);
  if (precision == Precision::FP8 && backend != Backend::Cuda)
    throw InvalidArgument("--precision", "fp8 is a mode of the CUDA engine (the CPU engine is exact): "
                          "use --backend cuda, or --precision exact");
  if (backend == Backend::Cuda && !cuda_built())
    throw Unsupported("--backend cuda: this build has no CUDA engine (nvcc was not found at configure time); use --backend cpu");
  if (backend == Backend::Cuda && cuda_device_count() == 0)
    throw Unsupported("--backend cuda: no CUDA GPU is visible on this machine; use --backend cpu");
  std::vector<SuiteCase> cases = suite_cases(suite);
  if (precision == Precision::FP8) {
    // The FP8 mode re-expresses MXFP8 activations: the cases with BF16 activations or
    // intermediate do not apply (config.validate would refuse them).
    const size_t all = cases.size();
    std::erase_if(cases, [](const SuiteCase& c) {
      return c.cfg.input_format != InputFormat::MXFP8 || c.cfg.resolved_intermediate() != IntermediateFormat::MXFP8;
    });
    for (SuiteCase& c : cases) c.cfg.precision = Precision::FP8;
    std::cerr << "--precision fp8: " << cases.size() << " of " << all
              << " cases (those with MXFP8 activations and intermediate)\n";
  }
  std::vector<CaseResult> results;
  int i = 0;
  for (const SuiteCase& c : cases) {
    ++i;
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    std::cerr << "[" << i << "/" << cases.size() << "] " << c.name << " ..." << std::flush;
    const uint64_t case_seed = seed + static_cast<uint64_t>(i) * 7919u;
    // Weights from the run's seed (shared by consecutive cases of one geometry), inputs
    // fresh per case.
    results.push_back(run_case(c, backend, case_seed, seed));
    std::cerr << " " << results.back().status_string() << " (" << fix(results.back().backend_seconds, 2)
              << " s backend, " << fix(results.back().reference_seconds, 2) << " s reference)\n";
  }
  std::ostream& os = report_stream(json_path);
  print_results(results, os);
  int failed = 0;
  for (const CaseResult& r : results) failed += r.status != CaseResult::Status::Pass;
  os << "validate --suite " << suite << " --backend " << backend_name
            << (precision == Precision::FP8 ? " --precision fp8" : "") << " --seed " << seed << ": "
            << results.size() - failed << " passed, " << failed << " failed\n";
  json j = {{"suite", suite}, {"backend", backend_name}, {"precision", to_string(precision)},
            {"seed", seed}, {"cases", json::array()}};
  for (const CaseResult& r : results) j["cases"].push_back(result_json(r));
  j["passed"] = results.size() - failed;
  j["failed"] = failed;
  write_json(json_path, j);
  return failed == 0 && !results.empty() ? 0 : 1;
}

// ------------------------------------------------------------------ run
// The embedded checkpoint: next to the executable's build tree (build/../data), in the
// source tree this binary was configured from, or under the current directory.
std::string default_checkpoint() {
  const std::string name = "data/kimi_k3_mini.safetensors";
  std::vector<std::string> candidates;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    std::string dir(exe);
    dir = dir.substr(0, dir.rfind('/'));
    candidates.push_back(dir + "/../" + name);
  }
  candidates.push_back(MXMOE_DEFAULT_CHECKPOINT);
  candidates.push_back(name);
  for (const std::string& c : candidates)
    if (std::ifstream(c).good()) return c;
  return MXMOE_DEFAULT_CHECKPOINT;  // the loader's error then names the expected path
}

struct RunOptions {
  std::string checkpoint = default_checkpoint();
  std::string backend;
  std::string activation;  // empty: the checkpoint format's (Kimi-K3 situ, GPT-OSS swiglu)
  int64_t tokens = 32, top_k = 0, layer = -1, ep_size = 1, ep_rank = 0;
  std::string prefix;
  std::string json_path;
  uint64_t seed = 0;
  bool bf16_input = false, bf16_intermediate = false;
  std::string intermediate = "auto";  // SPEC §7: follows the input unless asked
};

int cmd_run(RunOptions o) {
  std::string why_cpu;
  const Backend backend = o.backend.empty() ? default_backend(cuda_devices(), &why_cpu) : parse_backend(o.backend);
  if (!why_cpu.empty()) std::cerr << why_cpu << "\n";
  if (o.seed == 0) o.seed = fresh_seed();
  std::cerr << "loading " << o.checkpoint << " ...\n";
  // The layer index: from a single file's synthetic metadata when present, else 0 unless
  // given (a sharded checkpoint's index names no layer).
  LoadOptions lo;
  lo.prefix = o.prefix;
  lo.ep_size = o.ep_size;
  lo.ep_rank = o.ep_rank;
  SyntheticSpec spec;
  bool synthetic = false;
  const bool one_file = o.checkpoint.size() >= 12 &&
                        o.checkpoint.compare(o.checkpoint.size() - 12, 12, ".safetensors") == 0;
  if (o.layer < 0 && !one_file) {
    lo.layer = 0;
  } else if (o.layer < 0) {
    SafetensorsFile probe = SafetensorsFile::open(o.checkpoint);
    synthetic = synthetic_spec_from_metadata(probe.metadata(), spec);
    lo.layer = synthetic ? spec.layer : 0;
  } else {
    lo.layer = o.layer;
  }
  LoadedLayer L = load_checkpoint(o.checkpoint, lo);
  synthetic = synthetic_spec_from_metadata(L.metadata, spec);

  SuiteCase c;
  c.name = "run";
  c.cfg.num_experts = L.num_experts;
  c.cfg.hidden = L.hidden;
  c.cfg.intermediate = L.intermediate;
  c.cfg.top_k = o.top_k > 0 ? o.top_k : (synthetic ? spec.top_k : std::min<int64_t>(16, L.num_experts));
  c.cfg.ep_size = o.ep_size;
  c.cfg.ep_rank = o.ep_rank;
  // The model the checkpoint's format implies, unless asked otherwise: Kimi-K3's SiTU
  // with the sigmoid router and its correction bias, GPT-OSS's SwiGLU-OAI with softmax.
  const bool gpt_oss = L.format == CheckpointFormat::GptOss;
  const Activation act = o.activation.empty() ? (gpt_oss ? Activation::SwiGLU_OAI : Activation::SiTU)
                                              : parse_activation(o.activation, "--activation");
  c.cfg.activation = act == Activation::SiTU ? ActivationParams::situ()
                     : act == Activation::SwiGLU_OAI ? ActivationParams::swiglu_oai()
                                                     : ActivationParams::silu_gated();
  c.cfg.input_format = o.bf16_input ? InputFormat::BF16 : InputFormat::MXFP8;
  c.cfg.intermediate_format = o.bf16_intermediate || o.intermediate == "bf16" ? IntermediateFormat::BF16
                              : o.intermediate == "mxfp8"                    ? IntermediateFormat::MXFP8
                                                                             : IntermediateFormat::Auto;
  c.cfg.has_bias = !L.weights.w13_bias.empty();
  c.tokens = o.tokens;
  c.routing = gpt_oss ? RoutingPattern::RouterSoftmax : RoutingPattern::RouterSigmoid;
  c.router.kind = gpt_oss ? RouterKind::Softmax : RouterKind::Sigmoid;
  c.router.top_k = c.cfg.top_k;
  c.cfg.validate();

  CaseData d;
  d.cfg = c.cfg;
  d.weights = std::make_shared<const ExpertWeights>(std::move(L.weights));
  if (!gpt_oss) d.router_bias = L.correction_bias;  // the softmax router takes none
  if (synthetic) {
    // Regenerate the BF16 originals from the recorded seed: the ideal comparison shows the
    // quantization error a user pays.
    MoeConfig gen = c.cfg;
    d.ideal = std::make_shared<const IdealWeights>(make_synthetic_layer(gen, spec.seed).ideal);
  }
  make_case_inputs(c, o.seed, d);
  std::cerr << "running " << c.tokens << " tokens on " << to_string(backend) << " and the float64 reference ...\n";
  CaseResult r = judge_case(c, d, backend, o.seed);

  std::ostream& os = report_stream(o.json_path);
  os << "mxmoe run: " << to_string(L.format) << "-format expert layer, "
     << (c.router.kind == RouterKind::Softmax ? "softmax" : "sigmoid")
     << " router\n";
  Table info({"checkpoint", "experts (local)", "K", "N", "top-k", "activation", "input", "intermediate", "tokens", "backend"});
  info.row({o.checkpoint, std::to_string(d.cfg.num_experts) + " (" + std::to_string(d.cfg.local_experts()) + ")",
            std::to_string(d.cfg.hidden), std::to_string(d.cfg.intermediate), std::to_string(d.cfg.top_k),
            to_string(act), to_string(d.cfg.input_format), to_string(d.cfg.resolved_intermediate()),
            std::to_string(c.tokens), to_string(backend)});
  info.print(os);
  print_results({r}, os);
  os << "run --seed " << o.seed << ": " << (r.status == CaseResult::Status::Pass ? "1 passed, 0 failed" : "0 passed, 1 failed") << "\n";
  if (!o.json_path.empty()) write_json(o.json_path, result_json(r));
  return r.status == CaseResult::Status::Pass ? 0 : 1;
}

// ------------------------------------------------------------------ bench
using cli::BenchOptions;  // bench_options.h

int cmd_bench(const BenchOptions& o) {
  if (cuda_device_count() == 0)
    throw Unsupported("bench: needs a CUDA GPU (none visible); `mxmoe validate --backend cpu` checks correctness on the CPU");
  // Kimi-K3 real shapes on one EP32 rank: 28 local experts; every token's 16 experts are
  // local (the busiest rank), so M tokens touch min(28, ~16 + ...) experts.
  MoeConfig cfg;
  cfg.num_experts = 896;
  cfg.ep_size = 32;
  cfg.ep_rank = 7;
  cfg.top_k = 16;
  cfg.hidden = 3584;
  cfg.intermediate = 3072;
  cfg.activation = ActivationParams::situ();
  cfg.precision = parse_precision(o.precision, "--precision");
  const bool fp8 = cfg.precision == Precision::FP8;
  const double mma_tflops = fp8 ? o.fp8_tflops : o.bf16_tflops;
  const int64_t E = cfg.local_experts(), K = cfg.hidden, N = cfg.intermediate;
  if (o.ep_ranks != 1 && (o.ep_ranks < 1 || cfg.num_experts % o.ep_ranks != 0 ||
                          cfg.num_experts / o.ep_ranks != E))
    throw InvalidArgument("--ep-ranks", "must be 32 (28 experts per rank of 896) or 1");
  // Timing does not depend on values, but never time zeros: random MXFP4 bytes with
  // scales near 1 keep every value finite and non-trivial.
  ExpertWeights w;
  w.num_local = E;
  w.hidden = K;
  w.intermediate = N;
  Rng rng(12345);
  auto fill = [&](std::vector<uint8_t>& v, size_t n, bool scale) {
    v.resize(n);
    for (auto& b : v) b = scale ? static_cast<uint8_t>(118 + rng.below(8)) : static_cast<uint8_t>(rng.next_u64());
  };
  fill(w.w13_packed, E * 2 * N * K / 2, false);
  fill(w.w13_scale, E * 2 * N * K / 32, true);
  fill(w.w2_packed, E * K * N / 2, false);
  fill(w.w2_scale, E * K * N / 32, true);
  const double bytes_per_expert = static_cast<double>(2 * N * K / 2 + 2 * N * K / 32 + K * N / 2 + K * N / 32);
  const double flops_per_row = 2.0 * K * 2 * N + 2.0 * N * K;

  json baseline = json::object();
  if (!o.baseline_json.empty()) {
    std::ifstream f(o.baseline_json);
    if (!f) throw InvalidArgument("--baseline", "cannot read '" + o.baseline_json + "'");
    baseline = json::parse(f);
  }
  CudaMoeLayer layer(cfg, w);  // on the current device: 0, as bench never sets another
  const std::vector<GpuInfo> gpus = cuda_devices();
  const auto current = std::find_if(gpus.begin(), gpus.end(), [](const GpuInfo& g) { return g.index == 0; });
  const std::string gpu_name = current == gpus.end() ? std::string() : current->name;
  const std::string note = cli::ceiling_note(o, gpu_name);  // in the report and the JSON
  const int64_t max_m = *std::max_element(o.tokens.begin(), o.tokens.end()) * o.ep_ranks;
  CudaHostSession session(layer, max_m);
  Table t({"M", "mode", "experts", "time us", "TB/s", "TFLOP/s", "x HBM floor", "x MMA floor", "torch us", "speedup"});
  json out = json::array();
  const int32_t first = static_cast<int32_t>(cfg.ep_rank * E);
  for (int64_t M_in : o.tokens) {
    // The routing of M depends on M alone, not on the other sizes of the list: near 8 or
    // 16 rows per expert the decode path's time follows how many experts cross a tile
    // (session 22: M=16 took 275 or 247 us after or without M=1..12 in the list).
    Rng route_rng(0x5eed0000u + static_cast<uint64_t>(M_in));
    Routing r;
    r.top_k = 16;
    std::vector<bool> touched(E, false);
    int64_t M = M_in;
    if (o.ep_ranks > 1) {
      // Tokens of all ranks, each with 16 distinct experts of 896; keep those that hit
      // this rank (ids stay global: the layer skips the other ranks' experts).
      M = 0;
      for (int64_t tkn = 0; tkn < M_in * o.ep_ranks; ++tkn) {
        std::vector<int32_t> ids;
        while (ids.size() < 16) {
          const auto id = static_cast<int32_t>(route_rng.below(static_cast<uint64_t>(cfg.num_experts)));
          if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
        }
        bool hit = false;
        for (int32_t id : ids) hit |= id >= first && id < first + E;
        if (!hit) continue;
        for (int32_t id : ids) {
          r.ids.push_back(id);
          r.weights.push_back(1.0f / 16);
          if (id >= first && id < first + E) touched[id - first] = true;
        }
        ++M;
      }
    }
    r.tokens = M;
    for (int64_t tkn = 0; o.ep_ranks == 1 && tkn < M; ++tkn) {
      // 16 distinct local experts per token, rotating so tokens spread over all 28.
      std::vector<int32_t> perm(E);
      for (int64_t e = 0; e < E; ++e) perm[e] = static_cast<int32_t>(e);
      for (int64_t e = E - 1; e > 0; --e) std::swap(perm[e], perm[route_rng.below(e + 1)]);
      for (int j = 0; j < 16; ++j) {
        r.ids.push_back(first + perm[j]);
        r.weights.push_back(1.0f / 16);
        touched[perm[j]] = true;
      }
    }
    int64_t n_touched = 0;
    for (bool b : touched) n_touched += b;
    Activations x = make_activations(M, K, 777 + M).to_mxfp8();
    session.set_inputs(x, &r, nullptr);
    const double bytes = n_touched * bytes_per_expert;
    int64_t local_slots = 0;
    for (int32_t id : r.ids) local_slots += id >= first && id < first + E;
    const double flops = flops_per_row * static_cast<double>(local_slots);
    const double hbm_floor_us = bytes / (o.hbm_tbps * 1e12) * 1e6;
    const double mma_floor_us = flops / (mma_tflops * 1e12) * 1e6;
    const std::string key = std::to_string(M);  // the baseline is single-GPU only
    const std::string label = o.ep_ranks > 1 ? std::to_string(M_in) + "/rank->" + key : key;
    const double torch_us = o.ep_ranks == 1 && baseline.contains(key) ? baseline[key].get<double>() : 0.0;
    for (bool graph : {false, true}) {
      CudaHostSession::Timing tm = session.time(o.iterations, graph);
      const double us = tm.median_us;
      t.row({label, graph ? "graph" : "eager", std::to_string(n_touched), fix(us, 1),
             fix(bytes / (us * 1e-6) / 1e12, 2), fix(flops / (us * 1e-6) / 1e12, 1),
             fix(us / hbm_floor_us, 2), fix(us / mma_floor_us, 2), torch_us > 0 ? fix(torch_us, 1) : "-",
             torch_us > 0 ? fix(torch_us / us, 2) : "-"});
      out.push_back({{"tokens", M}, {"tokens_per_rank", M_in}, {"ep_ranks", o.ep_ranks},
                     {"local_slots", local_slots}, {"mode", graph ? "graph" : "eager"}, {"experts_touched", n_touched},
                     {"median_us", us}, {"min_us", tm.min_us}, {"max_us", tm.max_us},
                     {"iterations", tm.iterations}, {"tbps", bytes / (us * 1e-6) / 1e12},
                     {"tflops", flops / (us * 1e-6) / 1e12}, {"hbm_floor_us", hbm_floor_us},
                     {"mma_floor_us", mma_floor_us}, {"torch_us", torch_us},
                     {"precision", o.precision}, {"mma_tflops_ceiling", mma_tflops},
                     {"command", cli::bench_case_command(o, M_in)}});
    }
  }
  std::ostream& os = report_stream(o.json_path);
  os << "mxmoe bench: Kimi-K3 (E_local 28, K 3584, N 3072, top-16, SiTU, MXFP8 in/intermediate), "
            << "median of " << o.iterations << ", cold L2; floors at " << o.hbm_tbps << " TB/s and "
            << mma_tflops << " TFLOP/s (" << (fp8 ? "FP8; precision fp8" : "BF16") << ")\n";
  t.print(os);
  if (!note.empty()) os << note << "\n";
  os << "each case alone:\n";
  for (int64_t M_in : o.tokens) os << "  M=" << M_in << ": " << cli::bench_case_command(o, M_in) << "\n";
  write_json(o.json_path, {{"cases", out},
                           {"gpu", gpu_name},
                           {"ceilings", {{"hbm_tbps", o.hbm_tbps}, {"mma_tflops", mma_tflops}}},
                           {"ceiling_note", note}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mxmoe: fused MXFP4 Mixture-of-Experts (Kimi-K3 SiTU, GPT-OSS SwiGLU)"};
  app.require_subcommand(1);

  auto* info = app.add_subcommand("info", "build, GPUs seen, capabilities");
  bool info_json = false;
  info->add_flag("--json", info_json, "print JSON");

  auto* run = app.add_subcommand("run", "run a layer from a checkpoint and validate it against the reference");
  RunOptions ro;
  run->add_option("--checkpoint", ro.checkpoint,
                  "safetensors file, or a sharded checkpoint's index (model.safetensors.index.json) or folder "
                  "(default: the embedded Kimi-format checkpoint)");
  run->add_option("--backend", ro.backend, "cpu or cuda (default: cuda when a GPU is visible)");
  run->add_option("--tokens,-m", ro.tokens, "tokens")->check(CLI::Range(1, 1 << 20));
  run->add_option("--top-k", ro.top_k, "experts per token (default: from the checkpoint)");
  run->add_option("--activation", ro.activation, "situ | swiglu | silu (default: the checkpoint format's)");
  run->add_option("--layer", ro.layer, "layer index (default: from metadata, else 0)");
  run->add_option("--prefix", ro.prefix, "tensor name prefix (default model.layers.<layer>.mlp)");
  run->add_option("--ep-size", ro.ep_size, "expert-parallel size");
  run->add_option("--ep-rank", ro.ep_rank, "expert-parallel rank");
  run->add_flag("--bf16-input", ro.bf16_input, "BF16 activations instead of MXFP8");
  run->add_option("--intermediate", ro.intermediate,
                  "auto | bf16 | mxfp8 (auto: the input's format, SPEC §7)")
      ->check(CLI::IsMember({"auto", "bf16", "mxfp8"}));
  run->add_flag("--bf16-intermediate", ro.bf16_intermediate, "the same as --intermediate bf16");
  run->add_option("--seed", ro.seed, "input seed (default: fresh)");
  run->add_option("--json", ro.json_path, "write results as JSON ('-' for stdout)");

  auto* val = app.add_subcommand("validate", "run the SPEC §8 coverage matrix against the float64 reference");
  std::string suite = "smoke", backend = "cpu", vjson, filter, vprecision = "exact";
  uint64_t vseed = 0;
  val->add_option("--suite", suite, "smoke | real | all");
  val->add_option("--backend", backend, "cpu | cuda");
  val->add_option("--json", vjson, "write results as JSON ('-' for stdout)");
  val->add_option("--seed", vseed, "base seed (default: fresh)");
  val->add_option("--filter", filter, "only cases whose name contains this");
  val->add_option("--precision", vprecision,
                  "exact | fp8 (the CUDA FP8 mode on the cases with MXFP8 activations, judged by its bound)");

  auto* bench = app.add_subcommand("bench", "time the CUDA engine on Kimi-K3 shapes against the H200 floors");
  BenchOptions bo;
  bench->add_option("--tokens", bo.tokens, "token counts")->delimiter(',');
  bench->add_option("--iterations", bo.iterations, "timed runs per case (median reported)");
  bench->add_option("--baseline", bo.baseline_json, "JSON {\"M\": torch_us} from bench/torch_baseline.py, same run");
  bench->add_option("--json", bo.json_path, "write results as JSON ('-' for stdout)");
  bench->add_option("--hbm-tbps", bo.hbm_tbps, "HBM ceiling for the floor (measured copy bandwidth)");
  bench->add_option("--bf16-tflops", bo.bf16_tflops, "BF16 tensor-core ceiling");
  bench->add_option("--fp8-tflops", bo.fp8_tflops, "FP8 tensor-core ceiling (with --precision fp8)");
  bench->add_option("--precision", bo.precision, "exact | fp8 (the FP8 mode, docs/FP8_MODE.md)");
  bench->add_option("--ep-ranks", bo.ep_ranks,
                    "model EP over this many ranks (32): --tokens are per rank; time this rank's share");

  EpBenchOptions ebo;
  auto* ep_bench = add_ep_bench_command(app, ebo);

  auto* conv = app.add_subcommand("convert", "convert a checkpoint between Kimi and GPT-OSS layouts");
  std::string cin, cout_path, cto = "gpt-oss", cprefix;
  int64_t clayer = 0;
  conv->add_option("--input", cin, "input safetensors")->required();
  conv->add_option("--output", cout_path, "output safetensors")->required();
  conv->add_option("--to", cto, "kimi | gpt-oss");
  conv->add_option("--layer", clayer, "layer index");
  conv->add_option("--prefix", cprefix, "tensor name prefix");

  auto* gen = app.add_subcommand("generate", "write a deterministic synthetic checkpoint");
  SyntheticSpec gs;
  std::string gpath, gformat = "kimi";
  bool gfull = false;
  gen->add_option("--output", gpath, "output safetensors")->required();
  gen->add_option("--format", gformat, "kimi | gpt-oss");
  gen->add_option("--experts", gs.num_experts, "global experts");
  gen->add_option("--hidden", gs.hidden, "K");
  gen->add_option("--intermediate", gs.intermediate, "N");
  gen->add_option("--top-k", gs.top_k, "top-k recorded in metadata");
  gen->add_option("--layer", gs.layer, "layer index");
  gen->add_option("--seed", gs.seed, "seed");
  gen->add_flag("--bias", gs.with_bias, "GPT-OSS biases");
  gen->add_flag("--kimi-full-layer", gfull, "the full-size Kimi-K3 layer (896 experts, K 3584, N 3072; ~15.7 GB)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*info) return cmd_info(info_json);
    if (*val) return cmd_validate(suite, backend, vjson, vseed ? vseed : fresh_seed(), filter, vprecision);
    if (*run) return cmd_run(ro);
    if (*bench) return cmd_bench(bo);
    if (*ep_bench) return cmd_ep_bench(ebo);
    if (*conv) {
      LoadOptions lo;
      lo.layer = clayer;
      lo.prefix = cprefix;
      LoadedLayer L = load_checkpoint(cin, lo);
      write_checkpoint(cout_path, L, parse_checkpoint_format(cto), cprefix, clayer);
      std::cout << "wrote " << cout_path << " (" << to_string(parse_checkpoint_format(cto)) << ", "
                << L.num_experts << " experts)\n";
      return 0;
    }
    if (*gen) {
      gs.format = parse_checkpoint_format(gformat);
      if (gfull) {
        gs.num_experts = 896;
        gs.hidden = 3584;
        gs.intermediate = 3072;
        gs.top_k = 16;
      }
      write_synthetic_checkpoint(gpath, gs);
      std::cout << "wrote " << gpath << "\n";
      return 0;
    }
  } catch (const mxmoe::Error& e) {
    std::cerr << "mxmoe: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "mxmoe: error: " << e.what() << "\n";
    return 2;
  }
  return 1;
}
