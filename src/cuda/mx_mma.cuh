// mx_mma.cuh — the MX x MXFP4 warp mainloop shared by GEMM1 and GEMM2, and the exact
// code -> BF16 conversions it uses.
//
// How scales are applied (why this is exact): the MMA consumes the *unscaled* element
// values (E2M1 magnitudes 0..6, E4M3 values 2^-9..448, or BF16 activations), all exact
// in BF16, so every product is exact in the fp32 accumulator. Each MX block of 32 along
// K is reduced into a fresh fp32 partial (two m16n8k16 MMAs), then folded into the
// accumulator with the product of the two power-of-two scales:
//     acc = fma(partial, s_w * s_x, acc)
// This is right for every scale byte: 0 is 2^-127 (a float subnormal, which a BF16
// operand could not hold), 0xFF is NaN and poisons exactly the rows and tokens it
// belongs to. The cost is one FMA per accumulator per 32 K.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine.h"
#include "mxmoe/formats.h"
#include "ptx.cuh"

namespace mxmoe::cuda_detail {

/// Four E2M1 codes (the low 16 bits of `w`, code i in nibble i) -> two bf16x2 words:
/// r01 = {bf16(c0), bf16(c1)}, r23 = {bf16(c2), bf16(c3)}. Byte-permute table lookup of
/// the magnitude's two BF16 bytes, then the sign bit.
__device__ __forceinline__ void e2m1x4_to_bf16(uint32_t w, uint32_t& r01, uint32_t& r23) {
  // BF16 bits of 0, 0.5, 1, 1.5, 2, 3, 4, 6 split into low bytes and high bytes.
  constexpr uint32_t kLo0 = 0xC0800000u, kLo1 = 0xC0804000u;
  constexpr uint32_t kHi0 = 0x3F3F3F00u, kHi1 = 0x40404040u;
  const uint32_t sel = w & 0x7777u;  // bit 3 of a selector nibble would sign-replicate
  const uint32_t lo = __byte_perm(kLo0, kLo1, sel);
  const uint32_t hi = __byte_perm(kHi0, kHi1, sel);
  r01 = __byte_perm(lo, hi, 0x5140) | ((w << 12) & 0x8000u) | ((w << 24) & 0x80000000u);
  r23 = __byte_perm(lo, hi, 0x7362) | ((w << 4) & 0x8000u) | ((w << 16) & 0x80000000u);
}

/// One E4M3 code -> BF16 bits, exact (NaN code -> NaN).
__device__ __forceinline__ uint32_t e4m3_to_bf16_bits(uint32_t c) {
  const uint32_t s = (c & 0x80u) << 8;
  const uint32_t m = c & 0x7Fu;
  uint32_t r;
  if (m == 0x7Fu) r = 0x7FC0u;
  else if (m >= 8u) r = (m << 4) + (120u << 7);  // rebias the exponent 7 -> 127
  else r = __float_as_uint(static_cast<float>(m) * 0.001953125f) >> 16;  // m * 2^-9
  return r | s;
}
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two) {
  return e4m3_to_bf16_bits(two & 0xFFu) | (e4m3_to_bf16_bits((two >> 8) & 0xFFu) << 16);
}

__device__ __forceinline__ float e8m0_f(uint32_t b) { return fmt::e8m0_to_float(static_cast<uint8_t>(b)); }

/// Range guard for B rows with huge MX scales (e.g. a token holding ±Inf: its block
/// scale is 2^127 and its products reach ~2^135, past fp32). A row whose largest scale
/// byte exceeds 127 + 64 is folded with every scale multiplied by 2^-D (D = excess, exact
/// power of two) and the epilogue multiplies the accumulator back by 2^D, so blocks of
/// opposite sign are summed in range and only the final value may overflow, with the
/// right sign (an fma into an already infinite accumulator could not). Rows with normal
/// scales get D = 0: factor 1.0, the same bits as without the guard.
///   adj[nt]  = 2^-D of this lane's B row (used in the fold);
///   back[nt] = 2^D of the token in accumulator column 2t + c: back[nt][c].
template <int NT>
__device__ __forceinline__ void b_row_range(const uint8_t* const (&bscale)[NT], int kb_count,
                                            float (&adj)[NT], float (&back)[NT][2]) {
  const int lane = threadIdx.x & 31, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    int mx = 0;
    if (bscale[nt] != nullptr)
      for (int b = t; b < kb_count; b += 4) {
        const int v = bscale[nt][b];
        if (v != 0xFF && v > mx) mx = v;  // a NaN scale poisons its block anyway
      }
    mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const int d = max(0, mx - 127 - 64);
    adj[nt] = __uint_as_float(static_cast<uint32_t>(127 - d) << 23);
    const float up = __uint_as_float(static_cast<uint32_t>(127 + d) << 23);
    back[nt][0] = __shfl_sync(0xffffffffu, up, (2 * t) * 4);
    back[nt][1] = __shfl_sync(0xffffffffu, up, (2 * t + 1) * 4);
  }
}

/// Warp mainloop: acc[mt][nt][.] += W[64 rows of this warp] x B[8*NT rows]^T over K.
///   wp, ws: this warp's (expert, row group) tile start in the tiled layout;
///   brow[nt]: this lane's B row (token g of tile nt) or null (zeros);
///   bscale[nt]: its MX scales (kFp8) or null; adj[nt]: its range factor (b_row_range);
///   kc_count: 64-K chunks; kb_count: MX blocks of real K (the last chunk may be half).
template <int NT, bool kFp8>
__device__ __forceinline__ void warp_mma_mx(float (&acc)[4][NT][4], const uint4* __restrict__ wp,
                                            const uint32_t* __restrict__ ws, int kc_count,
                                            int kb_count, const void* const (&brow)[NT],
                                            const uint8_t* const (&bscale)[NT],
                                            const float (&adj)[NT]) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;

  uint4 wcur[4], wnxt[4];
  uint32_t scur[4], snxt[4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    wcur[mt] = ldg_stream_u4(wp + mt * 32 + lane);
    scur[mt] = __ldg(ws + mt * 8 + g);
  }
  for (int kc = 0; kc < kc_count; ++kc) {
    if (kc + 1 < kc_count) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        wnxt[mt] = ldg_stream_u4(wp + ((kc + 1) * 4 + mt) * 32 + lane);
        snxt[mt] = __ldg(ws + ((kc + 1) * 4 + mt) * 8 + g);
      }
    }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int kb = 2 * kc + b;
      if (kb >= kb_count) break;  // warp-uniform: K % 64 == 32 tail
      // B fragments: regs {b0(s0), b1(s0), b0(s1), b1(s1)} = elements [8t, 8t+8).
      uint32_t bf[NT][4];
      float sx[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float my_sx = 0.0f;
        if (brow[nt] == nullptr) {
          bf[nt][0] = bf[nt][1] = bf[nt][2] = bf[nt][3] = 0u;
        } else if constexpr (kFp8) {
          const uint2 v = __ldg(reinterpret_cast<const uint2*>(
              static_cast<const uint8_t*>(brow[nt]) + kb * 32 + 8 * t));
          bf[nt][0] = e4m3x2_to_bf16x2(v.x);
          bf[nt][1] = e4m3x2_to_bf16x2(v.x >> 16);
          bf[nt][2] = e4m3x2_to_bf16x2(v.y);
          bf[nt][3] = e4m3x2_to_bf16x2(v.y >> 16);
          my_sx = e8m0_f(bscale[nt][kb]) * adj[nt];
        } else {
          const uint4 v = __ldg(reinterpret_cast<const uint4*>(
              static_cast<const uint16_t*>(brow[nt]) + kb * 32 + 8 * t));
          bf[nt][0] = v.x;
          bf[nt][1] = v.y;
          bf[nt][2] = v.z;
          bf[nt][3] = v.w;
        }
        if constexpr (kFp8) {
          // The accumulator columns of this lane are tokens 2t and 2t+1 of the tile;
          // their scales sit with the lanes that loaded those rows (g = 2t, 2t+1).
          sx[nt][0] = __shfl_sync(0xffffffffu, my_sx, (2 * t) * 4);
          sx[nt][1] = __shfl_sync(0xffffffffu, my_sx, (2 * t + 1) * 4);
        } else {
          sx[nt][0] = sx[nt][1] = 1.0f;
        }
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const uint32_t w0 = b ? wcur[mt].z : wcur[mt].x;  // row g
        const uint32_t w1 = b ? wcur[mt].w : wcur[mt].y;  // row g + 8
        uint32_t a_s0[4], a_s1[4];
        e2m1x4_to_bf16(w0, a_s0[0], a_s0[2]);
        e2m1x4_to_bf16(w0 >> 16, a_s1[0], a_s1[2]);
        e2m1x4_to_bf16(w1, a_s0[1], a_s0[3]);
        e2m1x4_to_bf16(w1 >> 16, a_s1[1], a_s1[3]);
        const float sw0 = e8m0_f((scur[mt] >> (16 * b)) & 0xFFu);
        const float sw1 = e8m0_f((scur[mt] >> (16 * b + 8)) & 0xFFu);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma_bf16_16816(part, a_s0, bf[nt][0], bf[nt][1]);
          mma_bf16_16816(part, a_s1, bf[nt][2], bf[nt][3]);
          acc[mt][nt][0] = __fmaf_rn(part[0], sw0 * sx[nt][0], acc[mt][nt][0]);
          acc[mt][nt][1] = __fmaf_rn(part[1], sw0 * sx[nt][1], acc[mt][nt][1]);
          acc[mt][nt][2] = __fmaf_rn(part[2], sw1 * sx[nt][0], acc[mt][nt][2]);
          acc[mt][nt][3] = __fmaf_rn(part[3], sw1 * sx[nt][1], acc[mt][nt][3]);
        }
      }
    }
    if (kc + 1 < kc_count) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        wcur[mt] = wnxt[mt];
        scur[mt] = snxt[mt];
      }
    }
  }
}

}  // namespace mxmoe::cuda_detail
