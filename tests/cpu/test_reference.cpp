// The float64 oracle (reference_forward, ideal_forward) against a second, deliberately
// naive float64 implementation written here straight from SPEC §2/§6/§8: plain loops over
// the checkpoint-layout (gate rows, then up rows) source matrices, element-by-element
// dequantization with formats.h, sequential sums. It shares no code with reference.cpp
// beyond formats.h; the kernel-layout weights the oracle reads come from to_kernel_layout,
// so a wrong row permutation anywhere shows up as a large error here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <tuple>

#include "mxmoe/error.h"
#include "mxmoe/formats.h"
#include "mxmoe/layout.h"
#include "mxmoe/random.h"
#include "mxmoe/reference.h"
#include "mxmoe/suite.h"
#include "../expect_invalid.h"

namespace mxmoe {
namespace {

using mxmoe_test::expect_invalid;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Case {
  MoeConfig cfg;
  std::vector<SourceExpert> src;  // GateUp layout, one per local expert
  ExpertWeights w;                // kernel layout
  Activations x;                  // in cfg.input_format
  Activations x_bf16;             // the BF16 values x was quantized from
  Routing routing;
};

MxMatrix random_mx(Rng& rng, int64_t rows, int64_t cols, int scale_lo, int scale_hi) {
  MxMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.packed.resize(static_cast<size_t>(rows * cols / 2));
  m.scale.resize(static_cast<size_t>(rows * cols / kMxBlock));
  for (auto& b : m.packed) b = static_cast<uint8_t>(rng.below(256));
  for (auto& s : m.scale) s = static_cast<uint8_t>(scale_lo + rng.below(scale_hi - scale_lo + 1));
  return m;
}

struct Shape {
  int64_t experts = 8, ep_size = 2, ep_rank = 1, hidden = 64, intermediate = 64, top_k = 3,
          tokens = 5;
};

// Random layer and inputs. Slot ids per token are distinct, about one slot in eight is
// -1, token 2 (when it exists) routes only to other ranks' experts or -1.
Case make_case(const Shape& s, Activation act, InputFormat in, IntermediateFormat mid,
               OutputFormat out, bool bias, uint64_t seed) {
  Rng rng(seed);
  Case c;
  MoeConfig& cfg = c.cfg;
  cfg.num_experts = s.experts;
  cfg.top_k = s.top_k;
  cfg.hidden = s.hidden;
  cfg.intermediate = s.intermediate;
  cfg.ep_size = s.ep_size;
  cfg.ep_rank = s.ep_rank;
  cfg.activation = act == Activation::SiTU         ? ActivationParams::situ()
                   : act == Activation::SwiGLU_OAI ? ActivationParams::swiglu_oai()
                                                   : ActivationParams::silu_gated();
  cfg.input_format = in;
  cfg.intermediate_format = mid;
  cfg.output_format = out;
  cfg.has_bias = bias;
  cfg.output_scale = 2.5f;
  const int64_t el = s.experts / s.ep_size, K = s.hidden, N = s.intermediate;
  for (int64_t e = 0; e < el; ++e) {
    SourceExpert x;
    x.w13 = random_mx(rng, 2 * N, K, 121, 126);
    x.w2 = random_mx(rng, K, N, 121, 126);
    if (bias) {
      for (int64_t i = 0; i < 2 * N; ++i) x.w13_bias.push_back(static_cast<float>(0.5 * rng.normal()));
      for (int64_t i = 0; i < K; ++i) x.w2_bias.push_back(static_cast<float>(0.5 * rng.normal()));
    }
    c.src.push_back(std::move(x));
  }
  c.w = to_kernel_layout(c.src, W13Layout::GateUp);

  c.x_bf16.format = InputFormat::BF16;
  c.x_bf16.tokens = s.tokens;
  c.x_bf16.hidden = K;
  for (int64_t i = 0; i < s.tokens * K; ++i)
    c.x_bf16.bf16.push_back(fmt::float_to_bf16(static_cast<float>(rng.normal())));
  c.x = in == InputFormat::MXFP8 ? c.x_bf16.to_mxfp8(cfg.scale_rule) : c.x_bf16;

  Routing& r = c.routing;
  r.tokens = s.tokens;
  r.top_k = s.top_k;
  const int64_t lo = s.ep_rank * el;
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::vector<int32_t> ids(static_cast<size_t>(s.experts));
    std::iota(ids.begin(), ids.end(), 0);
    for (int64_t i = s.experts - 1; i > 0; --i) std::swap(ids[i], ids[rng.below(i + 1)]);
    if (t == 2) {  // only remote experts
      std::stable_partition(ids.begin(), ids.end(), [&](int32_t id) { return id < lo || id >= lo + el; });
    }
    // Every other token keeps at least one local expert in a random slot.
    const auto is_local = [&](int32_t id) { return id >= lo && id < lo + el; };
    int64_t keep = std::find_if(ids.begin(), ids.begin() + s.top_k, is_local) - ids.begin();
    if (t != 2 && keep == s.top_k) {
      keep = static_cast<int64_t>(rng.below(s.top_k));
      std::swap(ids[keep], *std::find_if(ids.begin(), ids.end(), is_local));
    }
    for (int64_t j = 0; j < s.top_k; ++j) {
      r.ids.push_back(rng.below(8) == 0 && j != keep ? -1 : ids[j]);
      r.weights.push_back(static_cast<float>(0.1 + rng.uniform()));
    }
  }
  return c;
}

// ------------------------------------------------------------------ the naive oracle

double naive_sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

double naive_activation(const ActivationParams& p, int64_t e, double g, double u) {
  const auto par = [e](const std::vector<float>& v) { return static_cast<double>(v.size() == 1 ? v[0] : v[e]); };
  switch (p.kind) {
    case Activation::SiTU: {
      const double a = par(p.alpha), b = par(p.beta);
      return a * std::tanh(g / a) * naive_sigmoid(g) * b * std::tanh(u / b);
    }
    case Activation::SwiGLU_OAI: {
      const double a = par(p.alpha), b = par(p.beta), l = par(p.limit);
      if (g > l) g = l;
      if (u > l) u = l;
      if (u < -l) u = -l;
      return g * naive_sigmoid(a * g) * (u + b);
    }
    case Activation::SiLU_Gated: return g * naive_sigmoid(g) * u;
  }
  return kNaN;
}

double mx_at(const MxMatrix& m, int64_t r, int64_t c) {
  return fmt::dequant_e2m1(m.packed[r * (m.cols / 2) + c / 2], static_cast<int>(c & 1),
                           m.scale[r * (m.cols / kMxBlock) + c / kMxBlock]);
}

double x_at(const Activations& x, int64_t t, int64_t k) {
  if (x.format == InputFormat::BF16) return fmt::bf16_to_float(x.bf16[t * x.hidden + k]);
  return fmt::dequant_e4m3(x.fp8[t * x.hidden + k], x.scale[(t * x.hidden + k) / kMxBlock]);
}

// mirror = false: no intermediate rounding (what ideal_forward computes on these values).
std::vector<double> naive_forward(const Case& c, bool mirror) {
  const MoeConfig& cfg = c.cfg;
  const int64_t M = c.routing.tokens, K = cfg.hidden, N = cfg.intermediate;
  const int64_t el = cfg.num_experts / cfg.ep_size, lo = cfg.ep_rank * el;
  std::vector<double> out(static_cast<size_t>(M * K), 0.0);
  for (int64_t t = 0; t < M; ++t) {
    std::vector<double> acc(static_cast<size_t>(K), 0.0);
    for (int64_t j = 0; j < cfg.top_k; ++j) {
      const int32_t id = c.routing.ids[t * cfg.top_k + j];
      if (id < lo || id >= lo + el) continue;
      const SourceExpert& s = c.src[id - lo];
      std::vector<double> a(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n) {
        double g = 0, u = 0;
        for (int64_t k = 0; k < K; ++k) {
          g += mx_at(s.w13, n, k) * x_at(c.x, t, k);
          u += mx_at(s.w13, N + n, k) * x_at(c.x, t, k);
        }
        if (cfg.has_bias) {
          g += s.w13_bias[n];
          u += s.w13_bias[N + n];
        }
        a[n] = naive_activation(cfg.activation, id - lo, g, u);
      }
      if (mirror) {
        for (int64_t b = 0; b < N; b += kMxBlock) {
          float f[kMxBlock];
          for (int i = 0; i < kMxBlock; ++i) f[i] = static_cast<float>(a[b + i]);
          if (cfg.resolved_intermediate() == IntermediateFormat::MXFP8) {
            uint8_t codes[kMxBlock], sc;
            fmt::quantize_block_e4m3(f, codes, &sc, cfg.scale_rule);
            for (int i = 0; i < kMxBlock; ++i) a[b + i] = fmt::dequant_e4m3(codes[i], sc);
          } else {
            for (int i = 0; i < kMxBlock; ++i) a[b + i] = fmt::bf16_to_float(fmt::float_to_bf16(f[i]));
          }
        }
      }
      for (int64_t k = 0; k < K; ++k) {
        double y = 0;
        for (int64_t n = 0; n < N; ++n) y += mx_at(s.w2, k, n) * a[n];
        if (cfg.has_bias) y += s.w2_bias[k];
        acc[k] += static_cast<double>(c.routing.weights[t * cfg.top_k + j]) * y;
      }
    }
    for (int64_t k = 0; k < K; ++k) out[t * K + k] = acc[k] * static_cast<double>(cfg.output_scale);
  }
  return out;
}

bool has_local(const Case& c, int64_t t) {
  for (int64_t j = 0; j < c.cfg.top_k; ++j)
    if (c.cfg.local_of(c.routing.ids[t * c.cfg.top_k + j]) >= 0) return true;
  return false;
}

double round_as(OutputFormat f, double v) {
  return f == OutputFormat::BF16 ? fmt::bf16_to_float(fmt::float_to_bf16(static_cast<float>(v)))
                                 : static_cast<float>(v);
}

// ------------------------------------------------------------------ tests

using Combo = std::tuple<Activation, InputFormat, IntermediateFormat, OutputFormat, bool>;
class ReferenceVsNaive : public ::testing::TestWithParam<Combo> {};

TEST_P(ReferenceVsNaive, Float64OutputAndRoundedOutputMatch) {
  const auto [act, in, mid, outf, bias] = GetParam();
  const Case c = make_case(Shape{}, act, in, mid, outf, bias, 1234 + static_cast<int>(act) * 16 +
                                                                 static_cast<int>(in) * 8 +
                                                                 static_cast<int>(mid) * 4 +
                                                                 static_cast<int>(outf) * 2 + bias);
  Output out;
  std::vector<double> out64;
  reference_forward(c.cfg, c.w, c.x, c.routing, out, &out64, 2);
  const std::vector<double> naive = naive_forward(c, true);
  const int64_t M = c.routing.tokens, K = c.cfg.hidden;
  ASSERT_EQ(out64.size(), naive.size());
  ASSERT_EQ(out.format, outf);
  ASSERT_EQ(out.tokens, M);
  ASSERT_EQ(out.hidden, K);

  // The test must exercise both: rows with local experts and a row without any.
  ASSERT_FALSE(has_local(c, 2));
  int64_t rows_with_local = 0;
  for (int64_t t = 0; t < M; ++t) rows_with_local += has_local(c, t);
  ASSERT_GE(rows_with_local, 3) << ::testing::PrintToString(c.routing.ids);

  for (int64_t t = 0; t < M; ++t) {
    double dd = 0, rr = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double d = out64[t * K + k] - naive[t * K + k];
      dd += d * d;
      rr += naive[t * K + k] * naive[t * K + k];
    }
    if (!has_local(c, t)) {
      EXPECT_EQ(rr, 0.0) << "token " << t;
      EXPECT_EQ(dd, 0.0) << "token " << t << ": no local expert must give an all-zero row";
    } else {
      ASSERT_GT(rr, 0.0);
      EXPECT_LE(std::sqrt(dd / rr), 1e-12) << "token " << t;
    }
  }
  // Rounded output: bit-identical to rounding the naive value, except where the naive
  // value sits within 1e-11 (relative) of a rounding boundary.
  int64_t checked = 0;
  for (int64_t i = 0; i < M * K; ++i) {
    const double lo = round_as(outf, naive[i] * (1 - 1e-11)), hi = round_as(outf, naive[i] * (1 + 1e-11));
    if (lo != hi) continue;
    ++checked;
    ASSERT_EQ(out.value(i / K, i % K), lo) << "element [" << i / K << "][" << i % K << "]";
  }
  EXPECT_GE(checked, M * K - 4);
}

INSTANTIATE_TEST_SUITE_P(
    AllActivationsFormatsBias, ReferenceVsNaive,
    ::testing::Combine(::testing::Values(Activation::SiTU, Activation::SwiGLU_OAI, Activation::SiLU_Gated),
                       ::testing::Values(InputFormat::BF16, InputFormat::MXFP8),
                       ::testing::Values(IntermediateFormat::BF16, IntermediateFormat::MXFP8),
                       ::testing::Values(OutputFormat::BF16, OutputFormat::FP32),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<Combo>& i) {
      return std::string(to_string(std::get<0>(i.param))) + "_in_" + to_string(std::get<1>(i.param)) +
             "_mid_" + to_string(std::get<2>(i.param)) + "_out_" + to_string(std::get<3>(i.param)) +
             (std::get<4>(i.param) ? "_bias" : "_nobias");
    });

TEST(Reference, ExplicitExpertMapMatchesNaive) {
  // Same layer seen through expert_map (rank owning globals 4..7 as locals 0..3) must
  // give the same result as the contiguous ep_rank slice.
  Case c = make_case(Shape{}, Activation::SiTU, InputFormat::MXFP8, IntermediateFormat::MXFP8,
                     OutputFormat::FP32, false, 77);
  Output a, b;
  std::vector<double> a64, b64;
  reference_forward(c.cfg, c.w, c.x, c.routing, a, &a64);
  c.cfg.expert_map = {-1, -1, -1, -1, 0, 1, 2, 3};
  c.cfg.ep_size = 1;
  c.cfg.ep_rank = 0;
  reference_forward(c.cfg, c.w, c.x, c.routing, b, &b64);
  EXPECT_EQ(a64, b64);
}

TEST(Reference, ThreadCountDoesNotChangeBits) {
  Shape s;
  s.experts = 16;
  s.ep_size = 1;
  s.ep_rank = 0;
  s.hidden = 256;
  s.intermediate = 128;
  s.top_k = 4;
  s.tokens = 23;
  for (Activation act : {Activation::SiTU, Activation::SwiGLU_OAI}) {
    const Case c = make_case(s, act, InputFormat::MXFP8, IntermediateFormat::MXFP8, OutputFormat::BF16,
                             act == Activation::SwiGLU_OAI, 99);
    Output o1, o2, o3;
    std::vector<double> v1, v2, v3;
    reference_forward(c.cfg, c.w, c.x, c.routing, o1, &v1, 1);
    reference_forward(c.cfg, c.w, c.x, c.routing, o2, &v2, 2);
    reference_forward(c.cfg, c.w, c.x, c.routing, o3, &v3, 5);
    ASSERT_EQ(v1.size(), v2.size());
    EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), v1.size() * sizeof(double)));
    EXPECT_EQ(0, std::memcmp(v1.data(), v3.data(), v1.size() * sizeof(double)));
    EXPECT_EQ(o1.bf16, o2.bf16);
    EXPECT_EQ(o1.bf16, o3.bf16);
  }
}

TEST(Reference, TokenBatchesDoNotChangeRows) {
  // Wide K with few local pairs makes the oracle split M=600 tokens into two batches
  // (~256 MiB of per-pair buffers each); every row must equal the row computed in a
  // call holding only its half of the tokens.
  Shape s;
  s.experts = 64;
  s.ep_size = 16;
  s.ep_rank = 3;
  s.hidden = 3584;
  s.intermediate = 32;
  s.top_k = 16;
  s.tokens = 600;
  const Case c = make_case(s, Activation::SiTU, InputFormat::MXFP8, IntermediateFormat::MXFP8,
                           OutputFormat::FP32, false, 5);
  Output full;
  std::vector<double> full64;
  reference_forward(c.cfg, c.w, c.x, c.routing, full, &full64);
  const int64_t K = s.hidden, split = 300;
  for (int half = 0; half < 2; ++half) {
    const int64_t t0 = half ? split : 0, t1 = half ? s.tokens : split;
    Activations x = c.x;
    x.tokens = t1 - t0;
    x.fp8.assign(c.x.fp8.begin() + t0 * K, c.x.fp8.begin() + t1 * K);
    x.scale.assign(c.x.scale.begin() + t0 * K / kMxBlock, c.x.scale.begin() + t1 * K / kMxBlock);
    Routing r = c.routing;
    r.tokens = t1 - t0;
    r.ids.assign(c.routing.ids.begin() + t0 * s.top_k, c.routing.ids.begin() + t1 * s.top_k);
    r.weights.assign(c.routing.weights.begin() + t0 * s.top_k, c.routing.weights.begin() + t1 * s.top_k);
    Output part;
    std::vector<double> part64;
    reference_forward(c.cfg, c.w, x, r, part, &part64);
    ASSERT_EQ(0, std::memcmp(part64.data(), full64.data() + t0 * K, part64.size() * sizeof(double)))
        << "half " << half;
  }
  double nz = 0;
  for (double v : full64) nz += v != 0;
  EXPECT_GT(nz, 0.5 * static_cast<double>(full64.size()));  // most tokens do hit this rank
}

TEST(Reference, NanTokenReachesOnlyItsRow) {
  for (InputFormat in : {InputFormat::BF16, InputFormat::MXFP8}) {
    Case c = make_case(Shape{}, Activation::SiTU, in, IntermediateFormat::MXFP8, OutputFormat::BF16,
                       false, 31);
    const int64_t K = c.cfg.hidden, bad = 1;
    ASSERT_TRUE(has_local(c, bad));
    if (in == InputFormat::BF16) c.x.bf16[bad * K + 7] = 0x7FC0;
    else c.x.fp8[bad * K + 7] = fmt::kE4m3Nan;
    Output out;
    std::vector<double> v;
    reference_forward(c.cfg, c.w, c.x, c.routing, out, &v);
    for (int64_t t = 0; t < c.routing.tokens; ++t)
      for (int64_t k = 0; k < K; ++k) {
        if (t == bad) {
          ASSERT_TRUE(std::isnan(v[t * K + k])) << "[" << t << "][" << k << "]";
          ASSERT_TRUE(std::isnan(out.value(t, k)));
        } else {
          ASSERT_TRUE(std::isfinite(v[t * K + k])) << "[" << t << "][" << k << "]";
        }
      }
  }
}

TEST(Reference, NanWeightScaleReachesOnlyRowsRoutedToThatExpert) {
  Shape s;
  s.tokens = 12;
  Case c = make_case(s, Activation::SwiGLU_OAI, InputFormat::MXFP8, IntermediateFormat::MXFP8,
                     OutputFormat::FP32, true, 47);
  const int64_t K = c.cfg.hidden, N = c.cfg.intermediate, e = 2;
  // Local expert 2, kernel row 70 (up row 38), block 1 of K.
  c.w.w13_scale[(e * 2 * N + 70) * (K / kMxBlock) + 1] = fmt::kE8m0Nan;
  Output out;
  std::vector<double> v;
  reference_forward(c.cfg, c.w, c.x, c.routing, out, &v);
  int64_t poisoned = 0, clean = 0;
  for (int64_t t = 0; t < s.tokens; ++t) {
    bool routed = false;
    for (int64_t j = 0; j < s.top_k; ++j) routed |= c.cfg.local_of(c.routing.ids[t * s.top_k + j]) == e;
    (routed ? poisoned : clean) += 1;
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(std::isnan(v[t * K + k]), routed) << "[" << t << "][" << k << "]";
  }
  EXPECT_GT(poisoned, 0);
  EXPECT_GT(clean, 0);
}

TEST(Reference, IdealOnExactlyRepresentableWeightsMatchesNaiveUnrounded) {
  for (bool bias : {false, true}) {
    const Case c = make_case(Shape{}, Activation::SiTU, InputFormat::BF16, IntermediateFormat::BF16,
                             OutputFormat::FP32, bias, 61 + bias);
    const int64_t E = c.w.num_local, K = c.cfg.hidden, N = c.cfg.intermediate;
    IdealWeights iw;
    iw.num_local = E;
    iw.hidden = K;
    iw.intermediate = N;
    // Kernel-order floats of the same MX values (exact: scale bytes 121..126).
    std::vector<float> w13_src;
    for (int64_t e = 0; e < E; ++e) {
      std::vector<float> src(static_cast<size_t>(2 * N * K));
      for (int64_t r = 0; r < 2 * N; ++r)
        for (int64_t k = 0; k < K; ++k) src[r * K + k] = static_cast<float>(mx_at(c.src[e].w13, r, k));
      const std::vector<float> kern = rows_to_kernel_layout(src, W13Layout::GateUp, N, K);
      iw.w13.insert(iw.w13.end(), kern.begin(), kern.end());
      for (int64_t r = 0; r < K; ++r)
        for (int64_t n = 0; n < N; ++n) iw.w2.push_back(static_cast<float>(mx_at(c.src[e].w2, r, n)));
    }
    iw.w13_bias = c.w.w13_bias;
    iw.w2_bias = c.w.w2_bias;
    std::vector<float> x;
    for (uint16_t b : c.x.bf16) x.push_back(fmt::bf16_to_float(b));
    std::vector<double> ideal;
    ideal_forward(c.cfg, iw, x, c.routing, ideal, 2);
    const std::vector<double> naive = naive_forward(c, false);
    ASSERT_EQ(ideal.size(), naive.size());
    double dd = 0, rr = 0;
    for (size_t i = 0; i < naive.size(); ++i) {
      dd += (ideal[i] - naive[i]) * (ideal[i] - naive[i]);
      rr += naive[i] * naive[i];
    }
    ASSERT_GT(rr, 0);
    EXPECT_LE(std::sqrt(dd / rr), 1e-12);

    // And the mirrored reference differs from it only by the BF16 intermediate rounding.
    Output out;
    std::vector<double> ref64;
    reference_forward(c.cfg, c.w, c.x, c.routing, out, &ref64);
    const Comparison cmp = compare_outputs(ref64, ideal, c.routing.tokens, K, 0, 0);
    EXPECT_GT(cmp.max_row_rel_l2, 0.0);  // the intermediate rounding is really mirrored
    EXPECT_LT(cmp.max_row_rel_l2, 1e-2);
  }
}

TEST(Reference, RejectsBadInputsWithoutWritingOutputs) {
  const Case good = make_case(Shape{}, Activation::SiTU, InputFormat::MXFP8, IntermediateFormat::MXFP8,
                              OutputFormat::BF16, false, 3);
  Output sentinel;
  sentinel.format = OutputFormat::FP32;
  sentinel.tokens = 1;
  sentinel.hidden = 3;
  sentinel.fp32 = {1.f, 2.f, 3.f};
  const std::vector<double> sentinel64 = {4.0, 5.0};
  auto run = [&](const Case& c) {
    Output out = sentinel;
    std::vector<double> v = sentinel64;
    try {
      reference_forward(c.cfg, c.w, c.x, c.routing, out, &v);
    } catch (...) {
      EXPECT_EQ(out.fp32, sentinel.fp32);
      EXPECT_EQ(out.format, sentinel.format);
      EXPECT_EQ(v, sentinel64);
      throw;
    }
  };
  {
    Case c = good;
    c.x = good.x_bf16;  // BF16 where the config says MXFP8
    expect_invalid([&] { run(c); }, "x");
  }
  {
    Case c = good;
    c.routing.ids[4] = 8;  // == num_experts
    expect_invalid([&] { run(c); }, "topk_ids");
  }
  {
    Case c = good;
    c.routing.ids[1] = -2;
    expect_invalid([&] { run(c); }, "topk_ids");
  }
  {
    Case c = good;
    c.w.w13_packed.pop_back();
    expect_invalid([&] { run(c); }, "weights.w13_packed");
  }
  {
    Case c = good;
    c.x.scale.pop_back();
    expect_invalid([&] { run(c); }, "x.scale");
  }
  {
    Case c = good;
    c.routing.tokens -= 1;
    c.routing.ids.resize(c.routing.ids.size() - 3);
    c.routing.weights.resize(c.routing.weights.size() - 3);
    expect_invalid([&] { run(c); }, "routing.tokens");
  }
  {
    Case c = good;
    c.cfg.top_k = 0;
    expect_invalid([&] { run(c); }, "config.top_k");
  }
  // ideal_forward: x of the wrong length.
  {
    IdealWeights iw;
    iw.num_local = 4;
    iw.hidden = 64;
    iw.intermediate = 64;
    iw.w13.assign(4 * 128 * 64, 0.5f);
    iw.w2.assign(4 * 64 * 64, 0.5f);
    std::vector<double> out = sentinel64;
    std::vector<float> x(static_cast<size_t>(good.routing.tokens * 64 - 1), 1.0f);
    expect_invalid([&] { ideal_forward(good.cfg, iw, x, good.routing, out); }, "x");
    EXPECT_EQ(out, sentinel64);
    iw.w2.pop_back();
    x.push_back(1.0f);
    expect_invalid([&] { ideal_forward(good.cfg, iw, x, good.routing, out); }, "weights.w2");
    EXPECT_EQ(out, sentinel64);
  }
}

TEST(Reference, ZeroTokensGiveAnEmptyOutput) {
  Case c = make_case(Shape{}, Activation::SiLU_Gated, InputFormat::BF16, IntermediateFormat::BF16,
                     OutputFormat::BF16, false, 8);
  c.x.tokens = 0;
  c.x.bf16.clear();
  c.routing.tokens = 0;
  c.routing.ids.clear();
  c.routing.weights.clear();
  Output out;
  out.bf16 = {1, 2};
  std::vector<double> v = {1.0};
  reference_forward(c.cfg, c.w, c.x, c.routing, out, &v);
  EXPECT_EQ(out.tokens, 0);
  EXPECT_TRUE(out.bf16.empty());
  EXPECT_TRUE(v.empty());
}

// ------------------------------------------------------------------ compare_outputs

TEST(Compare, MetricsBoundsAndNonFinite) {
  const double nan = kNaN, inf = std::numeric_limits<double>::infinity();
  // Row 0 exact, row 1 off by 1e-3 relative in one element, row 2 zero in both.
  std::vector<double> r = {1, 2, 3, 4, 1, 1, 1, 1, 0, 0, 0, 0};
  std::vector<double> a = r;
  a[5] = 1.001;
  Comparison c = compare_outputs(a, r, 3, 4, 0, 2e-3);
  EXPECT_EQ(c.bound_violations, 0);
  EXPECT_NEAR(c.max_row_rel_l2, 1e-3 / 2.0, 1e-12);
  EXPECT_NEAR(c.max_abs_err, 1e-3, 1e-12);
  EXPECT_LT(c.min_cosine, 1.0);
  EXPECT_TRUE(c.pass(1e-3, 0.999));
  EXPECT_FALSE(c.pass(1e-4, 0.999));

  c = compare_outputs(a, r, 3, 4, 0, 5e-4);
  EXPECT_EQ(c.bound_violations, 1);
  EXPECT_EQ(c.first_bad_row, 1);
  EXPECT_EQ(c.first_bad_col, 1);
  EXPECT_FALSE(c.pass(1, -1));
  EXPECT_NE(c.summary().find("first_bad=[1][1]"), std::string::npos) << c.summary();

  // A zero reference row must be matched by a zero row.
  a = r;
  a[9] = 1e-30;
  c = compare_outputs(a, r, 3, 4, 1, 1);
  EXPECT_EQ(c.bound_violations, 0);
  EXPECT_TRUE(std::isinf(c.max_row_rel_l2));
  EXPECT_FALSE(c.pass(1e9, -1));

  // NaN where the reference is finite: non-finite and a violation.
  a = r;
  a[2] = nan;
  c = compare_outputs(a, r, 3, 4, 1, 1);
  EXPECT_EQ(c.nonfinite, 1);
  EXPECT_EQ(c.bound_violations, 1);
  EXPECT_EQ(c.first_bad_col, 2);
  EXPECT_FALSE(c.pass(1e9, -1));

  // NaN in the reference where the actual is finite: a violation (not "nonfinite").
  a = r;
  std::vector<double> rn = r;
  rn[0] = nan;
  c = compare_outputs(a, rn, 3, 4, 1, 1);
  EXPECT_EQ(c.nonfinite, 0);
  EXPECT_EQ(c.bound_violations, 1);
  EXPECT_FALSE(c.pass(1e9, -1));

  // NaN in both at the same place (a poisoned row), and equal infinities: agreement.
  a = r;
  a[4] = a[5] = a[6] = a[7] = nan;
  rn = r;
  rn[4] = rn[5] = rn[6] = rn[7] = nan;
  a[0] = rn[0] = inf;
  c = compare_outputs(a, rn, 3, 4, 0, 0);
  EXPECT_EQ(c.nonfinite, 0);
  EXPECT_EQ(c.bound_violations, 0);
  EXPECT_TRUE(c.pass(0, 1 - 1e-12)) << c.summary();

  // Opposite infinities disagree.
  a[0] = -inf;
  c = compare_outputs(a, rn, 3, 4, 0, 0);
  EXPECT_EQ(c.bound_violations, 1);
  EXPECT_FALSE(c.pass(1e9, -1));

  expect_invalid([&] { compare_outputs(a, r, 3, 5, 0, 0); }, "actual");
}

TEST(Compare, OutputValuesDecodesBf16AndFp32) {
  Output o;
  o.format = OutputFormat::BF16;
  o.tokens = 1;
  o.hidden = 2;
  o.bf16 = {fmt::float_to_bf16(1.5f), fmt::float_to_bf16(-3.0f)};
  EXPECT_EQ(output_values(o), (std::vector<double>{1.5, -3.0}));
  o.format = OutputFormat::FP32;
  o.fp32 = {0.1f, 2.0f};
  EXPECT_EQ(output_values(o), (std::vector<double>{static_cast<double>(0.1f), 2.0}));
  o.fp32.pop_back();
  expect_invalid([&] { output_values(o); }, "out.fp32");
}

// Near-ties (reference.h): a tie is taken only where it brings the row closer to the
// backend, whole, and never on a row with non-finite values.
TEST(NearTies, TakenOnlyWhereTheyExplainTheBackend) {
  const int64_t cols = 4;
  std::vector<double> ref64 = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<NearTie> ties(3);
  ties[0] = {0, {0.5, 0, 0, 0}};    // row 0: the backend rounded this one the other way
  ties[1] = {0, {0, 0, -0.25, 0}};  // row 0: did not
  ties[2] = {1, {0, 0.5, 0, 0}};    // row 1: holds a NaN
  std::vector<double> actual = {1.5, 2, 3, 4.001, 5, 6.5, std::nan(""), 8};
  EXPECT_EQ(take_near_ties(actual, ref64, cols, ties, OutputFormat::FP32), 1);
  EXPECT_EQ(ref64, (std::vector<double>{1.5, 2, 3, 4, 5, 6, 7, 8}));
  // A tie is whole or nothing: half of it explained is not enough to take it.
  std::vector<double> r2 = {1, 2, 3, 4};
  std::vector<double> a2 = {1.2, 2, 3, 4};
  EXPECT_EQ(take_near_ties(a2, r2, cols, {NearTie{0, {0.5, 0, 0, 0}}}, OutputFormat::FP32), 0);
  expect_invalid([&] { take_near_ties(a2, r2, cols, {NearTie{1, {0, 0, 0, 0}}}, OutputFormat::FP32); }, "ties");
  expect_invalid([&] { take_near_ties(a2, r2, 3, {}, OutputFormat::FP32); }, "cols");
  std::vector<double> r3 = {1, 2, 3};
  expect_invalid([&] { take_near_ties(a2, r3, cols, {}, OutputFormat::FP32); }, "actual");
}

// The ties are judged on the rounded reference, since `actual` is rounded: for a BF16
// output a tie that moves no element across a rounding boundary explains nothing, though
// unrounded it moves the row toward `actual`. (Judged unrounded, situ-bf16-in-bf16-mid-m8
// took 277 of 1470 ties for rounding noise at seed 13434457364762741735; see below.)
TEST(NearTies, JudgedOnTheRoundedReference) {
  const int64_t cols = 4;
  const std::vector<double> actual = {1.0 + 1.0 / 128, 1, 1, 1};  // BF16 neighbours of 1
  const std::vector<NearTie> small = {NearTie{0, {1e-4, 0, 0, 0}}};
  std::vector<double> ref64 = {1, 1, 1, 1};
  EXPECT_EQ(take_near_ties(actual, ref64, cols, small, OutputFormat::BF16), 0);
  EXPECT_EQ(ref64, (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(take_near_ties(actual, ref64, cols, small, OutputFormat::FP32), 1);  // fp32 sees it
  // One that does cross the boundary (1 + 2^-8 is the midpoint) is taken.
  ref64 = {1.0 + 1.0 / 256 - 1e-6, 1, 1, 1};
  EXPECT_EQ(take_near_ties(actual, ref64, cols, {NearTie{0, {2e-6, 0, 0, 0}}}, OutputFormat::BF16), 1);
  EXPECT_EQ(output_rounded(OutputFormat::BF16, ref64[0]), actual[0]);
}

// Best first, not largest first: of two overlapping ties the one that explains the row
// is taken, though the other moves it more (seen at seed 16000825, situ-masked-slots-m32,
// where largest-first left 4.4e-4 and best-first matches the CPU backend exactly).
TEST(NearTies, TheTieThatExplainsMostIsTakenFirst) {
  const int64_t cols = 4;
  const std::vector<double> actual = {1, 1, 0, 0};
  std::vector<double> ref64 = {0, 0, 0, 0};
  const std::vector<NearTie> ties = {NearTie{0, {1.5, 1.5, 0.25, 0}},  // larger, explains some
                                     NearTie{0, {1, 1, 0, 0}}};        // explains all
  EXPECT_EQ(take_near_ties(actual, ref64, cols, ties, OutputFormat::FP32), 1);
  EXPECT_EQ(ref64, actual);
}

TEST(NearTies, OutputTiesNeedAdjacentBf16ValuesAndAReferenceAtTheirMidpoint) {
  const double lo = 1.0, hi = 1.0 + 1.0 / 128;  // adjacent BF16 values
  const double mid = 0.5 * (lo + hi);
  std::vector<double> ref = {lo, lo, lo, 2.0};
  std::vector<double> actual = {hi, hi, 1.0 + 2.0 / 128, 2.0};
  std::vector<double> ref64 = {mid * (1 - 1e-6), mid * (1 - 1e-3), mid, 2.0};
  EXPECT_EQ(take_output_ties(actual, ref, ref64, 1.0 / 16384), 1);
  EXPECT_EQ(ref, (std::vector<double>{hi, lo, lo, 2.0}));  // near, far, not adjacent, equal
}

// Smoke case `name` on the CPU backend with the seeds `mxmoe validate --seed seed` gives
// it (the case's position in the suite), as a CI run saw it.
CaseResult run_smoke_case_cpu(const std::string& name, uint64_t seed) {
  const std::vector<SuiteCase> cases = suite_cases("smoke");
  for (size_t i = 0; i < cases.size(); ++i)
    if (cases[i].name == name) return run_case(cases[i], Backend::Cpu, seed + (i + 1) * 7919u, seed);
  ADD_FAILURE() << "no case " << name << " in the smoke suite";
  return CaseResult{};
}

// The CI failure that motivated ties: situ-masked-slots-m32 failed the 5e-3 bound at seed
// 18415880773716947779 (rel L2 7.7e-3) because a few intermediate E4M3 codes of the fp32
// CPU backend rounded the other way at near-ties. With ties it passes, having taken some,
// and the remaining error is well inside the bound. Since SiTU became one quotient
// (session 12, more accurate) the backend matches the reference exactly at that seed, so
// the case now runs at one where it still rounds some codes the other way (7 ties taken).
TEST(NearTies, SmokeCaseThatFailedOnANearTieNowPasses) {
  const CaseResult r = run_smoke_case_cpu("situ-masked-slots-m32", 2000006ull);
  EXPECT_EQ(r.status, CaseResult::Status::Pass) << r.note;
  EXPECT_GT(r.near_ties_taken, 0);
  EXPECT_LT(r.vs_reference.max_row_rel_l2, 1e-3);
}

// The CI failure of session 15 (fff39cc): situ-bf16-in-bf16-mid-m8 at seed
// 13434457364762741735 gave rel L2 1.016e-3 against the 1e-3 bound, on the CPU backend,
// because the judge took ties for the BF16 output's rounding noise (JudgedOnTheRounded-
// Reference).
TEST(NearTies, Bf16IntermediateCaseThatFailedCiPasses) {
  const CaseResult r = run_smoke_case_cpu("situ-bf16-in-bf16-mid-m8", 13434457364762741735ull);
  EXPECT_EQ(r.status, CaseResult::Status::Pass) << r.note;
  EXPECT_LT(r.vs_reference.max_row_rel_l2, 2.5e-4);
}

}  // namespace
}  // namespace mxmoe
