// The fp32 CPU backend (cpu_forward) judged by the float64 reference (SPEC §8).
//
// Bounds used here, the same as the validation suite's (src/suite.cpp tolerance_for):
//   per-row relative L2 <= 5e-3 (MXFP8 intermediate) / 1e-3 (BF16 intermediate),
//   cosine >= 0.9999, and element-wise |out - ref| <= atol + rtol*|ref| with
//   atol = 1e-2 * rms(ref) and rtol = 2e-2 (MXFP8) / 1e-2 (BF16). rtol covers one BF16
//   output ulp (2^-8 relative) where fp32 and float64 round to different neighbours;
//   atol covers a near-zero element whose MXFP8/BF16 intermediate input rounded the
//   other way.
// Exact-grid cases (small integers and halves, activations that saturate to exact
// values) make every fp32 operation exact, so there the backend must equal the
// reference bit for bit: permute, GEMM1, activation, requantization, GEMM2, finalize.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>

#include "mxmoe/error.h"
#include "mxmoe/formats.h"
#include "mxmoe/layout.h"
#include "mxmoe/random.h"
#include "mxmoe/reference.h"
#include "../expect_invalid.h"

namespace mxmoe {
namespace {

using mxmoe_test::expect_invalid;

struct Case {
  MoeConfig cfg;
  ExpertWeights w;
  Activations x;
  Routing routing;
};

ActivationParams params_for(Activation a) {
  switch (a) {
    case Activation::SiTU: return ActivationParams::situ();
    case Activation::SwiGLU_OAI: return ActivationParams::swiglu_oai();
    case Activation::SiLU_Gated: return ActivationParams::silu_gated();
  }
  return {};
}

MoeConfig config(int64_t experts, int64_t ep_size, int64_t ep_rank, int64_t K, int64_t N,
                 int64_t top_k) {
  MoeConfig c;
  c.num_experts = experts;
  c.ep_size = ep_size;
  c.ep_rank = ep_rank;
  c.hidden = K;
  c.intermediate = N;
  c.top_k = top_k;
  return c;
}

// Random ids (distinct per token, at least one local, ~1 in 6 other slots -1) and weights in [0.1, 1.1).
Routing random_routing(Rng& rng, const MoeConfig& cfg, int64_t M) {
  Routing r;
  r.tokens = M;
  r.top_k = cfg.top_k;
  for (int64_t t = 0; t < M; ++t) {
    std::vector<int32_t> ids(static_cast<size_t>(cfg.num_experts));
    std::iota(ids.begin(), ids.end(), 0);
    for (int64_t i = cfg.num_experts - 1; i > 0; --i) std::swap(ids[i], ids[rng.below(i + 1)]);
    // Every token keeps one local expert (tests wanting empty rows set ids themselves).
    const auto is_local = [&](int32_t id) { return cfg.local_of(id) >= 0; };
    int64_t keep = std::find_if(ids.begin(), ids.begin() + cfg.top_k, is_local) - ids.begin();
    if (keep == cfg.top_k) {
      keep = static_cast<int64_t>(rng.below(cfg.top_k));
      std::swap(ids[keep], *std::find_if(ids.begin(), ids.end(), is_local));
    }
    for (int64_t j = 0; j < cfg.top_k; ++j) {
      r.ids.push_back(rng.below(6) == 0 && j != keep ? -1 : ids[j]);
      r.weights.push_back(static_cast<float>(0.1 + rng.uniform()));
    }
  }
  return r;
}

// Random MXFP4 bytes (scale bytes 121..126) in kernel layout, Gaussian BF16 activations.
Case random_case(MoeConfig cfg, int64_t M, uint64_t seed) {
  Rng rng(seed);
  Case c;
  const int64_t el = cfg.local_experts(), K = cfg.hidden, N = cfg.intermediate;
  ExpertWeights& w = c.w;
  w.num_local = el;
  w.hidden = K;
  w.intermediate = N;
  w.w13_packed.resize(el * 2 * N * K / 2);
  w.w13_scale.resize(el * 2 * N * K / kMxBlock);
  w.w2_packed.resize(el * K * N / 2);
  w.w2_scale.resize(el * K * N / kMxBlock);
  for (auto* v : {&w.w13_packed, &w.w2_packed})
    for (auto& b : *v) b = static_cast<uint8_t>(rng.below(256));
  for (auto* v : {&w.w13_scale, &w.w2_scale})
    for (auto& b : *v) b = static_cast<uint8_t>(121 + rng.below(6));
  if (cfg.has_bias) {
    for (int64_t i = 0; i < el * 2 * N; ++i) w.w13_bias.push_back(static_cast<float>(0.5 * rng.normal()));
    for (int64_t i = 0; i < el * K; ++i) w.w2_bias.push_back(static_cast<float>(0.5 * rng.normal()));
  }
  Activations x;
  x.format = InputFormat::BF16;
  x.tokens = M;
  x.hidden = K;
  for (int64_t i = 0; i < M * K; ++i) x.bf16.push_back(fmt::float_to_bf16(static_cast<float>(rng.normal())));
  c.x = cfg.input_format == InputFormat::MXFP8 ? x.to_mxfp8(cfg.scale_rule) : x;
  c.routing = random_routing(rng, cfg, M);
  c.cfg = std::move(cfg);
  return c;
}

double rms_finite(const std::vector<double>& v) {
  double ss = 0;
  int64_t n = 0;
  for (double x : v)
    if (std::isfinite(x)) ss += x * x, ++n;
  return n ? std::sqrt(ss / static_cast<double>(n)) : 0.0;
}

bool same_bits(const Output& a, const Output& b) {
  return a.format == b.format && a.tokens == b.tokens && a.hidden == b.hidden && a.bf16 == b.bf16 &&
         a.fp32.size() == b.fp32.size() &&
         (a.fp32.empty() || std::memcmp(a.fp32.data(), b.fp32.data(), a.fp32.size() * sizeof(float)) == 0);
}

// ------------------------------------------------------------------ SPEC §8 bounds

using Combo = std::tuple<Activation, InputFormat, IntermediateFormat, bool>;
class CpuVsReference : public ::testing::TestWithParam<Combo> {};

TEST_P(CpuVsReference, WithinSpecBoundsForTokenCounts1To32) {
  const auto [act, in, mid, bias] = GetParam();
  const bool mx = mid == IntermediateFormat::MXFP8;
  const double max_rel = mx ? 5e-3 : 1e-3, min_cos = 0.9999, rtol = mx ? 2e-2 : 1e-2;
  for (int64_t M : {1, 2, 8, 32}) {
    MoeConfig cfg = config(16, 2, 1, 256, 128, 4);
    cfg.activation = params_for(act);
    cfg.input_format = in;
    cfg.intermediate_format = mid;
    cfg.has_bias = bias;
    cfg.output_scale = 1.5f;
    const Case c = random_case(cfg, M, 1000 + M * 64 + static_cast<int>(act) * 8 + static_cast<int>(in) * 4 +
                                            static_cast<int>(mid) * 2 + bias);
    Output ref, out;
    reference_forward(c.cfg, c.w, c.x, c.routing, ref);
    cpu_forward(c.cfg, c.w, c.x, c.routing, out);
    const std::vector<double> r = output_values(ref), a = output_values(out);
    const Comparison cmp = compare_outputs(a, r, M, c.cfg.hidden, 1e-2 * rms_finite(r), rtol);
    EXPECT_TRUE(cmp.pass(max_rel, min_cos)) << "M=" << M << ": " << cmp.summary();
    EXPECT_GT(rms_finite(r), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllActivationsFormats, CpuVsReference,
    ::testing::Combine(::testing::Values(Activation::SiTU, Activation::SwiGLU_OAI, Activation::SiLU_Gated),
                       ::testing::Values(InputFormat::BF16, InputFormat::MXFP8),
                       ::testing::Values(IntermediateFormat::BF16, IntermediateFormat::MXFP8),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<Combo>& i) {
      return std::string(to_string(std::get<0>(i.param))) + "_in_" + to_string(std::get<1>(i.param)) +
             "_mid_" + to_string(std::get<2>(i.param)) + (std::get<3>(i.param) ? "_bias" : "_nobias");
    });

// The floor scale rule (ScaleRule::Floor, OCP's) end to end: the activations' and the
// intermediate's MXFP8 quantization both follow it in the engine and in the reference,
// within the same bounds; and it is applied (the outputs are not round-up's).
TEST(CpuEngine, FloorScaleRuleWithinSpecBoundsAndApplied) {
  for (Activation act : {Activation::SiTU, Activation::SiLU_Gated}) {
    SCOPED_TRACE(to_string(act));
    Output out_rule[2];
    for (ScaleRule rule : {ScaleRule::RoundUp, ScaleRule::Floor}) {
      MoeConfig cfg = config(16, 2, 1, 256, 128, 4);
      cfg.activation = params_for(act);
      cfg.scale_rule = rule;  // MXFP8 input and (by default) intermediate
      const Case c = random_case(cfg, 8, 4242 + static_cast<int>(act));
      Output ref, out;
      reference_forward(c.cfg, c.w, c.x, c.routing, ref);
      cpu_forward(c.cfg, c.w, c.x, c.routing, out);
      const std::vector<double> r = output_values(ref), a = output_values(out);
      const Comparison cmp = compare_outputs(a, r, 8, c.cfg.hidden, 1e-2 * rms_finite(r), 2e-2);
      EXPECT_TRUE(cmp.pass(5e-3, 0.9999)) << (rule == ScaleRule::Floor ? "floor: " : "round up: ") << cmp.summary();
      out_rule[rule == ScaleRule::Floor] = std::move(out);
    }
    EXPECT_FALSE(same_bits(out_rule[0], out_rule[1])) << "the scale rule changed nothing";
  }
}

TEST(CpuEngine, KimiLikeShapeWithinSpecBounds) {
  // Kimi-K3's activation and MXFP8 path on a narrower layer: EP32 rank 7 slice of 896
  // experts, top-16 (most slots route to other ranks), FP32 and BF16 outputs.
  for (OutputFormat of : {OutputFormat::BF16, OutputFormat::FP32}) {
    MoeConfig cfg = config(896, 32, 7, 512, 256, 16);
    cfg.output_format = of;
    Case c = random_case(cfg, 24, 4242 + static_cast<int>(of));
    // Route two slots of every token to this rank so every row is exercised.
    for (int64_t t = 0; t < 24; ++t) {
      c.routing.ids[t * 16 + 3] = static_cast<int32_t>(7 * 28 + (t % 28));
      c.routing.ids[t * 16 + 11] = static_cast<int32_t>(7 * 28 + ((5 * t + 1) % 28));
    }
    Output ref, out;
    reference_forward(c.cfg, c.w, c.x, c.routing, ref);
    cpu_forward(c.cfg, c.w, c.x, c.routing, out);
    const std::vector<double> r = output_values(ref), a = output_values(out);
    const Comparison cmp = compare_outputs(a, r, 24, c.cfg.hidden, 1e-2 * rms_finite(r), 2e-2);
    EXPECT_TRUE(cmp.pass(5e-3, 0.9999)) << cmp.summary();
  }
}

// ------------------------------------------------------------------ exact grid

// x in {1, 2}; gate weights 1.0 (so g is an integer >= 64 = K and sigmoid(g) rounds to
// exactly 1 in fp32 and in double); up weights in {0, +-0.5}; W2 in {0, +-0.5, +-1};
// routing weights in {0.5, 1}; output_scale 2. Worst case |partial sums| stay below
// 2^24 grid steps at every stage, so every fp32 sum is exact. SiLU then gives g*u
// exactly; SwiGLU with alpha 8 gives 7*(clamp(u)+1) exactly (sigmoid(56) == 1).
Case exact_grid_case(Activation act, InputFormat in, IntermediateFormat mid, OutputFormat of,
                     uint64_t seed) {
  Rng rng(seed);
  MoeConfig cfg = config(8, 2, 1, 64, 64, 4);
  cfg.activation = act == Activation::SwiGLU_OAI ? ActivationParams::swiglu_oai(8.0f, 1.0f, 7.0f)
                                                 : ActivationParams::silu_gated();
  cfg.input_format = in;
  cfg.intermediate_format = mid;
  cfg.output_format = of;
  cfg.output_scale = 2.0f;
  const int64_t el = 4, K = 64, N = 64;
  const uint8_t up_codes[] = {0x0, 0x1, 0x9}, w2_codes[] = {0x0, 0x1, 0x2, 0x9, 0xA};
  std::vector<SourceExpert> src(static_cast<size_t>(el));
  for (auto& e : src) {
    e.w13.rows = 2 * N;
    e.w13.cols = K;
    e.w2.rows = K;
    e.w2.cols = N;
    e.w13.scale.assign(2 * N * K / kMxBlock, 127);
    e.w2.scale.assign(K * N / kMxBlock, 127);
    for (int64_t r = 0; r < 2 * N; ++r)
      for (int64_t k = 0; k < K; k += 2) {
        const auto code = [&] { return r < N ? uint8_t{0x2} : up_codes[rng.below(3)]; };
        const uint8_t lo = code(), hi = code();
        e.w13.packed.push_back(static_cast<uint8_t>(lo | (hi << 4)));
      }
    for (int64_t i = 0; i < K * N / 2; ++i)
      e.w2.packed.push_back(static_cast<uint8_t>(w2_codes[rng.below(5)] | (w2_codes[rng.below(5)] << 4)));
  }
  Case c;
  c.w = to_kernel_layout(src, W13Layout::GateUp);
  Activations x;
  x.format = InputFormat::BF16;
  x.tokens = 9;
  x.hidden = K;
  for (int64_t i = 0; i < 9 * K; ++i) x.bf16.push_back(fmt::float_to_bf16(rng.below(2) ? 2.0f : 1.0f));
  c.x = in == InputFormat::MXFP8 ? x.to_mxfp8() : x;
  c.routing = random_routing(rng, cfg, 9);
  for (float& wt : c.routing.weights) wt = rng.below(2) ? 1.0f : 0.5f;
  c.cfg = std::move(cfg);
  return c;
}

using GridCombo = std::tuple<Activation, InputFormat, IntermediateFormat, OutputFormat>;
class ExactGrid : public ::testing::TestWithParam<GridCombo> {};

TEST_P(ExactGrid, CpuEqualsReferenceBitForBit) {
  const auto [act, in, mid, of] = GetParam();
  const Case c = exact_grid_case(act, in, mid, of, 77 + static_cast<int>(act) * 8 + static_cast<int>(in) * 4 +
                                                      static_cast<int>(mid) * 2 + static_cast<int>(of));
  Output ref, out;
  std::vector<double> ref64;
  reference_forward(c.cfg, c.w, c.x, c.routing, ref, &ref64);
  cpu_forward(c.cfg, c.w, c.x, c.routing, out);
  ASSERT_TRUE(same_bits(ref, out));
  int64_t nonzero = 0, distinct_rows = 0;
  for (size_t i = 0; i < ref64.size(); ++i) {
    // The float64 value is itself a float: nothing was rounded anywhere.
    ASSERT_EQ(ref64[i], static_cast<double>(static_cast<float>(ref64[i]))) << "element " << i;
    nonzero += ref64[i] != 0;
  }
  for (int64_t t = 1; t < c.x.tokens; ++t)
    distinct_rows += !std::equal(ref64.begin() + t * 64, ref64.begin() + t * 64 + 64, ref64.begin() + (t - 1) * 64);
  EXPECT_GT(nonzero, static_cast<int64_t>(ref64.size()) / 2);
  EXPECT_GE(distinct_rows, 4);
}

INSTANTIATE_TEST_SUITE_P(
    SiluSwigluFormats, ExactGrid,
    ::testing::Combine(::testing::Values(Activation::SiLU_Gated, Activation::SwiGLU_OAI),
                       ::testing::Values(InputFormat::BF16, InputFormat::MXFP8),
                       ::testing::Values(IntermediateFormat::BF16, IntermediateFormat::MXFP8),
                       ::testing::Values(OutputFormat::FP32, OutputFormat::BF16)),
    [](const ::testing::TestParamInfo<GridCombo>& i) {
      return std::string(to_string(std::get<0>(i.param))) + "_in_" + to_string(std::get<1>(i.param)) +
             "_mid_" + to_string(std::get<2>(i.param)) + "_out_" + to_string(std::get<3>(i.param));
    });

// ------------------------------------------------------------------ determinism, NaN, errors

TEST(CpuEngine, BitwiseIdenticalAcrossThreadCountsAndRuns) {
  MoeConfig cfg = config(16, 1, 0, 256, 128, 4);
  cfg.activation = ActivationParams::situ();
  cfg.output_format = OutputFormat::FP32;
  const Case c = random_case(cfg, 33, 17);
  Output base;
  cpu_forward(c.cfg, c.w, c.x, c.routing, base, 1);
  for (int threads : {1, 2, 3, 7, 0}) {
    Output o;
    cpu_forward(c.cfg, c.w, c.x, c.routing, o, threads);
    EXPECT_TRUE(same_bits(base, o)) << "threads=" << threads;
  }
}

TEST(CpuEngine, TokenBatchesDoNotChangeRows) {
  // Wide K makes cpu_forward split M=1200 tokens into two batches (~256 MiB of per-pair
  // buffers each); every row must equal the row of a call holding only its half.
  MoeConfig cfg = config(64, 16, 3, 3584, 32, 16);
  cfg.output_format = OutputFormat::FP32;
  const int64_t M = 1200, K = 3584, split = 600;
  const Case c = random_case(cfg, M, 12);
  Output full;
  cpu_forward(c.cfg, c.w, c.x, c.routing, full);
  for (int half = 0; half < 2; ++half) {
    const int64_t t0 = half ? split : 0, t1 = half ? M : split;
    Case h = c;
    h.x.tokens = t1 - t0;
    h.x.fp8.assign(c.x.fp8.begin() + t0 * K, c.x.fp8.begin() + t1 * K);
    h.x.scale.assign(c.x.scale.begin() + t0 * K / kMxBlock, c.x.scale.begin() + t1 * K / kMxBlock);
    h.routing.tokens = t1 - t0;
    h.routing.ids.assign(c.routing.ids.begin() + t0 * 16, c.routing.ids.begin() + t1 * 16);
    h.routing.weights.assign(c.routing.weights.begin() + t0 * 16, c.routing.weights.begin() + t1 * 16);
    Output part;
    cpu_forward(h.cfg, h.w, h.x, h.routing, part);
    ASSERT_EQ(0, std::memcmp(part.fp32.data(), full.fp32.data() + t0 * K, part.fp32.size() * sizeof(float)))
        << "half " << half;
  }
}

TEST(CpuEngine, NanTokenAndNanWeightBlockStayInTheirRows) {
  MoeConfig cfg = config(8, 2, 1, 64, 64, 3);
  cfg.output_format = OutputFormat::FP32;
  Case c = random_case(cfg, 16, 23);
  const int64_t K = 64, N = 64, bad_token = 5, bad_expert = 1;
  // A routed token gets a NaN activation; local expert 1 gets a NaN scale in W2.
  c.routing.ids[bad_token * 3] = 4;
  c.x.fp8[bad_token * K + 40] = fmt::kE4m3Nan;
  c.w.w2_scale[(bad_expert * K + 9) * (N / kMxBlock)] = fmt::kE8m0Nan;
  Output out;
  cpu_forward(c.cfg, c.w, c.x, c.routing, out);
  int64_t clean = 0;
  for (int64_t t = 0; t < 16; ++t) {
    bool to_bad_expert = false;
    for (int64_t j = 0; j < 3; ++j) to_bad_expert |= c.cfg.local_of(c.routing.ids[t * 3 + j]) == bad_expert;
    const bool poisoned_row = t == bad_token;  // the whole row
    int64_t nans = 0;
    for (int64_t k = 0; k < K; ++k) nans += std::isnan(out.fp32[t * K + k]);
    if (poisoned_row) {
      EXPECT_EQ(nans, K) << "token " << t;
    } else if (to_bad_expert) {
      EXPECT_EQ(nans, 1) << "token " << t << ": only W2 row 9 of expert 1 is NaN";
      EXPECT_TRUE(std::isnan(out.fp32[t * K + 9]));
    } else {
      EXPECT_EQ(nans, 0) << "token " << t;
      ++clean;
    }
  }
  EXPECT_GT(clean, 0);
}

TEST(CpuEngine, TokensWithoutLocalExpertsGetZeroRows) {
  MoeConfig cfg = config(8, 2, 0, 64, 64, 2);
  Case c = random_case(cfg, 6, 5);
  for (int64_t j = 0; j < 2; ++j) {
    c.routing.ids[2 * 2 + j] = -1;         // token 2: no expert at all
    c.routing.ids[4 * 2 + j] = 4 + j;      // token 4: only the other rank's experts
  }
  c.routing.ids[0] = 1;  // token 0 does reach this rank
  Output out;
  out.bf16.assign(3, 0x7FC0);
  cpu_forward(c.cfg, c.w, c.x, c.routing, out);
  ASSERT_EQ(out.bf16.size(), 6u * 64u);
  for (int64_t t : {2, 4})
    for (int64_t k = 0; k < 64; ++k) EXPECT_EQ(out.bf16[t * 64 + k], 0) << "[" << t << "][" << k << "]";
  int64_t nz = 0;
  for (int64_t k = 0; k < 64; ++k) nz += out.bf16[k] != 0;
  EXPECT_GT(nz, 32);
}

TEST(CpuEngine, RejectsBadInputsWithoutWritingOutputs) {
  MoeConfig cfg = config(8, 2, 1, 64, 64, 3);
  cfg.has_bias = true;
  const Case good = random_case(cfg, 4, 9);
  Output sentinel;
  sentinel.format = OutputFormat::FP32;
  sentinel.tokens = 1;
  sentinel.hidden = 2;
  sentinel.fp32 = {7.f, 8.f};
  auto run = [&](const Case& c) {
    Output out = sentinel;
    try {
      cpu_forward(c.cfg, c.w, c.x, c.routing, out, 2);
    } catch (...) {
      EXPECT_TRUE(same_bits(out, sentinel));
      throw;
    }
  };
  {
    Case c = good;
    c.cfg.input_format = InputFormat::BF16;  // x is MXFP8
    expect_invalid([&] { run(c); }, "x");
  }
  {
    Case c = good;
    c.routing.ids[5] = 8;
    expect_invalid([&] { run(c); }, "topk_ids");
  }
  {
    Case c = good;
    c.routing.weights.pop_back();
    expect_invalid([&] { run(c); }, "topk_weights");
  }
  {
    Case c = good;
    c.w.w2_scale.push_back(127);
    expect_invalid([&] { run(c); }, "weights.w2_scale");
  }
  {
    Case c = good;
    c.w.w13_bias.clear();
    expect_invalid([&] { run(c); }, "weights.w13_bias");
  }
  {
    Case c = good;
    c.x.hidden = 32;
    expect_invalid([&] { run(c); }, "x.hidden");
  }
  {
    Case c = good;
    c.cfg.intermediate = 48;
    expect_invalid([&] { run(c); }, "config.intermediate");
  }
  {
    Case c = good;
    c.routing.tokens = 5;
    c.routing.ids.resize(15, -1);
    c.routing.weights.resize(15, 1.0f);
    expect_invalid([&] { run(c); }, "routing.tokens");
  }
}

}  // namespace
}  // namespace mxmoe
