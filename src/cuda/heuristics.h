// heuristics.h — which GEMM path and token tile the engine uses for a shape. Kept in one
// place so the choice is visible and tunable without touching the kernels.
//
// Decode path ("fast"): the activation operand is MXFP8 (E4M3 codes, exact in FP16) and the
// weights are the MMA's large dimension. It uses FP16 MMAs (weights dequantized straight
// into FP16 bit fields, see mx_mma.cuh), a shared-memory cp.async weight ring per warp, and
// per-block shared-memory scales. Its token tile (8, 16 or 32 rows) is chosen per expert
// from the expert's row count, which only the GPU knows: one launch per count class, whose
// blocks leave at once for experts of another class (plan_fast). Otherwise the generic
// BF16 path (any activation format, any number of rows).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>

#include "mxmoe/formats.h"  // MXMOE_HD

namespace mxmoe::cuda_detail {

/// Largest token count routed to the decode path: above it the generic path (prefill).
/// Rows per expert, not tokens, decide the decode path's efficiency: under EP32 a rank's
/// ~400 received tokens at 32 tokens per rank hold ~18 rows per expert.
inline constexpr int64_t kFastMaxTokens = 512;
/// Shared memory of one decode block (bytes): its B scales plus its warps' weight rings
/// must fit. Above 48 KB the launcher opts the kernel in (cudaFuncSetAttribute).
inline constexpr int64_t kFastMaxSmemBytes = 96 * 1024;
inline constexpr int64_t kDefaultSmemBytes = 48 * 1024;
/// Bytes of one weight-ring stage (one warp's 64-K chunk: 4 x 512 weight bytes and 8
/// scale words; see FastRing in mx_mma.cuh) and the decode kernels' warps per block.
inline constexpr int kFastStageBytes = 4 * 32 * 16 + 8 * 16;
inline constexpr int kFastWarps = 4;

/// Generic path token tile: 8-token MMA tiles per warp (token tile = 8 * nt rows).
struct GemmPlan {
  int nt = 1;
};
inline GemmPlan plan_gemm(int64_t tokens) { return GemmPlan{tokens <= 8 ? 1 : 4}; }
/// Grid z of the generic kernels (blocks per expert and row-group block; each loops over
/// token tiles z apart). Behind the prefill path they are the fallback for values BF16
/// cannot hold exactly: launched every forward, they leave at once on the staging flag,
/// and 32 z-blocks per row-group block made that 34 us at M=4096 (21504 + 25088 blocks,
/// session 12's ncu). Four made that 4.5 + 3.5 us (ncu, session 13); one (session 64) is
/// 672 + 392 blocks at Kimi's shapes whatever M, whose exit session 64's probe put at
/// ~1.3 ns a block in the layer (M=128: leaving both launches out saved 7.8 us at z = 4,
/// M=16: 3.7 us at z = 1). The rare forward that needs the fallback still has every
/// (row-group block, expert) pair in parallel, ~8 blocks per SM, each over its tiles.
inline int64_t generic_grid_z(int64_t tiles, bool prefill_fallback) {
  return prefill_fallback ? 1 : std::clamp<int64_t>(tiles, 1, 32);
}

/// Which GEMM a decode launch is for (their shapes and splits differ).
enum class FastGemm { kGemm1, kGemm2 };
/// Ring stages per warp and blocks per SM (__launch_bounds__) of the decode kernels.
/// With the shared-memory rings a warp holds no registers for chunks in flight, so the
/// register budget sets how many warps (and chunks) an SM keeps in flight; these compile
/// without spills (ptxas -v). Measured on the H200 (mxmoe bench, graph):
/// - GEMM1 at M=1 (16 experts x 24 blocks, one wave of 2.9 blocks per SM): 8 stages at 3
///   blocks/SM beat 4 stages at 5 (session 7, layer: 116.8 vs 136.9 us).
/// - GEMM2 at M=1 (split 4: 16 x 14 x 4 blocks of short warps, 12 chunks each): 4 stages
///   at 5 blocks/SM beat 8 at 3 (session 7: GEMM2 48.9 -> 35.8 us in ncu, layer 129.5 ->
///   116.8 us; split 2 at 4 stages: 40.6 / 122.5 us).
/// - M=2..8 (all 28 experts, 5 blocks/SM filled): 4 stages at 5 win (196 vs 223 us at
///   M=2; equal at M=8); GEMM2 at 8 stages was 1-4 us slower at M=2..8 (session 7).
constexpr int fast_depth(int nt, int64_t tokens, FastGemm gemm = FastGemm::kGemm1) {
  return nt == 1 ? (tokens <= 1 && gemm == FastGemm::kGemm1 ? 8 : 4) : nt == 2 ? 4 : 3;
}
/// The 16-row kernel also holds the 8-row body (plan_fast), so it gets 3 blocks per SM
/// (170 registers): at 4 it spilled 52-92 bytes; at 3 only GEMM2's keeps one 4-byte
/// value in local memory, stored at block start and read in the epilogue (outside the
/// loops). Measured (H200, graph, us) 3 vs 4 blocks: M=12 333 / 365, M=16 387 / 377,
/// M=24 751 / 774.
constexpr int fast_min_blocks(int nt, int depth) {
  return nt == 1 ? (depth >= 8 ? 3 : 5) : nt == 2 ? 3 : 2;
}

/// Largest token count whose decode path runs only 8-row tiles (plan_fast).
inline constexpr int64_t kFastEightRowMaxTokens = 32;

/// One decode-path launch: experts whose row count lies in (lo, hi] run with token tile
/// 8 * nt, `depth` ring stages, and `z` token-tile slots in grid z (slot s takes tiles s,
/// s + z, ..., so any count is covered; z > 1 only spreads a big expert's tiles).
struct FastClass {
  int nt = 1, depth = 4;
  int32_t lo = 0, hi = std::numeric_limits<int32_t>::max();
  int z = 1;
};
struct FastPlan {
  bool ok = false;  // false: the generic path
  int n = 0;
  FastClass c[3];
};
/// Up to kFastEightRowMaxTokens tokens one class of 8-row tiles, whatever the counts: the
/// experts of more rows take several tiles (GEMM2: over grid z, up to 4; GEMM1: the
/// balanced kernel's units), all in one wave, their weights streamed by several blocks at
/// the same time (L2 serves the repeats). Measured on the H200 (session 22, run 4, graph,
/// us, Kimi shapes), the 16- and 32-row classes below against these 8-row tiles: M=12 285
/// / 219; with MXMOE_PREFILL=0, M=16 305 / 256, M=20 355 / 301, M=24 589 / 326, M=32 845 /
/// 421. A 16-row tile for the balanced kernel was slower (PERFORMANCE.md, session 22).
/// Above it, rows per expert are at most `tokens` unless a token repeats an expert (then
/// the last class's tile loop takes the extra tiles), so only the classes a count <=
/// tokens can fall in are launched: 16-row tiles for counts <= 16, 32 above (streaming
/// the weights once per 32 rows). The 16-row launch (nt 2) also takes the counts <= 8,
/// with 8-row tiles inside the same kernel: as two launches, each class streamed only
/// part of the experts' weights with the GPU partly idle (M=16: 432 us, session 7).
inline FastPlan plan_fast(int64_t tokens, bool operand_fp8, int64_t kb_count, FastGemm gemm) {
  FastPlan f;
  if (!operand_fp8 || tokens > kFastMaxTokens) return f;
  constexpr int32_t kAny = std::numeric_limits<int32_t>::max();
  if (tokens <= kFastEightRowMaxTokens) {
    // 8-row tiles; an expert's tiles over grid z (GEMM2; GEMM1's balanced kernel takes
    // them as units).
    const int z = static_cast<int>(std::clamp<int64_t>((tokens + 7) / 8, 1, 4));
    f.c[f.n++] = FastClass{1, fast_depth(1, tokens, gemm), 0, kAny, z};
  } else {
    f.c[f.n++] = FastClass{2, fast_depth(2, tokens, gemm), 0, 16, 1};
    const int z = static_cast<int>(std::clamp<int64_t>((tokens + 31) / 32, 1, 8));
    f.c[f.n++] = FastClass{4, fast_depth(4, tokens, gemm), 16, kAny, z};
  }
  // The block's B scales and its warps' rings live in dynamic shared memory.
  f.ok = true;
  for (int i = 0; i < f.n; ++i)
    f.ok = f.ok && kb_count * 8 * f.c[i].nt * 4 + int64_t{kFastWarps} * f.c[i].depth * kFastStageBytes <=
                       kFastMaxSmemBytes;
  return f;
}

// ---------------------------------------------------------------- balanced decode GEMM1
/// GEMM1 at 2..32 tokens (plan_fast's one class of 8-row tiles, 4 ring stages) runs as one
/// wave: every block of `blocks` = resident blocks per SM x SMs works, on the "units" of
/// the forward (the 8-row token tiles of the experts holding rows, expert order; an
/// expert of 9..16 rows is two units, streamed at the same time by neighbouring blocks). A unit
/// is rg x kc chunks of weights (rg 64-row groups of kc 64-K chunks). Its blocks' warps
/// take equal contiguous ranges of those chunks, so a row group may be cut between two
/// neighbouring warps; the one that finishes last adds the other's partial sums (part
/// order: K order) and runs the epilogue. Before, one warp per row group and 4-warp
/// blocks made 672 blocks for 660 resident slots at M=4..8 (Kimi: 28 experts x 24 blocks
/// at 5 per SM): the 12 blocks of the second wave cost ~13 us at M=4 and ~25 at M=8
/// (session 16's probe T). Not at M=1 (16 experts: 384 blocks for 396 slots at 3 per SM).
inline constexpr int64_t kBalancedMinTokens = 2;
inline constexpr int64_t kBalancedMaxTokens = kFastEightRowMaxTokens;
inline bool use_balanced(int64_t tokens) {
  return tokens >= kBalancedMinTokens && tokens <= kBalancedMaxTokens;
}
/// At most this many blocks (more SMs leave the rest idle): it sizes the partial sums, one
/// slot per warp (the row group it shares with the next warp), two parts of a warp's 4 x 4
/// sums per lane. The counters (one per slot) are cleared by the permutation each forward.
inline constexpr int kBalancedMaxBlocks = 1024;
inline constexpr int kBalancedSlots = kBalancedMaxBlocks * kFastWarps;
inline constexpr int kBalancedSlotFloats = 2 * 16 * 32;
inline constexpr size_t kBalancedAccBytes = size_t{kBalancedSlots} * kBalancedSlotFloats * sizeof(float);

/// Block `b`'s share of the balanced grid.
struct BalancedBlock {
  int unit = -1;         // first unit (-1: no work)
  int unit_stride = 1;   // next units: unit + k * unit_stride (more units than blocks)
  int index = 0;         // this block among the unit's blocks
  int blocks = 1;        // the unit's blocks
  int first_slot = 0;    // slot of the unit's first warp
};
/// `units` units over `blocks` blocks, unit u taking blocks / units blocks (one more for
/// the first blocks % units), at most ceil(rg / 4) (each warp >= one row group's chunks,
/// so a row group is cut at most once). More units than blocks: block b takes units b,
/// b + blocks, ... alone (its slots reused after a block barrier).
MXMOE_HD BalancedBlock balanced_block(int units, int blocks, int rg, int b) {
  BalancedBlock r;
  if (units <= 0 || b >= blocks) return r;
  const int q = blocks / units, rem = blocks % units;
  if (q == 0) {
    if (b < units) {
      r.unit = b;
      r.unit_stride = blocks;
      r.first_slot = kFastWarps * b;
    }
    return r;
  }
  int first = 0;
  if (b < rem * (q + 1)) {
    r.unit = b / (q + 1);
    r.blocks = q + 1;
    first = r.unit * (q + 1);
  } else {
    r.unit = rem + (b - rem * (q + 1)) / q;
    r.blocks = q;
    first = rem * (q + 1) + (r.unit - rem) * q;
  }
  r.unit_stride = units;  // one unit each
  r.index = b - first;
  r.first_slot = kFastWarps * first;
  const int cap = (rg + kFastWarps - 1) / kFastWarps;
  if (r.blocks > cap) r.blocks = cap;
  if (r.index >= r.blocks) r.unit = -1;
  return r;
}
/// Chunk range [lo, hi) of warp `wi` of a unit's `blocks` blocks, chunks numbered
/// row group major (rg x kc < 2^31); the first chunks % nw warps take one chunk more.
/// Empty for warps past the rg warps a unit can use.
MXMOE_HD void balanced_range(int rg, int kc, int blocks, int wi, int* lo, int* hi) {
  const int nw = kFastWarps * blocks < rg ? kFastWarps * blocks : rg;
  *lo = *hi = 0;
  if (wi >= nw) return;
  const int chunks = rg * kc, q = chunks / nw, extra = chunks - q * nw;
  *lo = wi * q + (wi < extra ? wi : extra);
  *hi = *lo + q + (wi < extra ? 1 : 0);
}

/// GEMM2 on the decode path splits its reduction (N, whole 64-K chunks) over grid z so
/// more warps stream weights at few tokens (at M=1 the unsplit grid has 6.8 warps per
/// SM). Split s writes its fp32 partial (before the range factor) to its own copy of y;
/// finalize sums the copies in split order, then applies the row's range factor, so
/// results are deterministic. Not with a GEMM2 bias (it must follow the factor).
inline constexpr int kGemm2MaxSplits = 4;
/// Largest token count that splits (gemm2_splits): sizes the split copies of y.
inline constexpr int64_t kGemm2SplitMaxTokens = 32;
/// Measured on the H200 (test_engine DISABLED_Timing, Kimi shapes): M=1 (16 experts, 224
/// blocks for 396 resident slots) 64.9 us unsplit / 67.6 (2) / 60.8 (4); M=8 (28
/// experts, ~1 wave unsplit) 73.7 / 77.9 / 84.7; M=32 (NT=4, 2 blocks per SM, 1.5
/// waves unsplit) 321 / 256 / 297. (Those M=1 times are with 8 stages; at 4 stages and 5
/// blocks per SM, fast_depth, split 4 takes 35.8 us and split 2 40.6: session 7, ncu.)
/// At one token 3 splits since the one-row kernel (gemm2_one_row): 672 blocks, all
/// resident at its 6 per SM (792 slots). Measured on the H200 (session 31, run 2, graph,
/// three rounds, us): the 8-row kernel with 4 splits 99.5 / 99.7 / 99.1, with 3 102.9 /
/// 103.0 / 103.0 (12 blocks past its 660 slots); the one-row kernel with 4 splits 98.6 /
/// 98.2 / 98.4, with 3 98.4 / 98.8 / 98.4, with 2 108.0 / 108.2 / 108.0. GEMM2 alone (ncu)
/// 36.5 us (8-row, 4 splits), 35.0 (one-row, 4), 34.2 (one-row, 3).
/// At 3..4 tokens 2 splits (784 blocks for 660 slots) since GEMM2 starts beside GEMM1
/// under the expert-ready counters (use_expert_ready): against one split with 3 blocks per
/// SM (kGemm2ReadyBlocksPerSm) M=3 150.0 -> 145.5 us, M=4 157.3 -> 150.0; at 2 and
/// 5..15 tokens no better or slower (H200, session 30, runs 2 and 3, two rounds).
inline int gemm2_splits(int64_t tokens, bool fast, bool has_bias) {
  if (!fast || has_bias) return 1;
  if (tokens <= 1) return 3;
  if (tokens >= 3 && tokens <= 4) return 2;
  return tokens > 16 && tokens <= kGemm2SplitMaxTokens ? 2 : 1;
}
/// GEMM2's one-row decode kernel (gemm2.cu, kOneRow): at one token every expert holds one
/// row (more only when a token names an expert twice: then one row at a time), so the
/// kernel compiles only the one-row diagonal loop (80 registers instead of 96) and stages
/// one row's scales (384 bytes instead of 3 KB at Kimi's N), and fits 6 blocks per SM
/// instead of 5: with 3 splits (gemm2_splits) every block of Kimi's M=1 is resident at once.
inline constexpr int kGemm2OneRowBlocksPerSm = 6;
inline bool gemm2_one_row(int64_t tokens) { return tokens <= 1; }

/// GEMM2's 8-row decode kernel with the narrow B form compiled in (stage_b_scales: the
/// token scales inside B, 16 fewer FMULs per MX block in warp_mma_fast), used for tiles
/// of 5..8 rows. Not at 1 or 2 tokens (tiles of at most 2 rows: the diagonal loop only)
/// nor when split (M=1): there the narrow loops' code only costs. Measured on the H200
/// (session 24, graph, three rounds): this rule against none (run 4) M=1, 2, 4 -0.2..0%,
/// M=8 -0.5%, M=12 -1.9%, M=15 -0.7%; the form in both GEMMs at every size (run 1) M=1
/// +1.8%, M=2 +2.7% (this kernel spilled 26 bytes instead of 6); in GEMM1's balanced
/// kernel alone (run 2) +0.4..+1.2% at M=1..8.
inline bool gemm2_narrow_b(int64_t tokens, int splits) { return splits == 1 && tokens > 2; }
/// Rows of GEMM2's fp32 output per top-k slot: room for every split's copy, and
/// non-decreasing in `tokens` (workspace_size(max) must cover every M <= max).
inline int64_t gemm2_y_rows(int64_t tokens, bool splittable) {
  if (!splittable) return tokens;
  return std::max<int64_t>(tokens, kGemm2MaxSplits * std::min<int64_t>(tokens, kGemm2SplitMaxTokens));
}

// ---------------------------------------------------------------- prefill path
/// The prefill path (sm_90a, gemm1_act.cu / gemm2.cu with wgmma_mx.cuh): BF16 wgmma with
/// both operands dequantized exactly to BF16 (the MX scales inside the operands), a
/// persistent warp-specialized kernel over (expert, token tile, 256-row block) tiles.
/// Used from kPrefillMinTokens tokens on, on sm_90 devices, when every weight scale byte
/// is at most kPrefillMaxWeightScale (fp4x8_to_bf16_times's exact range; real
/// checkpoints sit far below: |w| <= 12). Otherwise the decode or generic path.
/// Measured on the H200 (mxmoe bench, Kimi shapes, graph, us), decode path vs prefill
/// path with its 32-token tile (session 7): M=12 331 / 344, M=14 349 / 350, M=16 393 /
/// 348, M=20 443 / 358, M=24 766 / 359, M=28 886 / 368, M=31 873 / 367. Session 22,
/// decode path with 8-row tiles only (plan_fast) vs prefill: M=9 204 / 253, M=12 215 /
/// 254, M=14 236 / 255, M=15 244 / 255 (run 2), M=16 256 / 255, M=20 301 / 256, M=24 326 /
/// 259, M=32 421 / 265 (run 4). Near 9 rows per expert (M=16) the decode path's time
/// follows how many experts hold more than 8 rows (two units): 247 to 275 us at M=16 over
/// three routings.
inline constexpr int64_t kPrefillMinTokens = 16;
/// The FP8 mode's prefill (wgmma_fp8.cuh, 128-token tiles only) from this many tokens;
/// below it the exact paths run (decode, then exact prefill from kPrefillMinTokens).
/// Measured on the H200 (session 8, mxmoe bench, Kimi shapes, graph, us), exact path /
/// FP8 mode: M=32 370 / 463, M=64 456 / 517, M=96 531 / 562, M=128 669 / 606, M=512
/// 1872 / 1804: the FP8 kernels win from 128 tokens (the exact path's 128-token tile) and
/// lose below it. (32 until session 9.) Session 9: M=127 673 (exact) / 607 (FP8 mode,
/// session 8 binary): from 113 tokens (Kimi: rows per expert > 64) the exact path then
/// took its 128-token tile, so the switch belonged there, a lead. Since session 27 the
/// exact path takes 96 tokens at M=110..159 (prefill_token_tile), and the FP8 mode is
/// slower than it from 128 tokens to 1024 and level above (session 27, run 5: M=128 452
/// against 400 us, M=4096 8272 against 8257; FP8_MODE.md). Left at 128 so that the FP8
/// mode's GPU tests keep running its kernels; since then the FP8 kernels caught up: at
/// M=128 327 against 368 us (session 46, H200; 411 against 369 on session 45's H100).
inline constexpr int64_t kFp8PrefillMinTokens = 128;
inline constexpr uint8_t kPrefillMaxWeightScale = 128;
/// The exact prefill path (in FP8 mode only below kFp8PrefillMinTokens: the caller asks
/// use_fp8_prefill first).
inline bool use_prefill(int64_t tokens, bool capable) {
  return capable && tokens >= kPrefillMinTokens;
}
/// Token tile of the exact prefill path (wgmma_mx.cuh): 32, 64, 96 or 128 tokens per tile
/// (the wgmma N). A tile costs its weight decode whatever its N, and N's tensor time
/// whether its rows hold tokens or padding: small tiles where experts hold few rows, and
/// a tile whose multiple fits the experts' rows where a larger one would take as many
/// tiles, or pad one more. So the tile is the one whose expected count of tiles costs
/// least (kPrefillTileCost): the rows a local expert would hold if every routed pair were
/// local (tokens x top_k / num_local; the device counts are not known on the host), spread
/// as uniform routing spreads them (binomial: variance rows x (1 - top_k / num_local)).
/// Kimi (rows = M x 16 / 28): 32 tokens up to M=54, 64 to 109, 96 to 159, 128 to 230, 96
/// to 332, 128 to 448, 96 to 509, then 128.
/// Measured on the H200 (graph, us, Kimi shapes), session 27, tiles 32 / 64: M=44 240 /
/// 286, M=48 271 / 291, M=52 283 / 292, M=56 317 / 293, M=60 385 / 297; 64 / 96: M=96 334 /
/// 386, M=100 349 / 387, M=104 378 / 389, M=108 386 / 394, M=112 423 / 397; 96 / 128: M=144
/// 408 / 462, M=152 438 / 465, M=156 441 / 466, M=160 497 / 470, M=192 694 / 482, M=208
/// 717 / 515, M=224 728 / 702, M=228 722 / 686 (64: 706), M=232 726 / 766 (64: 755), M=256
/// 739 / 845 (64: 821), M=288 749 / 859, M=320 787 / 867, M=328 858 / 868, M=336 919 /
/// 874, M=384 1080 / 888, M=440 1090 / 1027, M=456 1103 / 1168, M=488 1187 / 1277, M=504
/// 1282 / 1284, M=520 1380 / 1287, M=1024 2425 / 2156. (Until session 27, thresholds on the
/// mean rows: 32, 64, then 128.)
inline constexpr int kPrefillTiles[] = {128, 96, 64, 32};
/// What one tile of each size costs, us of the layer (the order of kPrefillTiles): a
/// least-squares fit (relative error) of session 27's 114 graph times over tiles and M
/// (layer = 43 us + expected tiles x cost), which then picks the fastest tile measured at
/// every M but a tie (M=448: 96 / 128 1107 / 1113).
inline constexpr int kPrefillTileCost[] = {420, 350, 262, 194};
static_assert(std::size(kPrefillTileCost) == std::size(kPrefillTiles), "a cost per tile");
/// Expected tiles of `tile` rows for rows ~ normal(mean, sd): the sum over k of P(rows > k
/// tile), at least one.
inline double pf_expected_tiles(double mean, double sd, int tile) {
  const double sure = std::floor(std::max(mean - 8 * sd, 0.0) / tile);  // P = 1 below
  double tiles = sure;
  for (double edge = sure * tile; edge < mean + 8 * sd; edge += tile)
    tiles += sd > 0 ? 0.5 * std::erfc((edge + 0.5 - mean) / (sd * std::sqrt(2.0))) : 1.0;
  return std::max(tiles, 1.0);
}
inline int prefill_token_tile(int64_t tokens, int64_t top_k, int num_local) {
  const double pairs = static_cast<double>(tokens) * static_cast<double>(top_k);
  const double rows = num_local > 0 ? pairs / num_local : pairs;
  const double spread = num_local > 0 ? std::max(1.0 - static_cast<double>(top_k) / num_local, 0.0) : 1.0;
  const double sd = std::sqrt(rows * spread);
  size_t best = 0;
  double best_cost = 0;
  for (size_t i = 0; i < std::size(kPrefillTiles); ++i) {  // ties keep the larger tile
    const double cost = pf_expected_tiles(rows, sd, kPrefillTiles[i]) * kPrefillTileCost[i];
    if (i == 0 || cost < best_cost) best = i, best_cost = cost;
  }
  return kPrefillTiles[best];
}
/// Split tail of the exact prefill path (wgmma_mx.cuh pf_plan): the last `tiles` tiles of
/// a launch's sequence are each cut into `parts` K ranges of at least kPfMinSplitChunks
/// chunks, one item each, and the last part of a tile to finish adds the others' partial
/// sums in part order (deterministic) before the epilogue. Kimi GEMM1 at M = 16..128: 672
/// tiles and more on 132 SMs, where the last few tiles took a sixth of the kernel. The
/// partial sums live in kPfSplitBytes of the workspace (128 parts of the 128-token tile,
/// 512 of the 32-token one), with one counter per split tile (kPfSplitTiles at most).
inline constexpr size_t kPfSplitBytes = size_t{16} << 20;
inline constexpr int kPfSplitTiles = 256;
inline constexpr int kPfMinSplitChunks = 4;
/// At most this many parts: the last part reads the others' sums one part after another,
/// so beyond a few parts the reads cost what the shorter mainloop saves.
/// GEMM1, ncu us (median of 8) at M = 16 / 32 / 64 / 128, one run (session 16): at most
/// 11 parts (the earlier rule) 171.2 / 178.9 / 239.2 / 346.0, at most 6: 171.1 / 177.6 /
/// 235.6 / 342.9, at most 4: 169.7 / 178.3 / 237.6 / 342.6; no split 182.6 / 192.4 / 254.5
/// / 366.6. A second run, 11 -> 4 parts: GEMM1 170.0 / 177.7 / 236.5 / 343.3 -> 168.9 /
/// 177.4 / 235.6 / 340.2; the layer (graph) M=64 366.9 / 364.2 -> 361.7 / 362.6 us,
/// M=128 520.1 / 521.3 -> 514.8 / 517.0.
inline constexpr int kPfMaxSplitParts = 4;

/// The split tail of a launch: its last `tiles` tiles in `parts` parts each.
struct PfSplit {
  int tiles = 0, parts = 1;
};
/// The split tail for `tiles` tiles of `tok` tokens on `ctas` CTAs, K in `kc_count` 64-K
/// chunks; `claimed`: the CTAs claim their items (prefill_claims). Host and device: the
/// tests check that their cases split.
/// - Dealt (every G-th item to a CTA): the last wave's rem = tiles % G tiles when rem <= G
///   / 2, each in G / rem parts (at most 4): rem x parts CTAs finish it in 1 / parts of a
///   tile. Measured (session 15, graph, same run): M=16 280 -> 265 us, M=32 293 -> 277,
///   M=128 547 -> 524. Cutting a nearly full last wave costs more than it saves: GEMM2 at
///   rem = 128 of 132 tiles, 81 -> 93 us at M=32 (PERFORMANCE.md, session 15).
/// - Claimed: as many parts as allowed, and enough tiles (G / parts) that the CTAs' last
///   round of claims is all parts, so they finish within about a part of each other.
MXMOE_HD PfSplit pf_split(bool claimed, int tiles, int ctas, int kc_count, int tok) {
  int parts = kc_count / kPfMinSplitChunks;
  parts = parts < kPfMaxSplitParts ? parts : kPfMaxSplitParts;
  const int capacity = static_cast<int>(kPfSplitBytes / (256 * sizeof(float) * tok));  // parts
  if (!claimed) {
    const int rem = tiles % ctas;
    if (rem == 0 || rem > kPfSplitTiles) return PfSplit{};
    parts = parts < ctas / rem ? parts : ctas / rem;
    parts = parts < capacity / rem ? parts : capacity / rem;
    return parts >= 2 ? PfSplit{rem, parts} : PfSplit{};
  }
  if (parts < 2 || tiles <= 0) return PfSplit{};
  int split = (ctas + parts - 1) / parts;
  split = split < tiles ? split : tiles;
  split = split < kPfSplitTiles ? split : kPfSplitTiles;
  split = split < capacity / parts ? split : capacity / parts;
  return split > 0 ? PfSplit{split, parts} : PfSplit{};
}

/// CTAs per SM of the exact prefill kernels for `tok`-token tiles (wgmma_mx.cuh
/// PfGeometry). The 32-token tile's consumers wait on the weight decode's issue and
/// dependencies with the tensor pipe mostly idle, and its 13 KB ring stages let a second
/// CTA's warpgroups share each SM (registers: 80 per thread at launch, 32 / 104 after
/// setmaxnreg). Measured on the H200 (session 25, graph, us, mean of three rounds, one
/// CTA / two; M=40 and 56 from run 4, the others run 3): M=16 246.0 / 238.5, M=24 250.1 /
/// 242.5, M=32 255.7 / 246.3, M=40 261.3 / 251.7, M=48 296.1 / 269.9, M=56 354.9 / 339.9;
/// ncu at M=32 (run 3) GEMM2 75.7 / 72.8, GEMM1 163.0 / 161.3.
MXMOE_HD constexpr int prefill_ctas_per_sm(int tok) { return tok == 32 ? 2 : 1; }

/// Whether the exact prefill consumers of `tok`-token tiles decode their weights with
/// fp4x8_to_bf16_times' shared-shift form (mx_mma.cuh: 12 integer ops per word instead of
/// 13; every prefill chunk loop 196 -> 188 SASS instructions). Measured on an H100 against
/// the 13-op form at every tile (session 67, graph, three alternating rounds, medians):
/// M=128 (96-token tile) -1.9%, M=1024 (128) -0.9%, but M=16 / 32 (the 32-token tile,
/// two CTAs per SM) +0.2% / +0.5% with 3% fewer instructions (ncu: GEMM1 at M=32 139.8 ->
/// 142.2 us), so the 32- and 64-token tiles keep the 13-op form.
MXMOE_HD constexpr bool pf_decode_shared_shift(int tok) { return tok >= 96; }

/// Whether GEMM2's `tok`-token tiles take their B rows (contiguous) through the TMA engine
/// (wgmma_mx.cuh pf_producer_tma): the 96- and 128-token tiles. The 32- and 64-token tiles
/// keep the cp.async producer: TMA made gemm2_prefill<32> at M=32 86 -> 109 us (session 14).
MXMOE_HD constexpr bool pf_tma_rows(int tok) { return tok >= 96; }

/// Whether a prefill kernel's CTAs claim their items from a counter (wgmma_mx.cuh
/// pf_claim) instead of taking every G-th: GEMM1 (`gated`) at two CTAs per SM (the
/// 32-token tile). There the CTA resident first on an SM runs a tile in ~41 us and its
/// partner in ~61 (their warps' issue priority), so CTAs dealt equal work end ~40 us
/// apart; claimed, a faster CTA takes more. Measured on the H200 (session 26, run 7, ncu):
/// GEMM1 at M=16 / 32 / 48 157 -> 146, 161 -> 151, 168 -> 172 us (M=48 not understood
/// yet). GEMM2 measured slower claimed (72 -> 85 us at M=32, 139 -> 168 at M=128, one CTA
/// per SM), the cause not found; it keeps the dealt schedule.
MXMOE_HD constexpr bool prefill_claims(bool gated, int tok) { return gated && prefill_ctas_per_sm(tok) > 1; }

/// The FP8 precision mode (config.precision fp8, sm_90a, wgmma_fp8.cuh) from
/// kFp8PrefillMinTokens on; below it the exact paths run (use_prefill).
inline bool use_fp8_prefill(int64_t tokens, bool fp8_mode) {
  return fp8_mode && tokens >= kFp8PrefillMinTokens;
}
/// The FP8 mode's x staging in routed-row order (stage_fp8.cu): scattered (the warps of a
/// token read its row once and write it at each of its top_k routed rows) from 1024 tokens
/// on, else gathered (a warp per routed row reads its token's row). The gathered form
/// waits for a row-map load and then the row's loads, in series, per routed row: 34.6 us
/// at M=1024 on an H100 for 58.7 MB written, 43 MB of it reaching DRAM (~1.2 TB/s; ncu,
/// session 51). Scattered, ncu on an H100 (session 52, us per launch, gathered ->
/// scattered): M=512 20.0 -> 21.3, 768 27.2 -> 32.0, 1024 34.8 -> 30.8, 2048 64.6 -> 52.6,
/// 4096 134.7 -> 110.0 (its 220 MB of stores at ~2 TB/s). Below 1024 it loses: few
/// tokens, split over warps that each write one or two passes at up to top_k rows.
/// `knob`: MXMOE_F8_SCATTER (-1 unset, 0 never, 1 always: a test knob).
inline bool use_scattered_x_staging(int64_t tokens, int knob) {
  return knob >= 0 ? knob == 1 : tokens >= 1024;
}
/// Passes of 4 groups (512 bytes a warp) that a staging warp loads before it stores any
/// (stage_fp8.cu): one batch of loads, one memory latency, per kStageFp8Passes passes.
inline constexpr int kStageFp8Passes = 4;
/// Warps per token of the scattered staging (StageFp8Params::split): as few as take a
/// token's passes in one batch of loads each (Kimi's 3584 columns: 7 passes, 2 warps of 4
/// and 3), and more below 1024 tokens, for at least ~2048 warps in all; at most one per
/// pass. Measured on an H100 (session 53, ncu, us per launch, two launches each; split 2
/// twice): M=1024 split 1 30.3 / 28.9, 2 27.7 / 26.9 and 28.0 / 26.8, 3 29.7 / 28.8, 4
/// 31.9 / 29.9 and 32.8 / 30.9, 7 38.4 / 35.2; M=2048 split 1 56.1 / 54.8, 2 52.3 / 51.0
/// and 54.0 / 51.5, 3 61.0 / 63.9; M=4096 split 1 110.4 / 109.2, 2 107.2 / 106.5, 3
/// 110.1 / 107.3. Until then ~4096 warps were asked for (split 4 at 1024, 1 at 4096).
/// More warps than one batch needs wrote no faster: not explained (each also loads its
/// token's routed rows; the stores per warp are fewer).
/// `knob`: MXMOE_F8_SPLIT (-1 unset; n >= 1 asks for n warps per token, still at most one
/// per pass: a measurement knob).
inline int stage_fp8_split(int64_t tokens, int64_t groups, int knob = -1) {
  const int64_t passes = std::max<int64_t>((groups + 3) / 4, 1);
  const int64_t one_batch = (passes + kStageFp8Passes - 1) / kStageFp8Passes;
  const int64_t want = knob >= 1 ? knob : std::max(one_batch, (2048 + tokens - 1) / std::max<int64_t>(tokens, 1));
  return static_cast<int>(std::clamp<int64_t>(want, 1, passes));
}
/// Bits of the prefill path's per-forward word: an activation row (x, stage_bf16.cu) or
/// an intermediate block (GEMM1's prefill epilogue) held a value that the staged BF16 rows
/// cannot hold exactly, so that GEMM runs on the generic path instead (both kernels are
/// launched; each reads the bit and one exits). kInexactInter also runs the generic
/// GEMM1, which writes the intermediate that GEMM2's generic kernel reads.
inline constexpr uint32_t kInexactX = 1u;
inline constexpr uint32_t kInexactInter = 2u;
/// Bytes of the prefill path's per-forward words in the workspace: that word, then the
/// split-tile counters (pf_split), then the item counter that GEMM1's CTAs claim their
/// items from at two CTAs per SM (prefill_claims, wgmma_mx.cuh pf_claim), so the
/// forward's one memset clears them all. Each kernel also leaves its counters at zero.
inline constexpr size_t kPrefillWordsBytes = sizeof(uint32_t) * (1 + kPfSplitTiles + 1);

/// Programmatic dependent launch on the decode path (sm_90 and later, `device_ok`; the
/// test knob MXMOE_PDL=0 clears it at layer construction): GEMM2's decode kernel (one
/// count class, right after GEMM1's decode kernel) and finalize start their blocks before
/// the previous kernel ends, and wait (griddepcontrol.wait) before touching its results.
/// Only when GEMM2 splits (gemm2_splits, M=1), where its grid exceeds one wave. GEMM1's
/// one-token kernel lets GEMM2 start once all its blocks have begun; GEMM2 lets finalize
/// start after its mainloops. Measured on the H200 (session 8, graph, us, PDL off / on, 3
/// rounds): M=1 116.5 / 114.4; M=2 156.7 / 165.2 (GEMM2's 392 blocks fit one wave, and
/// started early they crowd the SMs GEMM1 frees first instead of spreading); M=4, 8, 12
/// equal. (With the trigger at block start, at M=2..8 the early blocks waited beside
/// GEMM1's running ones: +20 us.) At M=1 GEMM1's blocks fill every slot, so GEMM2's
/// blocks only take the slots of GEMM1's first blocks to finish: triggered at GEMM1's
/// block start instead of after its mainloop, M=1 111.9 -> 111.2 us (session 28, run 3,
/// two rounds), -0.8 us beside use_programmatic_gemm1 too.
/// Also whenever GEMM2 waits on the expert-ready counters (use_expert_ready): its blocks
/// then start work on the experts GEMM1 has finished while GEMM1's last blocks run.
inline bool use_programmatic_launch(bool device_ok, int gemm2_splits, bool expert_ready = false) {
  return device_ok && (gemm2_splits > 1 || expert_ready);
}

/// Most routed pairs for which GEMM1's one-token decode kernel reads the routing ids to
/// find its expert before the prologue ends (one id per lane of a warp).
inline constexpr int64_t kG1HintMaxPairs = 32;
/// GEMM1 on the decode path as a programmatic dependent of the permutation's prologue
/// (Gemm1Params::programmatic): its blocks start beside the one-block prologue instead of
/// after it, and those whose expert a routing id names move their first weight chunks
/// toward L2 before they wait. Only the one-token kernel (not the balanced one, `pairs` <=
/// kG1HintMaxPairs). Measured on the H200 (session 28, run 3, graph, two rounds, us):
/// M=1 112.4 / 111.9 -> 110.2 / 109.7. The balanced kernel (M=2..15) launched the same way
/// without the hint (its units depend on the counts): M=8 -1.8 us, M=12 +2.5, the others
/// within 0.6.
inline bool use_programmatic_gemm1(bool device_ok, bool balanced, int64_t pairs) {
  return device_ok && !balanced && pairs <= kG1HintMaxPairs;
}

/// Expert-ready counters on the decode path (Gemm1Params / Gemm2Params::expert_ready; one
/// u32 per local expert, cleared by the permutation each forward). Each GEMM1 warp, once
/// its row group of a token tile is stored, adds the tile's 8-row tiles to its expert's
/// counter (a release); GEMM2's blocks wait for their own expert's counter to reach
/// expert_ready_target (an acquire) instead of for all of GEMM1 (griddepcontrol.wait).
/// GEMM2 then streams the weights of the experts GEMM1 has finished while GEMM1's last
/// blocks still run: at M=1 GEMM1's blocks end between 58 and 69 us and GEMM2's waited
/// for the last (session 28's timeline).
/// Only with programmatic launches (before them GEMM2 starts after GEMM1 anyway), and only
/// when both GEMMs run their decode kernels: the generic kernels do not count, and GEMM2
/// would wait forever. `mode` is the test knob MXMOE_READY (0 off, 1 one token, 2 every
/// decode size, the default). Measured on the H200 (session 30, graph, two rounds, us):
/// M=1 103.3 / 104.3 -> 100.4 / 101.1 (run 1). At 2..15 tokens GEMM2 then also starts
/// beside GEMM1 (the balanced kernel lets it at once), and alone that lost 3-12 us at
/// M=2..8: GEMM2's 392 blocks (0.6 wave) crowded the SMs that GEMM1 freed first. With
/// at most 3 of its blocks per SM (kGemm2ReadyBlocksPerSm) or 2 splits they spread,
/// and every size from 2 to 15 tokens gained against the grid-wide wait (runs 2 and 3):
/// M=2 147.3 -> 142.8, M=4 160.5 -> 150.0 (split), M=8 169.7 -> 165.3, M=9 188.8 -> 165.2,
/// M=12 200.2 -> 189.0, M=15 222.4 -> 211.8.
enum class ReadyMode : int { kOff = 0, kOneToken = 1, kDecode = 2 };
inline bool use_expert_ready(ReadyMode mode, bool device_ok, int64_t tokens, bool gemm1_decode,
                             bool gemm2_decode) {
  if (!device_ok || !gemm1_decode || !gemm2_decode) return false;
  return mode == ReadyMode::kDecode || (mode == ReadyMode::kOneToken && tokens == 1);
}
/// GEMM2's unsplit decode grid under the expert-ready counters at 2..32 tokens: at most
/// this many of its blocks per SM (5 fit), so that the blocks starting beside GEMM1
/// spread over the SMs instead of filling the first ones GEMM1 frees. Measured (session
/// 30, runs 2, 3 and 5, graph, two rounds): 3 per SM gained at every size from 2 to 15
/// tokens against 5 (unpadded); 4 per SM lost 8-11 us against 3 at M=2, 8 and 9 (gained
/// 5 at M=12), whatever the carveout; 3 with 72 KB instead of the smallest padding (a
/// block then needs two of GEMM1's five blocks gone) lost 7-25 us at M=10..15. At M=1
/// (split, 896 blocks) 3 per SM lost 3.6% and 4 changed nothing, so it is not capped.
inline constexpr int kGemm2ReadyBlocksPerSm = 3;
inline bool gemm2_ready_capped(int64_t tokens, int splits, bool expert_ready) {
  return expert_ready && tokens > 1 && splits == 1;
}
/// Dynamic shared memory per block of at least `dyn` bytes with which at most `blocks`
/// blocks fit on an SM of `sm_bytes` (each block also takes `fixed` bytes: its static
/// shared memory and the driver's reserve): the smallest multiple of 128 with which
/// `blocks` + 1 do not fit, so that a block needs as little free memory as it can.
inline size_t smem_for_blocks_per_sm(size_t dyn, size_t fixed, size_t sm_bytes, int blocks) {
  const size_t per_block = sm_bytes / static_cast<size_t>(blocks + 1) + 1;
  const size_t need = per_block > fixed ? (per_block - fixed + 127) / 128 * 128 : 0;
  return need > dyn ? need : dyn;
}

/// The count GEMM1 leaves in an expert's ready counter once all of its `rows` are stored:
/// every one of the `row_groups` (GEMM1's 64-row groups of W13) over every 8-row tile.
MXMOE_HD uint32_t expert_ready_target(int row_groups, int rows) {
  return static_cast<uint32_t>(row_groups) * static_cast<uint32_t>((rows + 7) / 8);
}

/// Single-block permutation (one launch, fused with the activation quantization) when
/// the routed pairs fit one block and the per-warp expert histogram fits shared memory.
inline constexpr int64_t kSmallPermutePairs = 512;
inline constexpr int kSmallPermuteExperts = 64;
inline bool small_permute(int64_t pairs, int num_local) {
  return pairs <= kSmallPermutePairs && num_local <= kSmallPermuteExperts;
}

/// The block form of the permutation (permute.cu permute_block_kernel) for problems past
/// the small form's: blocks of kBlockPermuteThreads threads, each walking its segment of
/// the pairs in `steps` steps of that many, with a 16-bit count per (step, warp, local
/// expert), the expert map and the segment's routed rows in shared memory. One block
/// needs no grid-wide wait; several publish their experts' counts, wait for each other
/// (a cooperative launch: every block co-resident) and read the others' counts back.
/// Why not one block for everything: it is issue-bound on its one SM, 7.5 us at 2048
/// pairs, then ~1.15 us per 1024 more (13.7 at 8192, 23.4 at 16384; H100, session 54),
/// while the two-kernel form below takes ~11-12 us from 2048 pairs to 16384 (two
/// launches, their dependent L2 loads, 112 SMs), about flat. Several blocks of one step
/// each (H100, ncu, session 55): 8.6-9.0 us at 16384 pairs and 12.7-13.0 at 65536,
/// against the two kernels' 12-13 and 22-23; one block 7.4-7.8 us at 3 steps against a
/// grid's 8.0-8.6, 8.5-8.9 at 4 against 8.2-8.4.
inline constexpr int kBlockPermuteThreads = 1024;
inline constexpr int kBlockPermuteMaxSteps = 4;
inline constexpr int64_t kBlockPermutePairs = kBlockPermuteMaxSteps * kBlockPermuteThreads;  // per block
inline constexpr int64_t kBlockPermuteMaxExperts = 4096;  // the map, a byte per global id
/// One block (no wait) up to this many steps (Kimi top-16: 33 to 192 tokens); past it
/// several blocks.
inline constexpr int kBlockPermuteOneBlockSteps = 3;
/// Dynamic shared memory of one block of `steps` steps: the counts ([steps][32 warps]
/// [E_local], 16-bit), each routed row's pair (32-bit, up to one row per pair of the
/// segment) and the map. At most 36 KB, under the 48 KB default.
inline int64_t block_permute_smem_bytes(int steps, int num_local, int64_t num_experts) {
  return int64_t{steps} * (kBlockPermuteThreads / 32) * num_local * 2 + int64_t{steps} * kBlockPermuteThreads * 4 +
         (num_experts + 15) / 16 * 16;
}
static_assert(kBlockPermuteMaxSteps * (kBlockPermuteThreads / 32) * kSmallPermuteExperts * 2 +
                      kBlockPermutePairs * 4 + kBlockPermuteMaxExperts + 2048 <= kDefaultSmemBytes,
              "the block permutation's shared memory (and ~1 KB of static) fits the default 48 KB");
/// The most blocks of a grid: the largest measured (64 blocks of one step, 12.7-13.0 us
/// at 65536 pairs on an H100, session 55, already ~4 us over 16 blocks' 8.7 with the same
/// work per block: latency-bound, each block reading every block's counts back after the
/// wait, a cost that grows with the grid). Past it, more steps per block (~0.9 us each in
/// one block): 64 blocks of 4 steps take Kimi-K3 to 16384 tokens.
inline constexpr int64_t kBlockPermuteMaxBlocks = 64;
/// `blocks` blocks of `steps` steps each; blocks == 0: not this form.
struct BlockPermutePlan {
  int64_t blocks = 0;
  int steps = 0;
};
/// The block form for `pairs` routed pairs: past the small form, up to 64 local experts
/// and 4096 global ones. One block while it takes at most `one_block_steps` steps, else
/// the fewest steps per block (at least `min_grid_steps`) whose blocks all fit
/// `coresident` (the kernel's blocks per SM times the SMs) and kBlockPermuteMaxBlocks;
/// none fitting: the two kernels.
inline BlockPermutePlan block_permute_plan(int64_t pairs, int num_local, int64_t num_experts,
                                           int64_t coresident,
                                           int one_block_steps = kBlockPermuteOneBlockSteps,
                                           int min_grid_steps = 1,
                                           int64_t max_blocks = kBlockPermuteMaxBlocks) {
  if (small_permute(pairs, num_local) || num_local > kSmallPermuteExperts ||
      num_experts > kBlockPermuteMaxExperts)
    return {};
  const int64_t steps = (pairs + kBlockPermuteThreads - 1) / kBlockPermuteThreads;
  if (steps <= one_block_steps) return {1, static_cast<int>(steps)};
  const int64_t most = coresident < max_blocks ? coresident : max_blocks;
  for (int s = min_grid_steps < 1 ? 1 : min_grid_steps; s <= kBlockPermuteMaxSteps; ++s) {
    const int64_t blocks = (steps + s - 1) / s;
    if (blocks <= most) return {blocks, s};
  }
  return {};
}

/// The two-kernel permutation splits the pairs into segments, one block per (local
/// expert, segment): a block walks its segment in steps of 8192 pairs (permute.cu), each
/// step two dependent L2 loads per thread, so one block per expert over all of M = 4096's
/// 65536 pairs took 8 steps (23 + 30 us for the two kernels, PERFORMANCE.md session 40).
/// Segments of at most kPermuteSegmentPairs pairs while there are at most
/// kPermuteMaxSegments of them (28 experts x 16 = 448 blocks of 512 threads: one wave at
/// 4 blocks per SM on 132 SMs), longer past that.
inline constexpr int64_t kPermuteSegmentPairs = 4096;
inline constexpr int kPermuteMaxSegments = 16;
/// Pairs per segment: the pairs over as many segments as they need, up to a multiple of
/// 512 (a warp's 32 runs of 16), so that no run straddles two segments.
MXMOE_HD int64_t permute_segment_length(int64_t pairs) {
  if (pairs <= 0) return 512;
  int64_t s = (pairs + kPermuteSegmentPairs - 1) / kPermuteSegmentPairs;
  s = s > kPermuteMaxSegments ? kPermuteMaxSegments : s;
  return ((pairs + s - 1) / s + 511) / 512 * 512;
}
/// Segments of permute_segment_length: every one holds at least one pair.
MXMOE_HD int permute_segments(int64_t pairs) {
  const int64_t len = permute_segment_length(pairs);
  const int64_t s = (pairs + len - 1) / len;
  return static_cast<int>(s < 1 ? 1 : s);
}
/// Words of the segments' scratch (PermuteParams.seg): [segments][E_local] counts, then
/// [segments] bad-id flags; segments of the two kernels or blocks of the block form, at
/// most one per kBlockPermuteThreads pairs.
inline int64_t permute_seg_words(int64_t pairs, int num_local) {
  const int64_t blocks = (pairs + kBlockPermuteThreads - 1) / kBlockPermuteThreads;
  const int64_t segments = permute_segments(pairs);
  return (blocks > segments ? blocks : segments) * (num_local + 1);
}

}  // namespace mxmoe::cuda_detail
