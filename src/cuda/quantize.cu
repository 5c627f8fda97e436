// quantize.cu — BF16 activations -> MXFP8 (E4M3 codes + one E8M0 scale per 32 of K),
// bit-exact with fmt::quantize_block_e4m3 because it *is* that function, run by one
// thread per 32-block (the activations are a small fraction of the traffic).
#include "common.cuh"
#include "engine.h"
#include "quantize.cuh"
#include "mxmoe/formats.h"

namespace mxmoe::cuda_detail {

namespace {

__global__ void quantize_x_kernel(const uint16_t* __restrict__ x, int64_t blocks, ScaleRule rule,
                                  uint8_t* __restrict__ codes, uint8_t* __restrict__ scales) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  quantize_x_block(x, b, rule, codes, scales);
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
