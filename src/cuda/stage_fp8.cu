// stage_fp8.cu — the FP8 mode's activation staging (fp8_mode.h, wgmma_fp8.cuh): MXFP8
// rows (E4M3 codes, one E8M0 scale per 32) -> E4M3 codes under one power-of-two scale per
// group of 128 along K, once per forward for x (into routed-row order, so that GEMM1 takes
// a tile's token rows as one TMA box: gathered, a warp per routed row, or from M = 1024 on
// scattered, the warps of a token writing each of its routed rows, heuristics.h
// use_scattered_x_staging and stage_fp8_split), and for the intermediate only with MXMOE_F8_FUSED=0
// (by default GEMM1's drain does it: gemm1_act.cu f8_drain_tile). Both use fp8_regroup.cuh.
//
// A group's byte T is the largest scale byte of its blocks that hold a nonzero code or a
// NaN scale (an all-zero block adds nothing whatever its scale; a NaN scale poisons the
// block, so it poisons the group). Each code of a block with byte t is re-expressed as
// fp8mode::activation_code(c, t, T): while the result stays in E4M3's normal range it is
// the same code with its exponent lowered by T - t (exact); below it rounds onto the
// subnormal grid (the mode's bounded error); regroup_e4m3x4 does both, 4 codes at a time.
// Codes past `cols` are zeros up to `stride`; dst_scale holds 2^(T - 127 + scale_shift)
// as fp32 (the shift carries the row form's reference exponent, engine.h Fp8Dims),
// group-major: the FP8 kernels' producers take a tile's 128 token scales of a group as
// one TMA box (wgmma_fp8.cuh).
#include "common.cuh"
#include "engine.h"
#include "fp8_regroup.cuh"
#include "heuristics.h"
#include "mxmoe/formats.h"
#include "mxmoe/fp8_mode.h"

namespace mxmoe::cuda_detail {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row
constexpr int kGroupBlocks = fp8mode::kBlocksPerGroup;

// One warp per row; each pass covers 4 groups (512 bytes): lane l takes bytes
// [16 l, 16 l + 16) of the pass, half of MX block l / 2 of group l / 8, so the loads and
// stores of a warp are 512 contiguous bytes. (A lane per group, 128 bytes each, took 553
// us for Kimi's M=4096 intermediate on the H200.) The 8 lanes of a group agree on its byte
// by shuffles: key = byte of a used block (256 for a NaN byte), 0 otherwise; max.
// kPasses passes load before any is stored: a warp's stores may alias its later loads as
// far as the compiler knows, so pass by pass each warp had 512 bytes in flight (the
// intermediate at M=4096, 200 MB moved, took 107 us under ncu: ~1.9 TB/s, session 40).
constexpr int kPasses = kStageFp8Passes;

/// kScatter (StageFp8Params::pair_row): row `row` is a token, written at each of its routed
/// rows; lane j < 32 holds the token's slot j (its routed row or -1), shuffled to the warp
/// per store, slots past 32 read from memory (warp-uniform). The row's groups are split
/// over p.split warps, a multiple of 4 groups (whole passes) each, so that few tokens
/// still make warps enough to keep many stores in flight.
template <bool kScatter>
__global__ void __launch_bounds__(kRowsPerBlock * 32) stage_fp8_kernel(const StageFp8Params p) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int split = kScatter ? p.split : 1;
  const int64_t row = warp / split;
  if (row >= p.rows) return;
  if (p.live_rows != nullptr && row >= *p.live_rows) return;  // warp-uniform
  const int kb = static_cast<int>(p.cols / kMxBlock);
  const int groups = static_cast<int>(p.stride / fp8mode::kGroup);
  const int64_t src_row = p.row_map != nullptr ? p.row_map[row] / p.top_k : row;  // warp-uniform
  const uint8_t* src = p.src + src_row * p.cols;
  const uint8_t* sc = p.scale + src_row * kb;
  int32_t route = -1;
  int g_begin = 0, g_end = groups;  // this warp's groups of the row
  if constexpr (kScatter) {
    route = lane < p.top_k ? p.pair_row[row * p.top_k + lane] : -1;
    const int per = (groups + 4 * split - 1) / (4 * split) * 4;
    g_begin = static_cast<int>(warp % split) * per;
    g_end = min(groups, g_begin + per);
  }
  for (int g0 = g_begin; g0 < g_end; g0 += 4 * kPasses) {
    uint4 in[kPasses];
    uint8_t bytes[kPasses];
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int block = (g0 + 4 * i + lane / 8) * kGroupBlocks + (lane % 8) / 2;
      // false for the K tail, for groups past the row, and (split) for the next warp's
      const bool real = block < kb && (!kScatter || g0 + 4 * i + lane / 8 < g_end);
      bytes[i] = real ? sc[block] : uint8_t{0};
      in[i] = real ? *reinterpret_cast<const uint4*>(src + block * kMxBlock + (lane % 2) * 16)
                   : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int grp = g0 + 4 * i + lane / 8;
      const bool real = (grp * kGroupBlocks + (lane % 8) / 2) < kb && (!kScatter || grp < g_end);
      const uint8_t byte = bytes[i];
      const bool nonzero = ((in[i].x | in[i].y | in[i].z | in[i].w) & 0x7F7F7F7Fu) != 0;
      const bool partner = __shfl_xor_sync(0xffffffffu, nonzero, 1);  // the block's other half
      const bool used = real && regroup_block_used(partner || nonzero, byte);
      int key = regroup_block_key(used, byte);
#pragma unroll
      for (int m = 2; m <= 4; m *= 2) key = max(key, __shfl_xor_sync(0xffffffffu, key, m));
      key = max(key, __shfl_xor_sync(0xffffffffu, key, 1));
      // Scattered, every lane takes the slots' shuffles below: no lane leaves the pass.
      if (!kScatter && grp >= groups) continue;
      const uint8_t T = regroup_group_byte(key);
      const int d = static_cast<int>(T) - static_cast<int>(byte);
      uint32_t w[4] = {in[i].x, in[i].y, in[i].z, in[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = used ? regroup_e4m3x4(w[j], d, byte, T) : 0u;
      const int64_t at_col = (g0 + 4 * i) * fp8mode::kGroup + 16 * lane;
      if constexpr (!kScatter) {
        *reinterpret_cast<uint4*>(p.dst + row * p.stride + at_col) = make_uint4(w[0], w[1], w[2], w[3]);
        if (lane % 8 == 0) p.dst_scale[grp * p.scale_rows + row] = regroup_scale(T, p.scale_shift);
      } else {
        const float scale = regroup_scale(T, p.scale_shift);
        for (int j = 0; j < p.top_k; ++j) {  // warp-uniform trip count
          const int32_t at = j < 32 ? __shfl_sync(0xffffffffu, route, j) : p.pair_row[row * p.top_k + j];
          if (at < 0 || grp >= g_end) continue;
          *reinterpret_cast<uint4*>(p.dst + at * p.stride + at_col) = make_uint4(w[0], w[1], w[2], w[3]);
          if (lane % 8 == 0) p.dst_scale[grp * p.scale_rows + at] = scale;
        }
      }
    }
  }
}

}  // namespace

void launch_stage_fp8(const StageFp8Params& p, cudaStream_t stream) {
  MXMOE_CHECK_ARG(p.cols % kMxBlock == 0 && p.stride % fp8mode::kGroup == 0 && p.stride >= p.cols &&
                      p.stride < p.cols + fp8mode::kGroup,
                  "StageFp8Params.stride", p.stride, ": needs cols ", p.cols,
                  " rounded up to a multiple of ", fp8mode::kGroup);
  MXMOE_CHECK_ARG(p.row_map == nullptr || p.top_k >= 1, "StageFp8Params.top_k", p.top_k,
                  ": a gathered staging needs top_k >= 1");
  const bool scatter = p.pair_row != nullptr;
  MXMOE_CHECK_ARG(!scatter || (p.row_map == nullptr && p.live_rows == nullptr && p.top_k >= 1),
                  "StageFp8Params.pair_row", ": a scattered staging takes rows by token (no row_map, no live_rows)",
                  " and top_k >= 1");
  MXMOE_CHECK_ARG(p.split >= 1 && (scatter || p.split == 1), "StageFp8Params.split", p.split,
                  ": needs >= 1, and 1 unless the staging is scattered (pair_row)");
  const int64_t out_rows = scatter ? p.rows * p.top_k : p.rows;
  MXMOE_CHECK_ARG(p.scale_rows == fp8_scale_rows(out_rows), "StageFp8Params.scale_rows", p.scale_rows,
                  ": the scales' groups are fp8_scale_rows(", scatter ? "rows * top_k" : "rows", ") = ",
                  fp8_scale_rows(out_rows), " apart");
  if (p.rows == 0) return;
  const unsigned grid = static_cast<unsigned>((p.rows * p.split + kRowsPerBlock - 1) / kRowsPerBlock);
  if (scatter)
    stage_fp8_kernel<true><<<grid, kRowsPerBlock * 32, 0, stream>>>(p);
  else
    stage_fp8_kernel<false><<<grid, kRowsPerBlock * 32, 0, stream>>>(p);
  MXMOE_LAUNCH_CHECK("stage_fp8_kernel");
}

}  // namespace mxmoe::cuda_detail
