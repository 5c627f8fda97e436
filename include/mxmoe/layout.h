// mxmoe/layout.h — checkpoint layouts of GEMM1's weight and the library's kernel layout
// (SPEC §5).
//
// Kernel layout of W13 [2N][K]: rows come in groups of 2*kGateUpChunk = 64; group j
// holds the gate rows of intermediate columns [32j, 32j+32) followed by the up rows of
// the same columns:
//     kernel row 64j + i      = gate row 32j + i     (i < 32)
//     kernel row 64j + 32 + i = up   row 32j + i
// So a GEMM1 output tile of 64 rows yields 32 whole intermediate columns: the gated
// activation and the MXFP8 requantization (one 32-block) fuse into the epilogue with
// only N values per token written. N must be a multiple of 32 (it is for every MX
// checkpoint). W2 [K][N] keeps the checkpoint's row-major order. Packed nibbles and
// scales stay row-major (K contiguous) in both; faster paths may re-tile at load time.
#pragma once

#include <cstdint>
#include <vector>

#include "mxmoe/moe.h"

namespace mxmoe {

inline constexpr int64_t kGateUpChunk = 32;

/// How a checkpoint stores GEMM1's 2N rows.
enum class W13Layout : int {
  GateUp = 0,       // Kimi-K3: w1 (gate) rows then w3 (up) rows, separate halves
  Interleaved = 1,  // GPT-OSS: [g0, u0, g1, u1, ...]
  UpGate = 2,       // FlashInfer / TensorRT-LLM "w31": [up; gate]
};
const char* to_string(W13Layout l);

int64_t kernel_row_of_gate(int64_t n);
int64_t kernel_row_of_up(int64_t n);
/// Row of the source (checkpoint) matrix that lands at kernel row `kernel_row`.
int64_t source_row_of_kernel_row(W13Layout layout, int64_t intermediate, int64_t kernel_row);

/// One MXFP4 matrix [rows][cols]: packed [rows][cols/2], scale [rows][cols/32].
struct MxMatrix {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> packed, scale;
  void validate(const char* argument) const;
};

/// One expert as a checkpoint stores it: W13 [2N][K] in `layout` row order, W2 [K][N],
/// optional biases (w13_bias in the same row order as W13).
struct SourceExpert {
  MxMatrix w13, w2;
  std::vector<float> w13_bias, w2_bias;
};

/// Convert experts from a checkpoint layout into the kernel layout (bit-exact permutation
/// of rows; nothing is requantized). Throws InvalidArgument on inconsistent shapes.
ExpertWeights to_kernel_layout(const std::vector<SourceExpert>& experts, W13Layout layout);
/// The inverse: kernel layout back into a checkpoint layout.
std::vector<SourceExpert> from_kernel_layout(const ExpertWeights& weights, W13Layout layout);

/// Permute a float matrix's rows [2N][cols] from `layout` into kernel order (used for
/// BF16/float originals, e.g. the ideal reference).
std::vector<float> rows_to_kernel_layout(const std::vector<float>& src, W13Layout layout,
                                         int64_t intermediate, int64_t cols);

}  // namespace mxmoe
