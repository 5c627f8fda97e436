// wgmma_mx.cuh — the prefill path's mainloop (sm_90a), shared by GEMM1 and GEMM2: a
// persistent, warp-specialized grouped GEMM over (expert, token tile, row block) tiles.
//
// Exactness: both operands reach the tensor cores as BF16 holding the exact dequantized
// MX values (scale included): the weights through fp4x8_to_bf16_times in registers, the
// activations as staged BF16 rows: x through stage_bf16.cu, once per forward (row range
// factor 2^-D folded in, as the other paths do), the intermediate written in the same
// layout by GEMM1's prefill epilogue (range factor 1). A value BF16 cannot hold that way
// sets a flag that sends the GEMM (for the intermediate, both GEMMs) to the generic path.
// So every product is exact and only the fp32 summation order differs (SPEC §7).
//
// CTA = 3 warpgroups, a grid of one CTA per SM (two at the 32-token tile, PfGeometry)
// looping over tiles:
//   warpgroup 0 (producer, 56 registers; 32 at two CTAs per SM): each 64-K chunk into a
//     ring of kPfStages shared stages: the tile's kTok token rows (B, BF16, 128-byte
//     swizzled rows, the wgmma K-major layout), the CTA's 4 x 64 tiled weight rows and
//     their scale words. GEMM1 gathers its B rows by token: cp.async by all 128 threads,
//     each arriving on the stage's `full` mbarrier once its copies have landed
//     (pf_producer, cp_async_arrive_noinc). GEMM2's B rows are contiguous: one warp
//     hands the chunk to the TMA engine (one tensor-map box for B, bulk copies for the
//     weights), and `full` completes on the bytes (pf_producer_tma).
//   warpgroups 1, 2 (consumers, 224 registers; 104 at two CTAs per SM): each owns 2 of
//     the 4 row groups and all kTok tokens: per 64-K chunk it decodes the A fragments
//     (weights) of both MX blocks from shared memory into registers and issues one
//     group of 8 wgmma m64nNk16 with N = kTok (A registers, B shared); two fp32
//     accumulators of 64 x kTok per warpgroup. A chunk's stage goes back on `empty` once the next chunk's wait has
//     retired its group.
// Weights are the MMA's M dimension ("swap AB"): the tiled layout (engine.h) already
// gives each lane its m16n8k16 A fragment, which is also the wgmma A fragment of its warp.
// Its K permutation inside an MX block (lane t holds elements 8t..8t+7) is undone by
// permuting the staged B rows the same way (stage_bf16.cu), so no shuffle is needed.
//
// Tiles: per expert, ceil(rows / kTok) token tiles x ceil(RG / 4) row blocks, row block
// fastest so that the CTAs running at once share one token tile and one expert's weights
// in L2. Every role walks the tile sequence (pf_tile) as items of a plan (pf_plan), in
// which the last tiles are split along K: CTA b takes items b, b + G, ... ("dealt"), or
// for GEMM1 at two CTAs per SM its CTAs claim the items from a counter (pf_claim) and the
// producer hands each to the consumers in the header of its first chunk's stage
// (heuristics.h prefill_claims). The token tile kTok is 128,
// or 96 / 64 / 32 where experts hold fewer rows (heuristics.h prefill_token_tile): the wgmma
// N, the B rows copied and the epilogue's token blocks shrink with it, the weight decode
// per chunk does not, so a small tile saves the tensor time of padding rows.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "engine.h"
#include "mx_mma.cuh"
#include "mxmoe/error.h"
#include "ptx.cuh"

namespace mxmoe::cuda_detail {

inline constexpr int kPfTokens = 128;                          // largest token tile (wgmma N)
inline constexpr int kPfRowGroups = 4;                         // 64-row groups per tile
inline constexpr int kPfStages = 8;                            // ring depth (8 beat 6 by 0.3-1.2%)
inline constexpr int kPfThreads = 384;                         // 3 warpgroups
inline constexpr int kPfStageW = kPfRowGroups * 4 * 32 * 16;   // tiled weight words
inline constexpr int kPfStageS = kPfRowGroups * 8 * 16;        // tiled scale words
inline constexpr int kPfAmaxFloats = 2 * 4 * kPfTokens;        // GEMM1 epilogue exchange

/// The ring's geometry for kTok-token tiles. A stage holds the tile's kTok B rows (64
/// BF16 each, from offset 0), then the weight and the scale words, then the item header
/// (claimed items: pf_store_header); it is rounded up to 1 KB so that every
/// stage's B rows stay 1024-aligned (the 128-byte swizzle's atom). 128 tokens: 25 KB;
/// 32 tokens: 13 KB.
inline constexpr int kPfHeaderBytes = 32;  // sizeof(PfWork), checked where PfWork is
template <int kTok>
struct PfGeometry {
  static constexpr int kStageB = kTok * 128;
  static constexpr int kHeader = kStageB + kPfStageW + kPfStageS;
  static constexpr int kStageBytes = (kHeader + kPfHeaderBytes + 1023) / 1024 * 1024;
  /// Dynamic shared memory of one CTA (1 KB of slack to align the ring).
  static constexpr int kSmemBytes =
      1024 + kPfStages * kStageBytes + 2 * kPfStages * 8 + kPfAmaxFloats * 4 + 2 * kPfTokens * 4 + 16;
  static constexpr int kCtasPerSm = prefill_ctas_per_sm(kTok);
  /// setmaxnreg split of the registers the CTA was launched with (384 x 168 at one CTA
  /// per SM, 384 x 80 at two): producer warpgroup / each consumer warpgroup.
  static constexpr int kProducerRegs = kCtasPerSm == 1 ? 56 : 32;
  static constexpr int kConsumerRegs = kCtasPerSm == 1 ? 224 : 104;
  static constexpr int kLaunchRegs = kCtasPerSm == 1 ? 168 : 80;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kPfThreads * kLaunchRegs, "setmaxnreg split");
  static_assert(kCtasPerSm * (kSmemBytes + 1024) <= 228 * 1024, "shared memory per SM");
};

/// setmaxnreg.inc only takes registers that a .dec gave back to the CTA, which holds what
/// the kernel was launched with (ptxas's count x kPfThreads): a split beyond it would leave
/// the consumers waiting forever. Throws Error unless `kernel` (one producer and two
/// consumer warpgroups, and a drain warpgroup where drain_regs > 0: `threads` threads)
/// holds its split; the layer checks its prefill and FP8-mode kernels once when it is built.
inline void check_register_split(const void* kernel, const char* name, int producer_regs, int consumer_regs,
                                 int drain_regs = 0, int threads = kPfThreads) {
  cudaFuncAttributes a{};
  MXMOE_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
  if (a.numRegs * threads < 128 * producer_regs + 256 * consumer_regs + 128 * drain_regs)
    throw Error(detail::cat(name, ": launched with ", a.numRegs, " registers per thread, fewer than its ",
                            "setmaxnreg split (", producer_regs, " / ", consumer_regs, " / ", drain_regs,
                            ") needs"));
}
/// check_register_split for a prefill kernel of kTok-token tiles (PfGeometry's split).
template <int kTok>
inline void pf_check_registers(const void* kernel, const char* name) {
  check_register_split(kernel, name, PfGeometry<kTok>::kProducerRegs, PfGeometry<kTok>::kConsumerRegs);
}

inline constexpr uint32_t kPfSplitBarrier = 3;     // named barrier of the 256 consumer threads
inline constexpr uint32_t kPfProducerBarrier = 4;  // named barrier of the 128 producer threads

/// Calls f(std::integral_constant<int, kTok>{}) for a token tile `tile` of 32, 64, 96 or
/// 128 (prefill_tile_tokens): the one place where the tile sizes meet the kernels'
/// instantiations, shared by the GEMM1 and GEMM2 launchers.
template <class F>
void with_prefill_tile(int tile, F&& f) {
  switch (tile) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 96: return f(std::integral_constant<int, 96>{});
    default: return f(std::integral_constant<int, kPfTokens>{});
  }
}
/// with_prefill_tile for every token tile (the layer's register checks).
template <class F>
void for_each_prefill_tile(F&& f) {
  for (int tile : {32, 64, 96, kPfTokens}) with_prefill_tile(tile, f);
}

struct PfTile {
  int e = -1, tt = 0, rb = 0;
};
/// Where a walk of the tile sequence stands: expert `e`, whose first tile is `first`. A
/// role's items come in increasing tile order, so each search starts where the last ended.
struct PfWalk {
  int e = 0, first = 0;
};
/// Tile `i` of the sequence for kTok-token tiles (e = -1 past the end). Rows per expert
/// come from the device. Called by whole warps (all 32 lanes, the same arguments): the
/// lanes read 32 experts' counts at once and scan their tile counts, so one load round
/// trip covers 32 experts. One expert at a time, each step waited for its own load:
/// ~3 us between items at Kimi's 28 experts (session 26 timeline), on the consumers'
/// path and at every item of the producer. Starts at `at` (a tile before it: at expert
/// 0) and moves it to tile i's expert.
/// `tile_rows` (if given): the tile's routed rows, 1..kTok (past them its rows are padding).
template <int kTok = kPfTokens>
__device__ __forceinline__ PfTile pf_tile(const int32_t* counts, int num_local, int rb_count, int i, PfWalk& at,
                                          int* tile_rows = nullptr) {
  constexpr uint32_t kWarp = 0xFFFFFFFFu;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (i < at.first) at = PfWalk{};
  int base = at.first;  // tiles before expert e0
  for (int e0 = at.e; e0 < num_local; e0 += 32) {
    const int e = e0 + lane;
    const int rows = e < num_local ? counts[e] : 0;
    const int n = e < num_local ? (rows + kTok - 1) / kTok * rb_count : 0;
    int end = n;  // tiles of experts e0 .. e
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(kWarp, end, d);
      if (lane >= d) end += v;
    }
    const uint32_t past = __ballot_sync(kWarp, i < base + end);
    if (past != 0) {  // tile i's expert: the first whose tiles end past i
      const int l = __ffs(past) - 1;
      at = PfWalk{e0 + l, base + __shfl_sync(kWarp, end - n, l)};
      const int k = i - at.first;
      const int tt = k / rb_count;
      if (tile_rows != nullptr) *tile_rows = min(kTok, __shfl_sync(kWarp, rows, l) - tt * kTok);
      return PfTile{at.e, tt, k % rb_count};
    }
    base += __shfl_sync(kWarp, end, 31);
  }
  return PfTile{};
}
/// Tiles of the whole sequence (every lane of the warp gets the sum).
template <int kTok = kPfTokens>
__device__ __forceinline__ int pf_tile_count(const int32_t* counts, int num_local, int rb_count) {
  int tiles = 0;
  for (int e = static_cast<int>(threadIdx.x & 31); e < num_local; e += 32)
    tiles += (counts[e] + kTok - 1) / kTok * rb_count;
  return __reduce_add_sync(0xFFFFFFFFu, tiles);
}

/// The TMA tensor map of `count` staged BF16 rows `stride` elements apart (a multiple of
/// 64): boxes of `box_rows` rows x 64 elements, 128-byte swizzle (tensor_map.cu).
CUtensorMap staged_rows_map(const uint16_t* rows, int64_t count, int64_t stride, int box_rows);

/// What the producer streams.
struct PfOperands {
  const uint4* w = nullptr;          // tiled packed weights [E][RG][KC][4][32]
  const uint4* ws = nullptr;         // tiled scales as uint4 [E][RG][KC][8]
  int rg_count = 0, kc_count = 0;
  const uint16_t* b = nullptr;       // staged BF16 rows, `b_stride` elements apart
  int64_t b_stride = 0;
  const CUtensorMap* b_map = nullptr;  // the same rows as a tensor map (pf_producer_tma)
  const float* b_back = nullptr;     // range factor per B row, or null (all 1)
  const int32_t* row_map = nullptr;  // GEMM1: routed row -> pair (B row = pair / top_k);
  int top_k = 1;                     // null: B row = routed row (GEMM2)
  const int32_t* counts = nullptr;
  const int32_t* offsets = nullptr;
  int num_local = 0;
  float* split_acc = nullptr;        // kPfSplitBytes of partial sums, or null: no split
  uint32_t* split_count = nullptr;   // [kPfSplitTiles] split-tile counters, then the item
                                     // counter (pf_claim_counter); zero at launch
  __device__ int rb_count() const { return (rg_count + kPfRowGroups - 1) / kPfRowGroups; }
};

/// Operands of a prefill GEMM: weights `w`, staged BF16 rows `b` (`b_stride` elements
/// apart, range factors `b_back`); row_map null for GEMM2 (B row = routed row).
__host__ __device__ inline PfOperands pf_operands(const MatView& w, const uint16_t* b, int64_t b_stride,
                                                  const float* b_back, const int32_t* row_map,
                                                  int top_k, const int32_t* counts,
                                                  const int32_t* offsets, int num_local) {
  return PfOperands{.w = w.packed, .ws = reinterpret_cast<const uint4*>(w.scale),
                    .rg_count = w.rg, .kc_count = w.kc, .b = b, .b_stride = b_stride,
                    .b_back = b_back, .row_map = row_map, .top_k = top_k, .counts = counts,
                    .offsets = offsets, .num_local = num_local};
}

/// The staged B row of routed row `grow`: its token (GEMM1) or itself (GEMM2).
__device__ __forceinline__ int64_t pf_b_row(const PfOperands& o, int64_t grow) {
  return o.row_map != nullptr ? o.row_map[grow] / o.top_k : grow;
}

/// The work of one launch (computed from the device counts): `tiles` tiles in pf_tile's
/// sequence as items 0 .. items() - 1. Items 0 .. whole - 1 are tiles 0 .. whole - 1;
/// each of the last tiles - whole tiles is cut into `parts` K ranges, one item each
/// (heuristics.h pf_split), whose last part to finish adds the others' partial sums in
/// (pf_split_fixup). kClaim (heuristics.h prefill_claims): the CTAs claim the items in
/// order from a counter (pf_claim), so a faster CTA takes more and the last claims are
/// parts of a tile; otherwise CTA b takes items b, b + G, ... and only a short last wave
/// is split. With dealt items at two CTAs per SM a wave is counted in CTAs: counted in SMs
/// (GEMM1 at M=32: 660 whole tiles, the last 12 split) GEMM1 was no faster and GEMM2
/// slower (PERFORMANCE.md, session 25).
struct PfPlan {
  int tiles = 0, whole = 0, parts = 1;
  __device__ int items() const { return whole + (tiles - whole) * parts; }
};
template <int kTok, bool kClaim>
__device__ __forceinline__ PfPlan pf_plan(const PfOperands& o) {
  const int tiles = pf_tile_count<kTok>(o.counts, o.num_local, o.rb_count());
  PfPlan plan{tiles, tiles, 1};
  if (o.split_acc != nullptr) {
    const PfSplit split = pf_split(kClaim, tiles, gridDim.x, o.kc_count, kTok);
    plan.whole = tiles - split.tiles;
    plan.parts = split.parts;
  }
  return plan;
}

/// The launch's item counter: after the split-tile counters (heuristics.h
/// kPrefillWordsBytes), zero at launch.
__device__ __forceinline__ uint32_t* pf_claim_counter(const PfOperands& o) { return o.split_count + kPfSplitTiles; }
/// Claims the next item (one thread per CTA). Each CTA claims until it gets an item past
/// the plan, so the launch makes items + G claims; the one that gets the last of them
/// resets the counter for the next launch (no claim follows it).
__device__ __forceinline__ uint32_t pf_claim(const PfOperands& o, const PfPlan& plan) {
  uint32_t* counter = pf_claim_counter(o);
  const uint32_t item = atomicAdd(counter, 1u);
  if (item == static_cast<uint32_t>(plan.items()) + gridDim.x - 1) *counter = 0;
  return item;
}

/// One item of the plan: its tile (e = -1 past the end), its K chunks [kc_begin, kc_end),
/// and for a part of a split tile the tile's index among them (`slot`, else -1), its
/// `part` and the plan's `parts` per split tile.
struct PfWork {
  PfTile tile;
  int kc_begin = 0, kc_end = 0, slot = -1, part = 0, parts = 1;
};
static_assert(sizeof(PfWork) <= kPfHeaderBytes, "a stage's item header holds a PfWork");
template <int kTok>
__device__ __forceinline__ PfWork pf_work(const PfOperands& o, const PfPlan& plan, int item, PfWalk& at) {
  PfWork w;
  int ti = item;
  w.kc_end = o.kc_count;
  if (item >= plan.whole) {
    const int k = item - plan.whole;
    ti = plan.whole + k / plan.parts;
    if (ti >= plan.tiles) return w;
    w.slot = ti - plan.whole;
    w.part = k % plan.parts;
    w.parts = plan.parts;
    w.kc_begin = w.part * o.kc_count / plan.parts;
    w.kc_end = (w.part + 1) * o.kc_count / plan.parts;
  }
  w.tile = pf_tile<kTok>(o.counts, o.num_local, o.rb_count(), ti, at);
  return w;
}

/// The ring in dynamic shared memory.
struct PfRing {
  uint8_t* stages;   // [kPfStages][PfGeometry<kTok>::kStageBytes], 1024-aligned
  uint64_t* full;    // [kPfStages]: 128 arrivals (pf_producer) or 1 and the bytes (pf_producer_tma)
  uint64_t* empty;   // [kPfStages]: 256 consumer-thread arrivals
  float* amax;       // [2][4][kPfTokens]
  float* back;       // [2][kPfTokens]: each consumer warpgroup's tile's range factors
  uint32_t* arrived; // a split tile's parts counted before this one (pf_split_fixup)
  uint32_t* claimed; // [2]: pf_producer's claims, to its warpgroup, in alternate words
};

/// A position in a ring of kStages stages: a chunk's stage and the parity of that stage's
/// barriers on this lap, carried from chunk to chunk (no division by kStages in the loops).
template <int kStages>
struct RingCursor {
  int stage = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};
using PfCursor = RingCursor<kPfStages>;

/// The item header of a stage (PfGeometry::kHeader), for claimed items (pf_plan): the
/// consumers cannot know which item their producer claimed. The producer writes an item's
/// PfWork into the stage of the item's first chunk, and after the last item a header with
/// e = -1 into one more stage, which it publishes without copies. The consumers read it
/// once that stage's `full` phase completes (the arrival releases the write). They no
/// longer walk the experts' counts (pf_tile) between tiles either, 1-5 us per item.
template <int kTok>
__device__ __forceinline__ void pf_store_header(uint8_t* stage, const PfWork& work) {
  *reinterpret_cast<PfWork*>(stage + PfGeometry<kTok>::kHeader) = work;
}
template <int kTok>
__device__ __forceinline__ PfWork pf_load_header(const uint8_t* stage) {
  return *reinterpret_cast<const PfWork*>(stage + PfGeometry<kTok>::kHeader);
}

#if defined(MXMOE_SM90A)

/// A ring's stages and barriers as 32-bit shared addresses, broadcast from lane 0 by a
/// shuffle (PfRing, F8Ring). Why: from the dynamic shared symbol's address ptxas
/// re-derived the shared window's base (S2UR SR_CgaCtaId and ~8 uniform instructions) in
/// every chunk or group of the loops that use them, on the path to the barrier waits
/// (SASS, session 62: GEMM1's exact chunk loop, the FP8 group loops; session 63: the
/// producers' issue loops); a shuffle's result it cannot re-derive, so it keeps these in
/// uniform registers. Call it with the whole warp.
struct RingAddrs {
  uint32_t stages, full, empty;
};
template <class Ring>
__device__ __forceinline__ RingAddrs ring_addrs(const Ring& ring) {
  constexpr uint32_t kAll = 0xFFFFFFFFu;
  return RingAddrs{__shfl_sync(kAll, smem_addr(ring.stages), 0), __shfl_sync(kAll, smem_addr(ring.full), 0),
                   __shfl_sync(kAll, smem_addr(ring.empty), 0)};
}

template <int kTok>
__device__ __forceinline__ PfRing pf_ring(uint8_t* dyn_smem) {
  // Aligned by pointer arithmetic on the __shared__ array, not through an integer: the
  // compiler then still knows every ring pointer is shared memory and emits ld.shared
  // with 32-bit addresses (an integer round trip made them generic loads with 64-bit
  // address arithmetic in the mainloop).
  PfRing r;
  r.stages = dyn_smem + ((1024u - (smem_addr(dyn_smem) & 1023u)) & 1023u);
  r.full = reinterpret_cast<uint64_t*>(r.stages + kPfStages * PfGeometry<kTok>::kStageBytes);
  r.empty = r.full + kPfStages;
  r.amax = reinterpret_cast<float*>(r.empty + kPfStages);
  r.back = r.amax + kPfAmaxFloats;
  r.arrived = reinterpret_cast<uint32_t*>(r.back + 2 * kPfTokens);
  r.claimed = r.arrived + 1;  // in the 16 bytes after `back` (PfGeometry::kSmemBytes)
  return r;
}

/// `full_arrivals`: 128 for pf_producer (129 when it claims items: thread 0's header
/// release), 1 for pf_producer_tma.
__device__ __forceinline__ void pf_init_barriers(const PfRing& r, uint32_t full_arrivals) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kPfStages; ++s) {
      mbar_init(&r.full[s], full_arrivals);
      mbar_init(&r.empty[s], 256);  // every consumer thread releases its own reads
    }
    fence_mbarrier_init();  // the TMA engine (async proxy) completes on these barriers
  }
  __syncthreads();
}

/// Producer warpgroup (threads 0..127): thread i copies, per chunk, 16-byte piece i & 7
/// of token rows (i >> 3) + 16m (m < kTok / 16), weight words i + 128q (q < 4) and, for
/// i < 32, the scale words of row group i >> 3, pair i & 7. Each thread's `full` arrival
/// comes from the copy engine once its copies have landed (cp_async_arrive_noinc), so
/// no thread waits for them and every stage can be in flight; waiting for its own copies
/// two chunks later, as before session 36, held 3 chunks in flight and was 2-4% slower
/// (PERFORMANCE.md).
/// Every source is set up once per tile, without selects (rows past the expert's read
/// row 0 with source size 0), and advanced by its stride after each chunk: the producer
/// warp shares its scheduler with two consumer warps, and the per-chunk arithmetic of the
/// earlier forms came to ~245 instructions per chunk (offset or -1, select, multiply),
/// then ~146 (the tile's base plus the chunk's offset; ~112 since session 37). The weight and
/// scale words as bulk copies instead (B rows staying on cp.async) were slower: GEMM1
/// 6.08 -> 6.26 ms at M=4096, 205 -> 257 us at M=32 (PERFORMANCE.md, session 14).
template <int kTok, bool kClaim>
__device__ __forceinline__ void pf_producer(const PfOperands& o, const PfRing& ring) {
  constexpr int kRows = kTok / 16;  // token rows per thread
  const int i = threadIdx.x;
  const int c = i & 7, r0 = i >> 3;
  // Destinations inside a stage: B row r0 + 16m at b_dst + 2048m (the swizzle's r & 7 is
  // r0 & 7 for every m), weight words at w_dst + 2048q, scale words at s_dst.
  const int b_dst = r0 * 128 + ((c ^ (r0 & 7)) << 4);
  using Geo = PfGeometry<kTok>;
  const int w_dst = Geo::kStageB + i * 16;
  const int s_dst = Geo::kStageB + kPfStageW + i * 16;
  const int64_t w_group = static_cast<int64_t>(o.kc_count) * 128;  // uint4 per row group
  uint32_t n = 0;  // chunks filled
  PfCursor fill;   // where the next one goes in the ring
  const PfPlan plan = pf_plan<kTok, kClaim>(o);
  PfWalk at;  // this warp's place in the tile sequence
  for (uint32_t round = 0;; ++round) {
    int item = static_cast<int>(blockIdx.x + round * gridDim.x);
    if constexpr (kClaim) {
      // Thread 0's claim to the warpgroup, made once the previous item's copies are
      // issued (claimed at the previous item's start instead, a CTA held an item that
      // one idle sooner would have taken: GEMM2 at M=32 72 -> 109 us). The words
      // alternate, so thread 0 writes the next claim while a slow thread may still read
      // this one, and not this word again before every thread passed the next barrier.
      if (i == 0) ring.claimed[round & 1u] = pf_claim(o, plan);
      named_barrier_sync(kPfProducerBarrier, 128);
      item = static_cast<int>(ring.claimed[round & 1u]);
    }
    const PfWork work = pf_work<kTok>(o, plan, item, at);
    const PfTile& t = work.tile;
    if (t.e < 0) {
      if constexpr (kClaim) {
        // The end header, in a stage of its own, published as a chunk without copies.
        if (n >= static_cast<uint32_t>(kPfStages)) mbar_wait(&ring.empty[fill.stage], fill.phase ^ 1u);
        if (i == 0) {
          pf_store_header<kTok>(ring.stages + fill.stage * Geo::kStageBytes, work);
          mbar_arrive(&ring.full[fill.stage]);  // releases the header
        }
        cp_async_arrive_noinc(&ring.full[fill.stage]);
        ++n;
        fill.advance();
      }
      break;
    }
    const int count = o.counts[t.e], off = o.offsets[t.e];
    // Chunk 0 of row r0 + 16m's piece, or (bit m of `live` clear: past the expert's
    // rows) of row 0's, copied as zeros (source size 0, never read).
    const uint16_t* b_src[kRows];
    uint32_t live = 0;
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const int row = t.tt * kTok + r0 + 16 * m;
      const bool ok = row < count;
      b_src[m] = o.b + (ok ? pf_b_row(o, off + row) * o.b_stride : 0) + c * 8;
      live |= static_cast<uint32_t>(ok) << m;
    }
    const int64_t group0 = static_cast<int64_t>(t.e) * o.rg_count + t.rb * kPfRowGroups;
    const int groups = min(kPfRowGroups, o.rg_count - t.rb * kPfRowGroups);  // in range
    const uint4* w_src = o.w + group0 * w_group + i;  // row group q at + q * w_group
    const uint4* s_src = o.ws + (group0 + (i >> 3)) * o.kc_count * 8 + (i & 7);
    const bool s_copy = i < 32 && (i >> 3) < groups;
    // From the item's first chunk on, each source advances by its stride after each chunk:
    // one 64-bit add per copy (the docblock above; the producer was busy ~87% of GEMM1's
    // time at M=1024 when each address was rebuilt from the tile's base, session 37).
    const uint4* w_at[kPfRowGroups];
#pragma unroll
    for (int q = 0; q < kPfRowGroups; ++q) w_at[q] = w_src + (q * w_group + work.kc_begin * 128);
#pragma unroll
    for (int m = 0; m < kRows; ++m) b_src[m] += work.kc_begin * 64;
    s_src += work.kc_begin * 8;
    for (int kc = work.kc_begin; kc < work.kc_end; ++kc) {
      const int s = fill.stage;
      // From the second lap on, the consumers' release of this stage's previous chunk.
      if (n >= static_cast<uint32_t>(kPfStages)) mbar_wait(&ring.empty[s], fill.phase ^ 1u);
      uint8_t* st = ring.stages + s * Geo::kStageBytes;
      if (kClaim && i == 0 && kc == work.kc_begin) pf_store_header<kTok>(st, work);
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        cp_async_16_zfill(st + b_dst + 2048 * m, b_src[m], (live >> m) & 1u ? 16u : 0u);
        b_src[m] += 64;
      }
#pragma unroll
      for (int q = 0; q < kPfRowGroups; ++q) {
        if (q < groups) cp_async_16(st + w_dst + 2048 * q, w_at[q]);
        w_at[q] += 128;
      }
      if (s_copy) cp_async_16(st + s_dst, s_src);
      s_src += 8;
      // kClaim: thread 0's plain arrival releases the header (the copies' arrival, made by
      // the copy engine, orders no store of the thread's own).
      if (kClaim && i == 0) mbar_arrive(&ring.full[s]);
      cp_async_arrive_noinc(&ring.full[s]);  // once this thread's copies have landed
      ++n;
      fill.advance();
    }
  }
  cp_async_commit();
  cp_async_wait<0>();  // no copy outlives its thread
}

/// Producer for contiguous B rows (GEMM2), warp 0 of warpgroup 0 (the other three leave):
/// per chunk, once the consumers have released the stage, lane 0 arms `full` with the
/// chunk's bytes and copies the tile's kTok rows as one tensor-map box (`b_map`, boxes of
/// kTok rows; rows past the expert's are the next expert's or, past the buffer, zeros:
/// their accumulator columns are never stored), and lane q < groups copies row group q's
/// 2 KB of weight words and 128 bytes of scale words (bulk copies). About 20 instructions
/// per chunk, where pf_producer's cp.async issues ~190 per warp on the schedulers that the
/// consumers use (GEMM2 at M=4096: 2.63 -> 2.51 ms). Used at the 128-token tile only: at
/// 32 tokens it was slower (86 -> 109 us at M=32). A box per row, as GEMM1's gathered rows
/// would need, was 4x slower: ~60 cycles per 128-byte box (PERFORMANCE.md, session 14).
template <int kTok>
__device__ __forceinline__ void pf_producer_tma(const PfOperands& o, const PfRing& ring) {
  using Geo = PfGeometry<kTok>;
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  const int64_t w_group = static_cast<int64_t>(o.kc_count) * 128;  // uint4 per row group
  uint32_t n = 0;  // chunks filled
  PfCursor fill;
  const PfPlan plan = pf_plan<kTok, false>(o);
  const RingAddrs ra = ring_addrs(ring);
  PfWalk at;
  for (int item = blockIdx.x;; item += gridDim.x) {
    const PfWork work = pf_work<kTok>(o, plan, item, at);
    const PfTile& t = work.tile;
    if (t.e < 0) break;
    const int row0 = o.offsets[t.e] + t.tt * kTok;
    const int64_t group0 = static_cast<int64_t>(t.e) * o.rg_count + t.rb * kPfRowGroups;
    const int groups = min(kPfRowGroups, o.rg_count - t.rb * kPfRowGroups);  // in range
    const int q = min(lane, groups - 1);  // lanes < groups copy row group q
    const uint4* w_src = o.w + (group0 + q) * w_group;
    const uint4* s_src = o.ws + (group0 + q) * o.kc_count * 8;
    const uint32_t bytes = kTok * 128 + groups * (2048u + 128u);
    for (int kc = work.kc_begin; kc < work.kc_end; ++kc) {
      const int s = fill.stage;
      // From the second lap on, the consumers' release of this stage's previous chunk.
      if (n >= static_cast<uint32_t>(kPfStages)) mbar_wait_at(ra.empty + 8 * s, fill.phase ^ 1u);
      const uint32_t st = ra.stages + s * Geo::kStageBytes, bar = ra.full + 8 * s;
      if (lane == 0) {
        mbar_arrive_expect_tx_at(bar, bytes);
        tma_load_2d_at(st, o.b_map, kc * 64, row0, bar);
      }
      __syncwarp();  // the barrier is armed before any of the chunk's bytes can land
      if (lane < groups) {
        bulk_copy_g2s_tx_at(st + Geo::kStageB + q * 2048, w_src + kc * 128, 2048, bar);
        bulk_copy_g2s_tx_at(st + Geo::kStageB + kPfStageW + q * 128, s_src + kc * 8, 128, bar);
      }
      ++n;
      fill.advance();
    }
  }
}

/// A fragments of one MX block for the two k16 steps: rows g (word w0, multiplier m0)
/// and g + 8 (w1, m1) of this warp's m16 tile; frag[s] = {r0[2s], r1[2s], r0[2s+1],
/// r1[2s+1]} as in warp_mma_mx. kSharedShift: fp4x8_to_bf16_times' form.
template <bool kSharedShift>
__device__ __forceinline__ void pf_a_frags(uint32_t w0, uint32_t w1, __nv_bfloat162 m0, __nv_bfloat162 m1,
                                           uint32_t (&frag)[2][4]) {
  uint32_t r0[4], r1[4];
  fp4x8_to_bf16_times<kSharedShift>(w0, m0, r0);
  fp4x8_to_bf16_times<kSharedShift>(w1, m1, r1);
  frag[0][0] = r0[0]; frag[0][1] = r1[0]; frag[0][2] = r0[1]; frag[0][3] = r1[1];
  frag[1][0] = r0[2]; frag[1][1] = r1[2]; frag[1][2] = r0[3]; frag[1][3] = r1[3];
}

/// The A fragments of a 64-K chunk for the two m16 tiles a and b: tiled words w (x, y:
/// MX block 0's rows g and g + 8; z, w: block 1's) and their scale bytes s (byte 2k + h:
/// block k, row g + 8h), as frag[block][k16]; the two tiles' decodes interleaved.
template <bool kSharedShift>
__device__ __forceinline__ void pf_chunk_frags(const uint4& wa, uint32_t sa, const uint4& wb, uint32_t sb,
                                               uint32_t (&fa)[2][2][4], uint32_t (&fb)[2][2][4]) {
  __nv_bfloat162 ea, oa, eb, ob;  // rows g (even bytes) and g + 8 (odd); block k in lane k
  bf16_scale_pairs(sa, ea, oa);
  bf16_scale_pairs(sb, eb, ob);
  pf_a_frags<kSharedShift>(wa.x, wa.y, __low2bfloat162(ea), __low2bfloat162(oa), fa[0]);
  pf_a_frags<kSharedShift>(wb.x, wb.y, __low2bfloat162(eb), __low2bfloat162(ob), fb[0]);
  pf_a_frags<kSharedShift>(wa.z, wa.w, __high2bfloat162(ea), __high2bfloat162(oa), fa[1]);
  pf_a_frags<kSharedShift>(wb.z, wb.w, __high2bfloat162(eb), __high2bfloat162(ob), fb[1]);
}

/// One chunk's 8 wgmmas: both accumulators over the chunk's 4 k16 steps of the B tile at
/// descriptor `desc` (a k16 step moves the start by 32 bytes).
template <int kN>
__device__ __forceinline__ void pf_chunk_mma(float (&acc_a)[kN], float (&acc_b)[kN], const uint32_t (&fa)[2][2][4],
                                             const uint32_t (&fb)[2][2][4], uint64_t desc) {
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int k16 = 0; k16 < 2; ++k16) {
      const uint64_t d = desc + static_cast<uint64_t>(((2 * b + k16) * 32) >> 4);
      wgmma_rs(acc_a, fa[b][k16], d);
      wgmma_rs(acc_b, fb[b][k16], d);
    }
}

/// Consumer mainloop of one item for warpgroup `wg` (0, 1): acc_a / acc_b = its two m64
/// tiles x kTok tokens (kTok / 2 accumulators each) over the item's K chunks. kGated
/// (GEMM1): both tiles in row group 2wg + w/2, gate rows (m16 tile w % 2) in acc_a and
/// the up rows of the same columns (tile 2 + w % 2) in acc_b, so the activation needs no
/// exchange.
/// Otherwise (GEMM2): row groups 2wg (acc_a) and 2wg + 1 (acc_b), m16 tile w. `cur` walks
/// the ring's chunks in the producer's sequence. GEMM1 only: the tile's kTok range factors
/// go to the warpgroup's own ring.back[wg] after the last chunk, and its epilogue reads
/// them after a warpgroup barrier (GEMM2's staged operand has factor 1 and its epilogue
/// reads none): thread i loads row i's before the first chunk, so the two dependent
/// global loads (row map, factor) land under the mainloop.
template <bool kGated, int kTok>
__device__ __forceinline__ void pf_mainloop(float (&acc_a)[kTok / 2], float (&acc_b)[kTok / 2],
                                            const PfOperands& o, const PfWork& work,
                                            const PfRing& ring, PfCursor& cur, int wg) {
  const PfTile& tile = work.tile;
  const int i = threadIdx.x & 127;
  float back = 1.0f;
  if (kGated && i < kTok) {
    const int row = tile.tt * kTok + i;
    if (o.b_back != nullptr && row < o.counts[tile.e]) back = o.b_back[pf_b_row(o, o.offsets[tile.e] + row)];
  }
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2;
  const int qa = kGated ? 2 * wg + (warp >> 1) : 2 * wg;  // tile a's row group and m16 tile
  const int mta = kGated ? (warp & 1) : warp;
  using Geo = PfGeometry<kTok>;
  const RingAddrs ra = ring_addrs(ring);
  const uint32_t stages0 = ra.stages, full0 = ra.full, empty0 = ra.empty;
  // This thread's weight and scale words of tile a in stage 0, as shared addresses; tile
  // b's lie a constant further (GEMM1: m16 tile + 2; GEMM2: row group + 1). The empty asm
  // in the loop hides where the two come from, so the compiler keeps them in registers
  // instead of recomputing them from threadIdx every chunk (~20 instructions).
  uint32_t w_addr = stages0 + Geo::kStageB + ((qa * 4 + mta) * 32 + lane) * 16;
  uint32_t s_addr = stages0 + Geo::kStageB + kPfStageW + ((qa * 8 + g) * 4 + mta) * 4;
  constexpr uint32_t kWordsB = kGated ? 2 * 32 * 16 : 4 * 32 * 16;
  constexpr uint32_t kScalesB = kGated ? 2 * 4 : 8 * 4 * 4;
#pragma unroll
  for (int j = 0; j < kTok / 2; ++j) acc_a[j] = acc_b[j] = 0.0f;
  int prev = 0;  // stage of the previous chunk
  for (int kc = work.kc_begin; kc < work.kc_end; ++kc) {
    const int s = cur.stage;
    asm volatile("" : "+r"(w_addr), "+r"(s_addr));
    mbar_wait_at(full0 + 8 * s, cur.phase);
    fence_proxy_async_shared();  // pf_producer's cp.async rows, for the wgmmas (async proxy)
    const uint32_t so = static_cast<uint32_t>(s) * Geo::kStageBytes;
    const uint4 wa = lds_u4(w_addr + so);
    const uint4 wb = lds_u4(w_addr + so + kWordsB);
    const uint32_t sa = lds_u32(s_addr + so);
    const uint32_t sb = lds_u32(s_addr + so + kScalesB);
    const uint64_t desc = smem_desc_k128_at(stages0 + so);
    // One wgmma group per chunk (8 wgmmas, 512 tensor cycles of this warpgroup): the
    // other consumer warpgroup's group runs while this one waits, releases and decodes,
    // so that gap must stay under one group (a group per MX block, half as long, was 5%
    // slower in GEMM2; PERFORMANCE.md, session 4). Every earlier group is retired before the
    // fragments are rewritten: with a group left in flight (wait_group 1) ptxas
    // serializes every wgmma (C7513), as it cannot tell which group still reads the
    // registers being written. After the wait the previous chunk's stage goes back to
    // the producer, each thread releasing its own reads.
    wgmma_wait<0>();
    if (kc > work.kc_begin) mbar_arrive_at(empty0 + 8 * prev);
    uint32_t fa[2][2][4], fb[2][2][4];  // [MX block][k16][fragment]
    pf_chunk_frags<pf_decode_shared_shift(kTok)>(wa, sa, wb, sb, fa, fb);
    wgmma_fence();
    pf_chunk_mma(acc_a, acc_b, fa, fb, desc);
    wgmma_commit();
    prev = s;
    cur.advance();
  }
  wgmma_wait<0>();
  acc_fence(acc_a);
  acc_fence(acc_b);
  mbar_arrive(&ring.empty[prev]);
  if (kGated && i < kTok) ring.back[wg * kPfTokens + i] = back;
}

/// A part of a split tile (pf_plan), after its mainloop, by the 256 consumer threads:
/// stores its partial sums (thread t's accumulator j at [(slot * parts + part) * kTok + j]
/// * 256 + t, coalesced) and counts itself on the tile's counter. The part that arrives
/// last loads every part's sums and adds them in part order (so the result does not
/// depend on which part that is), resets the counter for the next launch and returns
/// true: it runs the tile's epilogue. The others return false.
template <int kTok>
__device__ __forceinline__ bool pf_split_fixup(float (&acc_a)[kTok / 2], float (&acc_b)[kTok / 2],
                                               const PfOperands& o, const PfWork& work, const PfRing& ring) {
  const int t = static_cast<int>(threadIdx.x) - 128;
  float* tile_acc = o.split_acc + static_cast<size_t>(work.slot) * work.parts * kTok * 256 + t;
  float* mine = tile_acc + static_cast<size_t>(work.part) * kTok * 256;
#pragma unroll
  for (int j = 0; j < kTok / 2; ++j) {
    __stcg(mine + j * 256, acc_a[j]);
    __stcg(mine + (kTok / 2 + j) * 256, acc_b[j]);
  }
  // The barrier orders the 256 threads' sums before thread 0's release; the second one
  // orders its acquire (every other part's sums) before their loads.
  named_barrier_sync(kPfSplitBarrier, 256);
  if (t == 0) *ring.arrived = atomic_add_acq_rel_gpu(&o.split_count[work.slot], 1u);
  named_barrier_sync(kPfSplitBarrier, 256);
  if (*ring.arrived != static_cast<uint32_t>(work.parts - 1)) return false;
#pragma unroll
  for (int j = 0; j < kTok / 2; ++j) {
    acc_a[j] = __ldcg(tile_acc + j * 256);
    acc_b[j] = __ldcg(tile_acc + (kTok / 2 + j) * 256);
  }
  for (int part = 1; part < work.parts; ++part) {
    const float* p = tile_acc + static_cast<size_t>(part) * kTok * 256;
#pragma unroll
    for (int j = 0; j < kTok / 2; ++j) {
      acc_a[j] += __ldcg(p + j * 256);
      acc_b[j] += __ldcg(p + (kTok / 2 + j) * 256);
    }
  }
  if (t == 0) o.split_count[work.slot] = 0;
  return true;
}

/// Body of both prefill kernels: the ring, the producer warpgroup (the TMA producer when
/// kTmaB: B rows contiguous, o.b_map set), and the consumers' item loop, which hands each
/// tile's accumulators to `epilogue(acc_a, acc_b, tile, wg, ring)` (wg = consumer
/// warpgroup 0 or 1), for a split tile once its last part has added the others' in.
template <bool kGated, int kTok, bool kTmaB, class Epilogue>
__device__ __forceinline__ void pf_run(const PfOperands& o, uint8_t* dyn_smem, Epilogue&& epilogue) {
  using Geo = PfGeometry<kTok>;
  const PfRing ring = pf_ring<kTok>(dyn_smem);
  constexpr bool kClaim = prefill_claims(kGated, kTok);
  pf_init_barriers(ring, kTmaB ? 1u : kClaim ? 129u : 128u);
  static_assert(!(kClaim && kTmaB), "claimed items come from pf_producer's headers");
  const int wg = static_cast<int>(threadIdx.x) / 128;
  if (wg == 0) {
    setmaxnreg_dec<Geo::kProducerRegs>();
    if constexpr (kTmaB) pf_producer_tma<kTok>(o, ring);
    else pf_producer<kTok, kClaim>(o, ring);
    return;
  }
  setmaxnreg_inc<Geo::kConsumerRegs>();
  PfCursor cur;
  [[maybe_unused]] const PfPlan plan = kClaim ? PfPlan{} : pf_plan<kTok, false>(o);
  [[maybe_unused]] PfWalk at;
  for (int item = blockIdx.x;; item += gridDim.x) {
    PfWork work;
    if constexpr (kClaim) {
      // The next item from its first chunk's header (pf_store_header); pf_mainloop's
      // wait on the same phase then returns at once.
      mbar_wait(&ring.full[cur.stage], cur.phase);
      work = pf_load_header<kTok>(ring.stages + cur.stage * Geo::kStageBytes);
    } else {
      work = pf_work<kTok>(o, plan, item, at);
    }
    if (work.tile.e < 0) break;
    float acc_a[kTok / 2], acc_b[kTok / 2];
    pf_mainloop<kGated, kTok>(acc_a, acc_b, o, work, ring, cur, wg - 1);
    if (work.slot >= 0 && !pf_split_fixup<kTok>(acc_a, acc_b, o, work, ring)) continue;
    epilogue(acc_a, acc_b, work.tile, wg - 1, ring);
  }
}

#endif  // MXMOE_SM90A

}  // namespace mxmoe::cuda_detail
