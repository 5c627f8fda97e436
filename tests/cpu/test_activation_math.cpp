// Accuracy of the shared fp32 transcendental arithmetic (mxmoe/activation_math.h)
// against double precision. Host and device evaluate the same operations (bit for bit:
// tests/gpu/test_engine.cu SharedMath), so these bounds hold for the GPU epilogues too.
// Measured maxima when the bounds were set: exp 1.01 ulp, sigmoid 2.48, tanh 2.99, SiTU
// 8.76 (five roundings and two tanh in a row).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "mxmoe/activation_math.h"
#include "mxmoe/moe.h"

namespace mxmoe {
namespace {

// One unit in the last place of an fp32 result near v (the subnormal spacing below 2^-126).
double ulp32(double v) {
  v = std::fabs(v);
  if (v < 0x1p-126) return 0x1p-149;
  int e = 0;
  std::frexp(v, &e);
  return std::ldexp(1.0, e - 24);
}

double ulps(float got, double want) { return std::fabs(static_cast<double>(got) - want) / ulp32(want); }

constexpr double kFloatMax = std::numeric_limits<float>::max();

TEST(ActivationMath, ExpSigmoidTanhAgainstDouble) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  double worst_exp = 0, worst_sig = 0, worst_tanh = 0;
  for (int i = 0; i < 4000000; ++i) {
    const float x = static_cast<float>(u(rng) * ((i & 1) ? 100.0 : 8.0));
    const double e = std::exp(static_cast<double>(x));
    if (e >= 0x1p-126 && e <= kFloatMax) worst_exp = std::max(worst_exp, ulps(am::exp_f32(x), e));
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    if (s >= 0x1p-126) worst_sig = std::max(worst_sig, ulps(am::sigmoid_f32(x), s));
    const double t = std::tanh(static_cast<double>(x));
    if (t != 0.0) worst_tanh = std::max(worst_tanh, ulps(am::tanh_f32(x), t));
  }
  EXPECT_LE(worst_exp, 2.0);
  EXPECT_LE(worst_sig, 3.0);
  EXPECT_LE(worst_tanh, 3.5);
  EXPECT_GT(worst_exp, 0.0);
}

TEST(ActivationMath, SituAgainstDouble) {
  // Kimi-K3's SiTU (alpha 4, beta 25) on normally drawn pre-activations (sd 18, wide
  // enough for both forms of both tanh), against the reference's float64 activation, in
  // ulp of the result.
  const ActivationParams kimi = ActivationParams::situ(4.0f, 25.0f);
  std::mt19937 rng(9);
  std::normal_distribution<double> n(0.0, 18.0);
  double worst = 0.0;
  for (int i = 0; i < 2000000; ++i) {
    const float g = static_cast<float>(n(rng)), up = static_cast<float>(n(rng));
    const double want = activation_ref(kimi, 0, g, up);
    if (std::fabs(want) < 0x1p-100) continue;
    worst = std::max(worst, ulps(am::situ_f32(g, up, 4.0f, 25.0f), want));
  }
  EXPECT_LE(worst, 12.0);
  EXPECT_GT(worst, 0.0);
}

}  // namespace
}  // namespace mxmoe
