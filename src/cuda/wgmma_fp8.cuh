// wgmma_fp8.cuh — the FP8 precision mode's mainloop (sm_90a; fp8_mode.h, docs/FP8_MODE.md),
// shared by GEMM1 and GEMM2: a persistent, warp-specialized grouped GEMM on Hopper's FP8
// tensor cores over (expert, 128-token tile, 128-row block) tiles.
//
// Operands: weights as E4M3 codes with one fp32 scale per row and 128-K group, or per row
// in the row form (engine.h fp8_weights, made at load time); activations as E4M3 codes with
// one scale per token and group (stage_fp8.cu). Per group, each consumer warpgroup runs 4
// wgmma m64n128k32 (64 tokens x 128 weight rows, both operands in shared memory) into a
// scratch accumulator, then promotes it into its fp32 accumulator: acc += (scratch *
// s_w[row]) * s_x[token], or in the row form acc += scratch * s_x[token] and acc *=
// s_w[row] once after the last group (one FFMA per element and group instead of FMUL +
// FFMA; the promotion was ~21% of the consumers' issue slots). So the FP8 accumulation
// inside the tensor cores never spans more than 128 products.
//
// CTA = 3 warpgroups (GEMM2) or 4 (GEMM1; F8Cta), a grid of one CTA per SM looping over
// tiles:
//   warpgroup 0 (producer; one thread issues): each group's 128 weight rows and 128 token
//     rows (one TMA box each; the token rows are staged in routed-row order, stage_fp8.cu),
//     128 bytes each, 128-byte swizzled (the wgmma K-major layout), and their scales (one
//     TMA box or bulk copy each; the row form's weight scales are read by the consumers
//     once per tile instead), into a ring of kF8Stages stages; a stage's `full` mbarrier
//     completes on the TMA bytes.
//   warpgroups 1, 2 (consumers 0, 1): consumer c owns tokens [64c, 64c + 64) of the
//     tile and all 128 weight rows of the block: 64 + 64 fp32 registers (accumulator and
//     scratch).
//   warpgroup 3 (GEMM1's drain): the epilogue of the tile the consumers staged in shared
//     memory, while they run the next one (f8_run), down to GEMM2's staged intermediate
//     (the regrouping stage_fp8 did after GEMM1 until session 49; F8Tiles, F8GroupBuffer).
// Tokens are the MMA's M dimension (unlike the exact prefill path, whose weights are:
// f8_mainloop says why); the tile sequence (pf_tile) and the ring bookkeeping
// (RingCursor) are wgmma_mx.cuh's.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "engine.h"
#include "mxmoe/error.h"
#include "ptx.cuh"
#include "wgmma_mx.cuh"

namespace mxmoe::cuda_detail {

inline constexpr int kF8Group = 128;                           // K per stage and promotion
inline constexpr int kF8StageA = 0;                            // 128 weight rows x 128 B
inline constexpr int kF8StageB = kF8Rows * kF8Group;           // 128 token rows x 128 B
inline constexpr int kF8StageSA = kF8StageB + kPfTokens * kF8Group;  // 128 f32 row scales
inline constexpr int kF8StageSB = kF8StageSA + kF8Rows * 4;    // 132 f32 token scales
/// Token scales per stage: the tile's 128 from the 16-byte boundary at or below its first
/// routed row (so up to 3 before it). By every sign the TMA engine raises an illegal
/// instruction on a box whose start in its innermost dimension is not 16-byte aligned (H200,
/// session 43: boxes at the tiles' first rows, which follow the experts' row counts, faulted), so the
/// box starts at the row rounded down to a multiple of 4 and the consumers read from
/// (first row & 3) on (f8_token_scale_shift).
inline constexpr int kF8TokenScaleBox = kPfTokens + 4;
inline constexpr int kF8StageBytes = 34 * 1024;                // stays 1024-aligned
/// Ring depth. 4 stages measured as fast as 6 once the producers stopped waiting for their
/// copies (session 36: FP8 layer -0.6% to +0.8% at M=512..4096), and leave GEMM1 the room
/// for its staged tile.
inline constexpr int kF8Stages = 4;
// f8_producer's warps take the groups in turns of four, and each waits only for the
// stages of its own groups: a warp about to fill group n knows group n - 4 - kF8Stages
// consumed, so stage n % kF8Stages's empty barrier is at most one phase behind (which
// its parity wait needs) only with at least four stages.
static_assert(kF8Stages >= 4, "f8_producer's turns: each warp's own wait covers its stage's previous round");
using F8Cursor = RingCursor<kF8Stages>;
static_assert(kF8StageSB + kF8TokenScaleBox * 4 <= kF8StageBytes, "stage overflow");
static_assert(kF8TokenScaleBox * 4 % 16 == 0 && kF8TokenScaleBox <= 256, "a TMA box: whole 16 bytes, at most 256");
/// Where a tile's token scales start in its stages' box (kF8TokenScaleBox): its first
/// routed row, offsets[e] + 128 tt, past the multiple of 4 at or below it.
__device__ __forceinline__ int f8_token_scale_shift(int first_row) { return first_row & 3; }
/// GEMM1's staged tile (f8_run with a drain warpgroup): the fp32 gate and up values of the
/// tile's 64 intermediate columns for its 128 tokens, [128 rows][128 tokens]
/// (f8_staged_index).
inline constexpr int kF8StagedBytes = 2 * 64 * kPfTokens * 4;

/// GEMM1's drain, with the intermediate's regrouping fused (gemm1_act.cu f8_drain_tile):
/// per token of the tile, the E4M3 codes of its 128-column group (4 MX blocks, the first
/// two from row block 2p, the last two from 2p + 1: F8Tiles), as 8 chunks of 16 bytes,
/// chunk c of token n at codes[n][c ^ (n & 7)] (so that 8 threads storing their tokens'
/// chunk c hit 8 different 16-byte bank groups); each block's scale byte, and which
/// blocks are used (fp8_regroup.cuh).
struct F8GroupBuffer {
  uint4 codes[kPfTokens][8];
  uint32_t bytes[kPfTokens];  // block b's byte in byte b
  uint32_t used[kPfTokens];   // bit b: block b used
};
inline constexpr int kF8GroupBufferBytes = static_cast<int>(sizeof(F8GroupBuffer));

/// The CTA of an FP8 kernel: warpgroup 0 the producer, 1 and 2 the consumers, and with
/// kDrain warpgroup 3 the drain (GEMM1's epilogue), with their setmaxnreg split of the
/// registers the CTA is launched with (ptxas's count: 168 at 384 threads, 128 at 512).
/// The producer's row addresses spilled at the exact path's 56 when it computed them per
/// group; set up per tile (session 37) they fit in 56, but giving the drain those 16
/// registers (setmaxnreg 56 / 184 / 184 / 88, and its loop unrolled 8) was no faster. The
/// consumers need 128 for acc and scratch.
template <bool kDrain>
struct F8Cta {
  static constexpr int kThreads = kDrain ? 512 : 384;
  static constexpr int kProducerRegs = kDrain ? 72 : 104;
  static constexpr int kConsumerRegs = kDrain ? 184 : 200;
  static constexpr int kDrainRegs = kDrain ? 72 : 0;
  static constexpr int kLaunchRegs = kDrain ? 128 : 168;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs + 128 * kDrainRegs <= kThreads * kLaunchRegs,
                "setmaxnreg split");
  /// Dynamic shared memory (1 KB of slack to align the ring): the stages, the staged tile
  /// and the drain's group buffer, the ring's barriers and the staged tile's two.
  static constexpr int kSmemBytes = 1024 + kF8Stages * kF8StageBytes +
                                    (kDrain ? kF8StagedBytes + kF8GroupBufferBytes : 0) + 2 * kF8Stages * 8 +
                                    (kDrain ? 16 : 0);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");
};
/// wgmma_mx.cuh check_register_split with this mode's split; checked when a layer is
/// built (check_gemm*_fp8_kernel).
template <bool kDrain>
inline void f8_check_registers(const void* kernel, const char* name) {
  using Cta = F8Cta<kDrain>;
  check_register_split(kernel, name, Cta::kProducerRegs, Cta::kConsumerRegs, Cta::kDrainRegs, Cta::kThreads);
}

/// TMA map of FP8 weight codes [rows][cols_p] (all experts' padded rows), boxes of one
/// 128-byte group of 128 rows, 128-byte swizzled (tensor_map.cu).
CUtensorMap fp8_codes_map(const uint8_t* codes, int64_t rows, int64_t cols_p);
/// TMA map of `count` staged E4M3 rows of cols_p bytes (GEMM1's x and GEMM2's intermediate,
/// routed-row order), boxes of one 128-byte group of a 128-token tile, 128-byte swizzled;
/// rows past `count` read as zeros (tensor_map.cu).
CUtensorMap fp8_staged_rows_map(const uint8_t* rows, int64_t count, int64_t cols_p);
/// TMA map of the staged rows' scales, fp32 [groups][fp8_scale_rows(count)] (stage_fp8.cu),
/// boxes of one group's kF8TokenScaleBox tokens, unswizzled; rows past the buffer read as 0.
CUtensorMap fp8_token_scales_map(const float* scales, int64_t count, int64_t groups);

/// What the producer streams.
struct F8Operands {
  const CUtensorMap* wmap = nullptr; // weight codes [E][rows_p][cols_p] (fp8_codes_map, a kernel parameter)
  const CUtensorMap* bmap = nullptr; // staged activation codes [routed rows][groups * 128]
                                     // (fp8_staged_rows_map, a kernel parameter)
  const CUtensorMap* bsmap = nullptr; // their scales (fp8_token_scales_map, a kernel parameter)
  const float* ws = nullptr;         // scales [E][groups][rows_p], or [E][rows_p] (kRowScale)
  int rows_p = 0, groups = 0;
  const int32_t* counts = nullptr;
  const int32_t* offsets = nullptr;
  int num_local = 0;
  __device__ int rb_count() const { return rows_p / kF8Rows; }
  /// The first routed row of tile t (its token rows' and token scales' start).
  __device__ int tile_first_row(const PfTile& t) const { return offsets[t.e] + t.tt * kPfTokens; }
};

/// A role's walk over its CTA's tiles (every role of the CTA takes the same ones, in the
/// same order): `for (ti = first();; ti = after(ti))` over pf_tile(..., span(o), ti, ...),
/// skipping the tiles `skipped` names. Plain (GEMM2): tiles blockIdx.x, + gridDim.x, ... of
/// pf_tile's sequence. kPaired (GEMM1): units of two tiles, row blocks 2p and 2p + 1 of
/// one (expert, token tile), back to back, so that the drain sees each 128-column group of
/// the intermediate whole (f8_drain_tile). The sequence is then pf_tile's over an even
/// row-block count, whose extra block (an odd count's last pair) is skipped: the CTA's
/// k-th unit is tiles 2 (blockIdx.x + k gridDim.x) and the one after. (GEMM1 walks in
/// pairs with MXMOE_F8_FUSED=0 too. A pair is the last wave's unit: up to one tile more
/// on the longest CTA, e.g. 26 units (52 tiles) against 51 tiles at Kimi's M=1024. Pairs
/// meeting through L2 instead, in the original order, cost GEMM1 more: PERFORMANCE.md,
/// session 49.)
template <bool kPaired>
struct F8Tiles {
  static __device__ __forceinline__ uint32_t first() { return kPaired ? 2u * blockIdx.x : blockIdx.x; }
  static __device__ __forceinline__ uint32_t after(uint32_t i) {
    return !kPaired ? i + gridDim.x : (i & 1u) ? i + 2u * gridDim.x - 1u : i + 1u;
  }
  static __device__ __forceinline__ int span(const F8Operands& o) {
    return kPaired ? o.rb_count() + (o.rb_count() & 1) : o.rb_count();
  }
  static __device__ __forceinline__ bool skipped(const F8Operands& o, const PfTile& t) {
    return kPaired && t.rb >= o.rb_count();
  }
  /// Tile `ti` of the walk (pf_tile; `rows`, if given: its routed rows).
  static __device__ __forceinline__ PfTile tile(const F8Operands& o, uint32_t ti, PfWalk& at, int* rows = nullptr) {
    return pf_tile(o.counts, o.num_local, span(o), static_cast<int>(ti), at, rows);
  }
};

/// Arrivals that complete a stage: the producer thread's arming of the TMA bytes (every
/// operand of a stage comes by TMA or bulk copy).
inline constexpr uint32_t kF8FullArrivals = 1;

/// The ring in dynamic shared memory, and GEMM1's staged tile.
struct F8Ring {
  uint8_t* stages;         // [kF8Stages][kF8StageBytes], 1024-aligned
  uint64_t* full;          // [kF8Stages]: kF8FullArrivals arrivals and the TMA bytes
  uint64_t* empty;         // [kF8Stages]: 256 consumer-thread arrivals
  float* staged;           // kDrain: [kF8StagedBytes / 4] (f8_staged_index), else null
  uint64_t* staged_full;   // kDrain: 256 consumer-thread arrivals once a tile is staged
  uint64_t* staged_empty;  // kDrain: 128 drain-thread arrivals once it is read
  F8GroupBuffer* group;    // kDrain: the drain's half-done intermediate groups (f8_drain_tile)
};

/// Where the staged tile holds row r (gate of column c: r = c; up: r = 64 + c) of token n:
/// rows of 128 tokens, the token's word XOR-swizzled by ((r >> 1) & 3) << 3 inside its
/// group of 32, so that the consumers' stores (8 tokens x 4 rows 2 apart per warp,
/// f8_stage_tile) and the drain warps' reads (32 tokens of one row) are both free of bank
/// conflicts.
__device__ __forceinline__ int f8_staged_index(int r, int n) { return r * kPfTokens + (n ^ (((r >> 1) & 3) << 3)); }

#if defined(MXMOE_SM90A)

template <bool kDrain>
__device__ __forceinline__ F8Ring f8_ring(uint8_t* dyn_smem) {
  F8Ring r;  // aligned by pointer arithmetic, as pf_ring
  r.stages = dyn_smem + ((1024u - (smem_addr(dyn_smem) & 1023u)) & 1023u);
  uint8_t* past = r.stages + kF8Stages * kF8StageBytes;
  r.staged = kDrain ? reinterpret_cast<float*>(past) : nullptr;
  if constexpr (kDrain) past += kF8StagedBytes;
  r.group = kDrain ? reinterpret_cast<F8GroupBuffer*>(past) : nullptr;
  if constexpr (kDrain) past += kF8GroupBufferBytes;
  r.full = reinterpret_cast<uint64_t*>(past);
  r.empty = r.full + kF8Stages;
  r.staged_full = kDrain ? r.empty + kF8Stages : nullptr;
  r.staged_empty = kDrain ? r.staged_full + 1 : nullptr;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kF8Stages; ++s) {
      mbar_init(&r.full[s], kF8FullArrivals);
      mbar_init(&r.empty[s], 256);
    }
    if constexpr (kDrain) {
      mbar_init(r.staged_full, 256);
      mbar_init(r.staged_empty, 128);
    }
    // The TMA engine (async proxy) completes on the full barriers, now their only
    // arrivals but the issuing thread's: the inits made visible to it, as pf_init_barriers does.
    fence_mbarrier_init();
  }
  __syncthreads();
  return r;
}

/// Producer warpgroup (threads 0..127): per group, lane 0 of one warp (warp n % 4 for the
/// n-th group, after that warp waited for the stage to be free) hands the 128 weight rows
/// and the tile's 128 token rows (one TMA box each, 128-byte swizzled), the tokens' 128
/// scales (one TMA box) and, in the group form, the weights' 128 scales (one bulk copy)
/// to the TMA engine. Every warp walks the tiles and groups (warp-uniform values, so the
/// TMA operands stay in uniform registers: issued by thread 0 alone, ptxas moved them
/// over from vector registers, ~67 instructions per group on one scheduler); the turns
/// spread the ~40 of each issue over the four schedulers.
/// The token rows are the expert's routed rows, staged in that order (stage_fp8.cu): rows
/// past the expert's are the next expert's, or rows nothing staged in this forward (past
/// *live_rows), or zeros past the buffer, and so are their scales: their accumulator rows
/// are never stored (a token is a row of the MMA's M dimension, so they touch no other).
/// Why: gathered by token with cp.async (8 copies of 16 bytes and one scale per thread and
/// group), every producer warp issued ~94 instructions per group on the scheduler it
/// shares with two consumer warps and a drain warp (session 39), ~37 with the token rows
/// by TMA and the scales still one cp.async per thread (session 40). Staging x in
/// routed-row order costs a write of 16x x's bytes (PERFORMANCE.md, session 40).
/// The stage is published by the TMA engine (the full barrier's transaction count), so
/// the thread never waits for its copies: every stage of the ring can be in flight.
template <bool kRowScale, bool kPaired>
__device__ __forceinline__ void f8_producer(const F8Operands& o, const F8Ring& ring) {
  const uint32_t warp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0);  // warp-uniform (f8_run)
  const bool lane0 = (threadIdx.x & 31) == 0;
  const RingAddrs ra = ring_addrs(ring);
  uint32_t n = 0;
  F8Cursor fill;
  PfWalk at;
  using Tiles = F8Tiles<kPaired>;
  for (uint32_t ti = Tiles::first();; ti = Tiles::after(ti)) {
    const PfTile t = Tiles::tile(o, ti, at);
    if (t.e < 0) break;
    if (Tiles::skipped(o, t)) continue;
    const int brow0 = o.tile_first_row(t);
    const int wrow = t.e * o.rows_p + t.rb * kF8Rows;      // the block's first row in the map
    const float* wsc = o.ws + static_cast<int64_t>(t.e) * o.groups * o.rows_p + t.rb * kF8Rows;
    for (int kg = 0; kg < o.groups; ++kg) {
      if ((n & 3u) == warp) {
        const int s = fill.stage;
        if (n >= static_cast<uint32_t>(kF8Stages)) mbar_wait_at(ra.empty + 8 * s, fill.phase ^ 1u);
        if (lane0) {
          const uint32_t st = ra.stages + s * kF8StageBytes, bar = ra.full + 8 * s;
          constexpr uint32_t kScaleBytes = kRowScale ? 0 : kF8Rows * 4;
          constexpr uint32_t kBytes = kF8Rows * kF8Group + kPfTokens * kF8Group + kF8TokenScaleBox * 4 + kScaleBytes;
          mbar_arrive_expect_tx_at(bar, kBytes);
          tma_load_2d_at(st + kF8StageA, o.wmap, kg * kF8Group, wrow, bar);
          tma_load_2d_at(st + kF8StageB, o.bmap, kg * kF8Group, brow0, bar);
          tma_load_2d_at(st + kF8StageSB, o.bsmap, brow0 - f8_token_scale_shift(brow0), kg, bar);
          if constexpr (!kRowScale)
            bulk_copy_g2s_tx_at(st + kF8StageSA, wsc + static_cast<int64_t>(kg) * o.rows_p, kScaleBytes, bar);
        }
      }
      ++n;
      fill.advance();
    }
  }
}

/// What a consumer's group loop addresses (f8_mainloop, f8_pass_groups), as 32-bit shared
/// addresses set up once per kernel (f8_group_addrs): stage 0's wgmma descriptors (stage
/// s's start address, their low field in 16-byte units, is s * kF8StageBytes / 16 further;
/// the high word is the same for both), the stages and the barriers. Why so (SASS):
/// through generic pointers ptxas rebuilt the ring's base in every group once f8_run's
/// consumers had a second loop (f8_pass_groups; +6 instructions a group in GEMM2, session
/// 60); from the shared symbol's address it re-derived the shared window's base (S2UR
/// SR_CgaCtaId and ~8 uniform instructions) in every group and at every tile's start,
/// and the FP8 kernels took 0.7% longer at M=4096 (ncu, session 62). Built on
/// ring_addrs' shuffled addresses, which ptxas keeps in uniform registers: GEMM2's group
/// loop is 99 instructions (main before the narrow tiles: 109).
struct F8GroupAddrs {
  uint64_t desc_hi;        // both descriptors' high word
  uint32_t da_lo, db_lo;   // stage 0's: the weights (this consumer's half), the tokens
  uint32_t stages, full, empty;
  const uint8_t* stages_p; // the stages by pointer (the group form's weight scales)
};
__device__ __forceinline__ F8GroupAddrs f8_group_addrs(const F8Ring& ring, int wg) {  // warp-uniform wg
  // The descriptors' low words shuffled as they are: built from ra.stages instead, the
  // group loop took 6 more uniform instructions (ptxas re-built them per stage; SASS,
  // session 63).
  const RingAddrs ra = ring_addrs(ring);
  const uint64_t da0 = smem_desc_k128(ring.stages + kF8StageB + 64 * wg * kF8Group);
  const uint64_t db0 = smem_desc_k128(ring.stages + kF8StageA);
  constexpr uint32_t kAll = 0xFFFFFFFFu;
  return F8GroupAddrs{da0 & 0xFFFFFFFF00000000ull, __shfl_sync(kAll, static_cast<uint32_t>(da0), 0),
                      __shfl_sync(kAll, static_cast<uint32_t>(db0), 0), ra.stages, ra.full, ra.empty, ring.stages};
}

/// Consumer mainloop of one tile for warpgroup `wg` (0, 1): acc = tokens
/// [64 wg, 64 wg + 64) of the tile x the block's 128 weight rows over all groups, in the
/// layout of wgmma m64n128 (warp w, lane (g, t): acc[4j + 2h + c] = token 64 wg + 16w +
/// 8h + g, weight row 8j + 2t + c), every group's scales applied; kRowScale: the activation
/// scales only (the epilogue applies the row's, F8RowScales).
/// The tokens are the MMA's M dimension, so each thread promotes 2 tokens, whose scales
/// are 2 loads per group. With the weights as M (until session 38) a thread held 32
/// tokens: 16 LDS.64 per group, whose 32 wavefronts per warp (a wavefront carries 128
/// bytes to the registers, broadcast or not) were ~30% of the shared-memory pipe's work
/// next to the wgmmas' own operand reads (ncu, session 37: the pipe 67-71% busy).
/// The group form's weight scales are now the 32 per thread (16 LDS.64).
template <bool kRowScale>
__device__ __forceinline__ void f8_mainloop(float (&acc)[64], const F8GroupAddrs& ad, F8Cursor& cur,
                                            int groups, int wg, int scale_shift) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tok = 64 * wg + 16 * warp + g;  // this thread's first token in the tile
#pragma unroll
  for (int j = 0; j < 64; ++j) acc[j] = 0.0f;
  float part[64];  // overwritten by each group's first wgmma (accumulate 0)
#pragma unroll
  for (int j = 0; j < 64; ++j) part[j] = 0.0f;
  for (int kg = 0; kg < groups; ++kg) {
    const int s = cur.stage;
    mbar_wait_at(ad.full + 8 * s, cur.phase);
    // No proxy fence: both operands are TMA (async-proxy) writes, ordered before the
    // wgmmas by the barrier's completion; the scales, TMA or bulk-copy writes as well, are
    // read by LDS after the same wait. (Dropping it from GEMM2 took the FP8 layer -2.6% at
    // M=4096, session 40.)
    const uint32_t st = ad.stages + s * kF8StageBytes;
    const uint64_t da = ad.desc_hi | (ad.da_lo + static_cast<uint32_t>(s * (kF8StageBytes >> 4)));
    const uint64_t db = ad.desc_hi | (ad.db_lo + static_cast<uint32_t>(s * (kF8StageBytes >> 4)));
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kF8Group / 32; ++ks)  // a k32 step moves 32 bytes along the row
      wgmma_m64n128k32_e4m3_ss(part, da + 2 * ks, db + 2 * ks, ks);
    wgmma_commit();
    const float* sa = reinterpret_cast<const float*>(ad.stages_p + s * kF8StageBytes + kF8StageSA);
    const uint32_t sbx = st + kF8StageSB + 4 * (scale_shift + tok);
    const float sx0 = __uint_as_float(lds_u32(sbx)), sx1 = __uint_as_float(lds_u32(sbx + 32));
    wgmma_wait<0>();
    acc_fence(part);
    // (sum * s_w) * s_x: the weight scale is at most 2 (weights' bytes <= 128), so the
    // first product stays finite wherever the result is; s_x * s_w could overflow to Inf
    // (activation byte 254) and turn a zero sum into NaN. Same cost. The row form has no
    // s_w here: one FFMA of the sum itself (its s_w comes once per tile, F8RowScales).
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float2 sw = kRowScale ? make_float2(1.0f, 1.0f) : *reinterpret_cast<const float2*>(sa + 8 * j + 2 * t);
      acc[4 * j + 0] = fmaf(kRowScale ? part[4 * j + 0] : part[4 * j + 0] * sw.x, sx0, acc[4 * j + 0]);
      acc[4 * j + 1] = fmaf(kRowScale ? part[4 * j + 1] : part[4 * j + 1] * sw.y, sx0, acc[4 * j + 1]);
      acc[4 * j + 2] = fmaf(kRowScale ? part[4 * j + 2] : part[4 * j + 2] * sw.x, sx1, acc[4 * j + 2]);
      acc[4 * j + 3] = fmaf(kRowScale ? part[4 * j + 3] : part[4 * j + 3] * sw.y, sx1, acc[4 * j + 3]);
    }
    // The stage goes back once the wgmmas (which read it asynchronously) and the scale
    // reads are done.
    mbar_arrive_at(ad.empty + 8 * s);
    cur.advance();
  }
}

/// A consumer's tile without work (f8_run): each group's stage handed back once full (the
/// full wait keeps this warpgroup's arrivals in the stage's current round).
__device__ __forceinline__ void f8_pass_groups(const F8GroupAddrs& ad, F8Cursor& cur, int groups) {
  for (int kg = 0; kg < groups; ++kg) {
    mbar_wait_at(ad.full + 8 * cur.stage, cur.phase);
    mbar_arrive_at(ad.empty + 8 * cur.stage);
    cur.advance();
  }
}

/// The row form's scales of the block's weight rows: pair(j) = those of this thread's
/// rows 8j + 2t and 8j + 2t + 1 (f8_mainloop's layout), 2^(row_exp - row_exp_ref) or NaN
/// (engine.h fp8_weights), read from global memory once per tile. The epilogues fold them
/// into their first operation on each accumulator (with the bias, one FFMA: acc * s, a
/// power of two times an fp32 sum, is exact while it stays normal, so fma(acc, s, b) has
/// the bits of acc * s + b there). The group form applied every scale in the promotion:
/// ones, and fma(acc, 1, b) is acc + b.
template <bool kRowScale>
struct F8RowScales {
  const float* rows = nullptr;  // kRowScale: the block's 128 row scales
  __device__ __forceinline__ F8RowScales(const F8Operands& o, const PfTile& tile) {
    if constexpr (kRowScale) rows = o.ws + static_cast<int64_t>(tile.e) * o.rows_p + tile.rb * kF8Rows;
  }
  __device__ __forceinline__ float2 pair(int j) const {
    if constexpr (!kRowScale) return make_float2(1.0f, 1.0f);
    else return *reinterpret_cast<const float2*>(rows + 8 * j + 2 * (threadIdx.x & 3));  // rows_p % 128 == 0
  }
};

/// No drain warpgroup (f8_run; GEMM2).
struct F8NoDrain {};

/// Body of both FP8 kernels: the ring, the producer warpgroup, and the consumers' tile
/// loop, which hands each tile's accumulator to `epilogue(acc, row_scales, tile, wg, ring)`
/// (row_scales: F8RowScales, for the epilogue to apply). kRowScale: the weights' row form.
/// With a drain (GEMM1, F8Cta<true>): the consumers' epilogue only stages the tile in
/// shared memory (ring.staged), and warpgroup 3 runs `drain(tile, ring)` on it
/// while the consumers go on with the next tile's mainloop; staged_full and staged_empty
/// hand the one staged tile back and forth. Why: GEMM1's activation and quantization kept
/// both consumer warpgroups, and so the tensor cores, away from the mainloop for ~30% of
/// GEMM1's time (without them the FP8 layer took 22% less at M=4096; session 36).
template <bool kRowScale, class Epilogue, class Drain = F8NoDrain>
__device__ __forceinline__ void f8_run(const F8Operands& o, uint8_t* dyn_smem, Epilogue&& epilogue,
                                       Drain&& drain = {}) {
  constexpr bool kDrain = !std::is_same_v<std::decay_t<Drain>, F8NoDrain>;
  using Cta = F8Cta<kDrain>;
  const F8Ring ring = f8_ring<kDrain>(dyn_smem);
  // Broadcast from lane 0 so that the compiler knows it is warp-uniform: the consumers'
  // wgmma descriptors (f8_mainloop) then live in uniform registers. Computed per thread,
  // they were built in vector registers and moved over (R2UR) before every wgmma: ~17
  // of the ~133 instructions per warp and group.
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  // setmaxnreg.inc only takes what a .dec gave back to the CTA (F8Cta's split; asking for
  // more never returns).
  if (wg == 0) {
    setmaxnreg_dec<Cta::kProducerRegs>();
    f8_producer<kRowScale, kDrain>(o, ring);
    return;
  }
  if constexpr (kDrain) {
    if (wg == 3) {
      setmaxnreg_dec<Cta::kDrainRegs>();
      PfWalk at;
      uint32_t k = 0;
      for (uint32_t ti = F8Tiles<true>::first();; ti = F8Tiles<true>::after(ti)) {
        const PfTile tile = F8Tiles<true>::tile(o, ti, at);
        if (tile.e < 0) break;
        if (F8Tiles<true>::skipped(o, tile)) continue;
        mbar_wait(ring.staged_full, k & 1u);
        drain(tile, ring);
        mbar_arrive(ring.staged_empty);
        ++k;
      }
      return;
    }
  }
  setmaxnreg_inc<Cta::kConsumerRegs>();
  const F8GroupAddrs ad = f8_group_addrs(ring, wg - 1);
  F8Cursor cur;
  PfWalk at;
  using Tiles = F8Tiles<kDrain>;  // GEMM1's in pairs
  uint32_t k = 0;
  for (uint32_t ti = Tiles::first();; ti = Tiles::after(ti)) {
    int rows = 0;
    const PfTile tile = Tiles::tile(o, ti, at, &rows);
    if (tile.e < 0) break;
    if (Tiles::skipped(o, tile)) continue;
    // A tile of at most 64 routed rows leaves consumer 1 only padding tokens: it passes
    // the stages on without a wgmma, so that consumer 0's wgmmas have the tensor cores alone,
    // and stores nothing (GEMM1's drain reads only the tile's rows).
    const bool idle = wg == 2 && rows <= 64;
    float acc[64];
    if (idle) f8_pass_groups(ad, cur, o.groups);
    else f8_mainloop<kRowScale>(acc, ad, cur, o.groups, wg - 1, f8_token_scale_shift(o.tile_first_row(tile)));
    if constexpr (kDrain) {
      if (k > 0) mbar_wait(ring.staged_empty, (k - 1) & 1u);  // the drain has read tile k - 1
    }
    if (!idle) epilogue(acc, F8RowScales<kRowScale>(o, tile), tile, wg - 1, ring);
    if constexpr (kDrain) mbar_arrive(ring.staged_full);
    ++k;
  }
}

#endif  // MXMOE_SM90A

}  // namespace mxmoe::cuda_detail
