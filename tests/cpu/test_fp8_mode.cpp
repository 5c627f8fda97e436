// Tests of the FP8 mode's re-expression numerics (include/mxmoe/fp8_mode.h): exhaustive
// over codes, scale bytes and spreads, with expected values computed here independently
// (E4M3 and E2M1 values from the OCP formulas in double, nearest E4M3 by brute force).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mxmoe/fp8_mode.h"

namespace {

using namespace mxmoe;
namespace f8 = mxmoe::fp8mode;

/// E4M3 (fn) code -> value in double; NaN for the NaN codes.
double e4m3_value(uint8_t code) {
  const int e = (code >> 3) & 0xF, m = code & 7;
  if (e == 0xF && m == 7) return std::nan("");
  const double mag = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (code & 0x80) ? -mag : mag;
}
double e2m1_value(uint8_t code) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}
/// Nearest E4M3 code to x (|x| <= 448), ties to the even code, sign of x kept.
uint8_t nearest_e4m3(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  uint8_t best = 0;
  double best_err = INFINITY;
  for (int c = 0; c <= 0x7E; ++c) {
    const double err = std::fabs(e4m3_value(static_cast<uint8_t>(c)) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return sign | best;
}

TEST(Fp8Mode, WeightCodesExactForEveryCodeByteAndSpreadUpToTheBound) {
  for (int c = 0; c < 16; ++c)
    for (int b = 0; b <= 254; ++b)
      for (int d = 0; d <= f8::kMaxWeightSpread && b + d <= 254; ++d) {
        const uint8_t w = f8::weight_code(static_cast<uint8_t>(c), static_cast<uint8_t>(b),
                                          static_cast<uint8_t>(b + d));
        const double got = e4m3_value(w) * std::ldexp(1.0, b + d - 127);
        const double want = e2m1_value(static_cast<uint8_t>(c)) * std::ldexp(1.0, b - 127);
        ASSERT_EQ(got, want) << "code " << c << " byte " << b << " spread " << d;
        ASSERT_EQ(std::signbit(got), std::signbit(want)) << "sign of zero, code " << c;
      }
  // One binade more and the smallest magnitude (0.5 * 2^-9 = 2^-10) is off the grid:
  // why the mode refuses larger spreads.
  const uint8_t w = f8::weight_code(1, 100, 100 + f8::kMaxWeightSpread + 1);
  EXPECT_NE(e4m3_value(w), 0.5 * std::ldexp(1.0, -9)) << "spread 9 would have to round";
  // A NaN group byte gives the NaN code.
  EXPECT_TRUE(std::isnan(e4m3_value(f8::weight_code(3, 120, fmt::kE8m0Nan))));
}

// The row form: every code of a block with byte b under a row whose largest byte is B,
// B - b in [0, kMaxRowSpread], times the row scale 2^(B - kRowHeadroom - 127), is the
// MXFP4 value exactly (bytes down to 0: the row exponent may be negative).
TEST(Fp8Mode, RowFormWeightCodesExactWithinTheRowSpread) {
  for (int c = 0; c < 16; ++c)
    for (int B = 0; B <= 254; ++B)
      for (int d = 0; d <= f8::kMaxRowSpread && d <= B; ++d) {
        const int row_exp = B - f8::kRowHeadroom;
        const uint8_t w = f8::weight_row_code(static_cast<uint8_t>(c), static_cast<uint8_t>(B - d), row_exp);
        const double got = e4m3_value(w) * std::ldexp(1.0, row_exp - 127);
        const double want = e2m1_value(static_cast<uint8_t>(c)) * std::ldexp(1.0, B - d - 127);
        ASSERT_EQ(got, want) << "code " << c << " row byte " << B << " spread " << d;
        ASSERT_EQ(std::signbit(got), std::signbit(want)) << "sign of zero, code " << c;
      }
  // One binade more and 0.5 * 2^-9 is off the E4M3 grid, as for the group form.
  const uint8_t w = f8::weight_row_code(1, 100 - f8::kMaxRowSpread - 1, 100 - f8::kRowHeadroom);
  EXPECT_NE(e4m3_value(w), 0.5 * std::ldexp(1.0, -9)) << "spread 15 would have to round";
  // The largest code at the row's largest byte is 6 * 2^6 = 384: within E4M3's 448.
  EXPECT_EQ(e4m3_value(f8::weight_row_code(7, 130, 130 - f8::kRowHeadroom)), 384.0);
}

TEST(Fp8Mode, RowFormOfTakesTheLargestUsedByteNaNRowsAndTheFirstOffender) {
  const int64_t rows = 2, K = 320, nb = K / 32;
  std::vector<uint8_t> packed(rows * K / 2, 0x21), scales(rows * nb, 120);
  scales[3] = 125;
  scales[4] = 125 - f8::kMaxRowSpread;  // row 0: spread 14 fits
  f8::RowForm f = f8::row_form_of(packed.data(), scales.data(), nb);
  EXPECT_TRUE(f.fits);
  EXPECT_FALSE(f.nan_row);
  EXPECT_EQ(f.max_byte, 125);
  EXPECT_EQ(f.row_exp(), 125 - f8::kRowHeadroom);
  std::string why;
  EXPECT_TRUE(f8::weights_fit_row_form(packed.data(), scales.data(), rows, K, &why)) << why;
  scales[nb + 6] = 200;  // row 1: block 6 raises the row's largest byte, 80 above the rest
  EXPECT_FALSE(f8::weights_fit_row_form(packed.data(), scales.data(), rows, K, &why));
  EXPECT_NE(why.find("row 1: block 0's scale byte 120 lies 80 binades below the row's 200"), std::string::npos) << why;
  // Blocks of zero codes (+0, -0) take no part: their bytes neither raise nor spread.
  for (int64_t b = 0; b < nb; ++b)
    if (b != 6)
      for (int j = 0; j < 16; ++j) packed[(nb + b) * 16 + j] = (j & 1) ? 0x88 : 0x00;
  EXPECT_TRUE(f8::weights_fit_row_form(packed.data(), scales.data(), rows, K, &why)) << why;
  for (int j = 0; j < 16; ++j) packed[(nb + 6) * 16 + j] = 0x00;
  f = f8::row_form_of(packed.data() + nb * 16, scales.data() + nb, nb);
  EXPECT_EQ(f.max_byte, 0) << "a row of zeros";
  // A NaN byte makes the row NaN (also over zero codes: 0 x NaN is NaN), whatever the spread.
  scales[nb + 2] = fmt::kE8m0Nan;
  scales[nb + 3] = 1;
  packed[(nb + 3) * 16] = 0x01;
  f = f8::row_form_of(packed.data() + nb * 16, scales.data() + nb, nb);
  EXPECT_TRUE(f.nan_row);
  EXPECT_TRUE(f.fits);
}

TEST(Fp8Mode, ActivationCodeIsTheNearestE4m3AndWithinItsBound) {
  double worst = 0;  // largest error seen below the normal range
  for (int c = 0; c < 256; ++c)
    for (int d = 0; d <= 24; ++d) {
      const uint8_t t = 110, T = static_cast<uint8_t>(110 + d);
      const uint8_t got = f8::activation_code(static_cast<uint8_t>(c), t, T);
      const double v = e4m3_value(static_cast<uint8_t>(c));
      if (std::isnan(v)) {
        ASSERT_TRUE(std::isnan(e4m3_value(got))) << "NaN code " << c;
        continue;
      }
      const double x = v * std::ldexp(1.0, -d);  // exact value in units of 2^(T-127)
      const uint8_t want = nearest_e4m3(x);
      // +-0: only the sign of a zero result may follow either convention.
      if (e4m3_value(want) == 0.0) {
        ASSERT_EQ(e4m3_value(got), 0.0) << "code " << c << " spread " << d;
      } else {
        ASSERT_EQ(got, want) << "code " << c << " spread " << d;
      }
      const double err = std::fabs(e4m3_value(got) - x);
      ASSERT_LE(err, f8::activation_error_bound(std::fabs(x))) << "code " << c << " spread " << d;
      if (std::fabs(x) >= std::ldexp(1.0, -6)) ASSERT_EQ(err, 0.0) << "normal range: exact";
      worst = std::max(worst, err);
      if (d == 0) ASSERT_EQ(e4m3_value(got), v) << "no spread: exact, code " << c;
    }
  EXPECT_EQ(worst, std::ldexp(1.0, -10)) << "the bound is reached (a tie at 2^-10)";
  EXPECT_TRUE(std::isnan(e4m3_value(f8::activation_code(0x38, 120, fmt::kE8m0Nan))));
  EXPECT_EQ(e4m3_value(f8::activation_code(0x7E, 0, 254)), 0.0);  // 448 * 2^-254
}

TEST(Fp8Mode, GroupScaleByteTakesTheLargestUsedByteAndNaN) {
  const uint8_t b[4] = {120, 131, 127, 90};
  EXPECT_EQ(f8::group_scale_byte(b, 4), 131);
  const bool used[4] = {true, false, true, true};
  EXPECT_EQ(f8::group_scale_byte(b, 4, used), 127);
  const uint8_t n[4] = {120, 0xFF, 127, 90};
  EXPECT_EQ(f8::group_scale_byte(n, 4), 0xFF);
  EXPECT_EQ(f8::group_scale_byte(n, 4, used), 127);  // the NaN block holds only zeros
  const bool none[4] = {false, false, false, false};
  EXPECT_EQ(f8::group_scale_byte(b, 4, none), 0);
  EXPECT_EQ(f8::group_scale_byte(b, 3), 131);  // a partial last group
}

TEST(Fp8Mode, WeightsFitChecksEveryGroupAndNamesTheFirstOffender) {
  const int64_t rows = 3, K = 320;  // 10 blocks: groups of 4, 4 and 2
  std::vector<uint8_t> packed(rows * K / 2, 0x21), scales(rows * K / 32, 127);
  std::string why;
  EXPECT_TRUE(f8::weights_fit_fp8_mode(packed.data(), scales.data(), rows, K, &why)) << why;
  scales[1 * 10 + 9] = 127 + f8::kMaxWeightSpread;  // row 1, last (partial) group: spread 8
  EXPECT_TRUE(f8::weights_fit_fp8_mode(packed.data(), scales.data(), rows, K, &why)) << why;
  scales[2 * 10 + 5] = 127 - f8::kMaxWeightSpread - 1;  // row 2, group 1: spread 9
  EXPECT_FALSE(f8::weights_fit_fp8_mode(packed.data(), scales.data(), rows, K, &why));
  EXPECT_NE(why.find("row 2, K group 1"), std::string::npos) << why;
  EXPECT_NE(why.find("9 binades"), std::string::npos) << why;
  // The same block holding only zero codes (+0 and -0) does not count.
  for (int j = 0; j < 16; ++j) packed[2 * (K / 2) + 5 * 16 + j] = (j & 1) ? 0x88 : 0x00;
  EXPECT_TRUE(f8::weights_fit_fp8_mode(packed.data(), scales.data(), rows, K, &why)) << why;
  // A NaN byte makes its group NaN, whatever the spread of the others.
  scales[0 * 10 + 0] = fmt::kE8m0Nan;
  scales[0 * 10 + 1] = 1;
  EXPECT_TRUE(f8::weights_fit_fp8_mode(packed.data(), scales.data(), rows, K, &why)) << why;
  // ... also over a block of zero codes (0 x NaN is NaN): the group is NaN, not refused.
  for (int j = 0; j < 16; ++j) packed[0 * (K / 2) + 0 * 16 + j] = 0x00;
  EXPECT_TRUE(f8::weights_fit_fp8_mode(packed.data(), scales.data(), rows, K, &why)) << why;
}

TEST(Fp8Mode, WeightBlockUsedByNonzeroCodesOrANaNByte) {
  std::vector<uint8_t> block(16, 0x00);
  EXPECT_FALSE(f8::weight_block_used(block.data(), 200));
  for (auto& b : block) b = 0x88;  // -0 codes only
  EXPECT_FALSE(f8::weight_block_used(block.data(), 127));
  EXPECT_TRUE(f8::weight_block_used(block.data(), fmt::kE8m0Nan));
  block[15] = 0x10;  // one code 1 (0.5) in the last element
  EXPECT_TRUE(f8::weight_block_used(block.data(), 0));
}

// A group's dot product with both operands re-expressed, against the exact one: the
// weights are exact, so the difference is bounded by sum |w| * (activation bound), in
// units of the group scales. Random groups with spreads 0..12 in the activations.
TEST(Fp8Mode, GroupDotProductWithinTheActivationBound) {
  std::mt19937_64 rng(20261130);
  for (int trial = 0; trial < 4000; ++trial) {
    uint8_t wb[4], xb[4], wc[128], xc[128];
    const int wbase = 100 + static_cast<int>(rng() % 40);
    const int xbase = 100 + static_cast<int>(rng() % 40);
    const int xspread = static_cast<int>(trial % 13);
    for (int i = 0; i < 4; ++i) {
      wb[i] = static_cast<uint8_t>(wbase + rng() % (f8::kMaxWeightSpread + 1));
      xb[i] = static_cast<uint8_t>(xbase + rng() % (xspread + 1));
    }
    for (int k = 0; k < 128; ++k) {
      wc[k] = static_cast<uint8_t>(rng() % 16);
      do xc[k] = static_cast<uint8_t>(rng() % 256); while ((xc[k] & 0x7F) == 0x7F);
    }
    const uint8_t S = f8::group_scale_byte(wb, 4), T = f8::group_scale_byte(xb, 4);
    double exact = 0, mode = 0, bound = 0;
    for (int k = 0; k < 128; ++k) {
      const double w = e2m1_value(wc[k]) * std::ldexp(1.0, wb[k / 32] - 127);
      const double x = e4m3_value(xc[k]) * std::ldexp(1.0, xb[k / 32] - 127);
      exact += w * x;
      const double w8 = e4m3_value(f8::weight_code(wc[k], wb[k / 32], S));
      const double x8 = e4m3_value(f8::activation_code(xc[k], xb[k / 32], T));
      mode += w8 * x8;  // in units of 2^(S-127) * 2^(T-127)
      const double xu = std::fabs(x) * std::ldexp(1.0, 127 - T);
      bound += std::fabs(w8) * f8::activation_error_bound(xu);
    }
    const double unit = std::ldexp(1.0, S - 127) * std::ldexp(1.0, T - 127);
    // Both sums are exact in double (at most 128 terms of <= 12 significant bits over a
    // range of < 2^50), so only the re-expression differs.
    ASSERT_LE(std::fabs(mode * unit - exact), bound * unit * (1 + 1e-12))
        << "trial " << trial << " spread " << xspread;
    if (xspread == 0) ASSERT_EQ(mode * unit, exact) << "no activation spread: exact";
  }
}

}  // namespace
