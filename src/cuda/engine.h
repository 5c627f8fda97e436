// engine.h — the CUDA engine's internals shared by the stage files, the layer and the
// GPU tests: the tiled weight layout, the one workspace layout, and one launcher per
// stage. Launchers enqueue on the given stream, check the launch, and never sync.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mxmoe/moe.h"
#include "mxmoe/routing.h"

namespace mxmoe::cuda_detail {

// ---------------------------------------------------------------- tiled MXFP4 weights
//
// Each warp owns 64 weight rows (4 MMA m16 tiles) and streams them along K in chunks of
// 64 (two MX blocks). Inside one MX block the K order of the MMA is permuted (the same
// way for both operands, so the dot product is unchanged): lane (g = lane/4, t = lane%4)
// takes the 8 consecutive elements [8t, 8t+8) of the block, i.e. the packed bytes
// [4t, 4t+4) of its rows g and g+8, and 16 contiguous activation bytes (bf16) or 8
// (e4m3) of its token. So one 16-byte load per lane per (m16 tile, 64-K chunk) feeds 4
// MMAs and every warp load is 512 contiguous bytes:
//
//   packed u32 [E][RG][KC][mt 4][lane 32][4] = { w(g, blk 2kc), w(g+8, 2kc),
//                                              w(g, 2kc+1), w(g+8, 2kc+1) }
//   scale  u32 [E][RG][KC][g 8][mt 4]        = bytes { s(g,2kc), s(g+8,2kc),
//                                                      s(g,2kc+1), s(g+8,2kc+1) }
// (row r = 64*rg + 16*mt + g; w(r, b) = the 8 codes of packed bytes [16b + 4t, +4) of
// row r, bit-scattered for a cheap FP16 decode: pair p = elements {2p, 2p+1} keeps its
// magnitude bits at {9, 6, 0, 3}[p] (+16 for the odd element) and its sign bit at
// {15, 12, 13, 14}[p] (+16); see fp4x8_to_f16 in mx_mma.cuh. A lane's four scale words
// of one chunk are one 16-byte load.)
// Rows are padded to a multiple of 64 and K to a multiple of 64 with code 0 and scale
// byte 127 (1.0): padding contributes exact zeros and never NaN; the kernels also skip
// MX blocks past K, so activation padding is never read.
inline constexpr int kRowsPerWarp = 64;
inline constexpr int kKChunk = 64;
inline constexpr int kWarps = 4;  // warps per GEMM block, one 64-row group each

struct TiledDims {
  int64_t rows = 0, cols = 0, rg = 0, kc = 0;
  int64_t u32_per_expert() const { return rg * kc * 4 * 32 * 4; }
  int64_t scale_u32_per_expert() const { return rg * kc * 4 * 8; }
};
TiledDims tiled_dims(int64_t rows, int64_t cols);
/// Row-major MXFP4 [experts][rows][cols/2] + [experts][rows][cols/32] -> tiled layout.
void tile_mxfp4(const uint8_t* packed, const uint8_t* scale, int64_t experts, int64_t rows,
                int64_t cols, std::vector<uint32_t>& tiled_packed,
                std::vector<uint32_t>& tiled_scale);

struct MatView {
  const uint4* packed = nullptr;    // [E][RG][KC][4][32] uint4
  const uint32_t* scale = nullptr;  // [E][RG][KC][4][8]
  int rows = 0, cols = 0, rg = 0, kc = 0;
  /// [E][RG] 1 where the row group holds a scale byte 0x00 or 0xFF (special_scale_groups);
  /// null: treat every group as special (the exact, slower conversion).
  const uint8_t* special = nullptr;
};
/// Per (expert, 64-row group): 1 if any real scale byte of the group is 0x00 (2^-127) or
/// 0xFF (NaN), which the decode path's two-op E8M0 conversion cannot represent.
std::vector<uint8_t> special_scale_groups(const uint8_t* scale, int64_t experts, int64_t rows,
                                          int64_t cols);

// ---------------------------------------------------------------- FP8-mode weights
//
// The FP8 precision mode (fp8_mode.h, wgmma_fp8.cuh) streams weights as E4M3 codes with
// one fp32 power-of-two scale per row and 128-K group, made at load time:
//   codes [E][rows_p][cols_p] u8 (row-major, K contiguous, zero-padded)
//   scale [E][groups][rows_p] f32 (a group's 128 consecutive rows are one 512-byte copy)
// or, in the row form (fp8_mode.h; where every row's scale spread fits it), one scale per
// row for all of K, relative to the matrix's largest row exponent row_exp_ref:
//   scale [E][rows_p] f32 = 2^(row_exp - row_exp_ref)
// rows_p = rows rounded up to kF8Rows (the kernel's row block), cols_p = groups * 128.
// W13 rows are reordered (`gate_up`) so that each 16 rows hold the gate rows of 8
// intermediate columns followed by their up rows: a wgmma accumulator thread then holds
// the gate and the up value of one column (rows g and g + 8) and the activation needs
// no exchange. fp8_row 64j + 16w + r = kernel row 64j + 8w + r (r < 8, gate) or
// 64j + 32 + 8w + r - 8 (up).
inline constexpr int kF8Rows = 128;
struct Fp8Dims {
  int64_t rows = 0, rows_p = 0, cols = 0, cols_p = 0, groups = 0;
  bool row_form = false;  // fp8_weights' choice
  int row_exp_ref = 0;    // row form: the largest row exponent (StageFp8Params.scale_shift)
};
/// Which form fp8_weights makes: the row form where it fits (kAuto), or one of them.
enum class Fp8FormChoice { kAuto, kGroup, kRow };
Fp8Dims fp8_dims(int64_t rows, int64_t cols);
/// Kernel-layout row held at FP8 row `r` (identity unless gate_up).
int64_t fp8_source_row(int64_t r, bool gate_up);
/// Row-major MXFP4 (kernel layout) -> the FP8-mode layout above, exact, with the form
/// taken in the returned dims. Throws InvalidArgument(argument) naming the expert, row and
/// group when the weights fit neither form (a group's spread beyond
/// fp8mode::kMaxWeightSpread and a row's beyond kMaxRowSpread), Unsupported when kRow is
/// asked for and does not fit.
Fp8Dims fp8_weights(const uint8_t* packed, const uint8_t* scale, int64_t experts, int64_t rows,
                    int64_t cols, bool gate_up, Fp8FormChoice choice, const char* argument,
                    std::vector<uint8_t>& codes, std::vector<float>& scales);
/// Throw Error unless this binary's FP8-mode GEMM1 / GEMM2 kernel can run its register
/// split (wgmma_fp8.cuh f8_check_registers); the layer calls both once when it is built.
void check_gemm1_fp8_kernel();
void check_gemm2_fp8_kernel();
/// The same for the exact prefill path's GEMM1 / GEMM2 kernels, every token tile
/// (wgmma_mx.cuh pf_check_registers); the layer calls both when it takes that path.
void check_gemm1_prefill_kernels();
void check_gemm2_prefill_kernels();
/// Local memory per thread (bytes: spills and stack frame) of the most demanding of the
/// decode kernels that launch_gemm1 / launch_gemm2 can pick, every class, activation and
/// intermediate format; for tests (issue 4: no spills in the hot kernels).
size_t gemm1_decode_local_bytes();
size_t gemm2_decode_local_bytes();
/// The same for the exact prefill path's kernels, every token tile: GEMM1's of activation
/// kind `kind` (am::with_activation_kind's values) in both intermediate formats, GEMM2's.
size_t gemm1_prefill_local_bytes(int kind);
size_t gemm2_prefill_local_bytes();
struct Fp8MatView {
  const uint8_t* codes = nullptr;
  const float* scale = nullptr;  // per row and group, or per row (row_scale)
  int rows = 0, rows_p = 0, cols_p = 0, groups = 0;
  bool row_scale = false;        // the row form (Fp8Dims::row_form)
};

// ---------------------------------------------------------------- workspace
/// Where each buffer of one forward lives inside the caller's workspace. Sized and
/// carved by this one function from (config, tokens), so workspace_size() and
/// forward() cannot drift. Offsets are 256-byte aligned.
struct WorkspaceLayout {
  size_t error = 0;        // u32 error flags (bit 0: expert id out of range)
  size_t ids = 0;          // i32 [M][k] topk ids (GPU routing only)
  size_t weights = 0;      // f32 [M][k] topk weights (GPU routing only)
  size_t counts = 0;       // i32 [E_local] rows per local expert
  size_t offsets = 0;      // i32 [E_local+1] exclusive scan of counts
  size_t row_map = 0;      // i32 [M*k] routed row -> pair index (token*k + slot)
  size_t pair_row = 0;     // i32 [M*k] pair -> routed row or -1
  size_t permute_seg = 0;  // i32, heuristics.h permute_seg_words: the permutation's segments
  size_t xq = 0;           // u8 [M][K] e4m3 codes (BF16 x into an MXFP8 layer)
  size_t xq_scale = 0;     // u8 [M][K/32]
  size_t inter = 0;        // [M*k][N] e4m3 codes or bf16 (the exact prefill path: ib instead)
  size_t inter_scale = 0;  // u8 [M*k][N/32] (MXFP8 intermediate)
  size_t y = 0;            // f32 [splits][M*k][K] GEMM2 result (or split partials) per routed row; the FP8 mode
                           // writes BF16 [M*k][K] in its first half (Gemm2Params::y_bf16)
  size_t back = 0;         // f32 [M*k] range factor per routed row (split GEMM2)
  // prefill path (tokens >= kPrefillMinTokens; in FP8 mode below kFp8PrefillMinTokens only;
  // empty otherwise)
  size_t inexact = 0;      // u32 kInexactX | kInexactInter, then u32 [kPfSplitTiles]
                           // split-tile counters (heuristics.h kPrefillWordsBytes)
  size_t split_acc = 0;    // f32, kPfSplitBytes: split tiles' partial sums
  // balanced decode GEMM1 (heuristics.h use_balanced, MXFP8 x; empty otherwise)
  bool balanced = false;      // the decode path runs it at this size (the two buffers below
                              // exist; from kPrefillMinTokens beside the prefill path's, for
                              // devices or weights without that path)
  size_t balanced_count = 0;  // u32 [kBalancedSlots], cleared by the permutation (right
                              // after expert_ready, so one range clears both)
  size_t balanced_acc = 0;    // f32, kBalancedAccBytes: cut row groups' partial sums
  size_t expert_ready = 0;  // u32 [E_local] decode path's per-expert counters
                           // (heuristics.h use_expert_ready), cleared by the permutation
  size_t xb = 0;           // bf16 [M][Kp] staged x
  size_t xb_back = 0;      // f32 [M]
  size_t ib = 0;           // bf16 [M*k][Np] staged intermediate (range factor 1)
  // FP8 mode (config.precision fp8, tokens >= kFp8PrefillMinTokens; empty otherwise)
  size_t xf = 0;           // u8 [M*k][Kp] x re-expressed (stage_fp8.cu) in routed-row
                           // order, Kp = K up to 128; inside y's range where it fits
                           // (GEMM2 writes y after GEMM1 has read it)
  size_t xf_scale = 0;     // f32 [Kp/128][fp8_scale_rows(M*k)], after xf
  size_t if8 = 0;          // u8 [M*k][Np] the intermediate re-expressed
  size_t if8_scale = 0;    // f32 [Np/128][fp8_scale_rows(M*k)]
  int gemm2_splits = 1;
  size_t total = 0;
  static WorkspaceLayout make(const MoeConfig& cfg, int64_t tokens);
};
inline constexpr uint32_t kErrorIdOutOfRange = 1u;

// ---------------------------------------------------------------- stages
struct RouteParams {
  const float* logits = nullptr;         // [M][E] fp32, or
  const uint16_t* logits_bf16 = nullptr; // [M][E] bf16 bits (exactly one of the two)
  const float* bias = nullptr;    // [E] or null
  int64_t tokens = 0, num_experts = 0;
  RoutingParams params;
  int32_t* ids = nullptr;
  float* weights = nullptr;
};
/// Largest E the register-resident routing kernel holds (32 experts per lane).
inline constexpr int64_t kMaxRouteExperts = 1024;
inline constexpr int64_t kMaxRouteTopK = 32;
void launch_route(const RouteParams& p, cudaStream_t stream);

void launch_quantize_x(const uint16_t* x, int64_t tokens, int64_t hidden, ScaleRule rule,
                       uint8_t* codes, uint8_t* scales, cudaStream_t stream);

struct PermuteParams {
  const int32_t* ids = nullptr;         // [M][k] global ids
  const int32_t* expert_map = nullptr;  // [E_global] -> local or -1
  int64_t tokens = 0, top_k = 0, num_experts = 0;
  int num_local = 0;
  int32_t* counts = nullptr;
  int32_t* offsets = nullptr;
  int32_t* row_map = nullptr;
  int32_t* pair_row = nullptr;
  uint32_t* error = nullptr;
  uint32_t* clear = nullptr;  // words set to zero for the later kernels (or null)
  int clear_words = 0;
  int32_t* seg = nullptr;  // heuristics.h permute_seg_words: the two kernels' segments or a
                           // grid of the block form (not used by one block)
};
void launch_permute(const PermuteParams& p, cudaStream_t stream);
/// Blocks of the block permutation that fit the current device at once (its grid's bound:
/// a cooperative launch; 0 where the device has none), cached per device.
int64_t block_permute_coresident();
/// launch_quantize_x + launch_permute, in one launch when the problem is small.
void launch_quantize_permute(const PermuteParams& p, const uint16_t* x, int64_t hidden,
                             ScaleRule rule, uint8_t* codes, uint8_t* scales,
                             cudaStream_t stream);

/// The count class of one decode-path launch (heuristics.h plan_fast): its blocks work
/// only on experts with count_lo < rows <= count_hi, with `z` token-tile slots.
struct FastLaunch {
  int32_t count_lo = 0, count_hi = 0x7FFFFFFF;
  int z = 1;
};

struct Gemm1Params {
  MatView w13;                       // rows 2N (kernel layout), cols K
  const float* bias = nullptr;       // [E_local][2N] or null
  int activation = 0;                // mxmoe::Activation, or am::kActSituAlpha4 / kActSituOtherAlpha
  const float* alpha = nullptr;      // [E_local] each
  const float* beta = nullptr;
  const float* limit = nullptr;
  const void* x = nullptr;           // [M][K] bf16 or e4m3
  const uint8_t* x_scale = nullptr;  // [M][K/32] when e4m3
  bool x_fp8 = false;
  const int32_t* counts = nullptr;
  const int32_t* offsets = nullptr;
  const int32_t* row_map = nullptr;
  int64_t tokens = 0, top_k = 0, hidden = 0, intermediate = 0;
  int num_local = 0;
  void* inter = nullptr;             // [M*k][N] e4m3 or bf16
  uint8_t* inter_scale = nullptr;
  bool inter_fp8 = false;
  ScaleRule rule = ScaleRule::RoundUp;
  FastLaunch fast;                   // set by launch_gemm1 per decode-path launch
  /// Prefill path (heuristics.h use_prefill): x staged as exact BF16 rows (stage_bf16.cu,
  /// `xb_stride` = K padded to 64) with their range factors; `inexact` bit kInexactX set
  /// on the device sends this GEMM to the generic path instead. The prefill kernel writes
  /// the intermediate only as GEMM2's staged rows `ib` (stage_bf16.cu's layout, `ib_stride`
  /// = N padded to 64, range factor 1), not to `inter`; where those cannot hold it exactly
  /// it sets bit kInexactInter, and then the generic path runs too and writes `inter`
  /// (the generic path always sets that bit: GEMM2 then reads `inter`).
  bool prefill = false;
  const uint16_t* xb = nullptr;
  int64_t xb_stride = 0;
  const float* xb_back = nullptr;
  uint32_t* inexact = nullptr;
  uint16_t* ib = nullptr;
  int64_t ib_stride = 0;
  /// Split tail (wgmma_mx.cuh pf_plan), or null; on the decode path at 2..32 tokens the
  /// balanced kernel's slots (heuristics.h kBalancedSlots: kBalancedAccBytes, counters at
  /// zero). GEMM1's prefill path needs split_count even without split_acc: its item
  /// counter follows the split counters (heuristics.h kPrefillWordsBytes, prefill_claims).
  float* split_acc = nullptr;
  uint32_t* split_count = nullptr;
  /// FP8 mode (config.precision fp8; prefill sizes): E4M3 weights and x re-expressed per
  /// 128 of K (stage_fp8.cu), FP8 wgmma (wgmma_fp8.cuh). Takes precedence over `prefill`.
  bool fp8 = false;
  Fp8MatView w13f8;
  const uint8_t* xf = nullptr;     // [M*k][w13f8.cols_p] staged x in routed-row order (TMA)
  const float* xf_scale = nullptr;  // [w13f8.groups][fp8_scale_rows(M*k)]
  /// FP8 mode with the intermediate's regrouping fused into GEMM1's drain (layer.cu;
  /// knob MXMOE_F8_FUSED=0 turns it off): the drain writes GEMM2's staged rows and scales,
  /// the bytes stage_fp8 would make from `inter`, and not `inter`. Null: `inter`, staged
  /// after GEMM1 by stage_fp8.
  uint8_t* if8 = nullptr;           // [M*k][if8_stride] E4M3 codes
  float* if8_scale = nullptr;       // [if8_stride / 128][if8_scale_rows]
  int64_t if8_stride = 0;           // w2f8.cols_p: N rounded up to 128
  int64_t if8_scale_rows = 0;       // fp8_scale_rows(M*k)
  int if8_shift = 0;                // StageFp8Params::scale_shift of GEMM2's weights
  /// Prefill path: the generic kernel behind the prefill kernel (the fallback, which leaves
  /// at once unless the inexact word says otherwise) is launched as a programmatic
  /// dependent of it (launch_gemm1), so that its blocks are dispatched in the prefill
  /// kernel's tail instead of after it; it waits for it before it reads the word.
  bool fallback_programmatic = false;
  /// Decode path at one token: launched as a programmatic dependent of the permutation's
  /// prologue kernel (heuristics.h use_programmatic_gemm1). Its blocks start beside the
  /// prologue, move their first weight chunks toward L2 if the routing ids (`ids`,
  /// `tokens` x `top_k`, mapped by `expert_map` of `num_experts`) name their expert, and
  /// wait for the prologue before reading its counts.
  bool programmatic = false;
  const int32_t* ids = nullptr;
  const int32_t* expert_map = nullptr;
  int num_experts = 0;
  /// Decode path (heuristics.h use_expert_ready): [num_local] counters, zero on entry;
  /// each warp adds its stored 8-row tiles to its expert's (a release), so GEMM2 may start
  /// on an expert once it reaches expert_ready_target. Null: no counting.
  uint32_t* expert_ready = nullptr;
};
void launch_gemm1(const Gemm1Params& p, cudaStream_t stream);

struct Gemm2Params {
  MatView w2;                        // rows K, cols N
  const float* bias = nullptr;       // [E_local][K] or null
  const void* inter = nullptr;
  const uint8_t* inter_scale = nullptr;
  bool inter_fp8 = false;
  const int32_t* counts = nullptr;
  const int32_t* offsets = nullptr;
  int64_t tokens = 0, top_k = 0, hidden = 0, intermediate = 0;
  int num_local = 0;
  float* y = nullptr;                // [M*k][K]
  /// FP8 mode (fp8): its kernel writes y as BF16 here instead, [M*k][K], each value rounded
  /// to nearest even (bf16x2_rn): half the bytes for GEMM2 to write and finalize to read.
  uint16_t* y_bf16 = nullptr;
  /// Decode path only, no bias (heuristics.h gemm2_splits): split s of the reduction
  /// writes its unscaled partial to y + s * split_stride and split 0 the row range
  /// factors to back[row]; finalize combines them.
  int splits = 1;
  int64_t split_stride = 0;
  float* back = nullptr;
  FastLaunch fast;                   // set by launch_gemm2 per decode-path launch
  /// Decode path with one count class, right after GEMM1's decode kernel: launched as its
  /// programmatic dependent (heuristics.h use_programmatic_launch), so its blocks start
  /// streaming weights once GEMM1's blocks are past their mainloops.
  bool programmatic = false;
  /// Prefill path: the generic fallback kernel as a programmatic dependent of the prefill
  /// kernel, as Gemm1Params::fallback_programmatic.
  bool fallback_programmatic = false;
  /// Prefill path: the intermediate staged as exact BF16 rows by GEMM1's prefill epilogue
  /// (`ib_stride` = N padded to 64, range factor 1); bit kInexactInter of `inexact`
  /// selects the generic path.
  bool prefill = false;
  const uint16_t* ib = nullptr;
  int64_t ib_stride = 0;
  const uint32_t* inexact = nullptr;
  float* split_acc = nullptr;        // split tail (wgmma_mx.cuh pf_plan), or null
  uint32_t* split_count = nullptr;
  /// FP8 mode: as Gemm1Params::fp8, the intermediate re-expressed.
  bool fp8 = false;
  Fp8MatView w2f8;
  const uint8_t* if8 = nullptr;
  const float* if8_scale = nullptr;  // [w2f8.groups][fp8_scale_rows(M*k)]
  /// Decode path: GEMM1's expert-ready counters (Gemm1Params::expert_ready). Each block
  /// waits for its expert's to reach expert_ready_target(ready_row_groups, rows) instead
  /// of for GEMM1's whole grid. Null: the grid-wide wait.
  const uint32_t* expert_ready = nullptr;
  int ready_row_groups = 0;  // GEMM1's 64-row groups of W13 (its w13.rg)
};
void launch_gemm2(const Gemm2Params& p, cudaStream_t stream);
/// Resident blocks per SM of GEMM2's decode kernel for 8-row tiles (or, at one token, its
/// one-row kernel) with the shared memory launch_gemm2 gives it for `p` (tokens, splits,
/// intermediate, expert_ready); for tests.
int gemm2_decode_blocks_per_sm(const Gemm2Params& p);

struct FinalizeParams {
  const float* y = nullptr;
  const uint16_t* y_bf16 = nullptr;  // non-null (FP8 mode, Gemm2Params::y_bf16): y as BF16, y unused
  const int32_t* pair_row = nullptr;
  const float* weights = nullptr;  // [M][k]
  int64_t tokens = 0, top_k = 0, hidden = 0;
  float output_scale = 1.0f;
  void* out = nullptr;
  bool out_fp32 = false;
  /// Split GEMM2 (Gemm2Params::splits): y row = (sum of the `splits` copies, in order)
  /// * back[row].
  int splits = 1;
  int64_t split_stride = 0;
  const float* back = nullptr;
  /// Launched as a programmatic dependent of GEMM2's last kernel (it waits for it before
  /// reading y): its launch overlaps GEMM2's end.
  bool programmatic = false;
};
void launch_finalize(const FinalizeParams& p, cudaStream_t stream);

/// Prefill path operand staging of x (stage_bf16.cu): rows of E4M3 codes + E8M0 scales (or
/// BF16) -> BF16 rows holding value * 2^-D exactly (D the row's range factor exponent, as
/// b_row_range), K-permuted inside each MX block like the tiled weights (wgmma_mx.cuh),
/// zero-padded to `stride`; back[row] = 2^D. A value BF16 cannot hold exactly (|v| under
/// 2^-126 or rounded) sets `flag_bit` in *flag.
struct StageBf16Params {
  const void* src = nullptr;         // [rows][cols] e4m3 codes or bf16
  const uint8_t* scale = nullptr;    // [rows][cols/32] when fp8
  bool fp8 = false;
  int64_t rows = 0;
  int64_t cols = 0, stride = 0;
  uint16_t* dst = nullptr;
  float* back = nullptr;
  uint32_t* flag = nullptr;
  uint32_t flag_bit = 0;
  /// Launched as a programmatic dependent of the permutation (launch_kernel), so that x is
  /// staged while the routed pairs are permuted: x is the layer's input, not the
  /// permutation's result. Its grid still waits for the permutation's before it ends, so
  /// the normally launched GEMM1 after it sees both.
  bool programmatic = false;
  /// src (and scale) are written by the kernels before: wait for them first (x quantized
  /// in the layer's prologue).
  bool src_after_predecessor = false;
};
void launch_stage_bf16(const StageBf16Params& p, cudaStream_t stream);
/// FP8-mode operand staging (stage_fp8.cu): MXFP8 rows (E4M3 codes + E8M0 scale per 32)
/// -> E4M3 codes under one scale per 128 of K (fp8mode::activation_code), zero-padded to
/// `stride` = groups * 128, and dst_scale[group][row] = 2^(group byte - 127 + scale_shift)
/// (group-major, so that a tile's 128 token scales of a group are one TMA box).
struct StageFp8Params {
  const uint8_t* src = nullptr;        // [rows][cols] e4m3 codes (gathered: [tokens][cols])
  const uint8_t* scale = nullptr;      // [rows][cols/32] (gathered: [tokens][cols/32])
  int64_t rows = 0;
  const int32_t* live_rows = nullptr;  // device count of rows in use, or null (all)
  /// Gathered (GEMM1's x in routed-row order): row r takes source row row_map[r] / top_k;
  /// null: row r takes source row r.
  const int32_t* row_map = nullptr;
  int64_t top_k = 1;
  int64_t cols = 0, stride = 0;
  uint8_t* dst = nullptr;              // [rows][stride]
  float* dst_scale = nullptr;          // [stride/128][scale_rows]
  int64_t scale_rows = 0;              // fp8_scale_rows(rows)
  /// Binades added to every staged scale: the consuming weights' row_exp_ref - 127 in the
  /// row form (engine.h Fp8Dims), 0 in the group form.
  int scale_shift = 0;
  /// Scattered (x in routed-row order, `split` warps per token): row r is token r, written
  /// at each of its routed rows pair_row[r * top_k + j] >= 0 (the slots of no local expert
  /// are -1); dst then has routed rows and scale_rows = fp8_scale_rows(rows * top_k).
  /// Needs row_map and live_rows null. Null: row r is written at row r.
  const int32_t* pair_row = nullptr;
  /// Scattered only: warps per row, each taking a share of its groups (heuristics.h
  /// stage_fp8_split); 1 otherwise.
  int split = 1;
};
void launch_stage_fp8(const StageFp8Params& p, cudaStream_t stream);
/// Rows of each group of the staged scales: `rows` up to a multiple of 4 (16 bytes, the
/// stride a TMA map needs).
inline constexpr int64_t fp8_scale_rows(int64_t rows) { return (rows + 3) / 4 * 4; }
/// SMs of the current device (cached per device).
int current_sm_count();
/// CTAs of a prefill launch: `per_sm` per SM of the current device (or fewer with the
/// test knob MXMOE_PREFILL_CTAS, so that small problems loop over several tiles per CTA).
int prefill_ctas(int per_sm = 1);
/// Blocks of the balanced decode GEMM1 (heuristics.h balanced_block): one wave,
/// `blocks_per_sm` (the kernel's occupancy) on every SM of the current device, at most
/// kBalancedMaxBlocks (or fewer with the test knob MXMOE_DECODE_BLOCKS).
int decode_balanced_blocks(int blocks_per_sm);
/// Token tile of an exact prefill launch: heuristics.h prefill_token_tile, or the test
/// knob MXMOE_PREFILL_TOKEN_TILE = 32 / 64 / 96 / 128 (so that any problem runs any tile).
int prefill_tile_tokens(int64_t tokens, int64_t top_k, int num_local);
/// True when the current device runs this binary's sm_90a prefill kernels (an sm_90 GPU
/// and a build with 90a; an sm_80 image would run there with empty prefill kernels).
bool prefill_kernels_available();

/// Token tile (8 * NT tokens per warp) the GEMMs use for `tokens` tokens: 8 for decode
/// (the MMA's N dimension holds the few tokens: "swap AB"), 32 otherwise.

/// cudaSuccess when this binary holds kernels the current device can run (else e.g.
/// cudaErrorNoKernelImageForDevice).
cudaError_t probe_kernel_image();

}  // namespace mxmoe::cuda_detail
