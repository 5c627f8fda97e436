// mxmoe/formats.h — the one numerics header (SPEC §2).
//
// E2M1 (FP4), E4M3 (FP8 "fn"), E8M0 (power-of-two scale) and BF16 codecs, and the
// MX block quantizer, for host and device alike. The CPU reference, the checkpoint
// generator and every kernel use these definitions, so "the same quantized bytes"
// means the same bytes everywhere. Fast kernels may use hardware conversions, but
// stage tests hold them bit-exact against these functions.
//
// Conventions (SPEC §2):
//  * round to nearest, ties to even; values past the largest finite saturate to it
//    (±Inf included);
//  * NaN is never turned into a number: an MXFP8 NaN element becomes the E4M3 NaN
//    code, an MXFP4 32-block containing NaN gets scale byte 0xFF; amax ignores NaN;
//  * scale rule "round up" (default): the smallest 2^s with amax / 2^s <= max_elem;
//    "floor" (OCP): s = floor(log2 amax) - emax_elem, elements saturating; amax == 0
//    gives byte 0;
//  * ±Inf saturates at the block's scale: amax is taken over the finite elements only,
//    and an Inf element becomes ±max_elem * 2^s. So one Inf neither wipes out its
//    block's finite values nor drives the scale to 0xFE, where dequantized values
//    (448 * 2^127) overflow fp32 and turn into Inf/NaN downstream; every MXFP8 value
//    stays finite and the kernels' fp32 arithmetic agrees with the float64 reference;
//  * packing: element 2i in the low nibble, 2i+1 in the high nibble.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

#if defined(__CUDACC__)
#define MXMOE_HD __host__ __device__ __forceinline__
#else
#define MXMOE_HD inline
#endif

namespace mxmoe {

/// Elements per MX scale block along the reduction dimension.
inline constexpr int kMxBlock = 32;

enum class ScaleRule : int { RoundUp = 0, Floor = 1 };

namespace fmt {

MXMOE_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
MXMOE_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
MXMOE_HD bool is_nan(float x) { return (float_bits(x) & 0x7fffffffu) > 0x7f800000u; }
MXMOE_HD bool is_inf(float x) { return (float_bits(x) & 0x7fffffffu) == 0x7f800000u; }

// ---------------------------------------------------------------- BF16
/// float -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN of the same sign.
MXMOE_HD uint16_t float_to_bf16(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
MXMOE_HD float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// ---------------------------------------------------------------- E8M0
inline constexpr uint8_t kE8m0Nan = 0xFF;
inline constexpr int kE8m0Bias = 127;
/// 2^(b-127); 0xFF is NaN; 0x00 is 2^-127 (a float subnormal, exact).
MXMOE_HD float e8m0_to_float(uint8_t b) {
  if (b == 0xFF) return bits_float(0x7fc00000u);
  if (b == 0) return bits_float(0x00400000u);
  return bits_float(static_cast<uint32_t>(b) << 23);
}

// ---------------------------------------------------------------- E2M1
inline constexpr float kE2m1Max = 6.0f;
inline constexpr int kE2m1Emax = 2;  // 6 = 1.5 * 2^2
/// Magnitudes of the 8 non-negative codes.
MXMOE_HD float e2m1_to_float(uint8_t code) {
  // code: s e e m ; e==0 -> subnormal m*0.5 ; else (1 + m/2) * 2^(e-1)
  const uint32_t c = code & 0xF;
  const uint32_t e = (c >> 1) & 3, m = c & 1;
  float mag = (e == 0) ? 0.5f * static_cast<float>(m)
                       : (1.0f + 0.5f * static_cast<float>(m)) * static_cast<float>(1u << (e - 1));
  return (c & 8) ? -mag : mag;
}
/// float (already divided by the block scale) -> E2M1 code, RNE, saturating. NaN -> 0
/// (the caller marks the block's scale NaN). The sign of zero is kept.
MXMOE_HD uint8_t float_to_e2m1(float x) {
  const uint8_t sign = (float_bits(x) >> 31) ? 8 : 0;
  if (is_nan(x)) return 0;
  const float a = fabsf(x);
  uint8_t c;
  // Midpoints between representable magnitudes; a tie goes to the even code.
  if (a <= 0.25f) c = 0;        // tie 0.25 -> 0 (code 0)
  else if (a < 0.75f) c = 1;    // 0.5   ; tie 0.75 -> 1.0 (code 2)
  else if (a <= 1.25f) c = 2;   // 1.0   ; tie 1.25 -> 1.0 (code 2)
  else if (a < 1.75f) c = 3;    // 1.5   ; tie 1.75 -> 2.0 (code 4)
  else if (a <= 2.5f) c = 4;    // 2.0   ; tie 2.5  -> 2.0 (code 4)
  else if (a < 3.5f) c = 5;     // 3.0   ; tie 3.5  -> 4.0 (code 6)
  else if (a <= 5.0f) c = 6;    // 4.0   ; tie 5.0  -> 4.0 (code 6)
  else c = 7;                   // 6.0, saturating (Inf included)
  return c | sign;
}

// ---------------------------------------------------------------- E4M3 (fn)
inline constexpr float kE4m3Max = 448.0f;
inline constexpr int kE4m3Emax = 8;  // 448 = 1.75 * 2^8
inline constexpr uint8_t kE4m3Nan = 0x7F;
MXMOE_HD float e4m3_to_float(uint8_t code) {
  const uint32_t e = (code >> 3) & 0xF, m = code & 7;
  const bool neg = code & 0x80;
  if (e == 0xF && m == 7) return bits_float(neg ? 0xffc00000u : 0x7fc00000u);
  float mag = (e == 0) ? static_cast<float>(m) * 0.001953125f  // m * 2^-9
                       : bits_float(((e + 120u) << 23) | (m << 20));  // (1+m/8) * 2^(e-7)
  return neg ? -mag : mag;
}
/// float -> E4M3 code, RNE, saturating to ±448 (±Inf included); NaN -> NaN code
/// (sign kept). The definition; float_to_e4m3 is the same function, on sm_89+ devices by
/// the hardware conversion (checked equal for every float in tests/gpu/test_engine.cu).
MXMOE_HD uint8_t float_to_e4m3_sw(float x) {
  const uint32_t u = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  if (is_nan(x)) return sign | kE4m3Nan;
  const float a = fabsf(x);
  if (a >= kE4m3Max) return sign | 0x7E;
  if (a < 0.015625f) {  // below 2^-6: subnormal grid m * 2^-9 (exact scaling, RNE)
    const float q = rintf(a * 512.0f);  // 0..8 ; 8 is the smallest normal, code 0x08
    return sign | static_cast<uint8_t>(q);
  }
  // Normal: keep 3 mantissa bits with RNE on the float's bit pattern.
  const uint32_t au = u & 0x7fffffffu;
  const uint32_t exp = au >> 23;     // float biased exponent, >= 121 here
  uint32_t mant = au & 0x7fffffu;
  uint32_t q = mant >> 20;
  const uint32_t rest = mant & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (q & 1))) ++q;
  uint32_t e = exp - 120u;  // E4M3 biased exponent
  if (q == 8) { q = 0; ++e; }
  uint32_t code = (e << 3) | q;
  if (code > 0x7E) code = 0x7E;  // rounding past 448 saturates
  return sign | static_cast<uint8_t>(code);
}
MXMOE_HD uint8_t float_to_e4m3(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // cvt.rn.satfinite.e4m3x2.f32: RNE, +-448 on overflow and for +-Inf; NaN separately so
  // its sign is kept as float_to_e4m3_sw keeps it.
  if (is_nan(x)) return static_cast<uint8_t>(((float_bits(x) >> 24) & 0x80u) | kE4m3Nan);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
#else
  return float_to_e4m3_sw(x);
#endif
}

// ---------------------------------------------------------------- MX blocks
/// Scale exponent s (scale = 2^s, byte = s + 127) for a block with max |x| = amax
/// (NaN already excluded), element type with largest finite `max_elem` = m * 2^emax.
MXMOE_HD uint8_t mx_scale_byte(float amax, float max_elem, int emax_elem, ScaleRule rule) {
  if (!(amax > 0.0f)) return 0;     // zero (or empty / all-NaN) block
  if (is_inf(amax)) return 0xFE;    // (block_amax never gives Inf) never the NaN byte
  // amax = 1.m * 2^E exactly (subnormals normalized): floor(log2 amax) = E. Integer
  // arithmetic only (GPU epilogues run this per token and block).
  const uint32_t u = float_bits(amax);
  int E = static_cast<int>(u >> 23) - 127;
  uint32_t mant = u & 0x7fffffu;
  if ((u >> 23) == 0) {  // subnormal: shift the leading one up to bit 23
#if defined(__CUDA_ARCH__)
    const int p = __clz(mant) - 8;
#else
    const int p = __builtin_clz(mant) - 8;
#endif
    mant = (mant << p) & 0x7fffffu;
    E = -126 - p;
  }
  int s = E - emax_elem;  // "floor": floor(log2 amax) - emax_elem
  // Round up: the smallest s with amax <= max_elem * 2^s. With max_elem = 1.n * 2^emax,
  // that is E - emax when 1.m <= 1.n, else one more (1.m < 2 <= 2 * 1.n).
  if (rule != ScaleRule::Floor && mant > (float_bits(max_elem) & 0x7fffffu)) ++s;
  if (s < -127) s = -127;
  if (s > 127) s = 127;
  return static_cast<uint8_t>(s + 127);
}
/// 1 / 2^s as a float, exact for every finite scale byte: 2^(127-b) = e8m0(254-b).
MXMOE_HD float mx_inv_scale(uint8_t b) { return e8m0_to_float(static_cast<uint8_t>(254 - b)); }

/// What a block's amax takes of x: |x| for a finite x, NaN for ±Inf and NaN, in one fma
/// (|x| * 0 + |x|: exact for a finite x, Inf * 0 is NaN). fmaxf drops NaN, so a running
/// fmaxf(amax, amax_term(x)) is the amax over the finite elements (Inf saturates at that
/// scale, above), with no branch: the GPU epilogues take their amax this way. It needs IEEE
/// arithmetic (no -ffast-math / -ffinite-math-only, which would fold it to |x|; no build of
/// this project sets them).
MXMOE_HD float amax_term(float x) { return fmaf(fabsf(x), 0.0f, fabsf(x)); }

MXMOE_HD float block_amax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = fmaxf(amax, amax_term(x[i]));
  return amax;
}

/// Quantize one 32-block to MXFP8 (E4M3 codes + scale byte).
MXMOE_HD void quantize_block_e4m3(const float* x, uint8_t* codes, uint8_t* scale,
                                  ScaleRule rule = ScaleRule::RoundUp) {
  const uint8_t b = mx_scale_byte(block_amax(x, kMxBlock), kE4m3Max, kE4m3Emax, rule);
  const float inv = mx_inv_scale(b);
  for (int i = 0; i < kMxBlock; ++i) codes[i] = float_to_e4m3(x[i] * inv);
  *scale = b;
}

/// Quantize one 32-block to MXFP4 (16 packed bytes, low nibble first, + scale byte).
/// A block containing NaN gets scale 0xFF.
MXMOE_HD void quantize_block_e2m1(const float* x, uint8_t* packed, uint8_t* scale,
                                  ScaleRule rule = ScaleRule::RoundUp) {
  bool has_nan = false;
  for (int i = 0; i < kMxBlock; ++i) has_nan |= is_nan(x[i]);
  const uint8_t b = mx_scale_byte(block_amax(x, kMxBlock), kE2m1Max, kE2m1Emax, rule);
  const float inv = mx_inv_scale(b);
  for (int i = 0; i < kMxBlock; i += 2) {
    const uint8_t lo = float_to_e2m1(x[i] * inv), hi = float_to_e2m1(x[i + 1] * inv);
    packed[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
  }
  *scale = has_nan ? kE8m0Nan : b;
}

/// Dequantize one element (value = element * 2^s), in double so no scale overflows.
MXMOE_HD double dequant_e2m1(uint8_t packed_byte, int nibble, uint8_t scale) {
  const uint8_t c = nibble ? (packed_byte >> 4) : (packed_byte & 0xF);
  if (scale == 0xFF) return static_cast<double>(e8m0_to_float(0xFF));
  return static_cast<double>(e2m1_to_float(c)) * ldexp(1.0, static_cast<int>(scale) - 127);
}
MXMOE_HD double dequant_e4m3(uint8_t code, uint8_t scale) {
  if (scale == 0xFF) return static_cast<double>(e8m0_to_float(0xFF));
  return static_cast<double>(e4m3_to_float(code)) * ldexp(1.0, static_cast<int>(scale) - 127);
}

}  // namespace fmt
}  // namespace mxmoe
