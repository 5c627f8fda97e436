// Accuracy of the shared fp32 transcendental arithmetic (mxmoe/activation_math.h)
// against double precision. Host and device evaluate the same operations (bit for bit:
// tests/gpu/test_engine.cu SharedMath), so these bounds hold for the GPU epilogues too.
// Measured maxima when the bounds were set: exp 1.01 ulp, sigmoid 2.48, tanh 2.99,
// expm1_nonpos 0.84, SiTU 6.84 (one quotient of three fractions; the earlier form, five
// divisions in a row, measured 8.76 against a bound of 12). The alpha-4 form with one exp
// for g (session 19) measured 6.83 where the any-alpha form measured 6.51 (Kimi, sd 18).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <type_traits>

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

TEST(ActivationMath, Expm1NonPositiveAgainstDouble) {
  // SiTU's tanh fractions rest on expm1_nonpos_f32: relative accuracy down to tiny |x|
  // (no cancellation), and -1 far out.
  std::mt19937 rng(8);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double worst = 0.0;
  for (int i = 0; i < 2000000; ++i) {
    // Magnitudes from 2^-40 to 2^6 (log-uniform), so the n = 0 range is well covered.
    const float x = static_cast<float>(-std::exp2(-40.0 + 46.0 * u(rng)));
    worst = std::max(worst, ulps(am::expm1_nonpos_f32(x), std::expm1(static_cast<double>(x))));
  }
  EXPECT_LE(worst, 1.0);
  EXPECT_GT(worst, 0.0);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(am::expm1_nonpos_f32(-inf), -1.0f);
  EXPECT_EQ(am::expm1_nonpos_f32(-60.0f), -1.0f);
  EXPECT_EQ(am::expm1_nonpos_f32(-0.0f), 0.0f);
  EXPECT_TRUE(fmt::is_nan(am::expm1_nonpos_f32(std::numeric_limits<float>::quiet_NaN())));
  std::printf("expm1_nonpos worst ulp %.2f\n", worst);
}

TEST(ActivationMath, ExpNonPositiveEqualsExp) {
  // SiTU's exps take exp_nonpos_f32, which drops exp_f32's overflow and NaN selects and
  // clamps below the underflow bound: equal bits for x <= 0 (a NaN in, a NaN out). Every
  // 61st negative float (all exponents, scattered mantissas) and every float within
  // 2^16 patterns of the underflow bound (checked over all 2^31 once, 88 s).
  auto same = [](float x) {
    const float a = am::exp_f32(x), b = am::exp_nonpos_f32(x);
    return (fmt::is_nan(a) && fmt::is_nan(b)) || fmt::float_bits(a) == fmt::float_bits(b);
  };
  int64_t bad = 0, checked = 0;
  for (uint64_t b = 0x80000000ull; b <= 0xFFFFFFFFull; b += 61, ++checked)
    bad += !same(fmt::bits_float(static_cast<uint32_t>(b)));
  const uint32_t bound = fmt::float_bits(am::kExpUnderflow);
  for (uint32_t b = bound - 65536; b <= bound + 65536; ++b, ++checked) bad += !same(fmt::bits_float(b));
  EXPECT_EQ(bad, 0) << "of " << checked;
  EXPECT_EQ(fmt::float_bits(am::exp_nonpos_f32(-std::numeric_limits<float>::infinity())), 0u);
  EXPECT_TRUE(fmt::is_nan(am::exp_nonpos_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST(ActivationMath, DivDen1To8AgainstIeee) {
  // SiTU's division (no branch): within 1 ulp (of the subnormal grid down there) of the
  // exact quotient, and the IEEE quotient's bits where that is 2^-100 or more in magnitude,
  // except within 1e-4 ulp of a tie. Numerators are random bit patterns up to 2^126,
  // denominators uniform in [1, 8].
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> dens(1.0f, 8.0f);
  int64_t near_tie = 0, unequal = 0, unequal_small = 0, over_ulp = 0;
  for (int i = 0; i < 4000000; ++i) {
    const float den = dens(rng), num = fmt::bits_float(static_cast<uint32_t>(rng()));
    if (fmt::is_nan(num) || std::fabs(num) > 0x1p126f) continue;
    const float want = num / den, got = am::div_den_1_to_8_f32(num, den);
    const double exact = static_cast<double>(num) / den;
    over_ulp += std::fabs(static_cast<double>(got) - exact) > ulp32(exact);
    if (fmt::float_bits(got) == fmt::float_bits(want)) continue;
    if (std::fabs(want) < 0x1p-100f) {
      ++unequal_small;
      continue;
    }
    const double in_ulps = std::fabs(exact) / ulp32(exact);
    const bool tie = std::fabs(in_ulps - std::floor(in_ulps) - 0.5) < 1e-4;
    (tie ? near_tie : unequal) += 1;
  }
  EXPECT_EQ(unequal, 0);
  EXPECT_EQ(over_ulp, 0);
  std::printf("division: of 4M, %lld differ from IEEE near a tie, %lld under 2^-100\n",
              static_cast<long long>(near_tie), static_cast<long long>(unequal_small));
  for (float den : {1.0f, 2.0f, 3.0f, 8.0f}) {
    EXPECT_EQ(fmt::float_bits(am::div_den_1_to_8_f32(-0.0f, den)), 0x80000000u);
    EXPECT_EQ(fmt::float_bits(am::div_den_1_to_8_f32(0x1p126f, den)), fmt::float_bits(0x1p126f / den));
    EXPECT_TRUE(fmt::is_nan(am::div_den_1_to_8_f32(std::numeric_limits<float>::quiet_NaN(), den)));
  }
  EXPECT_TRUE(fmt::is_nan(am::div_den_1_to_8_f32(1.0f, std::numeric_limits<float>::quiet_NaN())));
}

// situ(g, u, alpha, beta) is one of the SiTU forms: situ_f32 (which takes the alpha-4 form
// where alpha is 4) or situ_any_alpha_f32.
template <class Situ>
double situ_worst_ulps(float alpha, float beta, double sd, uint32_t seed, Situ&& situ) {
  const ActivationParams params = ActivationParams::situ(alpha, beta);
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0.0, sd);
  double worst = 0.0;
  for (int i = 0; i < 1000000; ++i) {
    const float g = static_cast<float>(n(rng)), up = static_cast<float>(n(rng));
    const double want = activation_ref(params, 0, g, up);
    if (std::fabs(want) < 0x1p-100) continue;
    worst = std::max(worst, ulps(situ(g, up, alpha, beta), want));
  }
  return worst;
}
double situ_worst_ulps(float alpha, float beta, double sd, uint32_t seed) {
  return situ_worst_ulps(alpha, beta, sd, seed, am::situ_f32);
}

TEST(ActivationMath, SituAgainstDouble) {
  // SiTU on normally drawn pre-activations against the reference's float64 activation,
  // in ulp of the result: Kimi-K3's (alpha 4, beta 25) with sd 18 (mostly large |x / a|,
  // m near -1 in the tanh fractions) and sd 2 (mostly small, m near 0), and a pair that
  // is neither a power of two nor Kimi's (-2/alpha and alpha*beta rounded).
  const double kimi_wide = situ_worst_ulps(4.0f, 25.0f, 18.0, 9);
  const double kimi_narrow = situ_worst_ulps(4.0f, 25.0f, 2.0, 10);
  const double other = situ_worst_ulps(1.7f, 7.3f, 6.0, 11);
  // Kimi's parameters through the any-alpha form too (situ_f32 takes the alpha-4 form).
  const double kimi_any_form = situ_worst_ulps(4.0f, 25.0f, 18.0, 9, am::situ_any_alpha_f32);
  EXPECT_LE(kimi_wide, 8.0);
  EXPECT_LE(kimi_narrow, 8.0);
  EXPECT_LE(other, 8.0);
  EXPECT_LE(kimi_any_form, 8.0);
  EXPECT_GT(kimi_wide, 0.0);
  std::printf("SiTU worst ulp: kimi sd 18 %.2f, sd 2 %.2f, (1.7, 7.3) sd 6 %.2f, kimi sd 18 any-alpha "
              "form %.2f\n", kimi_wide, kimi_narrow, other, kimi_any_form);
}

TEST(ActivationMath, SituFormsAgreeOnAlpha) {
  // situ_f32 is the alpha-4 form exactly where alpha is 4, and the any-alpha form
  // elsewhere (kernels pick the form once per expert and must get situ_f32's bits).
  std::mt19937 rng(12);
  std::normal_distribution<float> n(0.0f, 18.0f);
  for (int i = 0; i < 10000; ++i) {
    const float g = n(rng), u = n(rng);
    EXPECT_EQ(fmt::float_bits(am::situ_f32(g, u, 4.0f, 25.0f)), fmt::float_bits(am::situ_alpha4_f32(g, u, 25.0f)));
    EXPECT_EQ(fmt::float_bits(am::situ_f32(g, u, 4.5f, 25.0f)),
              fmt::float_bits(am::situ_any_alpha_f32(g, u, 4.5f, 25.0f)));
    EXPECT_EQ(fmt::float_bits(am::gated_activation_t<am::kActSituAlpha4>(g, u, 4.0f, 25.0f, 0.0f)),
              fmt::float_bits(am::gated_activation_f32(0, g, u, 4.0f, 25.0f, 0.0f)));
    EXPECT_EQ(fmt::float_bits(am::gated_activation_t<am::kActSituOtherAlpha>(g, u, 1.7f, 7.3f, 0.0f)),
              fmt::float_bits(am::gated_activation_f32(0, g, u, 1.7f, 7.3f, 0.0f)));
  }
}

TEST(ActivationMath, KindDispatchKeepsKindAndResolvesSitu) {
  // The launchers pick one kernel per kind with with_activation_kind: SiTU's unresolved
  // kind 0 must stay 0 (its kernel tests alpha per expert), values past the known kinds
  // run SiLU-gated as gated_activation_f32 does; inside a kind-0 kernel,
  // with_form_of_kind resolves the form by alpha, and asks for alpha only then.
  auto kind_of = [](int kind) {
    int got = -1;
    am::with_activation_kind(kind, [&](auto k) { got = decltype(k)::value; });
    return got;
  };
  EXPECT_EQ(kind_of(0), 0);
  EXPECT_EQ(kind_of(1), 1);
  EXPECT_EQ(kind_of(2), 2);
  EXPECT_EQ(kind_of(am::kActSituAlpha4), am::kActSituAlpha4);
  EXPECT_EQ(kind_of(am::kActSituOtherAlpha), am::kActSituOtherAlpha);
  EXPECT_EQ(kind_of(7), 2);
  auto form_of = [](auto kind, float alpha, int* alpha_calls) {
    int got = -1;
    am::with_form_of_kind<decltype(kind)::value>([&] { ++*alpha_calls; return alpha; },
                                                 [&](auto f) { got = decltype(f)::value; });
    return got;
  };
  int calls = 0;
  EXPECT_EQ(form_of(std::integral_constant<int, 0>{}, 4.0f, &calls), am::kActSituAlpha4);
  EXPECT_EQ(form_of(std::integral_constant<int, 0>{}, 3.0f, &calls), am::kActSituOtherAlpha);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(form_of(std::integral_constant<int, 1>{}, 4.0f, &calls), 1);
  EXPECT_EQ(form_of(std::integral_constant<int, am::kActSituAlpha4>{}, 3.0f, &calls), am::kActSituAlpha4);
  EXPECT_EQ(calls, 2);
}

TEST(ActivationMath, SituSpecialValues) {
  // Infinities and extremes of either input against the float64 activation; a NaN in
  // either gives NaN.
  const ActivationParams kimi = ActivationParams::situ(4.0f, 25.0f);
  const float inf = std::numeric_limits<float>::infinity();
  // -103 .. -106: e^(-|g|) alone underflows from -103.97 on, 4 * 25 * it does not (the
  // alpha-4 form keeps those values, within the bound; up to -106 they are nonzero).
  for (float g : {inf, -inf, 0.0f, 1e-30f, -1e-30f, 1e30f, -1e30f, -90.0f, -103.0f, -104.5f, -105.9f,
                  -106.0f, -120.0f, 3.0f}) {
    for (float u : {inf, -inf, 0.0f, 1e-30f, -1e30f, 2.0f}) {
      const double want = activation_ref(kimi, 0, g, u);
      const float got = am::situ_f32(g, u, 4.0f, 25.0f);
      EXPECT_LE(std::fabs(static_cast<double>(got) - want), 8.0 * ulp32(want)) << "g " << g << " u " << u;
    }
  }
  EXPECT_TRUE(std::isnan(am::situ_f32(std::nanf(""), 1.0f, 4.0f, 25.0f)));
  EXPECT_TRUE(std::isnan(am::situ_f32(1.0f, std::nanf(""), 4.0f, 25.0f)));
  EXPECT_TRUE(std::isnan(am::situ_f32(-inf, std::nanf(""), 4.0f, 25.0f)));
}

}  // namespace
}  // namespace mxmoe
