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

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "engine.h"
#include "heuristics.h"
#include "mxmoe/formats.h"
#include "ptx.cuh"

namespace mxmoe::cuda_detail {

/// One tiled weight word (8 E2M1 values of one row: elements 8t..8t+7 of an MX block,
/// bit-scattered at load time by tile_mxfp4, see engine.h) -> four f16x2 words holding
/// value * 2^-14 (exact: E2M1's 2-bit exponent and 1-bit mantissa land in the FP16
/// exponent's low bits and the mantissa's top bit; code 0.5 becomes the FP16 subnormal
/// 2^-15). r[p] = {element 2p, element 2p+1}. Six logic ops and five shifts for eight
/// values (the generic path; the decode path's form is fp4x8_to_f16_mul, the prefill
/// path's fp4x8_to_bf16_times).
__device__ __forceinline__ void fp4x8_to_f16(uint32_t q, uint32_t (&r)[4]) {
  constexpr uint32_t kAll = 0x8E008E00u, kMag = 0x0E000E00u, kSign = 0x80008000u;
  r[0] = q & kAll;
  r[1] = (q << 3) & kAll;
  r[2] = ((q << 9) & kMag) | ((q << 2) & kSign);
  r[3] = ((q << 6) & kMag) | ((q << 1) & kSign);
}
/// fp4x8_to_f16 in nine ops: words 2 and 3 keep magnitude and sign at different
/// distances from their place, so each is masked out alone and moved by one multiply,
/// x * (2^a + 2^b) = (x << a) + (x << b): the two shifted copies overlap only below bit
/// 24, where their sum's carries stop (checked over every value of the bits involved),
/// so the final mask sees each field exactly once. Same result for every q. Measured on
/// the H200 (session 8): faster in the decode mainloops (M=8 228 -> 216 us), slower in
/// the prefill producers (M=16 356 -> 386, M=1024 3193 -> 3272), which keep the shifts.
__device__ __forceinline__ void fp4x8_to_f16_mul(uint32_t q, uint32_t (&r)[4]) {
  constexpr uint32_t kAll = 0x8E008E00u;
  r[0] = q & kAll;
  r[1] = (q << 3) & kAll;
  r[2] = ((q & 0x20072007u) * ((1u << 9) + (1u << 2))) & kAll;  // magnitude << 9, sign << 2
  r[3] = ((q & 0x40384038u) * ((1u << 6) + (1u << 1))) & kAll;  // magnitude << 6, sign << 1
}

/// Same word -> four bf16x2 words holding the exact E2M1 values (generic path).
__device__ __forceinline__ void fp4x8_to_bf16(uint32_t q, uint32_t (&r)[4]) {
  uint32_t h[4];
  fp4x8_to_f16(q, h);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h[i]));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * 16384.0f, f.y * 16384.0f);
    r[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
}

/// Same word times a bf16x2 multiplier whose lanes both hold 2^(byte - 1) for the word's
/// E8M0 scale byte -> four bf16x2 words of the exact dequantized values (prefill path: the
/// scale lives in the operand, so a wgmma accumulates over all of K). Each pair's fields
/// go straight to BF16's places (magnitude at bits 8..6 = value * 2^-126, the code 0.5 a
/// BF16 subnormal; sign at 15), and the multiply restores the bias and applies the scale.
/// Exact for scale bytes 0..128 (|value| <= 12; heuristics.h kPrefillMaxWeightScale,
/// checked at load time), 0 stays +-0. The tiled word keeps each pair's sign 4 bits above
/// its magnitude (FP16's distance, for the decode path), BF16 wants 7. Pair 2 moves both
/// fields with one multiply, x * (2^6 + 2^2) = (x << 6) + (x << 2): its copies share no
/// bit that reaches a kept field (a carry out of bit 19 stops at bit 21), so the mask sees
/// each field exactly once. The other pairs, two forms (heuristics.h
/// pf_decode_shared_shift picks one per token tile; same words for every q: test_engine's
/// E2m1Decode.Bf16PlacementEqualsFp16RouteForEveryWord):
///   kSharedShift: each field from one of three shifted copies of q, two masks a pair;
///     q << 3 lands pair 1's sign and pair 3's magnitude both. 12 integer ops for eight
///     values (three shifts, eight masks, one multiply): the fewest a search over
///     shift, mask and multiply forms found for this layout (PERFORMANCE.md, session 67).
///   otherwise: pair 0 by x + (x >> 3) (one LEA.HI), pair 1 by x * 9 (the sign up 3),
///     pair 3 by two shifts. 13 integer ops, more of them on the FMA pipe (IMAD).
/// The route through fp4x8_to_f16 took 19.
template <bool kSharedShift>
__device__ __forceinline__ void fp4x8_to_bf16_times(uint32_t q, __nv_bfloat162 mul, uint32_t (&r)[4]) {
  constexpr uint32_t kBf16 = 0x81C081C0u;  // sign 15, magnitude 8..6 (and + 16)
  constexpr uint32_t kSign = 0x80008000u, kMag = 0x01C001C0u;
  // Pair 2 the same in both forms (written in each: the 13-op form's statements stay in
  // the order whose SASS was measured at the 32- and 64-token tiles; ptxas's schedule
  // follows it).
  uint32_t v[4];
  if constexpr (kSharedShift) {
    const uint32_t up3 = q << 3;    // pair 1's sign 12 -> 15; pair 3's magnitude 5..3 -> 8..6
    const uint32_t down3 = q >> 3;  // pair 0's magnitude 11..9 -> 8..6
    const uint32_t up1 = q << 1;    // pair 3's sign 14 -> 15
    v[0] = (q & kSign) | (down3 & kMag);
    v[1] = (up3 & kSign) | (q & kMag);
    v[2] = ((q & 0x20072007u) * ((1u << 6) + (1u << 2))) & kBf16;
    v[3] = (up1 & kSign) | (up3 & kMag);
  } else {
    const uint32_t x0 = q & 0x8E008E00u;                          // pair 0: magnitude 11..9, sign 15
    v[0] = ((x0 >> 3) | x0) & kBf16;                              // magnitude down 3
    v[1] = ((q & 0x11C011C0u) * ((1u << 3) + 1u)) & kBf16;       // magnitude 8..6 stays, sign 12 up 3
    v[2] = ((q & 0x20072007u) * ((1u << 6) + (1u << 2))) & kBf16;  // magnitude 2..0 up 6, sign 13 up 2
    v[3] = ((q << 3) & kMag) | ((q << 1) & kSign);                // magnitude 5..3 up 3, sign 14 up 1
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 x = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v[i]), mul);
    r[i] = *reinterpret_cast<const uint32_t*>(&x);
  }
}
/// The multipliers of a scale word's four E8M0 bytes b0..b3 (bytes 0..128), two per
/// bf16x2: even = {2^(b0 - 1), 2^(b2 - 1)}, odd = {2^(b1 - 1), 2^(b3 - 1)}. Four integer
/// ops for four scales: the multiply that takes one lane (__low2bfloat162 /
/// __high2bfloat162) selects it in its operand, without an instruction of its own.
__device__ __forceinline__ void bf16_scale_pairs(uint32_t word, __nv_bfloat162& even, __nv_bfloat162& odd) {
  constexpr uint32_t kBias = 126u * 0x00800080u;  // exponent field b + 126, in each lane
  const uint32_t e = (word & 0x00FF00FFu) * 0x80u + kBias;
  const uint32_t o = ((word & 0xFF00FF00u) >> 1) + kBias;
  even = *reinterpret_cast<const __nv_bfloat162*>(&e);
  odd = *reinterpret_cast<const __nv_bfloat162*>(&o);
}
/// fp4x8_to_bf16_times for one scale byte (tests).
template <bool kSharedShift>
__device__ __forceinline__ void fp4x8_to_bf16_scaled(uint32_t q, uint32_t scale_byte, uint32_t (&r)[4]) {
  __nv_bfloat162 even, odd;
  bf16_scale_pairs(scale_byte, even, odd);
  fp4x8_to_bf16_times<kSharedShift>(q, __low2bfloat162(even), r);
}

/// Two floats -> their E4M3 codes, a's in the low byte: fmt::float_to_e4m3 of each, in
/// one instruction for the pair (cvt.rn.satfinite.e4m3x2.f32), except for a NaN, which
/// comes out as code 0x7F or 0xFF whatever its sign, where float_to_e4m3 keeps the sign.
/// Where that matters the caller finds a NaN by its magnitude 0x7F (no finite value rounds
/// to it under satfinite) and takes float_to_e4m3 for that block.
__device__ __forceinline__ uint32_t e4m3x2_satfinite(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

/// Two E4M3 codes (low byte first) -> f16x2 of their exact values (NaN stays NaN).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xFFFFu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}
/// f16x2 -> two E4M3 codes (low half in the low byte), RNE, saturating
/// (cvt.rn.satfinite.e4m3x2.f16x2); e4m3x2_to_f16x2's way back.
__device__ __forceinline__ uint32_t f16x2_to_e4m3x2_satfinite(uint32_t h2) {
  __half2_raw r;
  r.x = static_cast<unsigned short>(h2 & 0xFFFFu);
  r.y = static_cast<unsigned short>(h2 >> 16);
  return __nv_cvt_halfraw2_to_fp8x2(r, __NV_SATFINITE, __NV_E4M3);
}

/// The smallest E8M0 byte at which every value of an MXFP8 block, E4M3 code times
/// 2^(byte - 127), is 0, NaN or a normal float (2^-9 * 2^(byte - 127) >= 2^-126): each is
/// then exact in BF16 (3 significant bits), the float's upper half.
inline constexpr int kE4m3NormalMinScale = 10;

/// Two E4M3 codes (low byte first) times s = 2^(byte - 127) -> bf16x2, for blocks with
/// kE4m3NormalMinScale <= byte (exact, above). The codes go through the hardware E4M3 ->
/// f16 conversion (exact); a NaN code gives the multiply's canonical NaN.
__device__ __forceinline__ uint32_t e4m3x2_scaled_to_bf16x2(uint32_t two, float s) {
  const uint32_t pair = e4m3x2_to_f16x2(two);
  const float lo = __half2float(__ushort_as_half(static_cast<uint16_t>(pair))) * s;
  const float hi = __half2float(__ushort_as_half(static_cast<uint16_t>(pair >> 16))) * s;
  return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);  // upper halves
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

/// Two floats -> bf16x2 (lo in the low half), one instruction (cvt.rn.bf16x2.f32): each
/// lane as fmt::float_to_bf16 (round to nearest even, subnormals kept, a finite value past
/// BF16's largest to infinity), except that a NaN comes out as the canonical 0x7FFF.
__device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
  const __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&r);
}

/// f16x2 product of two f16x2 bit patterns (round to nearest, subnormals kept).
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

__device__ __forceinline__ float e8m0_f(uint32_t b) { return fmt::e8m0_to_float(static_cast<uint8_t>(b)); }

/// The largest E8M0 byte a B row may hold and still be folded with range factor 1 (the
/// range guard below, and the prefill path's staged rows).
inline constexpr int kUnitRangeMaxScale = 127 + 64;
/// The range factor's exponent D of a row whose largest scale byte is `mx`.
__device__ __forceinline__ int range_excess(int mx) { return max(0, mx - kUnitRangeMaxScale); }

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
    const int d = range_excess(mx);
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
  const uint4* ws4 = reinterpret_cast<const uint4*>(ws);
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) wcur[mt] = ldg_stream_u4(wp + mt * 32 + lane);
  {
    const uint4 sv = __ldg(ws4 + g);
    scur[0] = sv.x; scur[1] = sv.y; scur[2] = sv.z; scur[3] = sv.w;
  }
  for (int kc = 0; kc < kc_count; ++kc) {
    if (kc + 1 < kc_count) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) wnxt[mt] = ldg_stream_u4(wp + ((kc + 1) * 4 + mt) * 32 + lane);
      const uint4 sv = __ldg(ws4 + (kc + 1) * 8 + g);
      snxt[0] = sv.x; snxt[1] = sv.y; snxt[2] = sv.z; snxt[3] = sv.w;
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
        uint32_t r0[4], r1[4];
        fp4x8_to_bf16(w0, r0);
        fp4x8_to_bf16(w1, r1);
        const uint32_t a_s0[4] = {r0[0], r1[0], r0[1], r1[1]};
        const uint32_t a_s1[4] = {r0[2], r1[2], r0[3], r1[3]};
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

/// A warp's accumulators (warp_mma_mx's and warp_mma_decode's layout) set to zero.
template <int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[4][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[mt][nt][j] = 0.0f;
}

/// A generic kernel's tile (gemm1_act_kernel, gemm2_kernel): acc = the warp's 64 weight
/// rows x the tile's B rows over all of K, from zero, and back[nt][c], the factor its
/// epilogue applies to token column 2t + c (b_row_range for E4M3 rows; 1 for BF16).
template <int NT, bool kFp8>
__device__ __forceinline__ void warp_tile_mx(float (&acc)[4][NT][4], float (&back)[NT][2],
                                             const uint4* __restrict__ wp, const uint32_t* __restrict__ ws,
                                             int kc_count, int kb_count, const void* const (&brow)[NT],
                                             const uint8_t* const (&bscale)[NT]) {
  zero_acc(acc);
  float adj[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) adj[nt] = back[nt][0] = back[nt][1] = 1.0f;
  if constexpr (kFp8) b_row_range<NT>(bscale, kb_count, adj, back);
  warp_mma_mx<NT, kFp8>(acc, wp, ws, kc_count, kb_count, brow, bscale, adj);
}


/// E8M0 byte at bit offset `sh` (0, 8, 16, 24; a constant after unrolling) of `w` ->
/// its float 2^(b-127) by moving the byte into the float exponent field: two integer
/// ops. Right only for bytes 1..254; row groups holding a byte 0 (2^-127, a subnormal)
/// or 0xFF (NaN) are flagged at load time (MatView::special) and take e8m0_f instead.
__device__ __forceinline__ float e8m0_normal_at(uint32_t w, int sh) {
  const uint32_t bits = sh <= 23 ? (w << (23 - sh)) : (w >> (sh - 23));
  return __uint_as_float(bits & 0x7F800000u);
}

/// The decode mainloop's weight ring: D stages of this warp's weight stream in shared
/// memory, filled with cp.async (no registers held while in flight). A stage is one
/// 64-K chunk: the 4 x 512 contiguous bytes of the warp's four m16 tiles (each lane
/// copies and later reads back its own 16 bytes per tile) and the chunk's 8 scale words
/// (copied by lanes 0..7, read by the four lanes of each row pair, hence the __syncwarp
/// after the wait). Stage c holds chunk kc_begin + i for every i = c (mod D).
/// fast_prefetch issues the first D - 1 chunks; kernels call it before staging the
/// token scales so the first HBM round trip overlaps the staging.
static_assert(kFastWarps == kWarps, "heuristics.h sizes the rings for the kernels' warps");
template <int D>
struct FastRing {
  uint4* stage;  // this warp's [D][4 * 32 + 8] uint4
};
/// Shared-memory bytes of a block's rings (kWarps warps).
template <int D>
constexpr int fast_ring_bytes() { return kWarps * D * kFastStageBytes; }
/// Lets decode kernel `kernel` take `smem` bytes of dynamic shared memory (the token scales,
/// the rings, any padding). The 48 KB default covers static plus dynamic shared memory; the
/// decode kernels' static staging (row pointers, factors) is under 1 KB.
template <typename Kernel>
void allow_fast_smem(Kernel kernel, size_t smem) {
  if (smem + 1024 > static_cast<size_t>(kDefaultSmemBytes))
    MXMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
}
/// This warp's ring inside the block's ring area. The decode kernels declare their dynamic
/// shared memory (token scales, then the rings) `__align__(128)`, and a stage is 17 x 128
/// bytes, so every stage starts on 128 bytes when the token scales' size (K x tile / 8
/// bytes) is a multiple of 128, as at Kimi-K3's shapes. GEMM1's one-token kernel had
/// 1216 bytes of static shared memory, which put its rings 64 bytes off: aligned, M=1 went
/// 107.3 / 107.4 -> 103.4 / 103.2 us. A branch whose balanced kernel held 48 more bytes of
/// state lost 14% at M=2 the same way, and the alignment gave it back (H200, session 29,
/// runs 2-4).
static_assert(kFastStageBytes % 128 == 0, "a ring stage keeps the next one on 128 bytes");
template <int D>
__device__ __forceinline__ FastRing<D> fast_ring_of_warp(void* ring_area) {
  const int warp = threadIdx.x >> 5;
  return FastRing<D>{static_cast<uint4*>(ring_area) + warp * D * (kFastStageBytes / 16)};
}
/// Issues chunk `kc` (nothing when kc >= kc_end) into stage `st` and commits the group,
/// so every lane commits the same number of groups whatever the chunk count. Every
/// instruction counts (at few rows the mainloop is bound by issue, not by HBM): one global
/// and one shared address per chunk, from unsigned 32-bit offsets (no sign extension), and
/// the four row tiles and the scale words at offsets the copies encode (cp_async_16_at).
/// No per-lane bases are kept across the loop: held beside the caller's wp and ws4, they
/// spilled in GEMM2's 8-row kernel. The shared base is this lane's slot of stage 0: with
/// the lane added to the stage offset instead, GEMM2's 8-row kernel spilled 10 bytes
/// instead of 6 and M=1 was 1% slower (H200, session 23, runs 2 and 3).
template <int D>
__device__ __forceinline__ void fast_issue(const FastRing<D>& ring, const uint4* __restrict__ wp,
                                           const uint4* __restrict__ ws4, int kc, int kc_end,
                                           int st) {
  constexpr uint32_t kTile = 32 * 16;  // bytes of one row tile's chunk (32 lanes x 16)
  const uint32_t lane = threadIdx.x & 31;
  if (kc < kc_end) {
    const uint4* src = wp + (static_cast<uint32_t>(kc) * 128u + lane);
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(ring.stage + lane)) +
                         static_cast<uint32_t>(st) * kFastStageBytes;
    cp_async_16_at<0 * kTile, 0 * kTile>(dst, src);
    cp_async_16_at<1 * kTile, 1 * kTile>(dst, src);
    cp_async_16_at<2 * kTile, 2 * kTile>(dst, src);
    cp_async_16_at<3 * kTile, 3 * kTile>(dst, src);
    if (lane < 8) cp_async_16_at<4 * kTile, 0>(dst, ws4 + (static_cast<uint32_t>(kc) * 8u + lane));
  }
  cp_async_commit();
}
template <int D>
__device__ __forceinline__ void fast_prefetch(const FastRing<D>& ring, const uint4* __restrict__ wp,
                                              const uint4* __restrict__ ws4, int kc_begin,
                                              int kc_end) {
#pragma unroll
  for (int d = 0; d < D - 1; ++d) fast_issue<D>(ring, wp, ws4, kc_begin + d, kc_end, d);
}

/// Folds one row tile's per-block partials into its accumulators (see the file comment):
/// acc += part * (weight scale * token scale); the weight scales of rows g and g+8 for
/// MX block b sit in bytes 2b and 2b+1 of `sw_word`.
template <int NT, bool kSpecial, bool kNarrow>
__device__ __forceinline__ void fast_fold(float (&acc)[NT][4], const float (&part)[NT][4],
                                          uint32_t sw_word, int b, const float2 (&sx)[NT],
                                          int nt_used) {
  float sw0, sw1;
  if constexpr (kSpecial) {
    sw0 = e8m0_f((sw_word >> (16 * b)) & 0xFFu);
    sw1 = e8m0_f((sw_word >> (16 * b + 8)) & 0xFFu);
  } else {
    sw0 = e8m0_normal_at(sw_word, 16 * b);
    sw1 = e8m0_normal_at(sw_word, 16 * b + 8);
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (NT == 1 || nt < nt_used) {
      if constexpr (kNarrow) {  // the token scales are in the partials already
        acc[nt][0] = __fmaf_rn(part[nt][0], sw0, acc[nt][0]);
        acc[nt][1] = __fmaf_rn(part[nt][1], sw0, acc[nt][1]);
        acc[nt][2] = __fmaf_rn(part[nt][2], sw1, acc[nt][2]);
        acc[nt][3] = __fmaf_rn(part[nt][3], sw1, acc[nt][3]);
      } else {
        acc[nt][0] = __fmaf_rn(part[nt][0], sw0 * sx[nt].x, acc[nt][0]);
        acc[nt][1] = __fmaf_rn(part[nt][1], sw0 * sx[nt].y, acc[nt][1]);
        acc[nt][2] = __fmaf_rn(part[nt][2], sw1 * sx[nt].x, acc[nt][2]);
        acc[nt][3] = __fmaf_rn(part[nt][3], sw1 * sx[nt].y, acc[nt][3]);
      }
    }
  }
}

/// Decode-path warp mainloop (E4M3 operand B, FP16 MMAs), streaming this warp's 64
/// weight rows through the shared-memory ring (D - 1 chunks in flight; fast_prefetch
/// issued the first ones) over the chunks [kc_begin, kc_end) (a split of K; indices into
/// wp, ws4, brow, s_sx are absolute).
///   acc[mt][nt][.] += W x B^T for the 8-token tiles nt < nt_used (warp-uniform; the
///   other tiles hold no rows and their MMAs are skipped);
///   brow[nt]: this lane's B row (E4M3 codes of token g of tile nt) or null (zeros);
///   s_sx: shared [kb][BT] floats: token scale * 2^14 (the FP16 weight bias) * range
///   factor (b_row_range), so one fma folds each MX block exactly as warp_mma_mx does.
///   kSpecial: the row group holds weight scale bytes 0 or 0xFF (exact e8m0_f); else the
///   two-op conversion. Both give the same float for bytes 1..254.
template <int NT, int D, bool kSpecial, bool kNarrow, bool kCoherentB>
__device__ __forceinline__ void warp_mma_fast(float (&acc)[4][NT][4], const FastRing<D>& ring,
                                              const uint4* __restrict__ wp,
                                              const uint4* __restrict__ ws4, int kc_begin,
                                              int kc_end, int kb_count,
                                              const uint8_t* const (&brow)[NT],
                                              const float* s_sx, int nt_used) {
  constexpr int BT = 8 * NT;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  // B (this lane's 8 bytes of both MX blocks of a chunk) is loaded a chunk ahead by
  // predicated loads (ldg_nc_u2_if): a load whose value is consumed at once (or selected
  // right after it, as `v = 0; if (row) v = ld` compiles) waits for L2 behind the SM's
  // queued weight copies (session 9, ncu). Rows without a token keep their zeros.
  uint2 b_cur[NT][2], b_nxt[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) b_cur[nt][h] = b_nxt[nt][h] = make_uint2(0u, 0u);
  // This lane's 8 bytes of block 0 of chunk 0; chunk kc's lie kc * 64 bytes further (an
  // unsigned 32-bit offset, so one 64-bit add per chunk and block 1 at +32 in the load).
  const uint8_t* b_lane[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) b_lane[nt] = brow[nt] != nullptr ? brow[nt] + 8 * t : nullptr;
  auto load_b = [&](uint2 (&b)[NT][2], int kc) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      if (NT == 1 || nt < nt_used) {
        const uint8_t* at = b_lane[nt] + static_cast<uint32_t>(kc) * 64u;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          ldg_u2_if<kCoherentB>(b_lane[nt] != nullptr && 2 * kc + h < kb_count, at + 32 * h, b[nt][h]);
      }
  };
  load_b(b_cur, kc_begin);
  for (int kc = kc_begin; kc < kc_end; ++kc) {
    // Unsigned, so the stage index is a mask (D a power of two) or a multiply, not a
    // signed remainder's four instructions.
    const uint32_t i = static_cast<uint32_t>(kc - kc_begin);
    load_b(b_nxt, kc + 1);
    // The stage refilled here was read in the previous iteration; every lane is past
    // those reads (their values fed that iteration's MMAs) once the warp syncs.
    __syncwarp();
    fast_issue<D>(ring, wp, ws4, kc + D - 1, kc_end, static_cast<int>((i + D - 1) % D));
    cp_async_wait<D - 1>();  // this lane's copies of chunk kc have landed
    __syncwarp();            // and the scale words other lanes copied
    const uint4* st = ring.stage + (i % D) * (kFastStageBytes / 16);
    uint4 wv[4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) wv[mt] = st[mt * 32 + lane];
    const uint4 sv = st[4 * 32 + g];
    const uint32_t sws[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int kb = 2 * kc + b;
      if (kb >= kb_count) break;  // warp-uniform: K % 64 == 32 tail
      uint32_t bf[NT][4];
      float2 sx[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (NT == 1 || nt < nt_used) {
          const uint2 v = b_cur[nt][b];
          bf[nt][0] = e4m3x2_to_f16x2(v.x);
          bf[nt][1] = e4m3x2_to_f16x2(v.x >> 16);
          bf[nt][2] = e4m3x2_to_f16x2(v.y);
          bf[nt][3] = e4m3x2_to_f16x2(v.y >> 16);
          if constexpr (kNarrow) {  // this lane's B row is token g: its block's multiplier
            const uint32_t m = reinterpret_cast<const uint32_t*>(s_sx)[kb * BT + nt * 8 + g];
#pragma unroll
            for (int k = 0; k < 4; ++k) bf[nt][k] = hmul2_bits(bf[nt][k], m);
          } else {
            sx[nt] = *reinterpret_cast<const float2*>(s_sx + kb * BT + nt * 8 + 2 * t);
          }
        }
      }
      // At NT = 1 all four row tiles' MMAs are issued before their folds, so each
      // fold's wait on its MMA overlaps the other tiles' decode and MMAs. At NT >= 2
      // each row tile already has NT independent MMA chains (and registers are short).
      constexpr int kParts = NT == 1 ? 4 : 1;
      float part[kParts][NT][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const int pm = kParts == 4 ? mt : 0;
        const uint32_t w0 = b ? wv[mt].z : wv[mt].x;  // row g
        const uint32_t w1 = b ? wv[mt].w : wv[mt].y;  // row g + 8
        uint32_t r0[4], r1[4];
        fp4x8_to_f16_mul(w0, r0);
        fp4x8_to_f16_mul(w1, r1);
        const uint32_t a_s0[4] = {r0[0], r1[0], r0[1], r1[1]};
        const uint32_t a_s1[4] = {r0[2], r1[2], r0[3], r1[3]};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (NT == 1 || nt < nt_used) {  // tile 0 always holds a row
#pragma unroll
            for (int j = 0; j < 4; ++j) part[pm][nt][j] = 0.0f;
            mma_f16_16816(part[pm][nt], a_s0, bf[nt][0], bf[nt][1]);
            mma_f16_16816(part[pm][nt], a_s1, bf[nt][2], bf[nt][3]);
          }
        }
        if (kParts == 1) fast_fold<NT, kSpecial, kNarrow>(acc[mt], part[0], sws[mt], b, sx, nt_used);
      }
      if (kParts == 4) {
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
          fast_fold<NT, kSpecial, kNarrow>(acc[mt], part[kParts == 4 ? mt : 0], sws[mt], b, sx, nt_used);
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) b_cur[nt][h] = b_nxt[nt][h];
  }
}

/// warp_mma_fast with the weight-scale path picked per row group and the token-scale form
/// per tile (stage_b_scales), both warp-uniform.
template <int NT, int D, bool kCoherentB>
__device__ __forceinline__ void warp_mma_fast_any(bool special, bool narrow, float (&acc)[4][NT][4],
                                                  const FastRing<D>& ring, const uint4* __restrict__ wp,
                                                  const uint4* __restrict__ ws4, int kc_begin,
                                                  int kc_end, int kb_count,
                                                  const uint8_t* const (&brow)[NT],
                                                  const float* s_sx, int nt_used) {
  auto run = [&](auto special_c, auto narrow_c) {
    warp_mma_fast<NT, D, decltype(special_c)::value, decltype(narrow_c)::value, kCoherentB>(
        acc, ring, wp, ws4, kc_begin, kc_end, kb_count, brow, s_sx, nt_used);
  };
  if (narrow) {
    if (special)
      run(std::true_type{}, std::true_type{});
    else
      run(std::false_type{}, std::true_type{});
  } else {
    if (special)
      run(std::true_type{}, std::false_type{});
    else
      run(std::false_type{}, std::false_type{});
  }
}

/// Decode mainloop for an expert with at most R = 1, 2 or 4 rows: the same weight stream,
/// decode and FP16 MMAs as warp_mma_fast, but with a block-diagonal B so that all 8 MMA
/// columns do useful work and the per-block fold runs once per P = 8 / R blocks instead
/// of once per block. Column n of B holds token n % R restricted to MX block n / R of the
/// current cycle of P blocks (zeros elsewhere), so after the cycle's MMAs accumulator
/// column j of row r is the partial dot product of row r and token j % R over exactly
/// one MX block, (cycle start + j / R): it is folded with that block's weight and token
/// scales as in warp_mma_fast. The per-lane sums are then added over the lanes holding
/// the same token (warp_reduce_diag). Lane (g, t) holds B column g (one block's 8
/// elements [8t, 8t + 8), loaded once per cycle, a cycle ahead) and accumulator columns
/// 2t, 2t + 1 (blocks (2t) / R, (2t + 1) / R of the cycle, both in chunk f_chunk).
///
/// Every instruction of the chunk loop counts here (at few rows the loop is bound by
/// issue and latency, not by HBM): the copies use one address per chunk with constant
/// offsets; each lane copies its own 16 bytes per row tile and reads back only those, so
/// the weights need no __syncwarp (a lane's reads of a stage issue before its refill, in
/// program order); at R = 2 and 4 the weight scale words skip the ring (kRingScales).
/// Session 8 on the H200 (graph, same run): 283 -> 205 instructions per chunk;
/// M=2 163 -> 158 us, M=4 204 -> 194, M=8 230 -> 220 (with fp4x8_to_f16_mul), M=1 equal.
///   acc[mt][.]: per-lane partial sums, zero on entry; warp_reduce_diag finishes them;
///   brow_src: the E4M3 row of token g % R, or null; or a callable that returns it, called
///   at each load (GEMM2's one-row kernel: the pointer is then rebuilt from the kernel's
///   parameters instead of kept over the loop, where it was spilled); s_sx as in
///   warp_mma_fast ([kb][8]), or [kb][kSxRows] with kSxRows >= R (GEMM2's one-row kernel
///   stages [kb][1]).
template <int R, int D, bool kSpecial, bool kCoherentB, int kSxRows = 8, typename BRow = const uint8_t*>
__device__ __forceinline__ void warp_mma_diag(float (&acc)[4][4], const FastRing<D>& ring,
                                              const uint4* __restrict__ wp,
                                              const uint4* __restrict__ ws4, int kc_begin,
                                              int kc_end, int kb_count, BRow brow_src,
                                              const float* s_sx) {
  static_assert(R == 1 || R == 2 || R == 4, "R rows per cycle column group");
  static_assert(kSxRows >= R, "the staged token scales hold every row of the cycle");
  static_assert((D & (D - 1)) == 0, "ring depth a power of two (stage index by mask)");
  constexpr int P = 8 / R;   // MX blocks per cycle
  constexpr int CP = P / 2;  // ring chunks per cycle
  constexpr uint32_t kTile = 32 * 16;  // bytes of one row tile's chunk (32 lanes x 16)
  // Where the fold's weight scale words come from (measured on the H200, session 8):
  // at R = 1 through the ring with the weights (lanes 0..7 copy a chunk's 128 bytes),
  // at R = 2 and 4 straight from global memory once per cycle (short cycles: the ring's
  // two __syncwarp per chunk cost more than the load).
  constexpr bool kRingScales = R == 1;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int kb_end = min(kb_count, 2 * kc_end);
  const int b_slot = g / R;                  // cycle block of this lane's B column
  const int f_slot0 = (2 * t) / R, f_slot1 = (2 * t + 1) / R;  // of its accumulator columns
  const int f_chunk = f_slot0 / 2;           // both lie in this chunk of the cycle
  const int f_tok0 = (2 * t) % R, f_tok1 = (2 * t + 1) % R;
  const uint4* src = wp + lane;                              // + chunk * 128 + mt * 32
  const uint32_t ring_lane = static_cast<uint32_t>(__cvta_generic_to_shared(ring.stage + lane));
  const uint4* sw_src = ws4 + (kRingScales ? lane : g);      // + chunk * 8
  auto issue = [&](int kc, int i) {  // chunk kc (ring position i) if it exists, then commit
    if (kc < kc_end) {
      const uint4* s = src + static_cast<uint32_t>(kc) * 128u;
      const uint32_t d = ring_lane + static_cast<uint32_t>(i & (D - 1)) * kFastStageBytes;
      cp_async_16_at<0 * kTile, 0 * kTile>(d, s);
      cp_async_16_at<1 * kTile, 1 * kTile>(d, s);
      cp_async_16_at<2 * kTile, 2 * kTile>(d, s);
      cp_async_16_at<3 * kTile, 3 * kTile>(d, s);
      if (kRingScales && lane < 8) cp_async_16_at<4 * kTile, 0>(d, sw_src + static_cast<uint32_t>(kc) * 8u);
    }
    cp_async_commit();
  };
  // B a cycle ahead, by a predicated load (ldg_nc_u2_if): as `v = 0; if (ok) v = ld` it
  // waited for the load right after issuing it (session 9, ncu: 16% of GEMM1's stall
  // samples at M=1, 9% at M=4).
  auto load_b = [&](int kb) {
    uint2 v = make_uint2(0u, 0u);
    const uint8_t* brow;
    if constexpr (std::is_pointer_v<BRow>) brow = brow_src;
    else brow = brow_src();
    ldg_u2_if<kCoherentB>(brow != nullptr && kb < kb_end, brow + kb * 32 + 8 * t, v);
    return v;
  };
  uint2 b_next = load_b(2 * kc_begin + b_slot);
  // The weight scale words of rows g, g + 8 of this lane's fold chunk. Without the ring:
  // loaded at the start of the cycle that folds them, their line moved into L2 a cycle
  // earlier, so the load waits for L2 at most, and only at the fold: zeros, then a
  // predicated load over them (ldg_nc_u4_if). As `v = in range ? load : 0` it compiled
  // to a load and a move right after it that waited for L2: 5.9% of GEMM1's stall
  // samples at M=8 on one instruction (session 23, ncu source counters).
  uint32_t sw[4] = {0u, 0u, 0u, 0u};
  auto sw_at = [&](int kc) { return sw_src + static_cast<uint32_t>(kc) * 8u; };
  if (!kRingScales && kc_begin + f_chunk < kc_end) prefetch_l2(sw_at(kc_begin + f_chunk));
  for (int kc0 = kc_begin; kc0 < kc_end; kc0 += CP) {
    const int cycle_kb = 2 * kc0;  // first block of this cycle
    const uint32_t bx[4] = {e4m3x2_to_f16x2(b_next.x), e4m3x2_to_f16x2(b_next.x >> 16),
                            e4m3x2_to_f16x2(b_next.y), e4m3x2_to_f16x2(b_next.y >> 16)};
    b_next = load_b(cycle_kb + P + b_slot);  // a cycle ahead
    if constexpr (!kRingScales) {
      sw[0] = sw[1] = sw[2] = sw[3] = 0u;
      ldg_nc_u4_if(kc0 + f_chunk < kc_end, sw_at(kc0 + f_chunk), sw);
      if (kc0 + CP + f_chunk < kc_end) prefetch_l2(sw_at(kc0 + CP + f_chunk));
    }
    float part[4][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int j = 0; j < 4; ++j) part[mt][j] = 0.0f;
    const int ci_end = min(CP, kc_end - kc0);
#pragma unroll 1
    for (int ci = 0; ci < ci_end; ++ci) {
      const int kc = kc0 + ci, i = kc - kc_begin;
      // Weights: each lane reads back only the bytes it copied, and its reads of a stage
      // issue before its refill of that stage (program order), so they need no
      // __syncwarp. Ring scale words are shared: copied by lanes 0..7, read by all.
      if constexpr (kRingScales) __syncwarp();  // their last readers are done
      issue(kc + D - 1, i + D - 1);
      cp_async_wait<D - 1>();  // this lane's copies of chunk kc have landed
      const uint4* st = ring.stage + (i & (D - 1)) * (kFastStageBytes / 16);
      if constexpr (kRingScales) {
        __syncwarp();  // and the scale words lanes 0..7 copied
        const uint4 sv = st[4 * 32 + g];
        const bool keep = ci == f_chunk;
        sw[0] = keep ? sv.x : sw[0];
        sw[1] = keep ? sv.y : sw[1];
        sw[2] = keep ? sv.z : sw[2];
        sw[3] = keep ? sv.w : sw[3];
      }
      // B of the chunk's two blocks: this lane's column where the block is its own. A
      // block past K (a K % 64 == 32 tail) gets zeros: its MMAs then add exact zeros
      // whatever the padding weights are (E2M1 values are finite), without a branch.
      uint32_t bsel[2][4];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const bool mine = b_slot == 2 * ci + b && 2 * kc + b < kb_count;
#pragma unroll
        for (int k = 0; k < 4; ++k) bsel[b][k] = mine ? bx[k] : 0u;
      }
      // Row tile by row tile, so only one tile's weight words are live at a time.
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const uint4 wv = st[mt * 32 + lane];
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          uint32_t r0[4], r1[4];
          fp4x8_to_f16_mul(b ? wv.z : wv.x, r0);  // row g
          fp4x8_to_f16_mul(b ? wv.w : wv.y, r1);  // row g + 8
          const uint32_t a_s0[4] = {r0[0], r1[0], r0[1], r1[1]};
          const uint32_t a_s1[4] = {r0[2], r1[2], r0[3], r1[3]};
          mma_f16_16816(part[mt], a_s0, bsel[b][0], bsel[b][1]);
          mma_f16_16816(part[mt], a_s1, bsel[b][2], bsel[b][3]);
        }
      }
    }
    // Fold: column c of this lane is block cycle_kb + f_slot_c of token f_tok_c; blocks
    // past the end got no nonzero B (their partial is exactly 0) and take factor 0, so a
    // scale word past the range (zeros) or NaN cannot reach the sum.
    const int kb0 = cycle_kb + f_slot0, kb1 = cycle_kb + f_slot1;
    const float sx0 = kb0 < kb_end ? s_sx[kb0 * kSxRows + f_tok0] : 0.0f;
    const float sx1 = kb1 < kb_end ? s_sx[kb1 * kSxRows + f_tok1] : 0.0f;
    const int sh0 = 16 * (f_slot0 & 1), sh1 = 16 * (f_slot1 & 1);
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      float s00, s01, s10, s11;  // row g / g + 8, column c
      if constexpr (kSpecial) {
        s00 = e8m0_f((sw[mt] >> sh0) & 0xFFu);
        s10 = e8m0_f((sw[mt] >> (sh0 + 8)) & 0xFFu);
        s01 = e8m0_f((sw[mt] >> sh1) & 0xFFu);
        s11 = e8m0_f((sw[mt] >> (sh1 + 8)) & 0xFFu);
      } else {
        const uint32_t w0 = sw[mt] >> sh0, w1 = sw[mt] >> sh1;
        s00 = e8m0_normal_at(w0, 0);
        s10 = e8m0_normal_at(w0, 8);
        s01 = e8m0_normal_at(w1, 0);
        s11 = e8m0_normal_at(w1, 8);
      }
      acc[mt][0] = __fmaf_rn(part[mt][0], kb0 < kb_end ? s00 * sx0 : 0.0f, acc[mt][0]);
      acc[mt][1] = __fmaf_rn(part[mt][1], kb1 < kb_end ? s01 * sx1 : 0.0f, acc[mt][1]);
      acc[mt][2] = __fmaf_rn(part[mt][2], kb0 < kb_end ? s10 * sx0 : 0.0f, acc[mt][2]);
      acc[mt][3] = __fmaf_rn(part[mt][3], kb1 < kb_end ? s11 * sx1 : 0.0f, acc[mt][3]);
    }
  }
}

/// Finishes warp_mma_diag: adds each token's per-lane sums over the lanes that hold it
/// (accumulator column j holds token j % R), leaving token 2t + c of rows g, g + 8 in
/// acc[mt][2h + c] of lane t (for 2t + c < R) as warp_mma_fast leaves it. The other
/// slots hold tokens >= R, which the epilogues never store (at R = 1 the c = 1 slots even
/// add the already-finished c = 0 total in place: harmless, and cheaper than a copy).
template <int R>
__device__ __forceinline__ void warp_reduce_diag(float (&acc)[4][4]) {
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float v = acc[mt][j];
      if constexpr (R == 1) v = v + acc[mt][j ^ 1];  // both columns are token 0
      if constexpr (R <= 2) v = v + __shfl_xor_sync(0xffffffffu, v, 1);
      v = v + __shfl_xor_sync(0xffffffffu, v, 2);
      acc[mt][j] = v;
    }
}

/// warp_mma_diag with the scale path picked per row group (warp-uniform), then
/// warp_reduce_diag.
template <int R, int D, bool kCoherentB, int kSxRows = 8, typename BRow = const uint8_t*>
__device__ __forceinline__ void warp_mma_diag_any(bool special, float (&acc)[4][4],
                                                  const FastRing<D>& ring, const uint4* __restrict__ wp,
                                                  const uint4* __restrict__ ws4, int kc_begin,
                                                  int kc_end, int kb_count, BRow brow,
                                                  const float* s_sx) {
  if (special) warp_mma_diag<R, D, true, kCoherentB, kSxRows>(acc, ring, wp, ws4, kc_begin, kc_end, kb_count, brow, s_sx);
  else warp_mma_diag<R, D, false, kCoherentB, kSxRows>(acc, ring, wp, ws4, kc_begin, kc_end, kb_count, brow, s_sx);
  warp_reduce_diag<R>(acc);
}

/// The decode mainloop for one token tile of `valid` rows: warp_mma_diag when the tile
/// holds at most 4 rows (NT == 1; its scales always in the wide form), else warp_mma_fast
/// in the form stage_b_scales chose (`narrow`); `row_of(i)` is the E4M3 row of token i of
/// the tile (or null). acc must be zero on entry. kCoherentB: B may have been written
/// while this kernel runs (GEMM2 under the expert-ready counters): plain loads instead of
/// the read-only path (ptx.cuh ldg_u2_if). kSxRows: the rows s_sx stages per MX block, 8
/// or 1 (GEMM2's one-row kernel: tiles of one row, only the one-row loop compiled in).
template <int NT, int D, bool kCoherentB, int kSxRows = 8, typename RowOf>
__device__ __forceinline__ void warp_mma_decode(bool special, bool narrow, int valid, float (&acc)[4][NT][4],
                                                const FastRing<D>& ring, const uint4* __restrict__ wp,
                                                const uint4* __restrict__ ws4, int kc_begin,
                                                int kc_end, int kb_count, RowOf row_of,
                                                const float* s_sx) {
  static_assert(kSxRows == 8 || (kSxRows == 1 && NT == 1), "one staged row: one-row tiles");
  const int g = (threadIdx.x & 31) >> 2;
  if constexpr (NT == 1) {
    if (kSxRows == 1 || valid <= 4) {
      float a[4][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int j = 0; j < 4; ++j) a[mt][j] = 0.0f;
      if constexpr (kSxRows == 1) {
        warp_mma_diag_any<1, D, kCoherentB, 1>(special, a, ring, wp, ws4, kc_begin, kc_end, kb_count,
                                               [&] { return row_of(0); }, s_sx);
      } else {
        // R = rows rounded up to a power of two; the row pointer of token g % R.
        const int R = valid <= 1 ? 1 : valid <= 2 ? 2 : 4;
        const uint8_t* brow = (g % R) < valid ? row_of(g % R) : nullptr;
        if (R == 1) warp_mma_diag_any<1, D, kCoherentB>(special, a, ring, wp, ws4, kc_begin, kc_end, kb_count, brow, s_sx);
        else if (R == 2) warp_mma_diag_any<2, D, kCoherentB>(special, a, ring, wp, ws4, kc_begin, kc_end, kb_count, brow, s_sx);
        else warp_mma_diag_any<4, D, kCoherentB>(special, a, ring, wp, ws4, kc_begin, kc_end, kb_count, brow, s_sx);
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[mt][0][j] = a[mt][j];
      return;
    }
  }
  if constexpr (kSxRows == 8) {
    const uint8_t* brow[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) brow[nt] = nt * 8 + g < valid ? row_of(nt * 8 + g) : nullptr;
    warp_mma_fast_any<NT, D, kCoherentB>(special, narrow, acc, ring, wp, ws4, kc_begin, kc_end, kb_count, brow,
                             s_sx, (valid + 7) / 8);
  }
}

/// GEMM1's side of the expert-ready counters (heuristics.h use_expert_ready), after a
/// warp's epilogue stores: the warp barrier orders every lane's stores before lane 0's
/// release, which adds the warp's stored 8-row tiles to its expert's counter.
__device__ __forceinline__ void expert_ready_signal(uint32_t* counter, int tiles) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) red_add_release_gpu(counter, static_cast<uint32_t>(tiles));
}
/// GEMM2's side, in one thread of the block (a __syncthreads must follow before the
/// others read the intermediate): waits until the counter reaches `target`. GEMM2's grid
/// starts only once every GEMM1 block is resident, so the counts always arrive; the
/// bound (seconds) turns a counting bug into a launch failure instead of a hang.
inline constexpr uint32_t kExpertReadyMaxPolls = 1u << 24;
__device__ __forceinline__ void expert_ready_wait(const uint32_t* counter, uint32_t target) {
  for (uint32_t polls = 0; ld_acquire_gpu(counter) < target; ++polls) {
    if (polls == kExpertReadyMaxPolls) __trap();
    __nanosleep(256);
  }
}

/// Whether a tile of `valid` rows may take stage_b_scales' narrow form: only
/// warp_mma_fast reads it (warp_mma_decode sends tiles of at most 4 rows to the diagonal
/// loop when NT == 1).
template <int NT>
__device__ __forceinline__ bool narrow_allowed(int valid) { return NT > 1 || valid > 4; }

/// Stages one token tile's B-row scales for the decode mainloops (called by every thread
/// of the block after rows_scale is visible; a __syncthreads must follow before use), in
/// one of two forms; returns true (the same in every thread) for the narrow one:
/// - wide: s_sx[kb][BT] = e8m0(scale) * 2^14 * adj(row), s_back[BT] = 2^D(row), with the
///   range factors of b_row_range; rows past `valid` get 0 and 1. warp_mma_diag and
///   warp_mma_fast<..., false> fold with the weight scale times s_sx.
/// - narrow (`allow_narrow`, and every row's bytes within the span below): the same words
///   hold f16x2 multipliers {2^d, 2^d}, d = byte - 127 - c(row) in [-15, 7], which
///   warp_mma_fast<..., true> applies to the row's E4M3 values in B (exact in FP16: E4M3
///   values are multiples of 2^-9 below 448), so its fold multiplies by the weight scale
///   alone; s_back = 2^(c + 14) puts the row's offset and the FP16 weight bias back in the
///   epilogue. c = max(-14, max byte - 134): the row fits when its largest byte is at most
///   247 and every other byte at least 112 + c (NaN bytes give NaN multipliers, rows past
///   `valid` 1.0). The sums are the wide form's scaled by 2^(c + 14 - D) per row (a power
///   of two, at most 2^-71), so they round alike while every value stays normal in fp32:
///   nonzero products are at least 2^-39 times the weight scale, which holds that for
///   weight scale bytes from 40 (real checkpoints sit near 120).
/// All threads load: the block's thread count is a multiple of BT, so thread `tid`
/// always sees row tid % BT and keeps that row's running max in a register (one shared
/// atomicMax per thread); the raw bytes wait in s_sx between the passes, each thread
/// rereading only its own entries.
/// kMayNarrow: the caller's mainloop has the narrow form compiled in (GEMM2's 8-row
/// kernel above 2 tokens, heuristics.h gemm2_narrow_b); otherwise the wide form.
template <int BT, bool kMayNarrow = false>
__device__ __forceinline__ bool stage_b_scales(const uint8_t* const* rows_scale, int valid,
                                               int kb_count, float* s_sx, float* s_back,
                                               int* s_mx, bool allow_narrow = false) {
  // Read here, not hoisted: kept over a decode kernel's tile loop, tid % BT was spilled.
  const int tid = thread_index_here(), nthreads = blockDim.x;
  const int r = tid % BT;
  const uint8_t* rs = r < valid ? rows_scale[r] : nullptr;
  int mx = 0;
#pragma unroll 4
  for (int i = tid; i < kb_count * BT; i += nthreads) {
    int v = 0;
    if (rs != nullptr) {
      v = rs[i / BT];
      if (v != 0xFF && v > mx) mx = v;  // a NaN scale poisons its block anyway
    }
    reinterpret_cast<int*>(s_sx)[i] = v;
  }
  if (mx > 0) atomicMax(s_mx + r, mx);
  __syncthreads();
  const int row_max = s_mx[r];
  if constexpr (kMayNarrow) {
    const int c = max(-14, row_max - 134);
    bool fits = allow_narrow && (rs == nullptr || row_max <= 247);
    if (fits && rs != nullptr)
      for (int i = tid; i < kb_count * BT; i += nthreads) {
        const int v = reinterpret_cast<const int*>(s_sx)[i];
        fits = fits && (v == 0xFF || v >= 112 + c);
      }
    if (__syncthreads_and(fits)) {
      if (tid < BT) s_back[tid] = rs != nullptr ? __uint_as_float(static_cast<uint32_t>(c + 14 + 127) << 23) : 1.0f;
      for (int i = tid; i < kb_count * BT; i += nthreads) {
        const int v = reinterpret_cast<const int*>(s_sx)[i];
        const int d = v - 127 - c;
        const uint32_t h = d >= -14 ? static_cast<uint32_t>(d + 15) << 10 : 0x0200u;  // 2^d in FP16
        reinterpret_cast<uint32_t*>(s_sx)[i] = rs == nullptr ? 0x3C003C00u : v == 0xFF ? 0x7E007E00u : h | (h << 16);
      }
      return true;
    }
  }
  const int d = range_excess(row_max);
  const float adj = __uint_as_float(static_cast<uint32_t>(127 - d) << 23) * 16384.0f;
  if (tid < BT) s_back[tid] = __uint_as_float(static_cast<uint32_t>(127 + d) << 23);
  // Unrolled as the compiler did unasked while tid was the plain threadIdx.x.
#pragma unroll 4
  for (int i = tid; i < kb_count * BT; i += nthreads) {
    const int v = reinterpret_cast<const int*>(s_sx)[i];
    s_sx[i] = rs != nullptr ? e8m0_f(static_cast<uint32_t>(v)) * adj : 0.0f;
  }
  return false;
}

}  // namespace mxmoe::cuda_detail
