// quantize.cu — BF16 activations -> MXFP8 (E4M3 codes + one E8M0 scale per 32 of K),
// bit-exact with fmt::quantize_block_e4m3 because it *is* that function, run by one
// thread per 32-block (the activations are a small fraction of the traffic).
#include "common.cuh"
#include "engine.h"
#include "mxmoe/formats.h"

namespace mxmoe::cuda_detail {

namespace {

__global__ void quantize_x_kernel(const uint16_t* __restrict__ x, int64_t blocks, ScaleRule rule,
                                  uint8_t* __restrict__ codes, uint8_t* __restrict__ scales) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + b * kMxBlock);
  float v[kMxBlock];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 q = src[i];
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[8 * i + 2 * j] = fmt::bf16_to_float(static_cast<uint16_t>(w[j] & 0xFFFFu));
      v[8 * i + 2 * j + 1] = fmt::bf16_to_float(static_cast<uint16_t>(w[j] >> 16));
    }
  }
  alignas(16) uint8_t c[kMxBlock];
  uint8_t s;
  fmt::quantize_block_e4m3(v, c, &s, rule);
  uint4* dst = reinterpret_cast<uint4*>(codes + b * kMxBlock);
  dst[0] = *reinterpret_cast<const uint4*>(c);
  dst[1] = *reinterpret_cast<const uint4*>(c + 16);
  scales[b] = s;
}

}  // namespace

void launch_quantize_x(const uint16_t* x, int64_t tokens, int64_t hidden, ScaleRule rule,
                       uint8_t* codes, uint8_t* scales, cudaStream_t stream) {
  const int64_t blocks = tokens * hidden / kMxBlock;
  if (blocks == 0) return;
  constexpr int kThreads = 128;
  quantize_x_kernel<<<static_cast<unsigned>((blocks + kThreads - 1) / kThreads), kThreads, 0,
                      stream>>>(x, blocks, rule, codes, scales);
  MXMOE_LAUNCH_CHECK("quantize_x_kernel");
}

}  // namespace mxmoe::cuda_detail
