// stage_bf16.cu — the prefill path's operand staging: MXFP8 (or BF16) rows -> BF16 rows
// that hold the exact dequantized values, once per forward, for the wgmma mainloop
// (wgmma_mx.cuh) to stream with plain copies. It stages x for GEMM1; GEMM1's prefill
// epilogue writes the intermediate for GEMM2 in the same layout itself (gemm1_act.cu).
//
// Row r of `dst` holds value * 2^-D(r): D is the row's range factor exponent (the largest
// scale byte above kUnitRangeMaxScale, mx_mma.cuh range_excess), so a token with
// huge scales still sums in fp32 range; back[r] = 2^D is applied after the GEMM. Inside
// each MX block of 32 the elements are stored in the order the tiled weights feed the MMA
// (engine.h): position 16s + k' (k16 step s, MMA k index k') holds element
//   8 * ((k' % 8) / 2) + 4s + 2 * (k' / 8) + k' % 2.
// Columns past `cols` are zeros up to `stride` (a multiple of 64). A value is exact in
// BF16 when it is 0, NaN, or a normal BF16 number (|v| >= 2^-126) that converts back to
// itself; anything else sets the flag bit, and that GEMM runs on the generic path.
#include <algorithm>
#include <atomic>

#include "common.cuh"
#include "engine.h"
#include "heuristics.h"
#include "mx_mma.cuh"
#include "mxmoe/formats.h"

namespace mxmoe::cuda_detail {

namespace {

// One MX block per lane; a row's blocks are split over warps (ceil(stride / 32 / 32) of
// them), so that a handful of rows (decode-sized prefill) still spreads over many SMs.
constexpr int kWarpsPerCta = 8;
constexpr int kBlocksPerWarp = 32;

/// Output position o (0..31) of an MX block <- input element.
__device__ __forceinline__ int staged_source(int o) {
  const int s = o >> 4, k = o & 15;
  return 8 * ((k & 7) >> 1) + 4 * s + 2 * (k >> 3) + (k & 1);
}

/// The checked conversion of one MXFP8 block (value = code * s), for blocks whose scale
/// lets a value fall under 2^-126: sets `inexact` where BF16 cannot hold a value.
__device__ __forceinline__ void e4m3_block_checked(const uint32_t (&words)[8], float s, uint16_t (&in)[32],
                                                   bool& inexact) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const uint8_t code = static_cast<uint8_t>(words[i >> 2] >> (8 * (i & 3)));
    const float v = fmt::e4m3_to_float(code) * s;
    in[i] = fmt::float_to_bf16(v);
    const bool ok = v == 0.0f ? (code & 0x7Fu) == 0 : fmt::is_nan(v) ||
                    (fabsf(v) >= 1.17549435e-38f && fmt::bf16_to_float(in[i]) == v);
    inexact = inexact || !ok;
  }
}

/// The same for a block with scale byte >= kE4m3NormalMinScale (mx_mma.cuh): every value
/// is exact in BF16, no per-value check. NaN codes give the multiply's canonical NaN, the
/// same bits as the checked path's.
__device__ __forceinline__ void e4m3_block_fast(const uint32_t (&words)[8], float s, uint16_t (&in)[32]) {
#pragma unroll
  for (int w = 0; w < 8; ++w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t pair = e4m3x2_scaled_to_bf16x2(words[w] >> (16 * h), s);
      in[4 * w + 2 * h] = static_cast<uint16_t>(pair);
      in[4 * w + 2 * h + 1] = static_cast<uint16_t>(pair >> 16);
    }
  }
}

/// One warp's part of one row (`part` of the row's warps_per_row).
template <bool kFp8>
__device__ __forceinline__ void stage_row_part(const StageBf16Params& p, int64_t row, int part) {
  const int lane = threadIdx.x & 31;
  const int kb = static_cast<int>(p.cols / kMxBlock), kbp = static_cast<int>(p.stride / kMxBlock);
  const int b = part * kBlocksPerWarp + lane;  // this lane's MX block
  float adj = 1.0f;
  [[maybe_unused]] int d = 0;
  if constexpr (kFp8) {
    // The range factor needs the whole row's largest scale: each warp of the row reads
    // all of them (kb bytes).
    const uint8_t* sc = p.scale + row * kb;
    int mx = 0;
    for (int i = lane; i < kb; i += 32) {
      const int v = sc[i];
      if (v != 0xFF && v > mx) mx = v;  // a NaN scale poisons its block anyway
    }
#pragma unroll
    for (int sh = 16; sh >= 1; sh >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
    d = range_excess(mx);
    adj = __uint_as_float(static_cast<uint32_t>(127 - d) << 23);
    if (part == 0 && lane == 0) p.back[row] = __uint_as_float(static_cast<uint32_t>(127 + d) << 23);
  } else if (part == 0 && lane == 0) {
    p.back[row] = 1.0f;
  }
  bool inexact = false;
  if (b < kbp) {
    uint16_t in[32];
    if (b >= kb) {
#pragma unroll
      for (int i = 0; i < 32; ++i) in[i] = 0;
    } else if constexpr (kFp8) {
      const uint8_t* codes = static_cast<const uint8_t*>(p.src) + row * p.cols + b * kMxBlock;
      const uint4 c0 = *reinterpret_cast<const uint4*>(codes);
      const uint4 c1 = *reinterpret_cast<const uint4*>(codes + 16);
      const uint32_t words[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
      const int sb = p.scale[row * kb + b];
      const float s = fmt::e8m0_to_float(static_cast<uint8_t>(sb)) * adj;
      // (a NaN scale, 0xFF, passes: all NaN)
      if (sb - d >= kE4m3NormalMinScale) e4m3_block_fast(words, s, in);
      else e4m3_block_checked(words, s, in, inexact);
    } else {
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.src) +
                                                        row * p.cols + b * kMxBlock);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 v = src[q];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          in[8 * q + 2 * i] = static_cast<uint16_t>(w[i]);
          in[8 * q + 2 * i + 1] = static_cast<uint16_t>(w[i] >> 16);
        }
      }
    }
    uint32_t o[16];
#pragma unroll
    for (int i = 0; i < 16; ++i)
      o[i] = static_cast<uint32_t>(in[staged_source(2 * i)]) |
             (static_cast<uint32_t>(in[staged_source(2 * i + 1)]) << 16);
    uint4* dst = reinterpret_cast<uint4*>(p.dst + row * p.stride + b * kMxBlock);
#pragma unroll
    for (int q = 0; q < 4; ++q) dst[q] = make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
  }
  if (__any_sync(0xffffffffu, inexact) && lane == 0) atomicOr(p.flag, p.flag_bit);
}

template <bool kFp8>
__global__ void __launch_bounds__(kWarpsPerCta * 32) stage_bf16_kernel(const StageBf16Params p, int warps_per_row) {
  // As a programmatic dependent (StageBf16Params::programmatic) this grid may run beside
  // the permutation; it waits for it before reading a source that kernel wrote, and in
  // any case before it ends, so that the next kernel, launched after this one, finds the
  // permutation complete too. Without a programmatic launch the waits return at once.
  if (p.src_after_predecessor) pdl_wait_for_predecessor();
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + (threadIdx.x >> 5);
  const int64_t row = warp / warps_per_row;
  if (row < p.rows) stage_row_part<kFp8>(p, row, static_cast<int>(warp - row * warps_per_row));
  pdl_wait_for_predecessor();
}

}  // namespace

void launch_stage_bf16(const StageBf16Params& p, cudaStream_t stream) {
  MXMOE_CHECK_ARG(p.cols % kMxBlock == 0 && p.stride % 64 == 0 && p.stride >= p.cols,
                  "StageBf16Params.stride", p.stride, ": needs a multiple of 64 >= cols ", p.cols);
  if (p.rows == 0) return;
  const int warps_per_row = static_cast<int>((p.stride / kMxBlock + kBlocksPerWarp - 1) / kBlocksPerWarp);
  const int64_t warps = p.rows * warps_per_row;
  const unsigned grid = static_cast<unsigned>((warps + kWarpsPerCta - 1) / kWarpsPerCta);
  launch_kernel(p.fp8 ? stage_bf16_kernel<true> : stage_bf16_kernel<false>, dim3(grid), dim3(kWarpsPerCta * 32), 0,
                stream, p.programmatic, p, warps_per_row);
  MXMOE_LAUNCH_CHECK("stage_bf16_kernel");
}

// ---------------------------------------------------------------- prefill grid

int current_sm_count() {
  static std::atomic<int> cache[64] = {};
  return per_device_cached(cache, [](int dev) {
    int n = 0;
    MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  });
}

int prefill_ctas(int per_sm) {
  const int sms = current_sm_count() * per_sm;
  // Tests shrink the grid so that each CTA loops over several tiles (both consumers'
  // turns, ring wrap-around) on small problems.
  return env_knob("MXMOE_PREFILL_CTAS", 1, sms - 1, sms);
}

int decode_balanced_blocks(int blocks_per_sm) {
  const int wave = std::min(std::max(blocks_per_sm, 1) * current_sm_count(), kBalancedMaxBlocks);
  // Tests shrink the grid so that small problems cut row groups between warps, or give
  // blocks several units.
  return env_knob("MXMOE_DECODE_BLOCKS", 1, wave - 1, wave);
}

int prefill_tile_tokens(int64_t tokens, int64_t top_k, int num_local) {
  const int n = env_knob("MXMOE_PREFILL_TOKEN_TILE", 32, 128, 0);
  return n % 32 == 0 && n > 0 ? n : prefill_token_tile(tokens, top_k, num_local);
}

}  // namespace mxmoe::cuda_detail
