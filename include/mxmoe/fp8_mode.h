// fp8_mode.h — the numerics of the FP8 precision mode (issue 5; SPEC §7: "a faster mode
// that re-expresses MX scales for Hopper FP8 tensor cores ... with a measured error
// bound"). Hopper's FP8 tensor cores take E4M3 operands with one scale per operand row
// and K step, not one per 32 elements, so both operands are re-expressed with one
// power-of-two scale per group of kGroup = 128 along K (the K step after which the FP8
// accumulator is promoted into fp32):
//
//   weights   w = e2m1(c) * 2^(b - 127)   ->  e4m3(c') * 2^(S - 127),  S = max b of the group
//   activation x = e4m3(c) * 2^(t - 127)  ->  e4m3(c') * 2^(T - 127),  T = max t of the group
//
// Weights: e2m1(c) * 2^-d with d = S - b lies on the E4M3 grid for d <= kMaxWeightSpread
// (0.5 * 2^-8 = 2^-9 is E4M3's smallest subnormal, 6 * 2^-8 = 1.5 * 2^-6 its smallest
// normal binade), so the conversion is exact; weights with a larger spread inside one
// group are refused at load time (weights_fit_fp8_mode), never silently rounded.
// Activations: e4m3(c) * 2^-(T - t) is rounded to E4M3 (RNE): exact while it stays in
// E4M3's normal range, else rounded to the subnormal grid, off by at most 2^-10 of the
// group scale (activation_error_bound). Products of the re-expressed operands are exact
// in the tensor cores; their FP8 accumulation over 128 K and its promotion to fp32 belong
// to the kernels (wgmma_fp8.cuh), measured end to end in docs/FP8_MODE.md.
//
// Row form (weights only): where every used block of a weight row lies within
// kMaxRowSpread binades of the row's largest byte B, the row takes ONE scale for all of K,
// R = B - kRowHeadroom, and codes e2m1(c) * 2^(b - R): b - R in [-8, 6] keeps every E2M1
// value on the E4M3 grid (6 * 2^6 = 384 <= 448; 0.5 * 2^-8 = 2^-9). The promotion then
// multiplies by the activation scale alone and the row scale is applied once per tile
// (wgmma_fp8.cuh): the same products, and in fp32 the same sums times a power of two, so
// the results equal the group form's while the fp32 values stay in the normal range.
//
// Host and device functions: the load-time weight conversion (layer.cu fp8_weights) and
// the activation staging kernel (stage_fp8.cu) share them with the tests.
#pragma once

#include <cstdint>
#include <string>

#include "mxmoe/formats.h"

namespace mxmoe::fp8mode {

/// K per FP8 group: one scale per operand row and group, fp32 promotion after each group.
inline constexpr int kGroup = 128;
inline constexpr int kBlocksPerGroup = kGroup / kMxBlock;  // MX blocks per group
/// Largest weight scale spread (group byte minus block byte) converted exactly.
inline constexpr int kMaxWeightSpread = 8;

/// Row form: binades between a row's largest byte and its one scale (E4M3 holds
/// e2m1 * 2^k exactly for k <= 6), and the largest spread of a row's used bytes it holds
/// exactly (k >= -8 as for kMaxWeightSpread).
inline constexpr int kRowHeadroom = 6;
inline constexpr int kMaxRowSpread = kRowHeadroom + kMaxWeightSpread;

/// Group scale byte of `n` MX blocks: the largest byte of the blocks that are `used`
/// (all when `used` is null), 0xFF (NaN) when a used block's byte is 0xFF, 0 when none
/// is used. A NaN block poisons its whole group, which changes no output: every row or
/// token it touches is NaN either way.
MXMOE_HD uint8_t group_scale_byte(const uint8_t* block_bytes, int n, const bool* used = nullptr) {
  uint8_t g = 0;
  for (int i = 0; i < n; ++i) {
    if (used != nullptr && !used[i]) continue;
    if (block_bytes[i] == fmt::kE8m0Nan) return fmt::kE8m0Nan;
    if (block_bytes[i] > g) g = block_bytes[i];
  }
  return g;
}

/// Weight element: E2M1 code `c` of a block with scale byte `block_byte`, re-expressed
/// under the group byte `group_byte` (>= block_byte): the E4M3 code of
/// e2m1(c) * 2^(block_byte - group_byte). Exact for a spread up to kMaxWeightSpread (the
/// caller refuses more: weights_fit_fp8_mode); a NaN group byte gives the NaN code.
MXMOE_HD uint8_t weight_code(uint8_t c, uint8_t block_byte, uint8_t group_byte) {
  const uint8_t sign = (c & 8) ? 0x80 : 0x00;
  if (group_byte == fmt::kE8m0Nan) return sign | fmt::kE4m3Nan;
  const int d = static_cast<int>(group_byte) - static_cast<int>(block_byte);
  if (d > 30) return sign;  // refused inputs only (rounds to +-0)
  // e2m1(c) * 2^-d by exact float scaling, then the (exact) E4M3 encode.
  const float v = fmt::e2m1_to_float(static_cast<uint8_t>(c & 7)) * fmt::e8m0_to_float(static_cast<uint8_t>(127 - d));
  return sign | fmt::float_to_e4m3_sw(v);
}

/// Row form: the E4M3 code of e2m1(c) * 2^(block_byte - row_exp), the row's exponent
/// row_exp = its largest used byte - kRowHeadroom (an int: it may be below 0). Exact while
/// block_byte - row_exp lies in [-8, kRowHeadroom] (weights_fit_row_form).
MXMOE_HD uint8_t weight_row_code(uint8_t c, uint8_t block_byte, int row_exp) {
  const uint8_t sign = (c & 8) ? 0x80 : 0x00;
  const int d = static_cast<int>(block_byte) - row_exp;
  if (d < -30 || d > kRowHeadroom) return sign;  // refused inputs only
  const float v = fmt::e2m1_to_float(static_cast<uint8_t>(c & 7)) * fmt::e8m0_to_float(static_cast<uint8_t>(127 + d));
  return sign | fmt::float_to_e4m3_sw(v);
}

/// Activation element: E4M3 code `c` of a block with scale byte `block_byte`,
/// re-expressed under `group_byte` (>= block_byte): the E4M3 code nearest (RNE) to
/// e4m3(c) * 2^(block_byte - group_byte). NaN codes and a NaN group byte give NaN.
/// Values that fall below E4M3's normal range lose bits (activation_error_bound): the
/// mode's error comes from activation blocks far below the largest of their group.
MXMOE_HD uint8_t activation_code(uint8_t c, uint8_t block_byte, uint8_t group_byte) {
  const uint8_t sign = c & 0x80;
  if (group_byte == fmt::kE8m0Nan || (c & 0x7F) == fmt::kE4m3Nan) return sign | fmt::kE4m3Nan;
  const int d = static_cast<int>(group_byte) - static_cast<int>(block_byte);
  if (d > 40) return sign;  // far below the smallest subnormal: +-0 (rounds there anyway)
  // An exact product (power of two, no underflow in float), then one RNE rounding.
  const float v = fmt::e4m3_to_float(c) * fmt::e8m0_to_float(static_cast<uint8_t>(127 - d));
  return fmt::float_to_e4m3_sw(v);
}

/// Bound on |re-expressed - exact| of one activation element, in units of the group
/// scale 2^(group_byte - 127), for an exact value of magnitude `a` in those units. A value
/// with E4M3's 4 significant bits moved down by whole binades stays on the grid while it
/// is normal (a >= 2^-6): exact. Below, it rounds to the subnormal grid m * 2^-9: at most
/// half a step, 2^-10 (ties reach it).
MXMOE_HD double activation_error_bound(double a) { return a >= 0.015625 ? 0.0 : 0.0009765625; }

/// Whether a weight block (its 16 packed bytes and scale byte) takes part in its group's
/// scale: it holds a nonzero code, or a NaN scale byte (0 x NaN is NaN in MX, so the
/// group must become NaN too, as the reference's row would).
inline bool weight_block_used(const uint8_t* packed16, uint8_t byte) {
  if (byte == fmt::kE8m0Nan) return true;
  for (int j = 0; j < kMxBlock / 2; ++j)
    if ((packed16[j] & 0x77) != 0) return true;
  return false;
}

/// Load-time check of an MXFP4 matrix ([rows][K/2] packed, [rows][K/32] scale bytes, K a
/// multiple of 32) for the FP8 mode: in every row and group of kBlocksPerGroup blocks,
/// each used block (weight_block_used) has a byte within kMaxWeightSpread of the group's
/// largest (a group with a 0xFF byte is NaN whatever the spread, as the block would be).
/// False with the first offending row, group and bytes in `why`.
inline bool weights_fit_fp8_mode(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                                 int64_t K, std::string* why) {
  const int64_t nb = K / kMxBlock;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g0 = 0; g0 < nb; g0 += kBlocksPerGroup) {
      const int n = static_cast<int>(nb - g0 < kBlocksPerGroup ? nb - g0 : kBlocksPerGroup);
      bool used[kBlocksPerGroup] = {};
      const uint8_t* sb = scales + r * nb + g0;
      for (int i = 0; i < n; ++i) used[i] = weight_block_used(packed + r * (K / 2) + (g0 + i) * (kMxBlock / 2), sb[i]);
      const uint8_t gb = group_scale_byte(sb, n, used);
      if (gb == fmt::kE8m0Nan) continue;
      for (int i = 0; i < n; ++i)
        if (used[i] && gb - sb[i] > kMaxWeightSpread) {
          if (why != nullptr)
            *why = "row " + std::to_string(r) + ", K group " + std::to_string(g0 / kBlocksPerGroup) +
                   ": block scale byte " + std::to_string(sb[i]) + " lies " +
                   std::to_string(gb - sb[i]) + " binades below the group's " + std::to_string(gb) +
                   " (the FP8 mode holds at most " + std::to_string(kMaxWeightSpread) + ")";
          return false;
        }
    }
  return true;
}

/// Row form of one weight row (`nb` blocks: packed bytes, scale bytes): its largest used
/// byte (weight_block_used) in `max_byte` (0 when none is used), and whether every used
/// block lies within kMaxRowSpread of it. A used NaN byte makes the row NaN (nan_row), as
/// it makes the reference's row NaN; such a row fits (its codes do not matter).
struct RowForm {
  uint8_t max_byte = 0;
  bool nan_row = false;
  bool fits = true;
  int worst_block = -1;  // the first block beyond the spread, when !fits
  /// The row's exponent: max_byte - kRowHeadroom (weight_row_code).
  int row_exp() const { return static_cast<int>(max_byte) - kRowHeadroom; }
};
inline RowForm row_form_of(const uint8_t* packed, const uint8_t* scales, int64_t nb) {
  RowForm f;
  for (int64_t i = 0; i < nb; ++i) {
    if (!weight_block_used(packed + i * (kMxBlock / 2), scales[i])) continue;
    if (scales[i] == fmt::kE8m0Nan) f.nan_row = true;
    else if (scales[i] > f.max_byte) f.max_byte = scales[i];
  }
  if (f.nan_row) return f;
  for (int64_t i = 0; i < nb && f.fits; ++i)
    if (weight_block_used(packed + i * (kMxBlock / 2), scales[i]) && f.max_byte - scales[i] > kMaxRowSpread) {
      f.fits = false;
      f.worst_block = static_cast<int>(i);
    }
  return f;
}

/// Whether an MXFP4 matrix (as weights_fit_fp8_mode) can take the row form: every row's
/// used bytes within kMaxRowSpread of its largest. False with the first offender in `why`.
inline bool weights_fit_row_form(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                                 int64_t K, std::string* why) {
  const int64_t nb = K / kMxBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const RowForm f = row_form_of(packed + r * (K / 2), scales + r * nb, nb);
    if (f.fits) continue;
    if (why != nullptr)
      *why = "row " + std::to_string(r) + ": block " + std::to_string(f.worst_block) + "'s scale byte " +
             std::to_string(scales[r * nb + f.worst_block]) + " lies " +
             std::to_string(f.max_byte - scales[r * nb + f.worst_block]) + " binades below the row's " +
             std::to_string(f.max_byte) + " (the row form holds at most " + std::to_string(kMaxRowSpread) + ")";
    return false;
  }
  return true;
}

}  // namespace mxmoe::fp8mode
