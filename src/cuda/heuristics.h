// heuristics.h — which GEMM path and token tile the engine uses for a shape. Kept in one
// place so the choice is visible and tunable without touching the kernels.
//
// Decode path ("fast"): the activation operand is MXFP8 (E4M3 codes, exact in FP16), the
// tokens of one expert fit one warp tile of at most 32 rows, and the weights are the MMA's
// large dimension. It uses FP16 MMAs (weights dequantized straight into FP16 bit fields,
// see mx_mma.cuh), a deep register prefetch ring, and per-block shared-memory scales.
// Otherwise the generic BF16 path (any activation format, any number of rows).
#pragma once

#include <algorithm>
#include <cstdint>

namespace mxmoe::cuda_detail {

/// Largest token count routed to the decode path.
inline constexpr int64_t kDecodeMaxTokens = 32;
/// Shared memory of one decode block (bytes): its B scales plus its warps' weight rings
/// must fit. Above 48 KB the launcher opts the kernel in (cudaFuncSetAttribute).
inline constexpr int64_t kFastMaxSmemBytes = 96 * 1024;
inline constexpr int64_t kDefaultSmemBytes = 48 * 1024;
/// Bytes of one weight-ring stage (one warp's 64-K chunk: 4 x 512 weight bytes and 8
/// scale words; see FastRing in mx_mma.cuh) and the decode kernels' warps per block.
inline constexpr int kFastStageBytes = 4 * 32 * 16 + 8 * 16;
inline constexpr int kFastWarps = 4;

struct GemmPlan {
  bool fast = false;  // decode path (FP16 MMA on E4M3 operands)
  int nt = 1;         // 8-token MMA tiles per warp (token tile = 8 * nt rows)
  int depth = 4;      // ring stages per warp (fast path): depth - 1 64-K chunks in flight
};

/// Ring stages per warp and blocks per SM (__launch_bounds__) of the decode kernels.
/// With the shared-memory rings a warp holds no registers for chunks in flight, so the
/// register budget sets how many warps (and chunks) an SM keeps in flight; these compile
/// without spills (ptxas -v). Measured on the H200 (mxmoe bench, graph): at M=1 (16
/// experts, one wave of 2.9 blocks per SM) 8 stages at 3 blocks/SM beat 4 stages at 5
/// (153 vs 176 us); at M=2..8 (all 28 experts, 5 blocks/SM filled) 4 stages at 5 win
/// (196 vs 223 us at M=2; equal at M=8).
constexpr int fast_depth(int nt, int64_t tokens) {
  return nt == 1 ? (tokens <= 1 ? 8 : 4) : nt == 2 ? 4 : 3;
}
constexpr int fast_min_blocks(int nt, int depth) {
  return nt == 1 ? (depth >= 8 ? 3 : 5) : nt == 2 ? 4 : 2;
}

/// Rows per expert are at most `tokens` unless a token repeats an expert (then the
/// kernels loop over extra tiles), so the tile is sized from the token count: one MMA
/// tile per 8 tokens, which keeps the weights streamed exactly once per expert.
inline GemmPlan plan_gemm(int64_t tokens, bool operand_fp8, int64_t kb_count) {
  GemmPlan g;
  if (operand_fp8 && tokens <= kDecodeMaxTokens) {
    g.nt = tokens <= 8 ? 1 : tokens <= 16 ? 2 : 4;
    g.depth = fast_depth(g.nt, tokens);
    // The block's B scales and its warps' rings live in dynamic shared memory.
    g.fast = kb_count * 8 * g.nt * 4 + int64_t{kFastWarps} * g.depth * kFastStageBytes <= kFastMaxSmemBytes;
    if (g.fast) return g;
  }
  g.nt = tokens <= 8 ? 1 : 4;
  g.depth = 2;
  return g;
}

/// GEMM2 on the decode path splits its reduction (N, whole 64-K chunks) over grid z so
/// more warps stream weights at few tokens (at M=1 the unsplit grid has 6.8 warps per
/// SM). Split s writes its fp32 partial (before the range factor) to its own copy of y;
/// finalize sums the copies in split order, then applies the row's range factor, so
/// results are deterministic. Not with a GEMM2 bias (it must follow the factor).
inline constexpr int kGemm2MaxSplits = 4;
/// Measured on the H200 (test_engine DISABLED_Timing, Kimi shapes): M=1 (16 experts, 224
/// blocks for 396 resident slots) 64.9 us unsplit / 67.6 (2) / 60.8 (4); M=8 (28
/// experts, ~1 wave unsplit) 73.7 / 77.9 / 84.7; M=32 (NT=4, 2 blocks per SM, 1.5
/// waves unsplit) 321 / 256 / 297.
inline int gemm2_splits(int64_t tokens, const GemmPlan& g2, bool has_bias) {
  if (!g2.fast || has_bias) return 1;
  if (tokens <= 1) return 4;
  return g2.nt == 4 ? 2 : 1;
}
/// Rows of GEMM2's fp32 output per top-k slot: room for every split's copy, and
/// non-decreasing in `tokens` (workspace_size(max) must cover every M <= max).
inline int64_t gemm2_y_rows(int64_t tokens, bool splittable) {
  if (!splittable) return tokens;
  return std::max<int64_t>(tokens, kGemm2MaxSplits * std::min<int64_t>(tokens, kDecodeMaxTokens));
}

/// Single-block permutation (one launch, fused with the activation quantization) when
/// the routed pairs fit one block and the per-warp expert histogram fits shared memory.
inline constexpr int64_t kSmallPermutePairs = 512;
inline constexpr int kSmallPermuteExperts = 64;
inline bool small_permute(int64_t pairs, int num_local) {
  return pairs <= kSmallPermutePairs && num_local <= kSmallPermuteExperts;
}

}  // namespace mxmoe::cuda_detail
