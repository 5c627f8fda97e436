// finalize.cu — deterministic combine: out[t][c] = output_scale * sum over slots
// j = 0..k-1, in order, of weight[t][j] * y[row(t, j)][c] (slots whose expert is not
// local contribute nothing; a token with none gets zeros). Every element is written.
// The sum is a fixed chain of fmaf, so runs are bitwise identical.
#include "common.cuh"
#include "engine.h"
#include "mxmoe/formats.h"

namespace mxmoe::cuda_detail {

namespace {

constexpr int kThreads = 256;

template <bool kFp32Out>
__global__ void __launch_bounds__(kThreads) finalize_kernel(const FinalizeParams p) {
  const int64_t t = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (c >= p.hidden) return;
  float acc = 0.0f;
  for (int64_t j = 0; j < p.top_k; ++j) {
    const int32_t r = p.pair_row[t * p.top_k + j];
    if (r < 0) continue;
    const float* yr = p.y + static_cast<int64_t>(r) * p.hidden + c;
    float v = yr[0];
    if (p.back != nullptr) {  // split GEMM2: partials in split order, then the range factor
      for (int s = 1; s < p.splits; ++s) v = v + yr[s * p.split_stride];
      v = v * p.back[r];
    }
    acc = __fmaf_rn(p.weights[t * p.top_k + j], v, acc);
  }
  acc = acc * p.output_scale;
  if constexpr (kFp32Out) static_cast<float*>(p.out)[t * p.hidden + c] = acc;
  else static_cast<uint16_t*>(p.out)[t * p.hidden + c] = fmt::float_to_bf16(acc);
}

}  // namespace

void launch_finalize(const FinalizeParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.tokens),
                  static_cast<unsigned>((p.hidden + kThreads - 1) / kThreads));
  if (p.out_fp32) finalize_kernel<true><<<grid, kThreads, 0, stream>>>(p);
  else finalize_kernel<false><<<grid, kThreads, 0, stream>>>(p);
  MXMOE_LAUNCH_CHECK("finalize_kernel");
}

cudaError_t probe_kernel_image() {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, finalize_kernel<true>);
}

}  // namespace mxmoe::cuda_detail
