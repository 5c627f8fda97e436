// Exhaustive tests of the codecs in include/mxmoe/formats.h (SPEC §2).
//
// Expected values are computed here independently of the header: decodes from the OCP
// formula with ldexp in double, encodes by brute force over every code of the grid
// (nearest value, ties to the even code, saturation), scale bytes by searching for the
// smallest power of two in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "mxmoe/formats.h"

namespace {

using namespace mxmoe;

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const float kInfF = std::numeric_limits<float>::infinity();
const float kNaNF = std::numeric_limits<float>::quiet_NaN();

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---------------------------------------------------------------- independent oracles

// OCP E2M1: bias 1, no Inf/NaN; e == 0 is subnormal m * 2^-1.
double ref_e2m1(int c) {
  const int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
  const double mag = e == 0 ? std::ldexp(m, -1) : std::ldexp(1.0 + m / 2.0, e - 1);
  return s ? -mag : mag;
}
// OCP E4M3 (fn): bias 7, S.1111.111 is NaN, e == 0 is subnormal m/8 * 2^-6.
double ref_e4m3(int c) {
  const int s = (c >> 7) & 1, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return kNaN;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}
double ref_e8m0(int b) { return b == 255 ? kNaN : std::ldexp(1.0, b - 127); }

// Nearest code by brute force over the non-negative codes [0, n_mag) whose magnitudes
// increase with the code; ties to the even code; saturate past the largest.
template <typename Dec>
int ref_encode(double x, int n_mag, int sign_bit, Dec dec) {
  const int sign = std::signbit(x) ? sign_bit : 0;
  const double a = std::fabs(x);
  int best = 0;
  double best_d = std::fabs(a - dec(0));
  for (int c = 1; c < n_mag; ++c) {
    const double d = std::fabs(a - dec(c));
    if (d < best_d || (d == best_d && (c % 2 == 0))) {
      best = c;
      best_d = d;
    }
  }
  return best | sign;
}
int ref_encode_e2m1(double x) { return ref_encode(x, 8, 8, ref_e2m1); }
int ref_encode_e4m3(double x) {
  if (std::isnan(x)) return (std::signbit(x) ? 0x80 : 0) | 0x7F;
  return ref_encode(x, 0x7F, 0x80, ref_e4m3);
}

// Smallest s with amax <= max_elem * 2^s ("round up"), or floor(log2 amax) - emax, both
// clamped to [-127, 127]; returns the byte.
int ref_scale_byte(double amax, double max_elem, int emax, ScaleRule rule) {
  if (!(amax > 0)) return 0;
  if (std::isinf(amax)) return 0xFE;
  int s;
  if (rule == ScaleRule::Floor) {
    int fl = -400;
    while (std::ldexp(1.0, fl + 1) <= amax) ++fl;
    s = fl - emax;
  } else {
    s = -400;
    while (amax > std::ldexp(max_elem, s)) ++s;
  }
  s = std::max(-127, std::min(127, s));
  return s + 127;
}

// Grid spacing of E4M3 / E2M1 at magnitude y (already divided by the block scale).
double ulp_e4m3(double y) {
  y = std::fabs(y);
  if (y < std::ldexp(1.0, -6)) return std::ldexp(1.0, -9);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(y))) - 3);
}
double ulp_e2m1(double y) {
  y = std::fabs(y);
  return y < 2 ? 0.5 : (y < 4 ? 1.0 : 2.0);
}

bool same(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// ---------------------------------------------------------------- E2M1

TEST(E2M1, EveryCodeDecodesToOcpValue) {
  const double table[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const double want = (c & 8) ? -table[c & 7] : table[c & 7];
    EXPECT_TRUE(same(fmt::e2m1_to_float(static_cast<uint8_t>(c)), want)) << "code " << c;
    EXPECT_TRUE(same(ref_e2m1(c), want)) << "oracle, code " << c;
  }
  // Only the low nibble counts.
  EXPECT_EQ(fmt::e2m1_to_float(0xF3), 1.5f);
}

TEST(E2M1, EncodeOfDecodeIsIdentityForAll16CodesIncludingNegativeZero) {
  for (int c = 0; c < 16; ++c)
    EXPECT_EQ(fmt::float_to_e2m1(fmt::e2m1_to_float(static_cast<uint8_t>(c))), c) << "code " << c;
}

TEST(E2M1, MidpointsRoundToEvenCodeAndNeighboursRoundToNearest) {
  for (int c = 0; c < 7; ++c) {
    for (double sgn : {1.0, -1.0}) {
      const float mid = static_cast<float>(sgn * (ref_e2m1(c) + ref_e2m1(c + 1)) / 2);
      const int even = (c % 2 == 0) ? c : c + 1;
      const int sb = sgn < 0 ? 8 : 0;
      EXPECT_EQ(fmt::float_to_e2m1(mid), even | sb) << "midpoint " << mid;
      EXPECT_EQ(fmt::float_to_e2m1(std::nextafter(mid, 0.0f)), c | sb) << "below " << mid;
      EXPECT_EQ(fmt::float_to_e2m1(std::nextafter(mid, static_cast<float>(sgn) * kInfF)),
                (c + 1) | sb)
          << "above " << mid;
    }
  }
}

TEST(E2M1, SaturatesAtSixIncludingInfinity) {
  for (float x : {6.0f, 6.5f, 7.0f, 100.0f, FLT_MAX, kInfF}) {
    EXPECT_EQ(fmt::float_to_e2m1(x), 7) << x;
    EXPECT_EQ(fmt::float_to_e2m1(-x), 15) << -x;
  }
}

TEST(E2M1, NaNEncodesToZeroCodeSoTheBlockScaleCarriesIt) {
  EXPECT_EQ(fmt::float_to_e2m1(kNaNF) & 7, 0);
}

TEST(E2M1, RandomFloatsMatchBruteForceNearestEven) {
  std::mt19937_64 rng(101);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = u(rng);
    ASSERT_EQ(fmt::float_to_e2m1(x), ref_encode_e2m1(x)) << "x = " << x;
  }
}

// ---------------------------------------------------------------- E4M3

TEST(E4M3, Every256CodesDecodeToOcpValue) {
  for (int c = 0; c < 256; ++c)
    EXPECT_TRUE(same(fmt::e4m3_to_float(static_cast<uint8_t>(c)), ref_e4m3(c))) << "code " << c;
  // Landmarks, written out: max 448, min normal 2^-6, min subnormal 2^-9, NaN codes.
  EXPECT_EQ(fmt::e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fmt::e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(fmt::e4m3_to_float(0x08), 0.015625f);
  EXPECT_EQ(fmt::e4m3_to_float(0x01), 0.001953125f);
  EXPECT_TRUE(std::isnan(fmt::e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(fmt::e4m3_to_float(0xFF)));
  EXPECT_EQ(fmt::kE4m3Nan, 0x7F);
}

TEST(E4M3, EncodeOfDecodeIsIdentityForEveryNonNaNCode) {
  int checked = 0;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(fmt::float_to_e4m3(fmt::e4m3_to_float(static_cast<uint8_t>(c))), c) << "code " << c;
    ++checked;
  }
  EXPECT_EQ(checked, 254);
}

TEST(E4M3, EveryMidpointRoundsToEvenCodeAndNeighboursToNearest) {
  // Codes 0..0x7E increase in value, so consecutive codes are grid neighbours; this
  // covers the subnormal grid, the subnormal/normal seam (7 -> 8) and 416/448.
  for (int c = 0; c < 0x7E; ++c) {
    for (int sb : {0, 0x80}) {
      const double lo = ref_e4m3(c), hi = ref_e4m3(c + 1);
      const float mid = static_cast<float>((sb ? -1 : 1) * (lo + hi) / 2);
      ASSERT_EQ(static_cast<double>(std::fabs(mid)), (lo + hi) / 2) << "midpoint exact in float";
      const int even = (c % 2 == 0) ? c : c + 1;
      EXPECT_EQ(fmt::float_to_e4m3(mid), even | sb) << "midpoint " << mid;
      EXPECT_EQ(fmt::float_to_e4m3(std::nextafter(mid, 0.0f)), c | sb) << "below " << mid;
      EXPECT_EQ(fmt::float_to_e4m3(std::nextafter(mid, sb ? -kInfF : kInfF)), (c + 1) | sb)
          << "above " << mid;
    }
  }
}

TEST(E4M3, SaturatesTo448IncludingInfinity) {
  for (float x : {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, FLT_MAX, kInfF}) {
    EXPECT_EQ(fmt::float_to_e4m3(x), 0x7E) << x;
    EXPECT_EQ(fmt::float_to_e4m3(-x), 0xFE) << -x;
  }
}

TEST(E4M3, NaNBecomesTheNaNCodeNeverANumber) {
  EXPECT_EQ(fmt::float_to_e4m3(kNaNF), 0x7F);
  EXPECT_EQ(fmt::float_to_e4m3(-kNaNF), 0xFF);
  EXPECT_EQ(fmt::float_to_e4m3(from_bits(0x7f800001u)) & 0x7F, 0x7F) << "signalling NaN";
}

TEST(E4M3, TinyValuesFlushToSignedZero) {
  EXPECT_EQ(fmt::float_to_e4m3(1e-30f), 0x00);
  EXPECT_EQ(fmt::float_to_e4m3(-1e-30f), 0x80);
  EXPECT_EQ(fmt::float_to_e4m3(from_bits(1)), 0x00) << "float subnormal";
  EXPECT_EQ(fmt::float_to_e4m3(-0.0f), 0x80);
}

TEST(E4M3, RandomFloatsMatchBruteForceNearestEven) {
  std::mt19937_64 rng(202);
  std::uniform_real_distribution<double> ex(-14.0, 10.0);
  std::uniform_real_distribution<double> m(1.0, 2.0);
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>((i & 1 ? -1 : 1) * m(rng) * std::exp2(std::floor(ex(rng))));
    ASSERT_EQ(fmt::float_to_e4m3(x), ref_encode_e4m3(x)) << "x = " << x;
  }
}

// ---------------------------------------------------------------- E8M0

TEST(E8M0, Every256BytesDecodeToPowerOfTwoOrNaN) {
  for (int b = 0; b < 256; ++b)
    EXPECT_TRUE(same(fmt::e8m0_to_float(static_cast<uint8_t>(b)), ref_e8m0(b))) << "byte " << b;
  EXPECT_EQ(fmt::e8m0_to_float(127), 1.0f);
  EXPECT_GT(fmt::e8m0_to_float(0), 0.0f) << "2^-127 is a float subnormal, not zero";
}

TEST(E8M0, InverseScaleIsExactForEveryFiniteByte) {
  for (int b = 0; b < 255; ++b)
    EXPECT_EQ(static_cast<double>(fmt::mx_inv_scale(static_cast<uint8_t>(b))),
              std::ldexp(1.0, 127 - b))
        << "byte " << b;
}

// ---------------------------------------------------------------- BF16

uint16_t ref_bf16(float x) {
  const uint32_t u = bits(x);
  if (std::isnan(x)) return 0;  // checked separately
  const uint32_t lo = u >> 16, rest = u & 0xFFFF;
  if (rest > 0x8000 || (rest == 0x8000 && (lo & 1))) return static_cast<uint16_t>(lo + 1);
  return static_cast<uint16_t>(lo);
}

TEST(BF16, DecodeIsTheTopHalfOfAFloatForAll65536Patterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = fmt::bf16_to_float(static_cast<uint16_t>(b));
    EXPECT_EQ(bits(f), b << 16) << "bf16 " << b;
  }
}

TEST(BF16, RoundsToNearestEvenAtTiesAndNeighbours) {
  EXPECT_EQ(fmt::float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(fmt::float_to_bf16(from_bits(0x3F808000u)), 0x3F80) << "tie, even below";
  EXPECT_EQ(fmt::float_to_bf16(from_bits(0x3F818000u)), 0x3F82) << "tie, even above";
  EXPECT_EQ(fmt::float_to_bf16(from_bits(0x3F808001u)), 0x3F81) << "just above tie";
  EXPECT_EQ(fmt::float_to_bf16(from_bits(0x3F807FFFu)), 0x3F80) << "just below tie";
  EXPECT_EQ(fmt::float_to_bf16(from_bits(0xBF818000u)), 0xBF82) << "negative tie";
  EXPECT_EQ(fmt::float_to_bf16(kInfF), 0x7F80);
  EXPECT_EQ(fmt::float_to_bf16(-kInfF), 0xFF80);
  EXPECT_EQ(fmt::float_to_bf16(FLT_MAX), 0x7F80) << "overflows to Inf as IEEE RNE does";
  EXPECT_EQ(fmt::float_to_bf16(-0.0f), 0x8000);
  // Every tie between consecutive bf16 values of one binade, both signs.
  for (uint32_t b = 0x3F00; b < 0x3F7F; ++b) {
    for (uint32_t sb : {0u, 0x8000u}) {
      const uint32_t tie = ((b | sb) << 16) | 0x8000u;
      const uint16_t even = static_cast<uint16_t>(((b & 1) ? b + 1 : b) | sb);
      EXPECT_EQ(fmt::float_to_bf16(from_bits(tie)), even) << std::hex << tie;
    }
  }
}

TEST(BF16, RandomBitPatternsMatchIndependentRne) {
  std::mt19937 rng(303);
  for (int i = 0; i < 1000000; ++i) {
    const float x = from_bits(rng());
    if (std::isnan(x)) continue;
    ASSERT_EQ(fmt::float_to_bf16(x), ref_bf16(x)) << std::hex << bits(x);
  }
}

TEST(BF16, NaNStaysNaNKeepingSignEvenForSignallingPayloads) {
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fffffffu}) {
    const uint16_t b = fmt::float_to_bf16(from_bits(u));
    EXPECT_TRUE(std::isnan(fmt::bf16_to_float(b))) << std::hex << u;
    EXPECT_EQ(b >> 15, u >> 31) << std::hex << u;
  }
}

// ---------------------------------------------------------------- scale rule

TEST(ScaleRule, RoundUpWorkedExamplesE2M1) {
  const auto up = [](float a) { return fmt::mx_scale_byte(a, 6.0f, 2, ScaleRule::RoundUp); };
  EXPECT_EQ(up(6.0f), 127) << "amax exactly 6*2^0";
  EXPECT_EQ(up(std::nextafter(6.0f, 7.0f)), 128) << "just above 6";
  EXPECT_EQ(up(0.75f), 124) << "amax exactly 6*2^-3";
  EXPECT_EQ(up(std::nextafter(0.75f, 1.0f)), 125);
  EXPECT_EQ(up(1.0f), 125) << "1/2^-2 = 4 <= 6 < 8";
  EXPECT_EQ(up(7.0f), 128);
  EXPECT_EQ(up(6.0f * 1024.0f), 137);
}

TEST(ScaleRule, FloorWorkedExamplesDifferFromRoundUp) {
  const auto fl = [](float a) { return fmt::mx_scale_byte(a, 6.0f, 2, ScaleRule::Floor); };
  EXPECT_EQ(fl(7.0f), 127) << "floor(log2 7) - 2 = 0: 7 then saturates to 6";
  EXPECT_EQ(fl(6.0f), 127);
  EXPECT_EQ(fl(4.0f), 127);
  EXPECT_EQ(fl(std::nextafter(4.0f, 0.0f)), 126);
  const auto fl8 = [](float a) { return fmt::mx_scale_byte(a, 448.0f, 8, ScaleRule::Floor); };
  const auto up8 = [](float a) { return fmt::mx_scale_byte(a, 448.0f, 8, ScaleRule::RoundUp); };
  EXPECT_EQ(up8(448.0f), 127);
  EXPECT_EQ(up8(449.0f), 128);
  EXPECT_EQ(fl8(449.0f), 127);
  EXPECT_EQ(up8(500.0f), 128);
  EXPECT_EQ(fl8(500.0f), 127);
  EXPECT_EQ(up8(1.0f), 119);
  EXPECT_EQ(fl8(1.0f), 119);
}

// mx_scale_byte uses integer arithmetic; the definition it must equal: floor(log2 amax)
// from frexp, then (round-up) the smallest s with amax <= max_elem * 2^s in double.
TEST(ScaleRule, IntegerFormEqualsFrexpDefinitionOnSampledFloats) {
  const auto oracle = [](float amax, float max_elem, int emax, ScaleRule rule) -> int {
    if (!(amax > 0.0f)) return 0;
    if (std::isinf(amax)) return 0xFE;
    int e;
    std::frexp(amax, &e);
    int s = (e - 1) - emax;
    if (rule == ScaleRule::RoundUp) {
      s -= 1;
      while (static_cast<double>(amax) > std::ldexp(static_cast<double>(max_elem), s)) ++s;
    }
    return std::clamp(s, -127, 127) + 127;
  };
  int64_t bad = 0;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) {  // every exponent, sign and range
    const float x = from_bits(static_cast<uint32_t>(u));
    for (ScaleRule r : {ScaleRule::RoundUp, ScaleRule::Floor}) {
      bad += fmt::mx_scale_byte(x, 448.0f, 8, r) != oracle(x, 448.0f, 8, r);
      bad += fmt::mx_scale_byte(x, 6.0f, 2, r) != oracle(x, 6.0f, 2, r);
      bad += fmt::mx_scale_byte(x, 0.5f, -1, r) != oracle(x, 0.5f, -1, r);
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(ScaleRule, ZeroInfTinyAndHugeAmax) {
  for (ScaleRule r : {ScaleRule::RoundUp, ScaleRule::Floor}) {
    EXPECT_EQ(fmt::mx_scale_byte(0.0f, 6.0f, 2, r), 0) << "amax 0 -> byte 0";
    EXPECT_EQ(fmt::mx_scale_byte(kInfF, 6.0f, 2, r), 0xFE) << "Inf saturates, never 0xFF";
    EXPECT_EQ(fmt::mx_scale_byte(kInfF, 448.0f, 8, r), 0xFE);
    EXPECT_EQ(fmt::mx_scale_byte(from_bits(1), 6.0f, 2, r), 0) << "2^-149 clamps to 2^-127";
    EXPECT_EQ(fmt::mx_scale_byte(FLT_MIN, 448.0f, 8, r), 0);
    // The largest float needs 2^126 (E2M1) / 2^120 (E4M3) under round-up: in range.
    EXPECT_EQ(fmt::mx_scale_byte(FLT_MAX, 6.0f, 2, r), r == ScaleRule::RoundUp ? 253 : 252);
    EXPECT_EQ(fmt::mx_scale_byte(FLT_MAX, 448.0f, 8, r), r == ScaleRule::RoundUp ? 247 : 246);
    // An element type with max < 1 would need 2^128: clamps to byte 254, not 0xFF.
    EXPECT_EQ(fmt::mx_scale_byte(FLT_MAX, 0.5f, -1, r), 254);
  }
}

TEST(ScaleRule, SweepMatchesIndependentSearchForBothRulesAndTypes) {
  std::vector<float> amaxes;
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    amaxes.push_back(p);
    amaxes.push_back(std::nextafter(p, kInfF));
    if (e > -149) amaxes.push_back(std::nextafter(p, 0.0f));
    for (float m : {6.0f, 448.0f, 3.0f, 1.5f, 1.75f}) {
      const float v = std::ldexp(m, e);
      if (std::isfinite(v) && v > 0) {
        amaxes.push_back(v);
        amaxes.push_back(std::nextafter(v, kInfF));
      }
    }
  }
  std::mt19937 rng(404);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::fabs(from_bits(rng() & 0x7fffffffu));
    if (std::isfinite(x)) amaxes.push_back(x);
  }
  for (float a : amaxes) {
    for (ScaleRule r : {ScaleRule::RoundUp, ScaleRule::Floor}) {
      ASSERT_EQ(fmt::mx_scale_byte(a, 6.0f, 2, r), ref_scale_byte(a, 6.0, 2, r))
          << "E2M1 amax " << a << " rule " << static_cast<int>(r);
      ASSERT_EQ(fmt::mx_scale_byte(a, 448.0f, 8, r), ref_scale_byte(a, 448.0, 8, r))
          << "E4M3 amax " << a << " rule " << static_cast<int>(r);
    }
  }
}

// ---------------------------------------------------------------- block quantizer

// Random 32-blocks over a wide range of magnitudes, with a per-block exponent and
// in-block dynamic range so that subnormal codes and flushes to zero occur too.
std::vector<float> random_block(std::mt19937_64& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_int_distribution<int> be(-40, 40), spread(0, 12);
  const int e = be(rng), sp = spread(rng);
  std::uniform_int_distribution<int> ie(-sp, 0);
  std::vector<float> x(kMxBlock);
  for (float& v : x) v = std::ldexp(n(rng), e + ie(rng));
  return x;
}

TEST(QuantizeE4M3, RandomBlocksErrorWithinHalfUlpAndAmaxNeverSaturates) {
  std::mt19937_64 rng(505);
  for (int it = 0; it < 20000; ++it) {
    const std::vector<float> x = random_block(rng);
    uint8_t codes[kMxBlock], sb;
    fmt::quantize_block_e4m3(x.data(), codes, &sb);
    const double amax = fmt::block_amax(x.data(), kMxBlock);
    ASSERT_EQ(sb, ref_scale_byte(amax, 448.0, 8, ScaleRule::RoundUp));
    const int s = sb - 127;
    ASSERT_LE(std::ldexp(amax, -s), 448.0) << "round-up scale leaves amax in range";
    for (int i = 0; i < kMxBlock; ++i) {
      const double y = std::ldexp(static_cast<double>(x[i]), -s);
      const double d = fmt::dequant_e4m3(codes[i], sb);
      ASSERT_LE(std::fabs(d - x[i]), std::ldexp(ulp_e4m3(y), s) / 2)
          << "block " << it << " elem " << i << " x " << x[i];
      ASSERT_EQ(codes[i], ref_encode_e4m3(y)) << "block " << it << " elem " << i;
    }
  }
}

TEST(QuantizeE2M1, RandomBlocksErrorWithinHalfUlpAndAmaxNeverSaturates) {
  std::mt19937_64 rng(606);
  for (int it = 0; it < 20000; ++it) {
    const std::vector<float> x = random_block(rng);
    uint8_t packed[kMxBlock / 2], sb;
    fmt::quantize_block_e2m1(x.data(), packed, &sb);
    const double amax = fmt::block_amax(x.data(), kMxBlock);
    ASSERT_EQ(sb, ref_scale_byte(amax, 6.0, 2, ScaleRule::RoundUp));
    const int s = sb - 127;
    ASSERT_LE(std::ldexp(amax, -s), 6.0);
    for (int i = 0; i < kMxBlock; ++i) {
      const double y = std::ldexp(static_cast<double>(x[i]), -s);
      const double d = fmt::dequant_e2m1(packed[i / 2], i & 1, sb);
      ASSERT_LE(std::fabs(d - x[i]), std::ldexp(ulp_e2m1(y), s) / 2)
          << "block " << it << " elem " << i << " x " << x[i];
      const int code = (i & 1) ? packed[i / 2] >> 4 : packed[i / 2] & 15;
      ASSERT_EQ(code, ref_encode_e2m1(y)) << "block " << it << " elem " << i;
    }
  }
}

// Requantizing a dequantized block reproduces its values always, and its bytes unless the
// block's largest code is max/2 exactly (rounded down onto a binade edge): then the round-
// up rule legitimately picks the next smaller scale for the same values.
TEST(QuantizeE4M3, RequantizingADequantizedBlockIsIdempotent) {
  std::mt19937_64 rng(707);
  int byte_equal = 0;
  for (int it = 0; it < 20000; ++it) {
    const std::vector<float> x = random_block(rng);
    uint8_t c1[kMxBlock], s1, c2[kMxBlock], s2;
    fmt::quantize_block_e4m3(x.data(), c1, &s1);
    float y[kMxBlock];
    double maxcode = 0;
    for (int i = 0; i < kMxBlock; ++i) {
      y[i] = static_cast<float>(fmt::dequant_e4m3(c1[i], s1));
      maxcode = std::max(maxcode, std::fabs(static_cast<double>(fmt::e4m3_to_float(c1[i]))));
    }
    fmt::quantize_block_e4m3(y, c2, &s2);
    for (int i = 0; i < kMxBlock; ++i)
      ASSERT_TRUE(same(fmt::dequant_e4m3(c2[i], s2), y[i])) << "block " << it << " elem " << i;
    if (maxcode > 224.0) {
      ASSERT_EQ(s2, s1) << "block " << it;
      ASSERT_EQ(0, std::memcmp(c1, c2, kMxBlock)) << "block " << it;
      ++byte_equal;
    } else {
      ASSERT_EQ(s2, s1 - 1) << "block " << it << " max code " << maxcode;
    }
  }
  EXPECT_GT(byte_equal, 17000);  // ~5% of blocks land on the edge
}

TEST(QuantizeE2M1, RequantizingADequantizedBlockIsIdempotent) {
  std::mt19937_64 rng(808);
  int byte_equal = 0;
  for (int it = 0; it < 20000; ++it) {
    const std::vector<float> x = random_block(rng);
    uint8_t p1[kMxBlock / 2], s1, p2[kMxBlock / 2], s2;
    fmt::quantize_block_e2m1(x.data(), p1, &s1);
    float y[kMxBlock];
    double maxcode = 0;
    for (int i = 0; i < kMxBlock; ++i) {
      y[i] = static_cast<float>(fmt::dequant_e2m1(p1[i / 2], i & 1, s1));
      const uint8_t c = (i & 1) ? p1[i / 2] >> 4 : p1[i / 2] & 15;
      maxcode = std::max(maxcode, std::fabs(static_cast<double>(fmt::e2m1_to_float(c))));
    }
    fmt::quantize_block_e2m1(y, p2, &s2);
    for (int i = 0; i < kMxBlock; ++i)
      ASSERT_TRUE(same(fmt::dequant_e2m1(p2[i / 2], i & 1, s2), y[i]))
          << "block " << it << " elem " << i;
    if (maxcode > 3.0) {
      ASSERT_EQ(s2, s1) << "block " << it;
      ASSERT_EQ(0, std::memcmp(p1, p2, kMxBlock / 2)) << "block " << it;
      ++byte_equal;
    } else {
      ASSERT_EQ(s2, s1 - 1) << "block " << it << " max code " << maxcode;
    }
  }
  EXPECT_GT(byte_equal, 13000);  // ~22% of blocks land on the edge
}

TEST(QuantizeE2M1, PacksElementTwoIInLowNibble) {
  float x[kMxBlock];
  for (int i = 0; i < kMxBlock; ++i) x[i] = (i % 2 == 0) ? 0.5f : 6.0f;  // codes 1 and 7
  uint8_t packed[kMxBlock / 2], sb;
  fmt::quantize_block_e2m1(x, packed, &sb);
  EXPECT_EQ(sb, 127);
  for (int i = 0; i < kMxBlock / 2; ++i) EXPECT_EQ(packed[i], 0x71) << i;
  EXPECT_EQ(fmt::dequant_e2m1(0x71, 0, 127), 0.5);
  EXPECT_EQ(fmt::dequant_e2m1(0x71, 1, 127), 6.0);
}

TEST(QuantizeE2M1, BlockWithNaNGetsScaleFFAndDequantizesToNaN) {
  std::mt19937_64 rng(909);
  std::vector<float> x = random_block(rng);
  x[17] = kNaNF;
  uint8_t packed[kMxBlock / 2], sb;
  fmt::quantize_block_e2m1(x.data(), packed, &sb);
  EXPECT_EQ(sb, 0xFF);
  for (int i = 0; i < kMxBlock; ++i)
    EXPECT_TRUE(std::isnan(fmt::dequant_e2m1(packed[i / 2], i & 1, sb))) << i;
}

TEST(QuantizeE4M3, NaNElementBecomesNaNCodeOthersUnaffected) {
  std::mt19937_64 rng(1001);
  std::vector<float> x = random_block(rng);
  std::vector<float> clean = x;
  x[5] = kNaNF;
  clean[5] = 0.0f;
  uint8_t c1[kMxBlock], s1, c2[kMxBlock], s2;
  fmt::quantize_block_e4m3(x.data(), c1, &s1);
  fmt::quantize_block_e4m3(clean.data(), c2, &s2);
  // amax ignores NaN, so the block quantizes as if the NaN were a zero.
  EXPECT_EQ(c1[5] & 0x7F, 0x7F);
  EXPECT_TRUE(std::isnan(fmt::dequant_e4m3(c1[5], s1)));
  EXPECT_EQ(s1, s2);
  for (int i = 0; i < kMxBlock; ++i) {
    if (i != 5) EXPECT_EQ(c1[i], c2[i]) << i;
  }
}

// ±Inf saturates at the scale of the block's finite values (formats.h): the finite
// elements quantize exactly as they would without the Inf, and the Inf becomes ±max.
TEST(QuantizeE4M3, InfinitySaturatesAtTheFiniteBlockScale) {
  std::mt19937_64 rng(1102);
  std::vector<float> x = random_block(rng);
  std::vector<float> finite = x;
  finite[3] = 0.0f;
  x[3] = -kInfF;
  uint8_t codes[kMxBlock], sb, ref_codes[kMxBlock], ref_sb;
  fmt::quantize_block_e4m3(x.data(), codes, &sb);
  fmt::quantize_block_e4m3(finite.data(), ref_codes, &ref_sb);
  EXPECT_EQ(sb, ref_sb) << "the scale comes from the finite elements";
  EXPECT_NE(sb, 0xFF);
  EXPECT_EQ(codes[3], 0xFE) << "-Inf saturates to -448";
  for (int i = 0; i < kMxBlock; ++i)
    if (i != 3) EXPECT_EQ(codes[i], ref_codes[i]) << i;
  EXPECT_EQ(fmt::dequant_e4m3(codes[3], sb), -448.0 * std::ldexp(1.0, sb - 127));
}

// amax_term (what the GPU epilogues' fmaxf amax takes of each value): |x| for every finite
// float, NaN for ±Inf and NaN; so the running max is block_amax's, the finite elements'.
TEST(AmaxTerm, AbsOfEveryFiniteFloatAndNaNForInfinitiesAndNaNs) {
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 0x101) {  // every 257th float
    const float x = fmt::bits_float(static_cast<uint32_t>(u));
    const float t = fmt::amax_term(x);
    if (std::isfinite(x)) {
      ASSERT_EQ(fmt::float_bits(t), fmt::float_bits(std::fabs(x))) << std::hex << u;
    } else {
      ASSERT_TRUE(std::isnan(t)) << std::hex << u;
    }
  }
  for (float x : {0.0f, -0.0f, FLT_MIN, -FLT_MIN, FLT_TRUE_MIN, -FLT_TRUE_MIN, FLT_MAX, -FLT_MAX})
    EXPECT_EQ(fmt::float_bits(fmt::amax_term(x)), fmt::float_bits(std::fabs(x))) << x;
  EXPECT_TRUE(std::isnan(fmt::amax_term(kInfF)));
  EXPECT_TRUE(std::isnan(fmt::amax_term(-kInfF)));
  EXPECT_TRUE(std::isnan(fmt::amax_term(std::numeric_limits<float>::quiet_NaN())));
  // A block with ±Inf and NaN among finite values: the fmaxf reduction is the finite amax.
  std::mt19937_64 rng(77);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x = random_block(rng);
    x[trial % kMxBlock] = trial % 3 == 0 ? kInfF : trial % 3 == 1 ? -kInfF : std::numeric_limits<float>::quiet_NaN();
    float want = 0.0f;
    for (float v : x)
      if (std::isfinite(v)) want = std::max(want, std::fabs(v));
    EXPECT_EQ(fmt::block_amax(x.data(), kMxBlock), want);
  }
}

TEST(QuantizeE2M1, InfinitySaturatesAtTheFiniteBlockScale) {
  float x[kMxBlock];
  for (int i = 0; i < kMxBlock; ++i) x[i] = 1.0f + i;  // amax 32 -> 32 <= 6 * 2^3: s = 3
  x[9] = kInfF;
  uint8_t packed[kMxBlock / 2], sb;
  fmt::quantize_block_e2m1(x, packed, &sb);
  EXPECT_EQ(sb, 127 + 3);
  EXPECT_EQ(packed[4] >> 4, 7) << "+Inf saturates to +6";
}

TEST(QuantizeBoth, AllInfinityBlockHasFiniteScale) {
  float x[kMxBlock];
  for (int i = 0; i < kMxBlock; ++i) x[i] = (i & 1) ? -kInfF : kInfF;
  uint8_t codes[kMxBlock], packed[kMxBlock / 2], s8, s4;
  fmt::quantize_block_e4m3(x, codes, &s8);
  fmt::quantize_block_e2m1(x, packed, &s4);
  EXPECT_EQ(s8, 0) << "no finite element: amax 0";
  EXPECT_EQ(s4, 0);
  for (int i = 0; i < kMxBlock; ++i) EXPECT_EQ(codes[i], (i & 1) ? 0xFE : 0x7E) << i;
  for (int i = 0; i < kMxBlock / 2; ++i) EXPECT_EQ(packed[i], 0xF7) << i;
}

TEST(QuantizeBoth, ZeroBlockGivesScaleByteZeroAndZeroCodes) {
  float x[kMxBlock] = {};
  uint8_t codes[kMxBlock], packed[kMxBlock / 2], s8 = 1, s4 = 1;
  fmt::quantize_block_e4m3(x, codes, &s8);
  fmt::quantize_block_e2m1(x, packed, &s4);
  EXPECT_EQ(s8, 0);
  EXPECT_EQ(s4, 0);
  for (uint8_t c : codes) EXPECT_EQ(c, 0);
  for (uint8_t p : packed) EXPECT_EQ(p, 0);
}

TEST(QuantizeBoth, FloorRuleSaturatesWhereRoundUpDoesNot) {
  float x[kMxBlock];
  for (int i = 0; i < kMxBlock; ++i) x[i] = 0.25f * (i % 5);
  x[0] = 7.0f;  // E2M1: floor rule gives 2^0 and 7 saturates to 6
  uint8_t packed[kMxBlock / 2], sb;
  fmt::quantize_block_e2m1(x, packed, &sb, ScaleRule::Floor);
  EXPECT_EQ(sb, 127);
  EXPECT_EQ(fmt::dequant_e2m1(packed[0], 0, sb), 6.0);
  fmt::quantize_block_e2m1(x, packed, &sb, ScaleRule::RoundUp);
  EXPECT_EQ(sb, 128);
  EXPECT_EQ(fmt::dequant_e2m1(packed[0], 0, sb), 8.0) << "7/2 = 3.5 ties to 4";
}

TEST(Dequant, ScaleFFIsNaNForEveryCode) {
  for (int c = 0; c < 256; ++c) {
    EXPECT_TRUE(std::isnan(fmt::dequant_e4m3(static_cast<uint8_t>(c), 0xFF))) << c;
    EXPECT_TRUE(std::isnan(fmt::dequant_e2m1(static_cast<uint8_t>(c), c & 1, 0xFF))) << c;
  }
}

TEST(Dequant, ExactProductOfCodeAndScaleForAllCodesAndScales) {
  for (int b = 0; b < 255; ++b) {
    for (int c = 0; c < 256; ++c) {
      const double want4 = ref_e4m3(c) * std::ldexp(1.0, b - 127);
      ASSERT_TRUE(same(fmt::dequant_e4m3(static_cast<uint8_t>(c), static_cast<uint8_t>(b)), want4))
          << c << " " << b;
      const double want2 = ref_e2m1(c >> 4) * std::ldexp(1.0, b - 127);
      ASSERT_TRUE(same(fmt::dequant_e2m1(static_cast<uint8_t>(c), 1, static_cast<uint8_t>(b)),
                       want2))
          << c << " " << b;
    }
  }
}

}  // namespace
