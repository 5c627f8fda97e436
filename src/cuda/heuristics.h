// heuristics.h — which GEMM path and token tile the engine uses for a shape. Kept in one
// place so the choice is visible and tunable without touching the kernels.
//
// Decode path ("fast"): the activation operand is MXFP8 (E4M3 codes, exact in FP16), the
// tokens of one expert fit one warp tile of at most 32 rows, and the weights are the MMA's
// large dimension. It uses FP16 MMAs (weights dequantized straight into FP16 bit fields,
// see mx_mma.cuh), a deep register prefetch ring, and per-block shared-memory scales.
// Otherwise the generic BF16 path (any activation format, any number of rows).
#pragma once

#include <cstdint>

namespace mxmoe::cuda_detail {

/// Largest token count routed to the decode path.
inline constexpr int64_t kDecodeMaxTokens = 32;
/// Shared-memory budget of the decode path's per-block B scales (bytes).
inline constexpr int64_t kFastMaxScaleBytes = 40 * 1024;

struct GemmPlan {
  bool fast = false;  // decode path (FP16 MMA on E4M3 operands)
  int nt = 1;         // 8-token MMA tiles per warp (token tile = 8 * nt rows)
  int depth = 4;      // 64-K chunks of weights in flight per warp (fast path)
};

/// Rows per expert are at most `tokens` unless a token repeats an expert (then the
/// kernels loop over extra tiles), so the tile is sized from the token count: one MMA
/// tile per 8 tokens, which keeps the weights streamed exactly once per expert.
inline GemmPlan plan_gemm(int64_t tokens, bool operand_fp8, int64_t kb_count) {
  GemmPlan g;
  if (operand_fp8 && tokens <= kDecodeMaxTokens) {
    g.nt = tokens <= 8 ? 1 : tokens <= 16 ? 2 : 4;
    g.depth = g.nt == 1 ? 4 : g.nt == 2 ? 3 : 2;  // registers: 20 per chunk in flight + 16 * nt
    // accumulators; these depths compile without spills (ptxas -v)
    // The block's B scales live in (default-limit) dynamic shared memory.
    g.fast = kb_count * 8 * g.nt * 4 <= kFastMaxScaleBytes;
    if (g.fast) return g;
  }
  g.nt = tokens <= 8 ? 1 : 4;
  g.depth = 2;
  return g;
}

/// Single-block permutation (one launch, fused with the activation quantization) when
/// the routed pairs fit one block and the per-warp expert histogram fits shared memory.
inline constexpr int64_t kSmallPermutePairs = 512;
inline constexpr int kSmallPermuteExperts = 64;
inline bool small_permute(int64_t pairs, int num_local) {
  return pairs <= kSmallPermutePairs && num_local <= kSmallPermuteExperts;
}

}  // namespace mxmoe::cuda_detail
