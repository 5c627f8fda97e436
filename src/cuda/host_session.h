// host_session.h — what the single-GPU and EP host sessions (src/cuda/host_session.cu,
// src/ep/host_session.cu) share: poisoning the output before a run and fetching it after.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common.cuh"
#include "mxmoe/moe.h"

namespace mxmoe::cuda_detail {

/// 0xFF bytes are NaN in both bf16 and fp32: every element must be written.
inline void poison_output(void* out, size_t bytes, cudaStream_t stream) {
  if (bytes) MXMOE_CUDA_CHECK(cudaMemsetAsync(out, 0xFF, bytes, stream));
}

/// Copies the [tokens][cfg.hidden] output at `out` to the host once `stream` is done.
inline Output fetch_output(const void* out, const MoeConfig& cfg, int64_t tokens,
                           cudaStream_t stream) {
  Output o;
  o.format = cfg.output_format;
  o.tokens = tokens;
  o.hidden = cfg.hidden;
  const size_t n = static_cast<size_t>(tokens * cfg.hidden);
  if (o.format == OutputFormat::BF16) {
    o.bf16.resize(n);
    if (n) MXMOE_CUDA_CHECK(cudaMemcpyAsync(o.bf16.data(), out, n * 2, cudaMemcpyDeviceToHost, stream));
  } else {
    o.fp32.resize(n);
    if (n) MXMOE_CUDA_CHECK(cudaMemcpyAsync(o.fp32.data(), out, n * 4, cudaMemcpyDeviceToHost, stream));
  }
  MXMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return o;
}

}  // namespace mxmoe::cuda_detail
