// fp8_regroup.cuh — the FP8 mode's re-expression of MXFP8 codes under their group's scale
// (fp8_mode.h activation_code), four codes at a time, for the two places that do it: the
// staging kernel (stage_fp8.cu: x, and the intermediate where GEMM1 does not) and the FP8
// GEMM1's drain (gemm1_act.cu f8_drain_tile, which re-expresses the intermediate it
// quantizes). One definition, so that both give the same bytes.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "mx_mma.cuh"
#include "mxmoe/formats.h"
#include "mxmoe/fp8_mode.h"

namespace mxmoe::cuda_detail {

/// activation_code itself, out of line: the rare codes (NaN, or lowered by more than 15
/// binades) take it; inlined at every code site it made the staging kernel ~6800
/// instructions.
__device__ __noinline__ inline uint32_t regroup_code_slow(uint32_t c, uint8_t block_byte, uint8_t group_byte) {
  return fp8mode::activation_code(static_cast<uint8_t>(c), block_byte, group_byte);
}

/// Four E4M3 codes of a block with scale byte `block_byte` (byte i of `w` is code i), each
/// re-expressed under the group byte T = block_byte + d: fp8mode::activation_code, byte by
/// byte. d = 0 keeps every code (T is the block's own byte); a NaN group byte makes every
/// code NaN, its sign kept.
/// The common case (no NaN code, 1 <= d <= 15) goes through f16: each code's exact value
/// (hardware E4M3 -> f16), times 2^-d (exact: an E4M3 value's lowest bit is >= 2^-9, so the
/// product's is >= 2^-24, f16's smallest subnormal), then one RNE rounding back to E4M3
/// (cvt.rn.satfinite; nothing lowered can exceed 448). That is activation_code's exact
/// product and single RNE rounding, two codes per conversion and multiply. The GPU tests
/// hold it bit for bit against activation_code (Fp8Mode.StageBitExactAgainstFp8ModeHeader:
/// every code, spreads 0..20).
__device__ __forceinline__ uint32_t regroup_e4m3x4(uint32_t w, int d, uint8_t block_byte, uint8_t group_byte) {
  if (group_byte == fmt::kE8m0Nan) return (w & 0x80808080u) | (0x01010101u * fmt::kE4m3Nan);
  if (d == 0) return w;
  const bool nan_code = (((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) != 0;  // magnitude 0x7F
  if (!nan_code && d <= 15) {
    // 2^-d as f16: normal down to 2^-14, 2^-15 the subnormal 0x0200.
    const uint16_t m = d <= 14 ? static_cast<uint16_t>((15 - d) << 10) : uint16_t{0x0200};
    const __half2 mm = __halves2half2(__ushort_as_half(m), __ushort_as_half(m));
    const uint32_t lo = e4m3x2_to_f16x2(w & 0xFFFFu), hi = e4m3x2_to_f16x2(w >> 16);
    const __half2 plo = __hmul2(*reinterpret_cast<const __half2*>(&lo), mm);
    const __half2 phi = __hmul2(*reinterpret_cast<const __half2*>(&hi), mm);
    return f16x2_to_e4m3x2_satfinite(*reinterpret_cast<const uint32_t*>(&plo)) |
           (f16x2_to_e4m3x2_satfinite(*reinterpret_cast<const uint32_t*>(&phi)) << 16);
  }
  uint32_t o = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) o |= regroup_code_slow((w >> (8 * k)) & 0xFFu, block_byte, group_byte) << (8 * k);
  return o;
}

/// A group's byte as stage_fp8 and the drain agree on it. A block is used if it holds a
/// nonzero code (magnitude, NaN included) or a NaN byte; an unused one (all codes +-0,
/// a finite byte) adds nothing whatever its scale, and is staged as zeros. Each block's
/// `key` is 0 unused, 256 for a NaN byte (it poisons the group), else its byte; T = the
/// largest key, 256 read as the NaN byte.
__device__ __forceinline__ bool regroup_block_used(bool any_code, uint8_t byte) {
  return any_code || byte == fmt::kE8m0Nan;
}
__device__ __forceinline__ int regroup_block_key(bool used, uint8_t byte) {
  return used ? (byte == fmt::kE8m0Nan ? 256 : byte) : 0;
}
__device__ __forceinline__ uint8_t regroup_group_byte(int max_key) {
  return max_key == 256 ? fmt::kE8m0Nan : static_cast<uint8_t>(max_key);
}
/// The staged scale of a group with byte T: 2^(T - 127 + shift), exact down to fp32's
/// smallest subnormal (ldexpf; shift 0 gives e8m0_to_float(T)); NaN stays NaN. The shift
/// carries the row form's reference exponent (engine.h Fp8Dims).
__device__ __forceinline__ float regroup_scale(uint8_t T, int shift) {
  return T == fmt::kE8m0Nan ? fmt::e8m0_to_float(T) : ldexpf(1.0f, static_cast<int>(T) - 127 + shift);
}

}  // namespace mxmoe::cuda_detail
