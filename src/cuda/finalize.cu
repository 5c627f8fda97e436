// finalize.cu — deterministic combine: out[t][c] = output_scale * sum over slots
// j = 0..k-1, in order, of weight[t][j] * y[row(t, j)][c] (slots whose expert is not
// local contribute nothing; a token with none gets zeros). Every element is written.
// The sum is a fixed chain of fmaf, so runs are bitwise identical.
#include "common.cuh"
#include "engine.h"
#include "heuristics.h"
#include "mxmoe/formats.h"
#include "ptx.cuh"

namespace mxmoe::cuda_detail {

namespace {

constexpr int kThreads = 256;

/// kMaxSplits: 1 when GEMM2 did not split (the loads and registers of the unsplit case
/// stay minimal: at M >= 1024 a 4-split array of values cost 2.7%), else kGemm2MaxSplits.
/// kVec: output columns per thread, 16 bytes of y (4 fp32 values, or 8 BF16 ones) where
/// launch_finalize finds the rows aligned for it, else 1. Each column keeps its own fma
/// chain, so the result does not depend on kVec.
/// kBf16Y: y holds BF16 values (FP8 mode, FinalizeParams::y_bf16), never split.
template <bool kFp32Out, int kMaxSplits, int kVec, bool kBf16Y = false>
__global__ void __launch_bounds__(kThreads) finalize_kernel(const FinalizeParams p) {
  static_assert(kVec == 1 || (kVec == (kBf16Y ? 8 : 4) && kMaxSplits == 1), "16-byte columns only unsplit");
  static_assert(!kBf16Y || kMaxSplits == 1, "a BF16 y is never split");
  const int64_t t = blockIdx.x;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * kVec;
  // Latency, not bandwidth, sets this kernel's time at decode sizes (a few KB of y per
  // token, just written to L2), so the loads go out in two waves: a batch of slots' row
  // indices and weights, then every y value and range factor of the batch (all splits)
  // together. Only then does the fixed fma chain run, in slot order and split order.
  // (A chain of dependent loads per split and slot took 18 us at M=1 with 4 splits.)
  // At prefill sizes it streams M * k rows of y from HBM: the 16-byte loads (kVec 4) took
  // it from 326 to 225 us at M=4096 (H200, ncu; PERFORMANCE.md, session 12). A batch is
  // 8 slots there; the split kernel (M=1) takes Kimi-K3's 16 in one batch, one round trip
  // fewer (ncu, session 24: 6.2 -> 5.4 us; 16-slot batches cost the 16-byte kernel 128
  // registers instead of 54 and M=4096 228 -> 239 us).
  constexpr int kBatch = kMaxSplits > 1 ? 16 : 8;
  const int32_t* pr = p.pair_row + t * p.top_k;
  const float* wt = p.weights + t * p.top_k;
  int32_t r[kBatch];
  float w[kBatch];
  auto load_slots = [&](int64_t j0) {
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const bool in = j0 + i < p.top_k;
      r[i] = in ? pr[j0 + i] : -1;
      w[i] = in ? wt[j0 + i] : 0.0f;
    }
  };
  // The first batch's slots before the wait: pair_row and the routing weights are the
  // prologue's and the routing's, complete once GEMM1 is (its blocks wait for the
  // prologue), and this grid starts only once every GEMM2 block has let it or ended;
  // GEMM2's block (0, 0, 0) lets it only after waiting for GEMM1. y and the range
  // factors are GEMM2's: read only after the wait.
  load_slots(0);
  // Every block waits (launch_finalize may make this grid a programmatic dependent of
  // GEMM2): finishing this grid then implies GEMM2 finished, so plain launches after it
  // see all of the forward done.
  pdl_wait_for_predecessor();
  if (c >= p.hidden) return;  // kVec divides hidden
  const int splits = kMaxSplits > 1 && p.back != nullptr ? p.splits : 1;
  float acc[kVec];
#pragma unroll
  for (int q = 0; q < kVec; ++q) acc[q] = 0.0f;
  for (int64_t j0 = 0; j0 < p.top_k; j0 += kBatch) {
    if (j0 > 0) load_slots(j0);
    float back[kBatch], v[kBatch][kMaxSplits][kVec];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      back[i] = 1.0f;
      const int64_t y_at = static_cast<int64_t>(r[i] < 0 ? 0 : r[i]) * p.hidden + c;
      if constexpr (kBf16Y) {
        // A BF16 value's float is its bits in the upper half.
        const uint16_t* yr = p.y_bf16 + y_at;
        if constexpr (kVec == 8) {
          const uint4 u = r[i] >= 0 ? *reinterpret_cast<const uint4*>(yr) : make_uint4(0, 0, 0, 0);
          const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            v[i][0][2 * q] = __uint_as_float(words[q] << 16);
            v[i][0][2 * q + 1] = __uint_as_float(words[q] & 0xFFFF0000u);
          }
        } else {
          v[i][0][0] = r[i] >= 0 ? fmt::bf16_to_float(yr[0]) : 0.0f;
        }
        continue;
      }
      const float* yr = p.y + y_at;
#pragma unroll
      for (int sp = 0; sp < kMaxSplits; ++sp) {
        const bool ok = r[i] >= 0 && sp < splits;
        if constexpr (kVec == 4) {
          const float4 f = ok ? *reinterpret_cast<const float4*>(yr) : make_float4(0, 0, 0, 0);
          v[i][sp][0] = f.x;
          v[i][sp][1] = f.y;
          v[i][sp][2] = f.z;
          v[i][sp][3] = f.w;
        } else {
          v[i][sp][0] = ok ? yr[sp * p.split_stride] : 0.0f;
        }
      }
      // Split GEMM2: partials in split order, then the row's range factor.
      if (r[i] >= 0 && p.back != nullptr) back[i] = p.back[r[i]];
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (r[i] < 0) continue;
#pragma unroll
      for (int q = 0; q < kVec; ++q) {
        float y = v[i][0][q];
        if (p.back != nullptr) {
#pragma unroll
          for (int sp = 1; sp < kMaxSplits; ++sp)
            if (sp < splits) y = y + v[i][sp][q];
          y = y * back[i];
        }
        acc[q] = __fmaf_rn(w[i], y, acc[q]);
      }
    }
  }
#pragma unroll
  for (int q = 0; q < kVec; ++q) acc[q] = acc[q] * p.output_scale;
  if constexpr (kFp32Out) {
    float* o = static_cast<float*>(p.out) + t * p.hidden + c;
    if constexpr (kVec > 1) {
#pragma unroll
      for (int q = 0; q < kVec; q += 4)
        *reinterpret_cast<float4*>(o + q) = make_float4(acc[q], acc[q + 1], acc[q + 2], acc[q + 3]);
    } else {
      o[0] = acc[0];
    }
  } else {
    uint16_t* o = static_cast<uint16_t*>(p.out) + t * p.hidden + c;
    if constexpr (kVec > 1) {
      uint32_t w[kVec / 2];
#pragma unroll
      for (int q = 0; q < kVec / 2; ++q)
        w[q] = fmt::float_to_bf16(acc[2 * q]) | static_cast<uint32_t>(fmt::float_to_bf16(acc[2 * q + 1])) << 16;
      if constexpr (kVec == 4) *reinterpret_cast<uint2*>(o) = make_uint2(w[0], w[1]);
      else *reinterpret_cast<uint4*>(o) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      o[0] = fmt::float_to_bf16(acc[0]);
    }
  }
}

}  // namespace

void launch_finalize(const FinalizeParams& p, cudaStream_t stream) {
  MXMOE_CHECK_ARG(p.splits >= 1 && p.splits <= kGemm2MaxSplits, "FinalizeParams.splits", p.splits,
                  ": needs 1..", kGemm2MaxSplits);
  const bool bf16_y = p.y_bf16 != nullptr;
  MXMOE_CHECK_ARG(!bf16_y || p.splits == 1, "FinalizeParams.y_bf16", "a BF16 y is never split; splits ",
                  p.splits);
  const bool split = p.splits > 1 && p.back != nullptr;
  // 16-byte columns: unsplit, and every row of y and of the output starts 16-byte aligned.
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const int vec_cols = bf16_y ? 8 : 4;
  const bool vec = !split && p.hidden % vec_cols == 0 &&
                   aligned16(bf16_y ? static_cast<const void*>(p.y_bf16) : p.y) && aligned16(p.out);
  const int cols = vec ? vec_cols * kThreads : kThreads;
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>((p.hidden + cols - 1) / cols));
  auto* kernel =
      bf16_y ? (p.out_fp32 ? (vec ? finalize_kernel<true, 1, 8, true> : finalize_kernel<true, 1, 1, true>)
                           : (vec ? finalize_kernel<false, 1, 8, true> : finalize_kernel<false, 1, 1, true>))
      : p.out_fp32 ? (split ? finalize_kernel<true, kGemm2MaxSplits, 1>
                            : vec ? finalize_kernel<true, 1, 4> : finalize_kernel<true, 1, 1>)
                   : (split ? finalize_kernel<false, kGemm2MaxSplits, 1>
                            : vec ? finalize_kernel<false, 1, 4> : finalize_kernel<false, 1, 1>);
  launch_kernel(kernel, grid, dim3(kThreads), 0, stream, p.programmatic, p);
  MXMOE_LAUNCH_CHECK("finalize_kernel");
}

cudaError_t probe_kernel_image() {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, finalize_kernel<true, 1, 1>);
}

}  // namespace mxmoe::cuda_detail
