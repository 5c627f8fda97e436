// `mxmoe ep-bench`: dispatch + local experts + combine over NCCL, one process per GPU
// (ep_launch), on Kimi-K3 per-rank shapes: 28 local experts per rank (E_global = 28 *
// ranks), K 3584, N 3072, top-16, SiTU, MXFP8 activations and intermediate. Each rank
// times its own phases with CUDA events (median over iterations); rank 0 prints its own
// times and the maximum over the ranks, beside the NCCL send/recv bandwidth.
#include "ep_bench.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "mxmoe/cuda.h"
#include "mxmoe/ep.h"
#include "mxmoe/error.h"
#include "mxmoe/random.h"
#include "mxmoe/reference.h"
#include "table.h"

using json = nlohmann::json;
using namespace mxmoe;

namespace {

std::string fix(double v, int digits) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

// Random MXFP4 bytes with scales 118..125 (as `mxmoe bench`): finite, non-trivial values;
// timing does not depend on them.
ExpertWeights random_weights(const MoeConfig& cfg, uint64_t seed) {
  const int64_t E = cfg.local_experts(), K = cfg.hidden, N = cfg.intermediate;
  ExpertWeights w;
  w.num_local = E;
  w.hidden = K;
  w.intermediate = N;
  Rng rng(seed);
  auto fill = [&](std::vector<uint8_t>& v, int64_t n, bool scale) {
    v.resize(static_cast<size_t>(n));
    for (auto& b : v) b = scale ? static_cast<uint8_t>(118 + rng.below(8)) : static_cast<uint8_t>(rng.next_u64());
  };
  fill(w.w13_packed, E * 2 * N * K / 2, false);
  fill(w.w13_scale, E * 2 * N * K / 32, true);
  fill(w.w2_packed, E * K * N / 2, false);
  fill(w.w2_scale, E * K * N / 32, true);
  return w;
}

// 16 distinct experts per token, uniform over all ranks' experts.
Routing random_routing(int64_t tokens, int64_t experts, int64_t top_k, uint64_t seed) {
  Rng rng(seed);
  Routing r;
  r.tokens = tokens;
  r.top_k = top_k;
  std::vector<int32_t> perm(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < experts; ++e) perm[e] = static_cast<int32_t>(e);
    for (int64_t j = 0; j < top_k; ++j) {
      std::swap(perm[j], perm[j + rng.below(experts - j)]);
      r.ids.push_back(perm[j]);
      r.weights.push_back(1.0f / static_cast<float>(top_k));
    }
  }
  return r;
}

int bench_rank(int rank, int ranks, const EpUniqueId& id, const EpBenchOptions& o) {
  if (cuda_device_count() < ranks) {
    if (rank == 0)
      std::cerr << "ep-bench: needs " << ranks << " GPUs, " << cuda_device_count() << " visible\n";
    return 2;
  }
  EpComm comm(id, ranks, rank, rank);
  MoeConfig cfg;
  cfg.num_experts = 28 * ranks;
  cfg.ep_size = ranks;
  cfg.ep_rank = rank;
  cfg.top_k = 16;
  cfg.hidden = 3584;
  cfg.intermediate = 3072;
  cfg.activation = ActivationParams::situ();
  const ExpertWeights w = random_weights(cfg, 12345 + static_cast<uint64_t>(rank));

  const size_t bw_bytes = size_t{256} << 20;
  const EpBandwidth bw = ep_sendrecv_bandwidth(comm, bw_bytes, 10);
  const std::vector<double> bw_max = comm.max_over_ranks({bw.median_us});

  std::vector<EpMode> modes;
  if (o.mode == "padded" || o.mode == "both") modes.push_back(EpMode::Padded);
  if (o.mode == "exact" || o.mode == "both") modes.push_back(EpMode::Exact);

  Table t({"tokens/rank", "mode", "dispatch us", "experts us", "combine us", "total us",
           "graph us", "max over ranks: dispatch", "experts", "combine", "total", "graph"});
  json cases = json::array();
  for (int64_t M : o.tokens) {
    const Activations x = make_activations(M, cfg.hidden, 777 + static_cast<uint64_t>(M) + 1000003ull * rank).to_mxfp8();
    const Routing r = random_routing(M, cfg.num_experts, cfg.top_k, 99 + static_cast<uint64_t>(M) * 31 + rank);
    for (EpMode mode : modes) {
      CudaEpLayer layer(cfg, w, comm, M, mode);
      CudaEpHostSession session(layer);
      session.set_inputs(x, r);
      const CudaEpHostSession::PhaseTiming e = session.time(o.iterations, false);
      double graph_us = 0;
      if (mode == EpMode::Padded) graph_us = session.time(o.iterations, true).total_us;
      const std::vector<double> mine = {e.dispatch_us, e.experts_us, e.combine_us, e.total_us, graph_us};
      const std::vector<double> mx = comm.max_over_ranks(mine);
      const bool g = mode == EpMode::Padded;
      t.row({std::to_string(M), to_string(mode), fix(mine[0], 1), fix(mine[1], 1), fix(mine[2], 1),
             fix(mine[3], 1), g ? fix(mine[4], 1) : "-", fix(mx[0], 1), fix(mx[1], 1), fix(mx[2], 1),
             fix(mx[3], 1), g ? fix(mx[4], 1) : "-"});
      auto phases = [&](const std::vector<double>& v) {
        json j = {{"dispatch_us", v[0]}, {"experts_us", v[1]}, {"combine_us", v[2]}, {"total_us", v[3]}};
        if (g) j["graph_total_us"] = v[4];
        return j;
      };
      cases.push_back({{"tokens_per_rank", M}, {"mode", to_string(mode)}, {"iterations", o.iterations},
                       {"rank0", phases(mine)}, {"max_over_ranks", phases(mx)}});
    }
  }
  if (rank != 0) return 0;
  std::cout << "mxmoe ep-bench: " << ranks << " ranks, Kimi-K3 per rank (E_local 28, E_global "
            << cfg.num_experts << ", K 3584, N 3072, top-16, SiTU, MXFP8 activations and "
               "intermediate, bf16 output), median of "
            << o.iterations << " (CUDA events, cold L2, ranks aligned by a barrier)\n"
            << "NCCL send/recv, rank r -> r+1 on all ranks at once, " << (bw_bytes >> 20)
            << " MiB: " << fix(bw.gbps, 1) << " GB/s on rank 0 (" << fix(bw.median_us, 1)
            << " us), slowest rank " << fix(static_cast<double>(bw_bytes) / (bw_max[0] * 1e-6) / 1e9, 1)
            << " GB/s\n"
            << "phases: dispatch = [quantize] + plan + pack + NCCL, experts = local fused layer, "
               "combine = NCCL + rank-order sum; graph = padded forward replayed as a CUDA graph "
               "(total only)\n";
  t.print(std::cout);
  if (!o.json_path.empty()) {
    json j = {{"ranks", ranks},
              {"shape", {{"e_local", 28}, {"e_global", cfg.num_experts}, {"hidden", 3584},
                         {"intermediate", 3072}, {"top_k", 16}, {"activation", "situ"},
                         {"input", "mxfp8"}, {"intermediate_format", "mxfp8"}}},
              {"sendrecv", {{"bytes", bw_bytes}, {"rank0_us", bw.median_us}, {"rank0_gbps", bw.gbps},
                            {"slowest_us", bw_max[0]}}},
              {"cases", cases}};
    std::ofstream f(o.json_path);
    if (!f) throw InvalidArgument("--json", "cannot write '" + o.json_path + "'");
    f << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

CLI::App* add_ep_bench_command(CLI::App& app, EpBenchOptions& o) {
  auto* c = app.add_subcommand(
      "ep-bench", "expert parallelism over NCCL: dispatch + experts + combine on Kimi-K3 shapes, one process per GPU");
  c->add_option("--ranks", o.ranks, "GPUs (one process each)")->check(CLI::Range(1, 64));
  c->add_option("--tokens", o.tokens, "tokens per rank")->delimiter(',');
  c->add_option("--mode", o.mode, "padded | exact | both")->check(CLI::IsMember({"padded", "exact", "both"}));
  c->add_option("--iterations", o.iterations, "timed runs per case (median reported)")->check(CLI::Range(1, 100000));
  c->add_option("--json", o.json_path, "write results as JSON (rank 0)");
  return c;
}

int cmd_ep_bench(const EpBenchOptions& o) {
  if (!ep_built())
    throw Unsupported("ep-bench: this build has no NCCL (expert parallelism is not built); "
                      "reconfigure where nccl.h and libnccl are found (NCCL_ROOT)");
  for (int64_t M : o.tokens) MXMOE_CHECK_ARG(M >= 1, "--tokens", "must be >= 1, got ", M);
  // Counted in a child: this process must stay CUDA-free to fork the ranks.
  const int gpus = ep_device_count();
  if (gpus < o.ranks)
    throw Unsupported(detail::cat("ep-bench --ranks ", o.ranks, ": needs one GPU per rank, ", gpus,
                                  " visible"));
  return ep_launch(o.ranks, [&](int rank, int ranks, const EpUniqueId& id) {
    return bench_rank(rank, ranks, id, o);
  });
}
