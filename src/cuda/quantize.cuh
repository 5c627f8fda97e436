// quantize.cuh — one MX block of BF16 activations -> MXFP8, shared by the quantize kernel
// and the fused decode prologue (permute.cu). Bit-exact with fmt::quantize_block_e4m3
// because it *is* that function, run by one thread per 32-block.
#pragma once

#include <cstdint>

#include "mxmoe/formats.h"
#include "mxmoe/moe.h"

namespace mxmoe::cuda_detail {

__device__ __forceinline__ void quantize_x_block(const uint16_t* __restrict__ x, int64_t b,
                                                 ScaleRule rule, uint8_t* __restrict__ codes,
                                                 uint8_t* __restrict__ scales) {
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

}  // namespace mxmoe::cuda_detail
