// gemm2.cu — GEMM2: intermediate rows (MXFP8 or BF16) x W2^T (MXFP4) + bias, one fp32
// row of K values per routed row (the finalize kernel sums them in slot order).
// Same warp mainloop and work split as GEMM1 (gemm1_act.cu): warp = 64 output columns
// (rows of W2), token tiles strided over grid z, per-expert counts read on the device.
#include <algorithm>
#include <type_traits>

#include "common.cuh"
#include "engine.h"
#include "heuristics.h"
#include "mx_mma.cuh"
#include "wgmma_fp8.cuh"
#include "wgmma_mx.cuh"

namespace mxmoe::cuda_detail {

namespace {

template <int NT, bool kFp8>
__global__ void __launch_bounds__(kWarps * 32) gemm2_kernel(const Gemm2Params p) {
  constexpr int BT = 8 * NT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int e = blockIdx.y;
  const int rg = blockIdx.x * kWarps + warp;
  if (rg >= p.w2.rg) return;
  // Fallback of the prefill path: runs only when staging flagged an inexact value.
  if (p.inexact != nullptr) {
    pdl_wait_for_predecessor();  // the prefill kernel's (Gemm2Params::fallback_programmatic)
    if ((*p.inexact & kInexactInter) == 0) return;
  }
  const int count = p.counts[e];
  if (count == 0) return;
  const int off = p.offsets[e];
  const int64_t K = p.hidden, N = p.intermediate;
  const int kbN = static_cast<int>(N / kMxBlock);
  const uint4* wp = p.w2.packed + (static_cast<size_t>(e) * p.w2.rg + rg) * p.w2.kc * 4 * 32;
  const uint32_t* ws = p.w2.scale + (static_cast<size_t>(e) * p.w2.rg + rg) * p.w2.kc * 4 * 8;
  const float* bias = p.bias ? p.bias + static_cast<size_t>(e) * K : nullptr;

  for (int tile = blockIdx.z; tile * BT < count; tile += gridDim.z) {
    const void* brow[NT];
    const uint8_t* bsc[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int r = tile * BT + nt * 8 + g;
      brow[nt] = nullptr;
      bsc[nt] = nullptr;
      if (r < count) {
        const int64_t row = off + r;
        if constexpr (kFp8) {
          brow[nt] = static_cast<const uint8_t*>(p.inter) + row * N;
          bsc[nt] = p.inter_scale + row * kbN;
        } else {
          brow[nt] = static_cast<const uint16_t*>(p.inter) + row * N;
        }
      }
    }
    float acc[4][NT][4], back[NT][2];
    warp_tile_mx<NT, kFp8>(acc, back, wp, ws, p.w2.kc, kbN, brow, bsc);

#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int r = tile * BT + nt * 8 + 2 * t + c;
        if (r >= count) continue;
        float* yr = p.y + (off + r) * K;
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t col = 64 * rg + 16 * mt + 8 * h + g;
            if (col >= K) continue;
            float v = acc[mt][nt][2 * h + c] * back[nt][c];
            if (bias) v = v + bias[col];
            yr[col] = v;
          }
      }
  }
}


// Decode path (heuristics.h): E4M3 intermediate through the FP16 mainloop, weights
// streamed D chunks deep, the token tile's row scales staged once per block.
//
// One block's work with token tile 8 * NT (the kernel's shared staging, sized for its
// own larger or equal tile; s_sx used as [N/32][8 * NT]). kNarrow: tiles of more than 4
// rows may take stage_b_scales' narrow form (heuristics.h gemm2_narrow_b). kOneRow (NT 1):
// tiles of one row through the one-row diagonal loop only, s_sx used as [N/32][1]
// (heuristics.h gemm2_one_row).
template <int NT, int D, bool kNarrow, bool kOneRow = false>
__device__ __forceinline__ void gemm2_fast_block(const Gemm2Params& p, int count, float* s_sx,
                                                 float* s_back, int* s_mx, const uint8_t** s_rsc,
                                                 const FastRing<D>& ring) {
  static_assert(!kOneRow || (NT == 1 && !kNarrow), "the one-row kernel has one wide-form row");
  constexpr int BT = kOneRow ? 1 : 8 * NT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int e = blockIdx.y;
  const int rg = blockIdx.x * kWarps + warp;
  const bool active = rg < p.w2.rg;
  const int off = p.offsets[e];
  const int64_t K = p.hidden, N = p.intermediate;
  const int kbN = static_cast<int>(N / kMxBlock);
  const int rgc = active ? rg : 0;
  const uint4* wp = p.w2.packed + (static_cast<size_t>(e) * p.w2.rg + rgc) * p.w2.kc * 4 * 32;
  const uint4* ws4 = reinterpret_cast<const uint4*>(p.w2.scale) +
                     (static_cast<size_t>(e) * p.w2.rg + rgc) * p.w2.kc * 8;

  // grid z = token-tile slots x splits of the reduction (whole 64-K chunks).
  const int S = p.splits;
  const int split = static_cast<int>(blockIdx.z) % S;
  const int kc_begin = split * p.w2.kc / S, kc_end = (split + 1) * p.w2.kc / S;

  // row0: the tile's first row in the expert (tile slot blockIdx.z / S, every gridDim.z / S-th
  // tile); the loop counts rows, not tiles, so that no tile index is kept (and spilled) beside it.
  for (int row0 = blockIdx.z / S * BT; row0 < count; row0 += gridDim.z / S * BT) {
    const int valid = min(BT, count - row0);
    if (active) fast_prefetch<D>(ring, wp, ws4, kc_begin, kc_end);  // before the staging
    // GEMM1's intermediate rows of this expert and their scales are complete: all of
    // GEMM1, or under the expert-ready counters this expert's part (the barrier below
    // orders the other threads' reads after thread 0's acquire).
    if (p.expert_ready == nullptr)
      pdl_wait_for_predecessor();
    else if (threadIdx.x == 0)
      expert_ready_wait(p.expert_ready + e, expert_ready_target(p.ready_row_groups, count));
    if (threadIdx.x < BT) {
      s_mx[threadIdx.x] = 0;
      s_rsc[threadIdx.x] = static_cast<int>(threadIdx.x) < valid
                               ? p.inter_scale + static_cast<int64_t>(off + row0 + threadIdx.x) * kbN
                               : nullptr;
    }
    __syncthreads();
    const bool narrow = stage_b_scales<BT, kNarrow>(s_rsc, valid, kbN, s_sx, s_back, s_mx,
                                                    narrow_allowed<NT>(valid));
    __syncthreads();
    if (!active) pdl_allow_dependents();
    if (active) {
      // Read per tile, just before its only use, rather than kept over the tile loop
      // (at 96 registers it was spilled to local memory).
      const bool special =
          p.w2.special == nullptr || p.w2.special[static_cast<size_t>(e) * p.w2.rg + rgc] != 0;
      float acc[4][NT][4];
      zero_acc(acc);
      warp_mma_decode<NT, D, true, kOneRow ? 1 : 8>(  // coherent B loads: GEMM1 may still be running
          special, narrow, valid, acc, ring, wp, ws4, kc_begin, kc_end, kbN,
          [&](int i) {
            int row = off + row0 + i;
            // Opaque to the compiler, so the pointer is rebuilt from the parameters at
            // each use instead of hoisted out of the loop and spilled (the one-row
            // kernel's 80 registers; PERFORMANCE.md sessions 57 and 58).
            asm volatile("" : "+r"(row));
            return static_cast<const uint8_t*>(p.inter) + static_cast<int64_t>(row) * p.intermediate;
          }, s_sx);
      pdl_allow_dependents();  // finalize's blocks may start (as in gemm1_fast_block)
      // Epilogue operands, formed only now so they hold no registers over the mainloop.
      const float* bias = p.bias ? p.bias + static_cast<size_t>(e) * K : nullptr;
      // The split again, read afresh: kept from block start, it was spilled (ptx.cuh).
      const int y_split = block_index_z_here() % S;
      float* y = p.y + y_split * p.split_stride;

#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          // The one-row loop leaves its row in column 0 of lane t = 0 (warp_reduce_diag).
          const int r = kOneRow ? (2 * t + c == 0 ? row0 : count) : row0 + nt * 8 + 2 * t + c;
          if (r >= count) continue;
          // Split: the unscaled partial; finalize applies the factor after the sum.
          const float back = S > 1 ? 1.0f : s_back[kOneRow ? 0 : nt * 8 + 2 * t + c];
          float* yr = y + static_cast<int64_t>(off + r) * K;
#pragma unroll
          for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int64_t col = 64 * rg + 16 * mt + 8 * h + g;
              if (col >= K) continue;
              float v = acc[mt][nt][2 * h + c] * back;
              if (bias) v = v + bias[col];
              yr[col] = v;
            }
        }
    }
    if (S > 1 && block_index_z_here() % S == 0 && static_cast<int>(threadIdx.x) < valid)
      p.back[off + row0 + threadIdx.x] = s_back[threadIdx.x];
    __syncthreads();  // the next tile rewrites the shared staging
  }
}

/// Floats of a decode block's staged token scales ([N/32][rows], rows = 8 * NT or 1); the
/// rings follow them. The one-row kernel's are padded to 128 bytes, so its rings start
/// aligned whatever N is (at 8 * NT rows they are a multiple of 32 bytes as they stand,
/// and of 128 when N / 32 is a multiple of 4, as at Kimi-K3's shapes).
template <int NT, bool kOneRow>
__host__ __device__ constexpr int64_t fast_sx_floats(int64_t kb_count) {
  return kOneRow ? (kb_count + 31) / 32 * 32 : kb_count * 8 * NT;
}

// The decode kernel of one count class (heuristics.h plan_fast); the 16-row kernel also
// serves the experts of at most 8 rows, with 8-row tiles (as gemm1_fast_kernel). The
// one-row kernel (kOneRow) takes every expert's rows one at a time, at more blocks per SM.
template <int NT, int D, bool kNarrow, bool kOneRow = false>
__global__ void __launch_bounds__(kWarps * 32, kOneRow ? kGemm2OneRowBlocksPerSm : fast_min_blocks(NT, D))
    gemm2_fast_kernel(const Gemm2Params p) {
  constexpr int BT = kOneRow ? 1 : 8 * NT;
  extern __shared__ __align__(128) float s_sx[];  // [N/32][BT] (fast_sx_floats), then the warps' rings; the region starts on 128 bytes (fast_ring_of_warp)
  __shared__ float s_back[BT];
  __shared__ int s_mx[BT];
  __shared__ const uint8_t* s_rsc[BT];
  // As a programmatic dependent of GEMM1 (Gemm2Params::programmatic) the counts and
  // offsets and the weights may be read at once: this grid starts only once every GEMM1
  // block has let it, and each does so after waiting for the prologue when it is a
  // programmatic dependent itself (or began after it). GEMM1's intermediate only after
  // pdl_wait_for_predecessor.
  const int count = p.counts[blockIdx.y];
  // Not this launch's count class (or no rows): block-uniform. Block (0, 0, 0) always
  // waits, so this grid's end implies GEMM1's (finalize relies on it).
  if (count <= p.fast.count_lo || count > p.fast.count_hi) {
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) pdl_wait_for_predecessor();
    return;
  }
  const FastRing<D> ring = fast_ring_of_warp<D>(s_sx + fast_sx_floats<NT, kOneRow>(p.intermediate / kMxBlock));
  if constexpr (NT == 2) {
    if (count <= 8)
      gemm2_fast_block<1, D, kNarrow>(p, count, s_sx, s_back, s_mx, s_rsc, ring);
    else
      gemm2_fast_block<NT, D, kNarrow>(p, count, s_sx, s_back, s_mx, s_rsc, ring);
  } else {
    gemm2_fast_block<NT, D, kNarrow, kOneRow>(p, count, s_sx, s_back, s_mx, s_rsc, ring);
  }
  // Under the expert-ready counters no block waited for GEMM1's grid: block (0, 0, 0)
  // does so last, so that this grid's end still implies GEMM1's.
  if (p.expert_ready != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0)
    pdl_wait_for_predecessor();
}

/// Dynamic shared memory of a decode launch: the token scales and the rings, padded so
/// that at most kGemm2ReadyBlocksPerSm blocks fit per SM when the unsplit grid starts
/// beside GEMM1 (heuristics.h gemm2_ready_capped).
template <int NT, int D, bool kNarrow, bool kOneRow = false>
size_t fast_smem_bytes(const Gemm2Params& p) {
  const size_t smem = static_cast<size_t>(fast_sx_floats<NT, kOneRow>(p.intermediate / kMxBlock)) * sizeof(float) +
                      fast_ring_bytes<D>();
  if (!gemm2_ready_capped(p.tokens, p.splits, p.expert_ready != nullptr)) return smem;
  int dev = 0, sm_bytes = 0, reserved = 0;
  cudaFuncAttributes a{};
  MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
  MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sm_bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
  MXMOE_CUDA_CHECK(cudaFuncGetAttributes(&a, gemm2_fast_kernel<NT, D, kNarrow, kOneRow>));
  return smem_for_blocks_per_sm(smem, a.sharedSizeBytes + static_cast<size_t>(reserved),
                                static_cast<size_t>(sm_bytes), kGemm2ReadyBlocksPerSm);
}

/// Calls f(narrow, one_row) (std::bool_constant each) for the kernel of GEMM2's 8-row
/// decode class at `p`'s shape: the one-row kernel at one token (heuristics.h
/// gemm2_one_row), else the 8-row kernel with or without the narrow B form
/// (gemm2_narrow_b). The one place that choice is made, for the launch and for the
/// occupancy query the tests make (gemm2_decode_blocks_per_sm).
template <class F>
decltype(auto) with_eight_row_kernel(const Gemm2Params& p, F&& f) {
  using std::false_type, std::true_type;
  if (gemm2_one_row(p.tokens)) return f(false_type{}, true_type{});
  if (gemm2_narrow_b(p.tokens, p.splits)) return f(true_type{}, false_type{});
  return f(false_type{}, false_type{});
}

template <int NT, int D, bool kNarrow = false, bool kOneRow = false>
void launch_fast(const Gemm2Params& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.w2.rg + kWarps - 1) / kWarps),
                  static_cast<unsigned>(p.num_local), static_cast<unsigned>(p.fast.z * p.splits));
  const size_t smem = fast_smem_bytes<NT, D, kNarrow, kOneRow>(p);
  allow_fast_smem(gemm2_fast_kernel<NT, D, kNarrow, kOneRow>, smem);
  launch_kernel(gemm2_fast_kernel<NT, D, kNarrow, kOneRow>, grid, dim3(kWarps * 32), smem, stream,
                p.programmatic, p);
  MXMOE_LAUNCH_CHECK("gemm2_fast_kernel");
}

// Prefill path (heuristics.h use_prefill, wgmma_mx.cuh): consumer warp w of warpgroup wg
// holds output columns 64 rg + 16 w + 8 h + g of row groups rg = 4 rb + 2 wg (acc_a) and
// + 1 (acc_b) for kTok routed rows, plus the bias. No range factor: the staged
// intermediate has factor 1 (GEMM1's prefill epilogue).
#if defined(MXMOE_SM90A)
template <int kTok = kPfTokens>
__device__ __forceinline__ void pf_store_y(const Gemm2Params& p, const float (&acc)[kTok / 2], int rg,
                                           const PfTile& tile) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int K = static_cast<int>(p.hidden);
  // This thread's two columns (h = 0, 1), their bias and its first row, once: the stores
  // below are then predicated stores at fixed offsets. (Read per element, the bias load
  // could not move past the y stores, which may alias it: a branch, a load and 64-bit
  // compares per store, ~17 instructions each, a quarter of the FP8 GEMM2's consumer
  // samples.) No bias adds -0, which leaves every value as it is, -0 included.
  const int col0 = 64 * rg + 16 * warp + g;
  const bool ok0 = col0 < K, ok1 = col0 + 8 < K;
  const float* bias = p.bias ? p.bias + static_cast<size_t>(tile.e) * K : nullptr;
  const float b0 = bias != nullptr && ok0 ? bias[col0] : -0.0f;
  const float b1 = bias != nullptr && ok1 ? bias[col0 + 8] : -0.0f;
  const int rows_left = p.counts[tile.e] - tile.tt * kTok - 2 * t;  // row 8j + c exists below it
  float* y = p.y + (static_cast<int64_t>(p.offsets[tile.e]) + tile.tt * kTok + 2 * t) * K + col0;
#pragma unroll
  for (int j = 0; j < kTok / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      if (8 * j + c >= rows_left) continue;
      float* yr = y + static_cast<int64_t>(8 * j + c) * K;
      if (ok0) yr[0] = acc[4 * j + c] + b0;
      if (ok1) yr[8] = acc[4 * j + 2 + c] + b1;
    }
}
#endif

// FP8 mode (wgmma_fp8.cuh): consumer warp w of warpgroup wg holds, for the tile's tokens
// (routed rows) 64 wg + 16 w + 8 h + g (h = 0, 1), output columns 128 rb + 8j + 2t + c
// (f8_mainloop), every scale but the row form's applied (no range factor).
#if defined(MXMOE_SM90A)
/// The FP8 kernel's epilogue: y = acc * row scale + bias (one FFMA: F8RowScales; no bias
/// adds -0, which leaves every value as it is), rounded to BF16, a bf16x2 per row and
/// column pair (Gemm2Params::y_bf16: finalize then reads 2 bytes a value instead of 4). The
/// biases and scales are read before the first store, which may alias them (as
/// pf_store_y).
template <bool kRowScale>
__device__ __forceinline__ void f8_store_y(const Gemm2Params& p, const float (&acc)[64],
                                           const F8RowScales<kRowScale>& row_scales, const PfTile& tile, int wg) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int K = static_cast<int>(p.hidden);
  const int col0 = kF8Rows * tile.rb + 2 * t;  // + 8j; col0 + 8j + 1 < K where col0 + 8j < K (K even)
  const float* bias = p.bias ? p.bias + static_cast<size_t>(tile.e) * K + col0 : nullptr;
  float2 b[16], s[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const bool ok = col0 + 8 * j < K;
    b[j] = bias != nullptr && ok ? *reinterpret_cast<const float2*>(bias + 8 * j) : make_float2(-0.0f, -0.0f);
    s[j] = row_scales.pair(j);
  }
  const int n = 64 * wg + 16 * warp + g;
  const int rows_left = p.counts[tile.e] - tile.tt * kPfTokens - n;  // row n + 8h exists below it
  uint16_t* y = p.y_bf16 + (static_cast<int64_t>(p.offsets[tile.e]) + tile.tt * kPfTokens + n) * K + col0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (8 * h >= rows_left) break;
    uint16_t* yr = y + static_cast<int64_t>(8 * h) * K;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      if (col0 + 8 * j < K)
        *reinterpret_cast<uint32_t*>(yr + 8 * j) =
            bf16x2_rn(fmaf(acc[4 * j + 2 * h], s[j].x, b[j].x), fmaf(acc[4 * j + 2 * h + 1], s[j].y, b[j].y));
  }
}
#endif

// kRowScale: the weights' row form (engine.h fp8_weights), whose row scales f8_store_y
// applies.
template <bool kRowScale>
__global__ void __launch_bounds__(F8Cta<false>::kThreads, 1)
    gemm2_fp8_kernel(const Gemm2Params p, const __grid_constant__ CUtensorMap w_map,
                     const __grid_constant__ CUtensorMap b_map, const __grid_constant__ CUtensorMap bs_map) {
#if defined(MXMOE_SM90A)
  extern __shared__ uint8_t f8_smem[];
  const F8Operands o{.wmap = &w_map, .bmap = &b_map, .bsmap = &bs_map, .ws = p.w2f8.scale,
                     .rows_p = p.w2f8.rows_p, .groups = p.w2f8.groups, .counts = p.counts,
                     .offsets = p.offsets, .num_local = p.num_local};
  f8_run<kRowScale>(o, f8_smem, [&](const float (&acc)[64], const F8RowScales<kRowScale>& row_scales,
                                          const PfTile& tile, int wg, const F8Ring&) {
    f8_store_y<kRowScale>(p, acc, row_scales, tile, wg);
  });
#endif
}

template <int kTok>
__global__ void __launch_bounds__(kPfThreads, PfGeometry<kTok>::kCtasPerSm)
    gemm2_prefill_kernel(const Gemm2Params p, const __grid_constant__ CUtensorMap ib_map) {
#if defined(MXMOE_SM90A)
  pdl_allow_dependents();  // the generic fallback after it (as in gemm1_prefill_kernel)
  if (*p.inexact & kInexactInter) return;  // an intermediate value is not exact in BF16
  extern __shared__ uint8_t pf_smem[];
  PfOperands o = pf_operands(p.w2, p.ib, p.ib_stride, nullptr, nullptr, 1, p.counts,
                             p.offsets, p.num_local);
  o.b_map = &ib_map;
  o.split_acc = p.split_acc;
  o.split_count = p.split_count;
  pf_run<false, kTok, pf_tma_rows(kTok)>(o, pf_smem, [&](const float (&acc_a)[kTok / 2], const float (&acc_b)[kTok / 2],
                                      const PfTile& tile, int wg, const PfRing&) {
    const int rg = tile.rb * kPfRowGroups + 2 * wg;
    pf_store_y<kTok>(p, acc_a, rg, tile);
    pf_store_y<kTok>(p, acc_b, rg + 1, tile);
  });
#endif
}

template <int kTok>
void launch_prefill(const Gemm2Params& p, cudaStream_t stream) {
  MXMOE_CUDA_CHECK(cudaFuncSetAttribute(gemm2_prefill_kernel<kTok>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, PfGeometry<kTok>::kSmemBytes));
  // The 96- and 128-token tiles' B chunks go through the TMA engine (wgmma_mx.cuh
  // pf_producer_tma, pf_tma_rows).
  const CUtensorMap ib_map =
      pf_tma_rows(kTok) ? staged_rows_map(p.ib, p.tokens * p.top_k, p.ib_stride, kTok) : CUtensorMap{};
  gemm2_prefill_kernel<kTok><<<prefill_ctas(PfGeometry<kTok>::kCtasPerSm), kPfThreads, PfGeometry<kTok>::kSmemBytes, stream>>>(p, ib_map);
  MXMOE_LAUNCH_CHECK("gemm2_prefill_kernel");
}

template <int NT, bool kFp8>
void launch_t(const Gemm2Params& p, cudaStream_t stream) {
  constexpr int BT = 8 * NT;
  const int64_t tiles = (p.tokens + BT - 1) / BT;
  const dim3 grid(static_cast<unsigned>((p.w2.rg + kWarps - 1) / kWarps),
                  static_cast<unsigned>(p.num_local),
                  static_cast<unsigned>(generic_grid_z(tiles, p.prefill)));
  launch_kernel(gemm2_kernel<NT, kFp8>, grid, dim3(kWarps * 32), 0, stream, p.prefill && p.fallback_programmatic, p);
  MXMOE_LAUNCH_CHECK("gemm2_kernel");
}

}  // namespace

void check_gemm2_prefill_kernels() {
  for_each_prefill_tile([&](auto t) {
    constexpr int kTok = decltype(t)::value;
    pf_check_registers<kTok>(reinterpret_cast<const void*>(gemm2_prefill_kernel<kTok>), "gemm2_prefill_kernel");
  });
}

size_t gemm2_prefill_local_bytes() {
  size_t most = 0;
  for_each_prefill_tile([&](auto t) {
    most = std::max(most, most_local_bytes({reinterpret_cast<const void*>(gemm2_prefill_kernel<decltype(t)::value>)}));
  });
  return most;
}

int gemm2_decode_blocks_per_sm(const Gemm2Params& p) {
  // The kernel launch_gemm2 picks for 8-row tiles (or one-row ones), with its shared memory.
  return with_eight_row_kernel(p, [&](auto narrow_c, auto one_row_c) {
    constexpr bool kNarrow = decltype(narrow_c)::value, kOneRow = decltype(one_row_c)::value;
    const auto kernel = gemm2_fast_kernel<1, 4, kNarrow, kOneRow>;
    const size_t smem = fast_smem_bytes<1, 4, kNarrow, kOneRow>(p);
    allow_fast_smem(kernel, smem);
    int blocks = 0;
    MXMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarps * 32, smem));
    return blocks;
  });
}

size_t gemm2_decode_local_bytes() {
  // The kernels of launch_gemm2's decode classes (with_eight_row_kernel's three for 8-row tiles).
  return most_local_bytes({reinterpret_cast<const void*>(gemm2_fast_kernel<1, 4, false, false>),
                           reinterpret_cast<const void*>(gemm2_fast_kernel<1, 4, true, false>),
                           reinterpret_cast<const void*>(gemm2_fast_kernel<1, 4, false, true>),
                           reinterpret_cast<const void*>(gemm2_fast_kernel<2, 4, false, false>),
                           reinterpret_cast<const void*>(gemm2_fast_kernel<4, 3, false, false>)});
}

void check_gemm2_fp8_kernel() {
  f8_check_registers<false>(reinterpret_cast<const void*>(gemm2_fp8_kernel<false>), "gemm2_fp8_kernel");
  f8_check_registers<false>(reinterpret_cast<const void*>(gemm2_fp8_kernel<true>), "gemm2_fp8_kernel");
}

// GEMM2's 8-row decode class has 4 stages at every M (heuristics.h fast_depth): its
// launch below instantiates only that kernel.
static_assert(fast_depth(1, 1, FastGemm::kGemm2) == 4 && fast_depth(1, 8, FastGemm::kGemm2) == 4,
              "GEMM2's 8-row decode kernel is instantiated with 4 stages only");

void launch_gemm2(const Gemm2Params& p, cudaStream_t stream) {
  if (p.fp8) {
    MXMOE_CHECK_ARG(p.if8 != nullptr && p.if8_scale != nullptr && p.w2f8.codes != nullptr &&
                        p.splits == 1 && p.w2f8.rows_p % kF8Rows == 0,
                    "Gemm2Params.if8", "the FP8 mode needs the staged intermediate and its "
                    "scales, the FP8 weights and no split");
    MXMOE_CHECK_ARG(p.y_bf16 != nullptr && p.hidden % 2 == 0, "Gemm2Params.y_bf16",
                    "the FP8 mode writes y as BF16 pairs: needs y_bf16 and an even K, K = ", p.hidden);
    with_bool(p.w2f8.row_scale, [&](auto row_c) {
      const auto kernel = gemm2_fp8_kernel<decltype(row_c)::value>;
      using Cta = F8Cta<false>;
      MXMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cta::kSmemBytes));
      kernel<<<prefill_ctas(), Cta::kThreads, Cta::kSmemBytes, stream>>>(
          p, fp8_codes_map(p.w2f8.codes, int64_t{p.num_local} * p.w2f8.rows_p, p.w2f8.cols_p),
          fp8_staged_rows_map(p.if8, p.tokens * p.top_k, p.w2f8.cols_p),
          fp8_token_scales_map(p.if8_scale, p.tokens * p.top_k, p.w2f8.groups));
      MXMOE_LAUNCH_CHECK("gemm2_fp8_kernel");
    });
    return;
  }
  if (p.prefill) {
    MXMOE_CHECK_ARG(p.ib != nullptr && p.inexact != nullptr && p.splits == 1,
                    "Gemm2Params.ib", "the prefill path needs the staged intermediate, the "
                    "inexact word and splits 1");
    with_prefill_tile(prefill_tile_tokens(p.tokens, p.top_k, p.num_local),
                      [&](auto tile) { launch_prefill<decltype(tile)::value>(p, stream); });
    // The generic kernels below leave at once unless the inexact bit is set.
  }
  const FastPlan fast =
      p.prefill ? FastPlan{}
                : plan_fast(p.tokens, p.inter_fp8, p.intermediate / kMxBlock, FastGemm::kGemm2);
  MXMOE_CHECK_ARG(p.expert_ready == nullptr || (fast.ok && p.ready_row_groups > 0),
                  "Gemm2Params.expert_ready", "only the decode kernels wait on the expert-ready "
                  "counters, with GEMM1's row groups (heuristics.h use_expert_ready)");
  if (fast.ok) {
    const bool ok = p.splits == 1 || (p.splits > 1 && p.splits <= kGemm2MaxSplits &&
                                      p.bias == nullptr && p.back != nullptr);
    MXMOE_CHECK_ARG(ok, "Gemm2Params.splits", p.splits, ": needs 1..", kGemm2MaxSplits,
                    ", no bias and a range-factor buffer");
    for (int i = 0; i < fast.n; ++i) {
      const FastClass& c = fast.c[i];
      Gemm2Params q = p;
      q.fast = FastLaunch{c.lo, c.hi, c.z};
      // Only a single class follows GEMM1 directly (a second one follows the first).
      q.programmatic = p.programmatic && fast.n == 1;
      if (c.nt == 1) {
        with_eight_row_kernel(p, [&](auto narrow_c, auto one_row_c) {
          launch_fast<1, 4, decltype(narrow_c)::value, decltype(one_row_c)::value>(q, stream);
        });
      } else if (c.nt == 2) {
        launch_fast<2, 4>(q, stream);
      } else {
        launch_fast<4, 3>(q, stream);
      }
    }
    return;
  }
  const GemmPlan plan = plan_gemm(p.tokens);
  MXMOE_CHECK_ARG(p.splits == 1, "Gemm2Params.splits", p.splits,
                  ": only the decode path splits the reduction (heuristics.h gemm2_splits)");
  const int sel = (plan.nt == 1 ? 2 : 0) | (p.inter_fp8 ? 1 : 0);
  switch (sel) {
    case 0: return launch_t<4, false>(p, stream);
    case 1: return launch_t<4, true>(p, stream);
    case 2: return launch_t<1, false>(p, stream);
    default: return launch_t<1, true>(p, stream);
  }
}

}  // namespace mxmoe::cuda_detail
