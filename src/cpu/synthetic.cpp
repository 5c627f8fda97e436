// Deterministic synthetic layers and activations (reference.h).
//
// Every GLOBAL expert draws from its own RNG stream, so an EP rank's slice is bit-for-bit
// the same experts as the full layer, and a synthetic checkpoint (checkpoint.cpp, which
// calls make_synthetic_layer) regenerates from (seed, shapes) alone. Within an expert
// the draw order is fixed: gate rows, up rows, W2 rows, then (only when biases are
// requested) gate bias, up bias, W2 bias, so adding biases does not change the weights.
#include <algorithm>
#include <cmath>
#include <thread>

#include "mxmoe/error.h"
#include "mxmoe/formats.h"
#include "mxmoe/layout.h"
#include "mxmoe/random.h"
#include "mxmoe/reference.h"
#include "synthetic_streams.h"

namespace mxmoe {

namespace {

float bf16_round(double v) { return fmt::bf16_to_float(fmt::float_to_bf16(static_cast<float>(v))); }

// One row of Gaussian BF16 values -> ideal floats and MXFP4 bytes (blocks of 32 along
// the row, the reduction dimension).
void gaussian_row(Rng& rng, double stddev, int64_t cols, float* ideal, uint8_t* packed, uint8_t* scale) {
  for (int64_t c = 0; c < cols; ++c) ideal[c] = bf16_round(rng.normal() * stddev);
  for (int64_t b = 0; b < cols / kMxBlock; ++b)
    fmt::quantize_block_e2m1(ideal + b * kMxBlock, packed + b * (kMxBlock / 2), scale + b);
}

}  // namespace

SyntheticLayer make_synthetic_layer(const MoeConfig& cfg, uint64_t seed) {
  const int64_t E = cfg.num_experts, K = cfg.hidden, N = cfg.intermediate;
  MXMOE_CHECK_ARG(E > 0, "config.num_experts", E, " must be positive");
  MXMOE_CHECK_ARG(K > 0 && K % kMxBlock == 0, "config.hidden", K, " must be a positive multiple of 32");
  MXMOE_CHECK_ARG(N > 0 && N % kMxBlock == 0, "config.intermediate", N,
                  " must be a positive multiple of 32");
  MXMOE_CHECK_ARG(cfg.ep_size >= 1 && E % cfg.ep_size == 0, "config.ep_size", cfg.ep_size,
                  " must be >= 1 and divide num_experts ", E);
  MXMOE_CHECK_ARG(cfg.ep_rank >= 0 && cfg.ep_rank < cfg.ep_size, "config.ep_rank", cfg.ep_rank,
                  " must be in [0, ep_size ", cfg.ep_size, ")");

  // Which global expert each local slot holds.
  std::vector<int64_t> global_of;
  if (cfg.expert_map.empty()) {
    const int64_t el = E / cfg.ep_size;
    for (int64_t l = 0; l < el; ++l) global_of.push_back(cfg.ep_rank * el + l);
  } else {
    MXMOE_CHECK_ARG(static_cast<int64_t>(cfg.expert_map.size()) == E, "config.expert_map", "has ",
                    cfg.expert_map.size(), " entries, expected num_experts ", E);
    const int64_t el = cfg.local_experts();
    global_of.assign(static_cast<size_t>(std::max<int64_t>(el, 0)), -1);
    for (int64_t g = 0; g < E; ++g) {
      const int32_t l = cfg.expert_map[g];
      MXMOE_CHECK_ARG(l >= -1 && l < el, "config.expert_map", "entry ", g, " = ", l,
                      " is outside [-1, ", el, ")");
      if (l >= 0) global_of[l] = g;
    }
    for (int64_t l = 0; l < el; ++l)
      MXMOE_CHECK_ARG(global_of[l] >= 0, "config.expert_map", "no global expert maps to local ", l);
  }
  const int64_t EL = static_cast<int64_t>(global_of.size());

  SyntheticLayer s;
  ExpertWeights& w = s.weights;
  IdealWeights& id = s.ideal;
  w.num_local = id.num_local = EL;
  w.hidden = id.hidden = K;
  w.intermediate = id.intermediate = N;
  w.w13_packed.resize(EL * 2 * N * K / 2);
  w.w13_scale.resize(EL * 2 * N * K / kMxBlock);
  w.w2_packed.resize(EL * K * N / 2);
  w.w2_scale.resize(EL * K * N / kMxBlock);
  id.w13.resize(EL * 2 * N * K);
  id.w2.resize(EL * K * N);
  if (cfg.has_bias) {
    w.w13_bias.resize(EL * 2 * N);
    w.w2_bias.resize(EL * K);
  }
  // Kernel rows of the gate and up rows, computed once (layout.h owns the layout).
  std::vector<int64_t> krow_gate(N), krow_up(N);
  for (int64_t n = 0; n < N; ++n) {
    krow_gate[n] = kernel_row_of_gate(n);
    krow_up[n] = kernel_row_of_up(n);
  }

  const double sd13 = 1.0 / std::sqrt(static_cast<double>(K));
  const double sd2 = 1.0 / std::sqrt(static_cast<double>(N));
  auto make_expert = [&](int64_t l) {
    Rng rng(detail::synthetic_stream(seed, detail::kStreamExpertWeights, static_cast<uint64_t>(global_of[l])));
    for (int half = 0; half < 2; ++half) {
      for (int64_t n = 0; n < N; ++n) {
        const int64_t r = l * 2 * N + (half == 0 ? krow_gate[n] : krow_up[n]);
        gaussian_row(rng, sd13, K, &id.w13[r * K], &w.w13_packed[r * K / 2], &w.w13_scale[r * K / kMxBlock]);
      }
    }
    for (int64_t k = 0; k < K; ++k) {
      const int64_t r = l * K + k;
      gaussian_row(rng, sd2, N, &id.w2[r * N], &w.w2_packed[r * N / 2], &w.w2_scale[r * N / kMxBlock]);
    }
    if (cfg.has_bias) {
      for (int half = 0; half < 2; ++half)
        for (int64_t n = 0; n < N; ++n)
          w.w13_bias[l * 2 * N + (half == 0 ? krow_gate[n] : krow_up[n])] = bf16_round(rng.normal() * 0.1);
      for (int64_t k = 0; k < K; ++k) w.w2_bias[l * K + k] = bf16_round(rng.normal() * 0.1);
    }
  };

  // Experts are independent streams writing disjoint rows: generate them in parallel
  // (real Kimi-K3 shapes are ~10^9 Gaussian draws per rank).
  const int64_t nthreads =
      std::min<int64_t>(EL, std::max<unsigned>(1u, std::thread::hardware_concurrency()));
  if (nthreads <= 1) {
    for (int64_t l = 0; l < EL; ++l) make_expert(l);
  } else {
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < nthreads; ++t)
      pool.emplace_back([&, t] {
        for (int64_t l = t; l < EL; l += nthreads) make_expert(l);
      });
    for (auto& th : pool) th.join();
  }
  id.w13_bias = w.w13_bias;
  id.w2_bias = w.w2_bias;
  return s;
}

Activations make_activations(int64_t tokens, int64_t hidden, uint64_t seed) {
  MXMOE_CHECK_ARG(tokens >= 0, "tokens", tokens, " must be >= 0");
  MXMOE_CHECK_ARG(hidden > 0, "hidden", hidden, " must be positive");
  Activations a;
  a.format = InputFormat::BF16;
  a.tokens = tokens;
  a.hidden = hidden;
  a.bf16.resize(static_cast<size_t>(tokens * hidden));
  Rng rng(detail::synthetic_stream(seed, detail::kStreamActivations, 0));
  for (auto& v : a.bf16) v = fmt::float_to_bf16(static_cast<float>(rng.normal()));
  return a;
}

}  // namespace mxmoe
